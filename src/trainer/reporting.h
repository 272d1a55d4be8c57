#pragma once
// report_to: which integrations a run reports to, and the callbacks the Trainer adds for them.
// Internal. (TrainingArguments::validate() checks report_to and run_name:
// src/training_arguments/reporting_checks.h.)

#include <memory>
#include <vector>

#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// The integrations mantissa can report to. Python: the keys of HF's `INTEGRATION_TO_CALLBACK`.
enum class Integration { tensorboard };

/// The integrations `report_to` names: none for `kNone`, every one mantissa has for `kAll`.
/// Python: the names `get_reporting_integration_callbacks(report_to)` looks up.
std::vector<Integration> report_integrations(ReportTo report_to);

/// A new callback for each integration `args.report_to()` names, in its order.
std::vector<std::shared_ptr<TrainerCallback>> make_reporting_callbacks(
    const TrainingArguments& args);

}  // namespace mantissa::detail
