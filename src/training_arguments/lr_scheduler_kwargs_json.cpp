#include "training_arguments/lr_scheduler_kwargs_json.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <system_error>
#include <variant>

#include <c10/util/Exception.h>

#include "io/json_reader.h"
#include "shorten.h"
#include "training_arguments/python_repr.h"

namespace mantissa::detail {
namespace {

using Json = nlohmann::ordered_json;

// A kwargs dict nests nothing; one level more lets a nested value reach the message that names
// its key.
constexpr std::size_t kKwargsDepth = 2;

// Keys and values are the user's text: a message shows the first 60 characters of a key, the
// first 80 of a value.
std::string cut(const std::string& text, std::size_t chars) { return shorten(text, chars); }
std::string key_repr(const std::string& key) { return repr(cut(key, 60)); }

bool all_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

// HF's _convert_str_dict for one string value: "7" -> 7, "0.5" -> 0.5, anything else stays.
LrSchedulerKwarg convert_str(const std::string& flag, const std::string& key,
                             const std::string& value) {
  if (all_digits(value)) {
    std::int64_t out = 0;
    const auto res = std::from_chars(value.data(), value.data() + value.size(), out);
    TORCH_CHECK_VALUE(res.ec == std::errc() && res.ptr == value.data() + value.size(), flag, ": ",
                      key_repr(key), ": ", repr(cut(value, 80)),
                      " is out of range for a 64-bit integer");
    return out;
  }
  const auto dot = value.find('.');
  if (dot != std::string::npos && all_digits(std::string(value).erase(dot, 1))) {
    double out = 0.0;
    const auto res = std::from_chars(value.data(), value.data() + value.size(), out);
    TORCH_CHECK_VALUE(res.ec == std::errc() && res.ptr == value.data() + value.size(), flag, ": ",
                      key_repr(key), ": ", repr(cut(value, 80)), " is out of range for a float");
    return out;
  }
  return value;
}

}  // namespace

Json lr_scheduler_kwargs_to_json(const char* key, const LrSchedulerKwargs& kwargs) {
  Json out = Json::object();
  for (const auto& [name, value] : kwargs) {
    if (const auto* d = std::get_if<double>(&value)) {
      TORCH_CHECK_VALUE(std::isfinite(*d), "to_json: ", key, " ", key_repr(name), " is ", repr(*d),
                        ", which JSON cannot hold");
    }
    out[name] = std::visit([](const auto& v) { return Json(v); }, value);
  }
  return out;
}

LrSchedulerKwargs lr_scheduler_kwargs_from_json(const std::string& key, const Json& j) {
  if (j.is_null()) return {};
  TORCH_CHECK_VALUE(j.is_object(), key, ": expected a JSON object of the schedule's arguments ",
                    "(such as {\"num_cycles\": 2}), got ", io::describe_json(j));
  LrSchedulerKwargs out;
  for (const auto& [name, value] : j.items()) {
    if (value.is_number_unsigned()) {
      TORCH_CHECK_VALUE(value.get<std::uint64_t>() <=
                            static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                        key, ": ", key_repr(name), ": ", io::describe_json(value),
                        " is out of range for a 64-bit integer");
    }
    if (value.is_number_integer()) {
      out[name] = value.get<std::int64_t>();
    } else if (value.is_number_float()) {
      out[name] = value.get<double>();
    } else if (value.is_string()) {
      out[name] = value.get<std::string>();
    } else {
      TORCH_CHECK_VALUE(false, key, ": ", key_repr(name),
                        " must be a number or a string (the schedules take nothing else), got ",
                        io::describe_json(value));
    }
  }
  return out;
}

LrSchedulerKwargs lr_scheduler_kwargs_from_cli(const std::string& flag, const std::string& text) {
  if (text.empty() || text == "None" || text == "none" || text == "null") return {};
  Json j;
  try {
    j = io::parse_json_text<Json>(text, kKwargsDepth);
  } catch (const io::JsonTextError& e) {
    TORCH_CHECK_VALUE(false, flag, ": invalid value '", cut(text, 80),
                      "' (expected a JSON object such as '{\"num_cycles\": 2}': ", e.what(), ")");
  }
  TORCH_CHECK_VALUE(j.is_object(), flag, ": invalid value '", cut(text, 80),
                    "' (expected a JSON object such as '{\"num_cycles\": 2}')");
  LrSchedulerKwargs out = lr_scheduler_kwargs_from_json(flag, j);
  for (auto& [name, value] : out) {
    if (const auto* s = std::get_if<std::string>(&value)) value = convert_str(flag, name, *s);
  }
  return out;
}

}  // namespace mantissa::detail
