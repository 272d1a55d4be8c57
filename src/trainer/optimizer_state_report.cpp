#include "trainer/optimizer_state_report.h"

#include <c10/util/Type.h>
#include <fmt/format.h>

#include <mantissa/optim/optimizer_registry.h>

namespace mantissa::detail {

std::optional<OptimizerStateSize> measure_optimizer_state(const torch::optim::Optimizer& optimizer,
                                                          const amp::MasterWeights* masters) {
  const auto* spec = optim::find_optimizer_of(optimizer);
  if (spec == nullptr || !spec->state_tensors) return std::nullopt;
  OptimizerStateSize size;
  size.optimizer = spec->name.empty() ? c10::demangle(spec->type.name()) : spec->name;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      size.parameters += param.numel();
      const auto it = optimizer.state().find(param.unsafeGetTensorImpl());
      if (it == optimizer.state().end()) continue;
      for (const auto& tensor : spec->state_tensors(*it->second)) {
        if (tensor.value.defined())
          size.state_bytes += static_cast<std::int64_t>(tensor.value.nbytes());
      }
    }
  }
  if (masters != nullptr) {
    const auto& model = masters->model_params();
    const auto& fp32 = masters->master_params();
    for (std::size_t i = 0; i < fp32.size(); ++i) {
      if (!fp32[i].is_same(model[i]))
        size.master_bytes += static_cast<std::int64_t>(fp32[i].nbytes());
    }
  }
  return size;
}

std::string bytes_text(std::int64_t bytes) {
  constexpr std::int64_t kMiB = 1024 * 1024;
  if (bytes >= kMiB) return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / kMiB);
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
  return fmt::format("{} bytes", bytes);
}

namespace {

std::string count(std::int64_t n) {
  if (n >= 1000000) return fmt::format("{:.1f}M", static_cast<double>(n) / 1e6);
  if (n >= 1000) return fmt::format("{:.1f}k", static_cast<double>(n) / 1e3);
  return std::to_string(n);
}

}  // namespace

std::string describe_optimizer_state_size(const OptimizerStateSize& size) {
  const double per_parameter = size.parameters > 0 ? static_cast<double>(size.state_bytes) /
                                                         static_cast<double>(size.parameters)
                                                   : 0.0;
  auto line = fmt::format(
      "mantissa: optimizer {} holds {} of state ({:.2f} bytes per parameter, {} parameters)",
      size.optimizer, bytes_text(size.state_bytes), per_parameter, count(size.parameters));
  if (size.master_bytes > 0)
    line += fmt::format("; fp32 masters {} more", bytes_text(size.master_bytes));
  return line;
}

}  // namespace mantissa::detail
