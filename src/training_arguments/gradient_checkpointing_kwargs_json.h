#pragma once
// gradient_checkpointing_kwargs in JSON: the object of training_args.json and the text of
// --gradient_checkpointing_kwargs.

#include <string>

#include <nlohmann/json.hpp>

#include <mantissa/gradient_checkpointing_kwargs.h>

namespace mantissa::detail {

/// The kwargs as a JSON object holding the keys that are set: `{"use_reentrant": false}`.
nlohmann::ordered_json gradient_checkpointing_kwargs_to_json(
    const GradientCheckpointingKwargs& kwargs);

/// Reads an object of `use_reentrant` and `preserve_rng_state`, each true or false. Throws
/// `c10::ValueError` naming `key` and the offending entry for anything else (another key, a
/// value that is not a bool, a value that is not an object).
GradientCheckpointingKwargs gradient_checkpointing_kwargs_from_json(
    const std::string& key, const nlohmann::ordered_json& j);

/// The value of `--gradient_checkpointing_kwargs`: a JSON object (the caller handles "None").
/// Throws `c10::ValueError` naming `flag` and the text.
GradientCheckpointingKwargs gradient_checkpointing_kwargs_from_cli(const std::string& flag,
                                                                   const std::string& text);

}  // namespace mantissa::detail
