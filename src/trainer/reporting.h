#pragma once
// report_to and run_name: which integrations a run reports to, parsed once from the string
// field, and the callbacks the Trainer adds for them. Internal.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// The integrations mantissa can report to. Python: the keys of HF's `INTEGRATION_TO_CALLBACK`.
enum class Integration { tensorboard };

/// `report_to` as integrations: "none" -> none, "all" -> every one mantissa has, else one name
/// or several separated by commas ("tensorboard"), each once. Throws c10::ValueError naming the
/// value and the choices. Python: `get_reporting_integration_callbacks(report_to)`.
std::vector<Integration> parse_report_to(const std::string& report_to);

/// Checks that `run_name`, when set, can name a folder under `runs/`: not empty, no '/', not
/// "." or "..". Throws c10::ValueError naming the value.
void check_run_name(const std::optional<std::string>& run_name);

/// A new callback for each integration `args.report_to()` names, in its order.
std::vector<std::shared_ptr<TrainerCallback>> make_reporting_callbacks(
    const TrainingArguments& args);

}  // namespace mantissa::detail
