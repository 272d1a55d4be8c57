#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/ordered_dict.h>

#include <mantissa/fp8/recipe.h>

namespace c10d {
class ProcessGroup;
}

namespace mantissa::fp8 {

/// The state of the delayed recipe for every FP8 layer of a model, in two fp32 tensors:
/// `amax_history` [amax_history_len, n] and `scale` [n], one column per scaled tensor, three
/// per layer (`TensorRole` order), the layout of TransformerEngine's `amax_and_scale_update`.
///
/// Row 0 of the history collects the amaxes seen since the last update: each cast records
/// max(row 0, amax of the tensor), so the micro-batches of one accumulation group count
/// together. `update_()` turns the history into new scales once per optimizer step and rolls
/// it. Because every layer's current amaxes sit in one contiguous row, a data-parallel run
/// all-reduces them in one collective (`all_reduce_amaxes_`), and the state is one entry of a
/// checkpoint (`state_dict`). Scales start at 1.0, as in TE.
///
/// Nothing here syncs with the device, so updates can be captured in a CUDA graph. Move-only.
class Float8ScalingState {
 public:
  /// An empty state for `recipe` (validated; its `recipe()` must be kDelayed) on `device`.
  explicit Float8ScalingState(Float8Recipe recipe, c10::Device device = c10::kCPU);

  Float8ScalingState(Float8ScalingState&&) noexcept = default;
  Float8ScalingState& operator=(Float8ScalingState&&) noexcept = default;
  Float8ScalingState(const Float8ScalingState&) = delete;
  Float8ScalingState& operator=(const Float8ScalingState&) = delete;

  /// Adds the three scales of layer `name` and returns its first column. Resets nothing that
  /// is already there. Call before training starts (it reallocates both tensors).
  int64_t add_layer(const std::string& name);

  /// Number of scales (three per layer).
  int64_t num_scales() const { return static_cast<int64_t>(names_.size()); }
  /// "<layer>.input" / ".weight" / ".grad_output" for each column, in order.
  const std::vector<std::string>& names() const { return names_; }
  const Float8Recipe& recipe() const { return recipe_; }
  c10::Device device() const { return scale_.device(); }

  /// Moves both tensors to `device` (a no-op when they are there). Allocates: not inside a
  /// CUDA graph capture.
  void to_(c10::Device device);

  /// The scale of column `column` as a 1-element view (on the state's device): what the next
  /// cast of that tensor multiplies by. No sync.
  at::Tensor scale(int64_t column) const;
  /// Records `amax` (a 0-d or 1-element fp32 tensor) for column `column`: row 0 keeps the
  /// larger of the two, NaN sticking. Python (TE): the amax the cast kernel writes. No sync.
  void record_amax_(int64_t column, const at::Tensor& amax);

  /// One update at an optimizer step, TE's rule: for each column the window amax (the history's
  /// max, or row 0 for most_recent) gives `scale = fp8_max * 2^-margin / amax` when that amax
  /// is finite and > 0, otherwise the scale stays; then the history rolls by one step and row 0
  /// starts again from 0. Python: `amax_and_scale_update`. No sync.
  void update_();

  /// Row 0 of the history: every amax recorded since the last update, contiguous, [n]. A
  /// data-parallel run reduces it (max) in place before `update_()`.
  at::Tensor current_amaxes() const { return amax_history_.select(0, 0); }

  /// The full tensors (for inspection and tests).
  const at::Tensor& amax_history() const { return amax_history_; }
  const at::Tensor& scales() const { return scale_; }

  /// `{"amax_history": [len, n], "scale": [n]}` (CPU copies): what a checkpoint saves so a
  /// resumed run casts with the same scales. Syncs (device-to-host copies).
  torch::OrderedDict<std::string, at::Tensor> state_dict() const;
  /// Restores what `state_dict()` returned. Throws `c10::ValueError` naming the key when one is
  /// missing or its shape or dtype differs from this state's (another model, another
  /// `fp8_amax_history_len`), or when a value no run records is there: a scale that is not
  /// finite and > 0, a negative amax (NaN and inf amaxes stay: an overflowing step records
  /// them). The error names the scale's column (`fc2.input`) and the first bad value; nothing is
  /// restored then. Syncs (reads the counts of bad values).
  void load_state_dict(const torch::OrderedDict<std::string, at::Tensor>& state);

 private:
  Float8Recipe recipe_;
  std::vector<std::string> names_;
  at::Tensor amax_history_;  // [len, n] fp32
  at::Tensor scale_;         // [n] fp32
  at::Tensor scaled_max_;    // [n] fp32: fp8_max * 2^-margin of each column
};

/// The all-reduce of one data-parallel step: `all_reduce_max` gets the state's current amaxes
/// (one tensor, all layers) and must replace them, in place, by their maximum over the ranks.
using AmaxAllReduce = std::function<void(at::Tensor& amaxes)>;

/// Makes every rank hold the same current amaxes, so that `update_()` gives every rank the same
/// scales: one call of `all_reduce_max` per step, whatever the number of layers. Python (TE):
/// the amax reduction `fp8_autocast` runs over `amax_reduction_group`. Syncs only if
/// `all_reduce_max` does.
void all_reduce_amaxes_(Float8ScalingState& state, const AmaxAllReduce& all_reduce_max);

/// The same over a c10d process group: one `allreduce` with `ReduceOp::MAX`, waited for (on
/// NCCL the wait orders the current stream after it and does not block the host; Gloo
/// blocks).
void all_reduce_amaxes_(Float8ScalingState& state, c10d::ProcessGroup& group);

}  // namespace mantissa::fp8
