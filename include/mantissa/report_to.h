#pragma once

#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace mantissa {

/// `--report_to`: the integrations a run reports its logs to, besides trainer_log.jsonl, as a
/// list of names in the order their callbacks run. Python: `TrainingArguments.report_to` after
/// `__post_init__`, a `list[str]`.
///
///     ReportTo("tensorboard")              // ["tensorboard"]
///     ReportTo("tensorboard,my_tracker")   // a comma-separated text is a list
///     ReportTo{"tensorboard", "my_tracker"}  // a list: its items are not split
///     ReportTo("none"), ReportTo{}, ReportTo()     // [] (the default)
///     ReportTo("all")                      // every integration registered now
///
/// A list that is exactly `none` becomes empty, and one that is exactly `all` becomes the names
/// of every integration registered at that moment (`registered_integrations()` of
/// include/mantissa/integrations.h), as HF replaces `"all"` by the integrations installed when
/// the arguments are made. Any other list is kept as given, unknown names and repeats included:
/// `TrainingArguments::validate()` refuses a name that is not registered, a name given twice,
/// and `none` or `all` among other names. A plain host value; never touches a device.
class ReportTo {
 public:
  /// No integration (HF 5's default, `"none"`).
  ReportTo() = default;
  /// A name or several separated by commas ("tensorboard", "tensorboard,my_tracker"), or
  /// "none" / "all". The empty text is one empty name, which `validate()` refuses.
  ReportTo(const char* text);  // NOLINT(google-explicit-constructor)
  /// Same as `ReportTo(const char*)`.
  ReportTo(const std::string& text);  // NOLINT(google-explicit-constructor)
  /// A list of names, each taken whole (no splitting at commas): `{"tensorboard"}`; `{"none"}`
  /// and `{"all"}` as their texts. Python: `report_to=["tensorboard"]`.
  ReportTo(std::initializer_list<std::string> names);  // NOLINT(google-explicit-constructor)
  /// Same as the `initializer_list` form.
  ReportTo(std::vector<std::string> names);  // NOLINT(google-explicit-constructor)

  /// The names, in order (empty for none).
  const std::vector<std::string>& names() const noexcept { return names_; }
  /// Whether no integration is named.
  bool empty() const noexcept { return names_.empty(); }
  /// The names joined by commas, "none" when empty: the command line's spelling, which reads
  /// back as the same list.
  std::string text() const;

  friend bool operator==(const ReportTo& a, const ReportTo& b) { return a.names_ == b.names_; }
  friend bool operator!=(const ReportTo& a, const ReportTo& b) { return !(a == b); }
  /// Writes `text()`.
  friend std::ostream& operator<<(std::ostream& out, const ReportTo& r) { return out << r.text(); }

 private:
  std::vector<std::string> names_;
};

}  // namespace mantissa
