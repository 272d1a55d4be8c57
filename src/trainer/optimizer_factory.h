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

/// The trainable tensors of `params` in HF's weight-decay groups: group 0 the tensors of 2 or
/// more dimensions (they decay), then the 1-d ones (biases, normalisation weights: no decay);
/// an empty group is left out. With `masters`, each tensor is replaced by its fp32 master.
/// `first_group_decays` says whether group 0 is the decaying one. Python:
/// `Trainer.get_decay_parameter_names` + `create_optimizer`'s two groups.
std::vector<torch::optim::OptimizerParamGroup> weight_decay_groups(
    const std::vector<torch::Tensor>& params, const amp::MasterWeights* masters,
    bool* first_group_decays);

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

/// Builds the optimizer over `model_params` (their masters when `masters` is not null):
/// `factory` when given, else the one `args.optim` names with `learning_rate`, the Adam betas
/// and epsilon, and `weight_decay` in the decaying group only; a FusedAdamW writes
/// low-precision parameters without masters with `low_precision_update` (its stochastic
/// rounding seeded by `args.seed`). A FusedAdamW over masters of a
/// low-precision model writes them back into the model in its own pass. Python:
/// `Trainer.create_optimizer`. `module`, when given, names the parameters for the registry's
/// entry (`OptimizerBuildInputs::group_names`). Throws `c10::ValueError` when there is nothing to
/// optimize or the factory returns null.
TrainerOptimizer make_trainer_optimizer(const TrainingArguments& args,
                                        const std::vector<torch::Tensor>& model_params,
                                        amp::MasterWeights* masters,
                                        optim::LowPrecisionUpdate low_precision_update,
                                        const OptimizerFactory& factory,
                                        const torch::nn::Module* module = nullptr);

}  // namespace mantissa::detail
