#pragma once
// lr_scheduler_kwargs in JSON: the object of training_args.json and the text of
// --lr_scheduler_kwargs.

#include <string>

#include <nlohmann/json.hpp>

#include <mantissa/lr_scheduler_kwargs.h>

namespace mantissa::detail {

/// The kwargs as a JSON object: integers as integers, floats as floats (2.0 stays a float), strings
/// as strings. Throws `c10::ValueError` naming `key` for a float JSON cannot hold (inf, nan).
nlohmann::ordered_json lr_scheduler_kwargs_to_json(const char* key,
                                                   const LrSchedulerKwargs& kwargs);

/// Reads what `lr_scheduler_kwargs_to_json` wrote; `null` (what HF 5 writes for its default
/// `None`) is no kwargs. Throws `c10::ValueError` naming `key` (and the kwarg) for anything but
/// an object of integers, floats and strings.
LrSchedulerKwargs lr_scheduler_kwargs_from_json(const std::string& key,
                                                const nlohmann::ordered_json& j);

/// The value of `--lr_scheduler_kwargs`: a JSON object, or "None" / "null" / "" for none. As
/// HF's `_convert_str_dict` does for a dict given on the command line, a string value of digits
/// becomes an integer ("2") and one of digits and a single dot a float ("0.5"). Throws
/// `c10::ValueError` naming `flag` and the text.
LrSchedulerKwargs lr_scheduler_kwargs_from_cli(const std::string& flag, const std::string& text);

}  // namespace mantissa::detail
