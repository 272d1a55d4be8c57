#include "trainer/optimizer_factory.h"

#include <string>
#include <unordered_map>
#include <utility>

#include <c10/util/Exception.h>

#include <mantissa/optim/optimizer_registry.h>

namespace mantissa::detail {
namespace {

// The registry's entry `args.optim` names (validate() checked that it exists).
std::unique_ptr<torch::optim::Optimizer> build_named(
    const TrainingArguments& args, std::vector<torch::optim::OptimizerParamGroup> groups,
    bool first_group_decays, amp::MasterWeights* masters,
    optim::LowPrecisionUpdate low_precision_update,
    std::vector<std::vector<std::string>> group_names) {
  const auto* spec = optim::find_optimizer(args.optim().name());
  TORCH_CHECK_VALUE(spec != nullptr, "optim: ", args.optim().name(),
                    " is not a valid OptimizerNames, please select one of ",
                    optim::optimizer_names_text());
  return spec->build(optim::OptimizerBuildInputs{args, std::move(groups), first_group_decays,
                                                 masters, low_precision_update,
                                                 std::move(group_names)});
}

}  // namespace

optim::FusedAdamWOptions fused_adamw_options(const TrainingArguments& args,
                                             optim::LowPrecisionUpdate low_precision_update) {
  return optim::FusedAdamWOptions(args.learning_rate())
      .betas(std::make_tuple(args.adam_beta1(), args.adam_beta2()))
      .eps(args.adam_epsilon())
      .weight_decay(args.weight_decay())
      .low_precision_update(low_precision_update)
      .stochastic_rounding_seed(static_cast<std::uint64_t>(args.seed()));
}

OptimizerParams weight_decay_params(const std::vector<torch::Tensor>& params,
                                    const torch::nn::Module* module) {
  std::unordered_map<const void*, std::string> name_of;
  if (module != nullptr) {
    for (const auto& item : module->named_parameters()) {
      name_of.emplace(item.value().unsafeGetTensorImpl(), item.key());
    }
  }
  // Group 0 the tensors that decay, group 1 the others; an empty group is dropped below.
  std::vector<torch::Tensor> groups[2];
  std::vector<std::string> names[2];
  OptimizerParams out;
  out.in_order = params;  // frozen ones too: they keep their masters, as they always had
  for (const auto& param : params) {
    if (!param.requires_grad()) continue;
    const int g = param.dim() >= 2 ? 0 : 1;
    groups[g].push_back(param);
    if (module == nullptr) continue;
    const auto it = name_of.find(param.unsafeGetTensorImpl());
    names[g].push_back(it == name_of.end() ? std::string() : it->second);
  }
  out.first_group_decays = !groups[0].empty();
  for (int g = 0; g < 2; ++g) {
    if (groups[g].empty()) continue;
    out.groups.push_back(std::move(groups[g]));
    if (module != nullptr) out.names.push_back(std::move(names[g]));
  }
  return out;
}

std::vector<double> learning_rates(const torch::optim::Optimizer& optimizer) {
  std::vector<double> lrs;
  for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

void set_learning_rates(torch::optim::Optimizer& optimizer, const std::vector<double>& lrs) {
  auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size() && g < lrs.size(); ++g) {
    groups[g].options().set_lr(lrs[g]);
  }
}

TrainerOptimizer make_trainer_optimizer(const TrainingArguments& args,
                                        const OptimizerParams& params, amp::MasterWeights* masters,
                                        optim::LowPrecisionUpdate low_precision_update,
                                        const OptimizerFactory& factory) {
  TORCH_CHECK_VALUE(!params.groups.empty(), "the model has no parameter that requires grad");
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& group : params.groups) {
    groups.emplace_back(masters != nullptr ? masters->masters_for(group) : group);
  }
  const bool first_group_decays = params.first_group_decays;
  TrainerOptimizer result;
  result.optimizer = factory ? factory(std::move(groups))
                             : build_named(args, std::move(groups), first_group_decays, masters,
                                           low_precision_update, params.names);
  TORCH_CHECK_VALUE(result.optimizer != nullptr, "the optimizer factory returned null");
  for (const auto& group : result.optimizer->param_groups()) {
    result.params.insert(result.params.end(), group.params().begin(), group.params().end());
  }
  result.fused = dynamic_cast<optim::FusedAdamW*>(result.optimizer.get());
  return result;
}

}  // namespace mantissa::detail
