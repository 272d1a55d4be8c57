#pragma once
// report_to: the callbacks the Trainer adds for the integrations it names. Internal.
// (TrainingArguments::validate() checks report_to and run_name:
// src/training_arguments/reporting_checks.h; the registry is include/mantissa/integrations.h.)

#include <memory>
#include <vector>

#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// A new callback for each integration `args.report_to()` names, in its order, made by the
/// registry's factories. Python: `get_reporting_integration_callbacks(args.report_to)`. Throws
/// c10::ValueError for a name no integration has (which `validate()` refuses first).
std::vector<std::shared_ptr<TrainerCallback>> make_reporting_callbacks(
    const TrainingArguments& args);

}  // namespace mantissa::detail
