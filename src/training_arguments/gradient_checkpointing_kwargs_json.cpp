#include "training_arguments/gradient_checkpointing_kwargs_json.h"

#include <optional>

#include <c10/util/Exception.h>

#include "io/json_reader.h"
#include "shorten.h"
#include "training_arguments/python_repr.h"

namespace mantissa::detail {
namespace {

using Json = nlohmann::ordered_json;

// The object nests nothing; one level more lets a nested value reach the message naming its key.
constexpr std::size_t kKwargsDepth = 2;

constexpr const char* kExample = "{\"use_reentrant\": false}";

// The keys, in the order they are written.
struct Key {
  const char* name;
  std::optional<bool> GradientCheckpointingKwargs::*field;
};
constexpr Key kKeys[] = {{"use_reentrant", &GradientCheckpointingKwargs::use_reentrant},
                         {"preserve_rng_state", &GradientCheckpointingKwargs::preserve_rng_state}};

}  // namespace

Json gradient_checkpointing_kwargs_to_json(const GradientCheckpointingKwargs& kwargs) {
  Json out = Json::object();
  for (const auto& key : kKeys) {
    if (const auto& value = kwargs.*key.field) out[key.name] = *value;
  }
  return out;
}

GradientCheckpointingKwargs gradient_checkpointing_kwargs_from_json(const std::string& key,
                                                                    const Json& j) {
  TORCH_CHECK_VALUE(j.is_object(), key, ": expected a JSON object such as ", kExample, ", got ",
                    io::describe_json(j));
  GradientCheckpointingKwargs out;
  for (const auto& [name, value] : j.items()) {
    const Key* known = nullptr;
    for (const auto& candidate : kKeys) {
      if (name == candidate.name) known = &candidate;
    }
    TORCH_CHECK_VALUE(known != nullptr, key, ": unknown key ", repr(shorten(name, 60)),
                      "; the keys mantissa's checkpointing takes are 'use_reentrant' and "
                      "'preserve_rng_state'");
    TORCH_CHECK_VALUE(value.is_boolean(), key, ": ", repr(name), " must be true or false, got ",
                      io::describe_json(value));
    out.*known->field = value.get<bool>();
  }
  return out;
}

GradientCheckpointingKwargs gradient_checkpointing_kwargs_from_cli(const std::string& flag,
                                                                   const std::string& text) {
  Json j;
  try {
    j = io::parse_json_text<Json>(text, kKwargsDepth);
  } catch (const io::JsonTextError& e) {
    TORCH_CHECK_VALUE(false, flag, ": invalid value '", shorten(text, 80),
                      "' (expected a JSON object such as '", kExample, "': ", e.what(), ")");
  }
  return gradient_checkpointing_kwargs_from_json(flag, j);
}

}  // namespace mantissa::detail
