// TrainingArguments as training_args.json: every field in declaration order, read back
// bit-exact, with errors that name the key.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <mantissa/training_arguments.h>

#include "io/atomic_file.h"
#include "io/json_reader.h"
#include "shorten.h"
#include "training_arguments/gradient_checkpointing_kwargs_json.h"
#include "training_arguments/lr_scheduler_kwargs_json.h"
#include "training_arguments/python_repr.h"

namespace mantissa {
namespace {

// Key order follows the declaration order, as HF's `json.dumps(asdict(args))` does.
using Json = nlohmann::ordered_json;

template <class T>
Json to_json_value(const char* key, const T& v) {
  if constexpr (std::is_same_v<T, double>) {
    // JSON has no inf or nan; nlohmann would write null and the file would not read back.
    TORCH_CHECK_VALUE(std::isfinite(v), "to_json: ", key, " is ", detail::repr(v),
                      ", which JSON cannot hold");
  }
  return Json(v);
}

template <class E>
Json to_json_value(const char* /*key*/, const Choice<E>& v) {
  return Json(std::string(v.name()));
}

Json to_json_value(const char* /*key*/, const std::vector<std::string>& v) { return Json(v); }

// A list, as HF writes report_to after __post_init__ ([] for none).
Json to_json_value(const char* /*key*/, const ReportTo& v) { return Json(v.names()); }

Json to_json_value(const char* key, const LrSchedulerKwargs& v) {
  return detail::lr_scheduler_kwargs_to_json(key, v);
}

Json to_json_value(const char* /*key*/, const GradientCheckpointingKwargs& v) {
  return detail::gradient_checkpointing_kwargs_to_json(v);
}

template <class T>
Json to_json_value(const char* key, const std::optional<T>& v) {
  return v ? to_json_value(key, *v) : Json(nullptr);
}

void from_json_value(const char* key, const Json& j, bool& out) {
  TORCH_CHECK_VALUE(j.is_boolean(), key, ": expected true or false, got ", io::describe_json(j));
  out = j.get<bool>();
}

void from_json_value(const char* key, const Json& j, int64_t& out) {
  TORCH_CHECK_VALUE(j.is_number_integer(), key, ": expected an integer, got ",
                    io::describe_json(j));
  if (j.is_number_unsigned()) {
    TORCH_CHECK_VALUE(
        j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), key, ": ",
        io::describe_json(j), " is out of range for a 64-bit integer");
  }
  out = j.get<int64_t>();
}

void from_json_value(const char* key, const Json& j, double& out) {
  TORCH_CHECK_VALUE(j.is_number(), key, ": expected a number, got ", io::describe_json(j));
  out = j.get<double>();
}

void from_json_value(const char* key, const Json& j, std::string& out) {
  TORCH_CHECK_VALUE(j.is_string(), key, ": expected a string, got ", io::describe_json(j));
  out = j.get<std::string>();
}

void from_json_value(const char* key, const Json& j, std::vector<std::string>& out) {
  TORCH_CHECK_VALUE(j.is_array(), key, ": expected a list of strings, got ", io::describe_json(j));
  out.clear();
  for (const auto& item : j) {
    TORCH_CHECK_VALUE(item.is_string(), key, ": expected a list of strings, but it holds ",
                      io::describe_json(item));
    out.push_back(item.get<std::string>());
  }
}

// An object of numbers and strings, or null (HF 5's default None); validate() checks the keys.
void from_json_value(const char* key, const Json& j, LrSchedulerKwargs& out) {
  out = detail::lr_scheduler_kwargs_from_json(key, j);
}

// An object of use_reentrant / preserve_rng_state; other keys are refused here.
void from_json_value(const char* key, const Json& j, GradientCheckpointingKwargs& out) {
  out = detail::gradient_checkpointing_kwargs_from_json(key, j);
}

// HF's list of names; also the single string that training_args.json held before report_to
// was a list ("none", "all", "tensorboard", "tensorboard,other"), read as the command line
// reads it. Unknown names are kept; validate() names them.
void from_json_value(const char* key, const Json& j, ReportTo& out) {
  TORCH_CHECK_VALUE(j.is_array() || j.is_string(), key,
                    ": expected a list of integration names or one string, got ",
                    io::describe_json(j));
  if (j.is_string()) {
    out = ReportTo(j.get<std::string>());
    return;
  }
  std::vector<std::string> names;
  from_json_value(key, j, names);
  out = ReportTo(std::move(names));
}

// Any spelling is kept; validate() names the key when it is not one of the enum's.
template <class E>
void from_json_value(const char* key, const Json& j, Choice<E>& out) {
  std::string text;
  from_json_value(key, j, text);
  out = Choice<E>(text);
}

template <class T>
void from_json_value(const char* key, const Json& j, std::optional<T>& out) {
  if (j.is_null()) {
    out.reset();
    return;
  }
  T value{};
  from_json_value(key, j, value);
  out = std::move(value);
}

// "'a', 'b'" for from_json's message: the first few keys, each cut short, so that a hostile
// file of a million long keys gives a message of one line.
std::string unknown_keys_text(const std::vector<std::string>& keys) {
  constexpr std::size_t kShown = 5;
  constexpr std::size_t kKeyChars = 60;
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < kShown; ++i) {
    if (i) out += ", ";
    out += detail::repr(detail::shorten(keys[i], kKeyChars));
  }
  if (keys.size() > kShown) out += " and " + std::to_string(keys.size() - kShown) + " more";
  return out;
}

}  // namespace

std::string TrainingArguments::to_json() const {
  Json j = Json::object();
#define MANTISSA_TA_TO_JSON_(type, name, default_value, help) \
  j[#name] = to_json_value(#name, name##_);
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_TO_JSON_)
#undef MANTISSA_TA_TO_JSON_
  try {
    return j.dump(2);
  } catch (const Json::type_error& e) {  // a string field that is not valid UTF-8
    TORCH_CHECK_VALUE(false, "to_json: ", e.what());
  }
}

TrainingArguments TrainingArguments::from_json(const std::string& text, bool validate) {
  Json j;
  try {
    j = io::parse_json_text<Json>(text);
  } catch (const io::JsonTextError& e) {
    TORCH_CHECK_VALUE(false, "from_json: not valid JSON: ", e.what());
  }
  TORCH_CHECK_VALUE(j.is_object(),
                    "from_json: expected a JSON object of TrainingArguments fields, got ",
                    j.type_name());
  TrainingArguments args;
  std::vector<std::string> unknown;
  for (const auto& [key, value] : j.items()) {
    bool known = false;
#define MANTISSA_TA_FROM_JSON_(type, name, default_value, help) \
  if (!known && key == #name) {                                 \
    from_json_value(#name, value, args.name##_);                \
    known = true;                                               \
  }
    MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_FROM_JSON_)
#undef MANTISSA_TA_FROM_JSON_
    if (!known) unknown.push_back(key);
  }
  TORCH_CHECK_VALUE(unknown.empty(), "from_json: unknown key", unknown.size() > 1 ? "s " : " ",
                    unknown_keys_text(unknown), ": TrainingArguments has no such field");
  if (validate) args.validate();
  return args;
}

void TrainingArguments::save_json(const std::string& path) const {
  io::write_file_atomically(path, to_json() + "\n");
}

TrainingArguments TrainingArguments::load_json(const std::string& path, bool validate) {
  std::vector<char> bytes;
  try {
    bytes = io::read_file(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot load training arguments from '", path, "': ", e.msg());
  }
  try {
    return from_json(std::string(bytes.begin(), bytes.end()), validate);
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, "'", path, "': ", e.msg());
  }
}

}  // namespace mantissa
