#include "trainer/optimizer_factory.h"

#include <utility>

#include <c10/util/Exception.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace mantissa::detail {
namespace {

// One optimizer of type `Optim` over `groups`: each group gets a copy of `options`, with
// `weight_decay` only in group 0 when it is the decaying one. The optimizer's own defaults
// are the learning rate alone, as torch::optim's constructors take them.
template <typename Optim, typename Options>
std::unique_ptr<Optim> build(std::vector<torch::optim::OptimizerParamGroup> groups,
                             bool first_group_decays, const Options& options) {
  const double decay = options.weight_decay();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    auto group_options = std::make_unique<Options>(options);
    group_options->weight_decay(i == 0 && first_group_decays ? decay : 0.0);
    groups[i].set_options(std::move(group_options));
  }
  return std::make_unique<Optim>(std::move(groups), Options(options.lr()));
}

std::unique_ptr<torch::optim::Optimizer> build_named(
    const TrainingArguments& args, std::vector<torch::optim::OptimizerParamGroup> groups,
    bool first_group_decays, amp::MasterWeights* masters,
    optim::LowPrecisionUpdate low_precision_update) {
  const double lr = args.learning_rate();
  const auto betas = std::make_tuple(args.adam_beta1(), args.adam_beta2());
  switch (args.optim().value()) {
    case OptimizerNames::kAdamWTorch:
      return build<torch::optim::AdamW>(std::move(groups), first_group_decays,
                                        torch::optim::AdamWOptions(lr)
                                            .betas(betas)
                                            .eps(args.adam_epsilon())
                                            .weight_decay(args.weight_decay()));
    case OptimizerNames::kAdamWTorchFused:
    case OptimizerNames::kAdamWMantissaFused: {
      auto fused = build<optim::FusedAdamW>(std::move(groups), first_group_decays,
                                            fused_adamw_options(args, low_precision_update));
      // The fused step writes the updated fp32 masters back into the bf16/fp16 model itself.
      if (masters != nullptr && masters->has_low_precision()) fused->link_model_params(*masters);
      return fused;
    }
    case OptimizerNames::kSgd:
      return build<torch::optim::SGD>(
          std::move(groups), first_group_decays,
          torch::optim::SGDOptions(lr).weight_decay(args.weight_decay()));
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled OptimizerNames ", args.optim());
  return nullptr;
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
                                        const OptimizerFactory& factory) {
  bool first_group_decays = false;
  auto groups = weight_decay_groups(model_params, masters, &first_group_decays);
  TORCH_CHECK_VALUE(!groups.empty(), "the model has no parameter that requires grad");
  TrainerOptimizer result;
  result.optimizer = factory ? factory(std::move(groups))
                             : build_named(args, std::move(groups), first_group_decays, masters,
                                           low_precision_update);
  TORCH_CHECK_VALUE(result.optimizer != nullptr, "the optimizer factory returned null");
  for (const auto& group : result.optimizer->param_groups()) {
    result.params.insert(result.params.end(), group.params().begin(), group.params().end());
  }
  result.fused = dynamic_cast<optim::FusedAdamW*>(result.optimizer.get());
  return result;
}

}  // namespace mantissa::detail
