#include "training_arguments/python_repr.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <variant>

namespace mantissa::detail {

std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Shortest digits that read back exactly, then Python's layout: positional notation for
  // exponents in [-4, 16), scientific with a two-digit exponent otherwise.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  const bool negative = s.front() == '-';
  if (negative) s.erase(0, 1);
  const auto e_pos = s.find('e');
  const int exponent = std::atoi(s.c_str() + e_pos + 1);
  std::string digits;
  for (char c : s.substr(0, e_pos)) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      const auto int_len = static_cast<std::size_t>(exponent) + 1;
      std::string int_part = digits.substr(0, std::min(digits.size(), int_len));
      int_part.resize(int_len, '0');
      const std::string frac = digits.size() > int_len ? digits.substr(int_len) : "0";
      out = int_part + "." + frac;
    } else {
      out = "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  }
  return negative ? "-" + out : out;
}

std::string repr(bool v) { return v ? "True" : "False"; }
std::string repr(int64_t v) { return std::to_string(v); }
std::string repr(double v) { return py_float(v); }
std::string repr(const std::string& v) { return "'" + v + "'"; }
std::string repr(const std::vector<std::string>& v) {
  std::string text = "[";
  for (std::size_t i = 0; i < v.size(); ++i) text += (i ? ", " : "") + repr(v[i]);
  return text + "]";
}

std::string repr(const LrSchedulerKwarg& v) {
  return std::visit([](const auto& value) { return repr(value); }, v);
}

std::string repr(const LrSchedulerKwargs& v) {
  std::string out = "{";
  for (const auto& [key, value] : v) {
    if (out.size() > 1) out += ", ";
    out += repr(key) + ": " + repr(value);
  }
  return out + "}";
}

std::string repr(const GradientCheckpointingKwargs& v) {
  std::string out;
  if (v.use_reentrant) out += "'use_reentrant': " + repr(*v.use_reentrant);
  if (v.preserve_rng_state) {
    out += (out.empty() ? "" : ", ") + std::string("'preserve_rng_state': ") +
           repr(*v.preserve_rng_state);
  }
  return "{" + out + "}";
}

}  // namespace mantissa::detail
