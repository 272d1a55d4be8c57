#pragma once
// `--fp8` as the Trainer applies it: a model converter (trainer/model_converter.h) that
// switches the model's Float8Linear layers to FP8 and brings the delayed recipe's state as an
// entry of the Trainer's registry of saved state (trainer/saved_state.h).

#include <mantissa/fp8/convert.h>
#include <mantissa/fp8/scaling_state.h>

#include "trainer/model_converter.h"
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

/// `--fp8` for the Trainer, as a model converter: `convert_for_trainer` with the user's
/// filter, the layers it converted written into the plan, and the delayed recipe's state
/// registered (`fp8_saved_state`). Python: torchtitan's `Float8Converter`.
class TrainerFloat8Converter final : public detail::ModelConverter {
 public:
  explicit TrainerFloat8Converter(Float8Recipe recipe) : recipe_(std::move(recipe)) {}

  /// The filter `Trainer::set_float8_filter` gave (empty: the default filter); before
  /// `convert`.
  void set_filter(Float8Filter filter) { filter_ = std::move(filter); }
  /// The delayed recipe's state after `convert`; null before and for current scaling.
  const Float8ScalingState* scaling_state() const noexcept { return state_.get(); }

  detail::SavedStates convert(torch::nn::Module& module, PrecisionPlan& plan) override;

 private:
  Float8Recipe recipe_;
  Float8Filter filter_;
  std::shared_ptr<Float8ScalingState> state_;
};

}  // namespace mantissa::fp8
