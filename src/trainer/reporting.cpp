#include "trainer/reporting.h"

#include <mantissa/integrations.h>

namespace mantissa::detail {

std::vector<std::shared_ptr<TrainerCallback>> make_reporting_callbacks(
    const TrainingArguments& args) {
  std::vector<std::shared_ptr<TrainerCallback>> callbacks;
  for (const auto& name : args.report_to().names()) {
    callbacks.push_back(make_integration_callback(name));
  }
  return callbacks;
}

}  // namespace mantissa::detail
