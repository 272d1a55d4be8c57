#pragma once
// The checks of report_to and run_name that TrainingArguments::validate() runs. Internal.

#include <optional>
#include <string>

#include <mantissa/report_to.h>

namespace mantissa::detail {

/// Checks that every name of `report_to` is a registered integration, named once, and that
/// "none" and "all" do not appear among other names (alone, `ReportTo` has already turned them
/// into a list). Throws c10::ValueError naming the first bad name and the whole list, with the
/// registered names. Python: what `get_reporting_integration_callbacks(report_to)` refuses; HF
/// makes a second callback for a repeated name, which would write every entry twice, so a
/// repeat is refused here.
void check_report_to(const ReportTo& report_to);

/// Checks that `run_name`, when set, can name a folder under `runs/`: not empty, no '/', not
/// "." or "..". Throws c10::ValueError naming the value.
void check_run_name(const std::optional<std::string>& run_name);

}  // namespace mantissa::detail
