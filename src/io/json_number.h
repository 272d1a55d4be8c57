#pragma once
// Numbers in the JSON files the Trainer writes (trainer_state.json, trainer_log.jsonl).

#include <cmath>
#include <cstdint>

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

/// A value of a log entry (`log_history`, trainer_log.jsonl) as JSON: whole numbers that a
/// double holds exactly as integers (`"step": 5`, as HF writes them), the rest as
/// `json_number`.
inline nlohmann::json json_log_value(double value) {
  if (std::isfinite(value) && std::floor(value) == value && std::fabs(value) < 9007199254740992.0) {
    return static_cast<std::int64_t>(value);
  }
  return json_number(value);
}

}  // namespace mantissa::io
