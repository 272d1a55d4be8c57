#include "trainer/reporting.h"

#include <algorithm>

#include <c10/util/Exception.h>

#include <mantissa/tensorboard_callback.h>

namespace mantissa::detail {
namespace {

constexpr const char* kChoices = "none, all, tensorboard";

}  // namespace

std::vector<Integration> parse_report_to(const std::string& report_to) {
  if (report_to == "none") return {};
  if (report_to == "all") return {Integration::tensorboard};
  std::vector<Integration> integrations;
  std::size_t start = 0;
  while (start <= report_to.size()) {
    const auto comma = std::min(report_to.find(',', start), report_to.size());
    const auto name = report_to.substr(start, comma - start);
    TORCH_CHECK_VALUE(name == "tensorboard", "report_to: '", name, "' (in '", report_to,
                      "') is not an integration mantissa has; choose one of ", kChoices,
                      " (several separated by commas)");
    TORCH_CHECK_VALUE(std::find(integrations.begin(), integrations.end(),
                                Integration::tensorboard) == integrations.end(),
                      "report_to: '", name, "' appears twice in '", report_to, "'");
    integrations.push_back(Integration::tensorboard);
    start = comma + 1;
  }
  return integrations;
}

void check_run_name(const std::optional<std::string>& run_name) {
  if (!run_name) return;
  const auto& name = *run_name;
  TORCH_CHECK_VALUE(!name.empty() && name != "." && name != ".." &&
                        name.find('/') == std::string::npos && name.find('\0') == std::string::npos,
                    "run_name must name one folder (not empty, '.' or '..', no '/'), got '", name,
                    "'");
}

std::vector<std::shared_ptr<TrainerCallback>> make_reporting_callbacks(
    const TrainingArguments& args) {
  std::vector<std::shared_ptr<TrainerCallback>> callbacks;
  for (const auto integration : parse_report_to(args.report_to())) {
    switch (integration) {
      case Integration::tensorboard:
        callbacks.push_back(std::make_shared<TensorBoardCallback>());
        break;
    }
  }
  return callbacks;
}

}  // namespace mantissa::detail
