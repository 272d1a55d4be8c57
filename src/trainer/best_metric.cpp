#include "trainer/best_metric.h"

#include <cmath>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

namespace mantissa::detail {

std::optional<double> improved_best_metric(const TrainingArguments& args, const LogEntry& metrics,
                                           std::optional<double> best) {
  const auto metric = args.resolved_metric_for_best_model();
  const auto it = metrics.find(metric);
  if (it == metrics.end()) {
    std::vector<std::string> names;
    for (const auto& entry : metrics) names.push_back(entry.first);
    TORCH_CHECK_VALUE(false, "metric_for_best_model is '", metric,
                      "', but the evaluation reported no such metric; it reported ",
                      c10::Join(", ", names),
                      ". Set metric_for_best_model to one of them, or add it in compute_metrics.");
  }
  const double value = it->second;
  if (!std::isfinite(value)) return std::nullopt;
  const bool greater = args.resolved_greater_is_better();
  if (best && !(greater ? value > *best : value < *best)) return std::nullopt;
  return value;
}

}  // namespace mantissa::detail
