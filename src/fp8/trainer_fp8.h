#pragma once
// `--fp8` as the Trainer applies it: the model converted, and the delayed recipe's state as an
// entry of the Trainer's registry of saved state (trainer/saved_state.h).

#include <mantissa/fp8/convert.h>
#include <mantissa/fp8/scaling_state.h>

#include "trainer/saved_state.h"

namespace mantissa::fp8 {

/// `state` as a registry entry: `fp8_state.pt` in each checkpoint (torch.save format,
/// {"amax_history": ..., "scale": ...}), and after each optimizer update the amaxes agreed
/// across the processes (max) and the scales renewed (`update_()`), skipped steps included, as
/// TransformerEngine does. A checkpoint without the file is refused when its
/// training_args.json says it trained with the delayed recipe (the file was lost); otherwise the
/// scales start afresh, with a warning. `state` must outlive the entry.
detail::SavedState fp8_saved_state(Float8ScalingState& state);

/// `--fp8` for the Trainer: `convert_to_float8_training(module, recipe, filter)` with the
/// user's `filter` (`set_float8_filter`), or the default filter when it is empty. Throws
/// `c10::ValueError`, naming the flag and which filter refused them, when no layer can run in
/// FP8. No sync.
Float8Conversion convert_for_trainer(torch::nn::Module& module, const Float8Recipe& recipe,
                                     const Float8Filter& filter);

}  // namespace mantissa::fp8
