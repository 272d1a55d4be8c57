#pragma once
// Numbers in the JSON files the Trainer writes (trainer_state.json, trainer_log.jsonl).

#include <cmath>

#include <nlohmann/json.hpp>

namespace mantissa::io {

/// `value` as JSON. JSON has no NaN or infinity, so those become the strings "NaN",
/// "Infinity" and "-Infinity" (the words Python's json module uses, quoted so that strict
/// parsers accept the file); `TrainerState::from_json` reads them back.
inline nlohmann::json json_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return value;
}

}  // namespace mantissa::io
