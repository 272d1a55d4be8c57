#pragma once
// The Trainer's optimizer: the one `args.optim` names, HF's weight-decay grouping, and the
// optimizer built over the tensors it should update (the fp32 masters when there are some).

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <mantissa/amp/master_weights.h>
#include <mantissa/optim/fused_adamw.h>
#include <mantissa/trainer_hooks.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// The tensors an optimizer is to update, as a strategy hands them to the optimizer's
/// factory: HF's weight-decay groups, the model's name of each tensor, and the same tensors in
/// the strategy's own order (where the fp32 masters are made from).
struct OptimizerParams {
  /// Group 0 decays when `first_group_decays`; the other holds the 1-d tensors (biases,
  /// normalisation weights). No group is empty, except in a process that owns none of a whole
  /// group's tensors under the sharding by whole tensors (its groups stay those of the whole
  /// model).
  std::vector<std::vector<torch::Tensor>> groups;
  bool first_group_decays = false;
  /// The model's name of each tensor of `groups`, parallel to them; empty where the tensors
  /// have no names of their own (a strategy's flat shards).
  std::vector<std::vector<std::string>> names;
  /// The tensors fp32 masters are made for, in the order they are made and saved in: every
  /// parameter of the model (frozen ones too), or a sharded strategy's shards in bucket order.
  std::vector<torch::Tensor> in_order;
};

/// The trainable tensors of `params` in HF's weight-decay groups: group 0 the tensors of 2 or
/// more dimensions (they decay), then the 1-d ones (no decay); an empty group is left out.
/// `module`, when given, names them. Python: `Trainer.get_decay_parameter_names` +
/// `create_optimizer`'s two groups. Pure host code.
OptimizerParams weight_decay_params(const std::vector<torch::Tensor>& params,
                                    const torch::nn::Module* module);

/// mantissa's FusedAdamW configured from `args` (`learning_rate`, the Adam betas and epsilon,
/// `weight_decay`, the stochastic rounding seeded by `seed`) and writing low-precision
/// parameters with `low_precision_update`. What `adamw_torch_fused` builds for the decaying
/// group. Pure host code.
optim::FusedAdamWOptions fused_adamw_options(const TrainingArguments& args,
                                             optim::LowPrecisionUpdate low_precision_update);

/// The optimizer the Trainer steps, with what the loop needs to know about it.
struct TrainerOptimizer {
  /// The optimizer itself.
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  /// The same optimizer when it is mantissa's FusedAdamW (built here or by a user factory),
  /// else null: its step can write the masters back into the model and be captured.
  optim::FusedAdamW* fused = nullptr;
  /// Every param group's tensors, in order: what gradient clipping sees.
  std::vector<torch::Tensor> params;
};

/// Each param group's learning rate, in order. No sync.
std::vector<double> learning_rates(const torch::optim::Optimizer& optimizer);
/// Sets param group g's learning rate to `lrs[g]`, for the groups both have. No sync.
void set_learning_rates(torch::optim::Optimizer& optimizer, const std::vector<double>& lrs);

/// Builds the optimizer over `params` (each tensor's master when `masters` is not null):
/// `factory` when given, else the one `args.optim` names with `learning_rate`, the Adam betas
/// and epsilon, and `weight_decay` in the decaying group only; a FusedAdamW writes
/// low-precision parameters without masters with `low_precision_update` (its stochastic
/// rounding seeded by `args.seed`). A FusedAdamW over masters of low-precision tensors writes
/// them back in its own pass. Python: `Trainer.create_optimizer`. Throws `c10::ValueError`
/// when there is nothing to optimize or the factory returns null.
TrainerOptimizer make_trainer_optimizer(const TrainingArguments& args,
                                        const OptimizerParams& params, amp::MasterWeights* masters,
                                        optim::LowPrecisionUpdate low_precision_update,
                                        const OptimizerFactory& factory);

}  // namespace mantissa::detail
