#pragma once
// The optimizers the Trainer knows, one `OptimizerSpec` each: how `--optim NAME` builds it from
// TrainingArguments and HF's weight-decay groups, which state tensors a checkpoint saves and
// checks for it, and what it supports (the low-precision update rules, sharding). The built-in
// entries live one per file in src/optim/registry/; a program adds its own with
// `register_optimizer` before it builds its TrainingArguments' Trainer.

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include <mantissa/amp/master_weights.h>
#include <mantissa/optim/low_precision_update.h>
#include <mantissa/training_arguments.h>

namespace mantissa::optim {

/// One state tensor of a parameter, by its key in optimizer.pt (`exp_avg`, ...). It may be
/// undefined (`max_exp_avg_sq` without amsgrad).
struct StateTensor {
  const char* name;
  at::Tensor value;
  /// A running sum or mean of squares (`exp_avg_sq`, `square_avg`, Adagrad's `sum`), which no
  /// run makes negative: the update takes its square root.
  bool non_negative = false;
  /// Whether it has its parameter's shape. Factored moments (Adafactor's `exp_avg_sq_row`) and
  /// per-block scales do not; their optimizer's `load` checks their shapes.
  bool param_shaped = true;
  /// Integer codes of a quantised tensor (8-bit AdamW's `exp_avg_codes`): neither a floating
  /// dtype nor finite values are asked of it.
  bool codes = false;
};

/// The state tensors of one parameter.
using StateTensors = std::vector<StateTensor>;

/// One hyperparameter of a parameter group (`lr`, `betas[0]`, `eps`, ...) and the values its
/// optimizer's constructor accepts: every one must be finite.
struct GroupOption {
  const char* name;
  double value;
  bool non_negative = true;  ///< >= 0 (SGD's `dampening` is the only one that may be negative)
  bool below_one = false;    ///< < 1 (the Adam betas)
};

/// What an entry's `build` gets. Python: what `Trainer.get_optimizer_cls_and_kwargs` and
/// `create_optimizer` hand the optimizer class.
struct OptimizerBuildInputs {
  /// The run's arguments (`learning_rate`, `adam_beta1`, `weight_decay`, `seed`, ...).
  const TrainingArguments& args;
  /// HF's weight-decay groups, options not set yet: group 0 decays when `first_group_decays`,
  /// the other holds the 1-d tensors. They are the fp32 masters when there are masters.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  bool first_group_decays = false;
  /// The fp32 masters of a low-precision model, or null.
  amp::MasterWeights* masters = nullptr;
  /// How bf16/fp16 tensors updated without masters are written (see `low_precision_rules`).
  LowPrecisionUpdate low_precision_update = LowPrecisionUpdate::kNearest;
  /// The model's name of each tensor of `groups` (`blocks.0.fc.weight`), parallel to them; empty
  /// where the names are unknown. Muon reads them to keep embeddings and the LM head on AdamW.
  std::vector<std::vector<std::string>> group_names = {};
};

/// One optimizer the Trainer can build, save and check. Plain data; `register_optimizer` adds
/// one.
struct OptimizerSpec {
  /// The `--optim` spelling (HF's `OptimizerNames` value where HF has one). Empty for a class
  /// reached only through `Trainer::set_optimizer_factory`, whose checkpoints are still checked.
  std::string name;
  /// The exact class `build` makes: checkpoints of an optimizer of this class use this entry.
  std::type_index type = typeid(void);
  /// The family whose optimizer.pt files load into one another (`Adam/AdamW`), for errors.
  std::string family;
  /// Option names that only this family's saved group options have (`betas`, `eps`,
  /// `amsgrad`), by which an optimizer.pt's family is recognised before it is loaded.
  std::vector<std::string> family_marks;
  /// Builds the optimizer over `inputs.groups`. Required when `name` is set. No device sync.
  std::function<std::unique_ptr<torch::optim::Optimizer>(OptimizerBuildInputs inputs)> build;
  /// The state tensors of a parameter's state, under their optimizer.pt keys; empty when the
  /// state has another class. Null: checkpoints cannot hold this optimizer.
  std::function<StateTensors(const torch::optim::OptimizerParamState&)> state_tensors;
  /// The steps a parameter's state has taken, or nullopt where it counts none (SGD). May sync
  /// (a step held in a tensor).
  std::function<std::optional<double>(const torch::optim::OptimizerParamState&)> steps;
  /// A parameter group's hyperparameters, by their optimizer.pt names, to be checked on load.
  std::function<std::vector<GroupOption>(const torch::optim::OptimizerOptions&)> group_options;
  /// Throws `c10::ValueError` for arguments this optimizer cannot run with (an `optim_args` key it
  /// does not take, a bad value, a precision or strategy setting it refuses), naming both
  /// settings. `TrainingArguments::validate()` calls it. Null: every combination is accepted.
  std::function<void(const TrainingArguments& args)> check_arguments;
  /// Applies `low_precision_update` kahan and stochastic_rounding to the bf16/fp16 tensors it
  /// updates without masters; `--low_precision_update auto` then picks kahan.
  bool low_precision_rules = false;
  /// `--fsdp` (either mode) can shard its state by flat element ranges (mantissa's FusedAdamW).
  bool shardable = false;
  /// `--fsdp` (either mode) can shard its state by whole tensors: each process keeps the state
  /// (and fp32 masters) of the tensors it owns and updates them. Under shard_grad_op the
  /// gradients are averaged whole as under data parallel and the owners broadcast the new
  /// weights; under full sharding each tensor lies whole in its owner's shard, whose
  /// reduce-scattered gradient it updates in place. For an optimizer whose update needs a whole
  /// tensor (Adafactor's factored moments, Muon's orthogonalisation, 8-bit AdamW's block
  /// scales) and whose state is per tensor, saved by its `save`.
  bool shards_whole_tensors = false;
};

/// Adds `spec`. Throws `c10::ValueError` for a `name` already taken, one with a comma or a
/// space, a named entry without `build`, or a `type` left as `void`. Call it before building
/// the TrainingArguments' Trainer; entries stay for the life of the process. Thread-safe.
void register_optimizer(OptimizerSpec spec);

/// The entry `--optim name` selects, or null. Thread-safe.
const OptimizerSpec* find_optimizer(std::string_view name);

/// The entry of `optimizer`'s exact class (a subclass has none of its own), or null.
const OptimizerSpec* find_optimizer_of(const torch::optim::Optimizer& optimizer);

/// Every `--optim` spelling, in registration order (the built-ins first).
std::vector<std::string> optimizer_names();

/// `optimizer_names()` as a Python list: "['adamw_torch', 'sgd']".
std::string optimizer_names_text();

/// Every entry, named or not, in registration order (copies).
std::vector<OptimizerSpec> registered_optimizers();

/// An `Optim` over `inputs.groups` whose groups each take a copy of `options`, with its
/// `weight_decay` in the decaying group only, as HF's `create_optimizer` does. What most
/// entries' `build` is. No device sync.
template <typename Optim, typename Options>
std::unique_ptr<Optim> build_in_decay_groups(OptimizerBuildInputs& inputs, const Options& options) {
  auto& groups = inputs.groups;
  const double decay = options.weight_decay();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    auto group_options = std::make_unique<Options>(options);
    group_options->weight_decay(i == 0 && inputs.first_group_decays ? decay : 0.0);
    groups[i].set_options(std::move(group_options));
  }
  return std::make_unique<Optim>(std::move(groups), Options(options.lr()));
}

}  // namespace mantissa::optim
