#include "optim/optim_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <utility>

#include <c10/util/Exception.h>

namespace mantissa::optim::detail {
namespace {

std::string without_spaces(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c != ' ') out += c;
  }
  return out;
}

}  // namespace

OptimArgs::OptimArgs(const std::optional<std::string>& text, std::string optim)
    : optim_(std::move(optim)) {
  if (!text || text->empty()) return;
  const std::string compact = without_spaces(*text);
  std::size_t start = 0;
  while (start <= compact.size()) {
    const auto end = std::min(compact.find(',', start), compact.size());
    const std::string pair = compact.substr(start, end - start);
    const auto eq = pair.find('=');
    TORCH_CHECK_VALUE(
        eq != std::string::npos && eq > 0 && pair.find('=', eq + 1) == std::string::npos,
        "optim_args: '", pair, "' in '", *text,
        "' is not one key=value pair (pairs are separated by commas)");
    const std::string key = pair.substr(0, eq);
    TORCH_CHECK_VALUE(pairs_.count(key) == 0, "optim_args: the key '", key, "' is given twice in '",
                      *text, "'");
    pairs_[key] = pair.substr(eq + 1);
    start = end + 1;
  }
}

std::optional<std::string> OptimArgs::take(const std::string& key) {
  known_[key] = true;
  const auto it = pairs_.find(key);
  if (it == pairs_.end()) return std::nullopt;
  return it->second;
}

double OptimArgs::to_double(const std::string& key, const std::string& text,
                            const std::string& optim) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  TORCH_CHECK_VALUE(
      !text.empty() && end == text.c_str() + text.size() && errno == 0 && std::isfinite(value),
      "optim_args: ", key, "=", text, " is not a finite number (optim ", optim, ")");
  return value;
}

double OptimArgs::take_double(const std::string& key, double fallback) {
  const auto text = take(key);
  return text ? to_double(key, *text, optim_) : fallback;
}

std::optional<double> OptimArgs::take_optional_double(const std::string& key,
                                                      std::optional<double> fallback) {
  const auto it = pairs_.find(key);
  if (it != pairs_.end() && it->second == "None") {
    known_[key] = true;
    return std::nullopt;
  }
  if (it == pairs_.end()) {
    known_[key] = true;
    return fallback;
  }
  return take_double(key, 0.0);
}

long long OptimArgs::take_int(const std::string& key, long long fallback) {
  const auto text = take(key);
  if (!text) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text->c_str(), &end, 10);
  TORCH_CHECK_VALUE(!text->empty() && end == text->c_str() + text->size() && errno == 0,
                    "optim_args: ", key, "=", *text, " is not a whole number (optim ", optim_, ")");
  return value;
}

bool OptimArgs::take_bool(const std::string& key, bool fallback) {
  const auto text = take(key);
  if (!text) return fallback;
  if (*text == "True" || *text == "true" || *text == "1") return true;
  if (*text == "False" || *text == "false" || *text == "0") return false;
  TORCH_CHECK_VALUE(false, "optim_args: ", key, "=", *text,
                    " is not a boolean (True or False; optim ", optim_, ")");
}

std::string OptimArgs::take_string(const std::string& key, const std::string& fallback) {
  const auto text = take(key);
  return text ? *text : fallback;
}

void OptimArgs::finish() const {
  std::string unknown;
  for (const auto& [key, value] : pairs_) {
    if (known_.count(key) == 0) unknown += (unknown.empty() ? "'" : ", '") + key + "'";
  }
  if (unknown.empty()) return;
  std::string taken;
  for (const auto& [key, flag] : known_) taken += (taken.empty() ? "" : ", ") + key;
  TORCH_CHECK_VALUE(
      false, "optim_args: optim ", optim_, " does not take ", unknown,
      taken.empty() ? std::string(" (it takes no optim_args)") : " (it takes " + taken + ")");
}

}  // namespace mantissa::optim::detail
