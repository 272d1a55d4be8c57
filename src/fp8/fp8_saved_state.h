#pragma once
// The delayed FP8 recipe's entry in the Trainer's registry of saved state (trainer/saved_state.h).

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

}  // namespace mantissa::fp8
