#pragma once
// Which optimizers a checkpoint can hold, and the per-parameter state tensors of each: one table
// that the writer of optimizer.pt and its reader both consult, so an optimizer added to the
// project without an entry fails at its first save with its name, instead of being loaded from a
// checkpoint unchecked.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

namespace mantissa::detail {

/// One state tensor of a parameter, by its name in optimizer.pt (`exp_avg`, ...). It may be
/// undefined (`max_exp_avg_sq` without amsgrad).
struct StateTensor {
  const char* name;
  at::Tensor value;
  /// A running sum or mean of squares (`exp_avg_sq`, `square_avg`, Adagrad's `sum`), which no
  /// run makes negative: the update takes its square root.
  bool non_negative = false;
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

/// One optimizer class of the table.
struct OptimizerStateKind {
  /// The class as users write it (`torch::optim::AdamW`).
  const char* name;
  /// The tensors of a parameter's state; nullptr when the state has the wrong class (an
  /// internal error: the optimizer made it).
  StateTensors (*tensors)(const torch::optim::OptimizerParamState& state);
  /// The steps a parameter's state has taken, or nullopt for an optimizer that counts none
  /// (SGD). Syncs for FusedAdamW (its `step` is a tensor).
  std::optional<double> (*step)(const torch::optim::OptimizerParamState& state);
  /// The hyperparameters of a parameter group's options, by their names in optimizer.pt.
  std::vector<GroupOption> (*options)(const torch::optim::OptimizerOptions& options);
};

/// The table's entry for `optimizer`'s exact class: FusedAdamW, torch::optim's AdamW, Adam, SGD,
/// Adagrad and RMSprop. Throws a c10::ValueError naming the class for any other (a subclass
/// included, whose state may hold more). Python has no equivalent: `torch.optim` state dicts
/// are plain dicts. No device sync.
const OptimizerStateKind& optimizer_state_kind(const torch::optim::Optimizer& optimizer);

/// Checks what `optimizer` loaded: each group's hyperparameters finite and in the range its
/// constructor accepts (`lr` >= 0, betas in [0, 1), ...); each parameter's `step` finite and
/// >= 0; each state tensor of its parameter's shape, a floating dtype, only finite values, and
/// no negative one in a sum of squares (`exp_avg_sq`, `max_exp_avg_sq`, `square_avg`, `sum`).
/// Else a c10::ValueError naming the group or the state and the parameter's index (counted over
/// all groups), with the value: both shapes, the dtype, or how many values are bad and the
/// first. An optimizer.pt of another model, or one holding NaN (written by a script, say),
/// would otherwise fail at or after the first step, far from the file. Syncs (reads the
/// tensors' counts of bad values).
void check_optimizer_state(const torch::optim::Optimizer& optimizer);

}  // namespace mantissa::detail
