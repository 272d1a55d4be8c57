#pragma once
// The checks of report_to and run_name that TrainingArguments::validate() runs. Internal.

#include <optional>
#include <string>

#include <mantissa/argument_enums.h>

namespace mantissa::detail {

/// Checks that `report_to` is "none", "all" or a list of integration names separated by commas,
/// each once (mantissa has one: "tensorboard"). Throws c10::ValueError naming the first name
/// that is not an integration, or the one that appears twice, with the whole text. Python: what
/// `get_reporting_integration_callbacks(report_to)` refuses.
void check_report_to(const Choice<ReportTo>& report_to);

/// Checks that `run_name`, when set, can name a folder under `runs/`: not empty, no '/', not
/// "." or "..". Throws c10::ValueError naming the value.
void check_run_name(const std::optional<std::string>& run_name);

}  // namespace mantissa::detail
