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

// The names of weight_decay_groups' tensors, split the same way; empty without a module.
std::vector<std::vector<std::string>> weight_decay_group_names(
    const std::vector<torch::Tensor>& params, const torch::nn::Module* module) {
  if (module == nullptr) return {};
  std::unordered_map<const void*, std::string> name_of;
  for (const auto& item : module->named_parameters()) {
    name_of.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  std::vector<std::string> decay;
  std::vector<std::string> no_decay;
  for (const auto& param : params) {
    if (!param.requires_grad()) continue;
    const auto it = name_of.find(param.unsafeGetTensorImpl());
    (param.dim() >= 2 ? decay : no_decay).push_back(it == name_of.end() ? "" : it->second);
  }
  std::vector<std::vector<std::string>> names;
  if (!decay.empty()) names.push_back(std::move(decay));
  if (!no_decay.empty()) names.push_back(std::move(no_decay));
  return names;
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

std::vector<torch::optim::OptimizerParamGroup> weight_decay_groups(
    const std::vector<torch::Tensor>& params, const amp::MasterWeights* masters,
    bool* first_group_decays) {
  std::vector<torch::Tensor> decay;
  std::vector<torch::Tensor> no_decay;
  for (const auto& param : params) {
    if (!param.requires_grad()) continue;
    (param.dim() >= 2 ? decay : no_decay).push_back(param);
  }
  auto optimized = [&](const std::vector<torch::Tensor>& group) {
    return masters != nullptr ? masters->masters_for(group) : group;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(optimized(decay));
  if (!no_decay.empty()) groups.emplace_back(optimized(no_decay));
  *first_group_decays = !decay.empty();
  return groups;
}

TrainerOptimizer make_trainer_optimizer(const TrainingArguments& args,
                                        const std::vector<torch::Tensor>& model_params,
                                        amp::MasterWeights* masters,
                                        optim::LowPrecisionUpdate low_precision_update,
                                        const OptimizerFactory& factory,
                                        const torch::nn::Module* module) {
  bool first_group_decays = false;
  auto groups = weight_decay_groups(model_params, masters, &first_group_decays);
  TORCH_CHECK_VALUE(!groups.empty(), "the model has no parameter that requires grad");
  TrainerOptimizer result;
  result.optimizer =
      factory ? factory(std::move(groups))
              : build_named(args, std::move(groups), first_group_decays, masters,
                            low_precision_update, weight_decay_group_names(model_params, module));
  TORCH_CHECK_VALUE(result.optimizer != nullptr, "the optimizer factory returned null");
  for (const auto& group : result.optimizer->param_groups()) {
    result.params.insert(result.params.end(), group.params().begin(), group.params().end());
  }
  result.fused = dynamic_cast<optim::FusedAdamW*>(result.optimizer.get());
  return result;
}

}  // namespace mantissa::detail
