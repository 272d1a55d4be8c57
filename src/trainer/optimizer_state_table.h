#pragma once
// Which optimizers a checkpoint can hold, and the checks of what optimizer.pt restores, both
// read from the optimizer registry (include/mantissa/optim/optimizer_registry.h): the writer of
// optimizer.pt and its reader consult the same entry, so an optimizer without one fails at its
// first save with its name, instead of being loaded from a checkpoint unchecked.

#include <torch/optim/optimizer.h>

#include <mantissa/optim/optimizer_registry.h>

namespace mantissa::detail {

/// The registry's entry for `optimizer`'s exact class, when checkpoints can hold its state
/// (its `state_tensors`, `steps` and `group_options` are set): the built-ins are FusedAdamW,
/// torch::optim's AdamW, Adam, SGD, Adagrad and RMSprop. Throws a c10::ValueError naming the
/// class for any other (a subclass included, whose state may hold more). Python has no
/// equivalent: `torch.optim` state dicts are plain dicts. No device sync.
const optim::OptimizerSpec& optimizer_state_kind(const torch::optim::Optimizer& optimizer);

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
