#pragma once
// HF's `optim_args` string ("key=value,key=value", spaces ignored) as the entries of the optimizer
// registry read it: each entry takes the keys it knows, typed, and `finish` refuses the rest.
// Internal.

#include <map>
#include <optional>
#include <string>

namespace mantissa::optim::detail {

/// The pairs of one `optim_args` string. Python: `transformers.trainer_optimizer._parse_optim_args`
/// (which yields strings; each optimizer converts its own). Host only.
class OptimArgs {
 public:
  /// Parses `text` for the optimizer `optim`. Throws `c10::ValueError` naming the pair for a pair
  /// without '=' or with an empty key, and for a key given twice.
  OptimArgs(const std::optional<std::string>& text, std::string optim);

  /// The value of `key` as a finite double, or `fallback` when absent.
  double take_double(const std::string& key, double fallback);
  /// The value of `key` as a double, or nullopt when absent or spelled `None`.
  std::optional<double> take_optional_double(const std::string& key,
                                             std::optional<double> fallback);
  /// The value of `key` as a whole number, or `fallback` when absent.
  long long take_int(const std::string& key, long long fallback);
  /// `True`/`False` (Python's spellings; `true`, `false`, `1` and `0` too), or `fallback`.
  bool take_bool(const std::string& key, bool fallback);
  /// The value of `key` as written, or `fallback` when absent.
  std::string take_string(const std::string& key, const std::string& fallback);

  /// `text` as a finite double; throws `c10::ValueError` naming `key=text` and `optim`.
  static double to_double(const std::string& key, const std::string& text,
                          const std::string& optim);

  /// Throws `c10::ValueError` naming every key nobody took, and the keys that were taken.
  void finish() const;

 private:
  std::optional<std::string> take(const std::string& key);
  std::map<std::string, std::string> pairs_;
  std::map<std::string, bool> known_;
  std::string optim_;
};

}  // namespace mantissa::optim::detail
