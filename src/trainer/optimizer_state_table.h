#pragma once
// Which optimizers a checkpoint can hold, and the per-parameter state tensors of each: one table
// that the writer of optimizer.pt and its reader both consult, so an optimizer added to the
// project without an entry fails at its first save with its name, instead of being loaded from a
// checkpoint unchecked.

#include <string>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

namespace mantissa::detail {

/// The state tensors of one parameter, by their names in optimizer.pt (`exp_avg`, ...). An
/// entry may be undefined (`max_exp_avg_sq` without amsgrad).
using StateTensors = std::vector<std::pair<const char*, at::Tensor>>;

/// One optimizer class of the table.
struct OptimizerStateKind {
  /// The class as users write it (`torch::optim::AdamW`).
  const char* name;
  /// The tensors of a parameter's state; nullptr when the state has the wrong class (an
  /// internal error: the optimizer made it).
  StateTensors (*tensors)(const torch::optim::OptimizerParamState& state);
};

/// The table's entry for `optimizer`'s exact class: FusedAdamW, torch::optim's AdamW, Adam, SGD,
/// Adagrad and RMSprop. Throws a c10::ValueError naming the class for any other (a subclass
/// included, whose state may hold more). Python has no equivalent: `torch.optim` state dicts
/// are plain dicts. No device sync.
const OptimizerStateKind& optimizer_state_kind(const torch::optim::Optimizer& optimizer);

/// Checks each loaded state tensor of `optimizer` against its parameter: the same shape, a
/// floating dtype and only finite values, else a c10::ValueError naming the state and the
/// parameter's index (counted over all groups), with both shapes or the count of non-finite
/// values. A optimizer.pt of another model, or one holding NaN, would otherwise fail at or after
/// the first step, far from the file. Syncs (reads each count of non-finite values).
void check_optimizer_state(const torch::optim::Optimizer& optimizer);

}  // namespace mantissa::detail
