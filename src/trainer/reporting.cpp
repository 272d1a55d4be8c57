#include "trainer/reporting.h"

#include <c10/util/Exception.h>

#include <mantissa/tensorboard_callback.h>

namespace mantissa::detail {

std::vector<Integration> report_integrations(ReportTo report_to) {
  switch (report_to) {
    case ReportTo::kNone:
      return {};
    case ReportTo::kAll:
    case ReportTo::kTensorboard:
      return {Integration::tensorboard};
  }
  TORCH_INTERNAL_ASSERT(false, "unknown ReportTo ", static_cast<int>(report_to));
}

std::vector<std::shared_ptr<TrainerCallback>> make_reporting_callbacks(
    const TrainingArguments& args) {
  std::vector<std::shared_ptr<TrainerCallback>> callbacks;
  for (const auto integration : report_integrations(args.report_to().value())) {
    switch (integration) {
      case Integration::tensorboard:
        callbacks.push_back(std::make_shared<TensorBoardCallback>());
        break;
    }
  }
  return callbacks;
}

}  // namespace mantissa::detail
