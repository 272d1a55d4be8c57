#pragma once
// FusedAdamW's update of a list of parameters: each goes to the CPU kernel of this CPU's
// instruction set, to the CUDA kernel, or to an ATen fallback for what the kernels do not cover.
// Internal; used by FusedAdamW::step and by the torch.ops bridge (src/python_ops/).

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include <mantissa/optim/fused_adamw.h>

namespace mantissa::optim::detail {

/// One parameter's update: its tensors and state, and where it sits for messages.
struct FusedAdamWItem {
  at::Tensor param;
  at::Tensor grad;
  FusedAdamWParamState* state;
  at::Tensor model;  // undefined: no model copy
  LowPrecisionUpdate rule;
  std::uint32_t index;   // the parameter's position over all groups: stochastic rounding's key
  std::size_t group;     // where the parameter is, for messages
  std::size_t position;  // in its group
};

/// Runs one AdamW step (torch::optim::AdamW's arithmetic) on every item: one kernel call per
/// bucket of alike tensors (device, dtypes, rule), the rest through ATen. `lr_tensor` (0-d fp64,
/// the capturable form) replaces `options.lr()` when defined; `grad_scale` and `found_inf` may be
/// undefined, and a non-zero `found_inf` leaves every tensor as it was. May replace an item's
/// `grad` by a copy in its parameter's layout. Never syncs on CUDA; on the CPU it reads the flag,
/// the scale and the rate from memory. Throws `c10::ValueError` for a compensated rule on a
/// tensor no kernel takes.
void run_fused_adamw_items(std::vector<FusedAdamWItem>& items, const FusedAdamWOptions& options,
                           const at::Tensor& lr_tensor, const at::Tensor& grad_scale,
                           const at::Tensor& found_inf);

}  // namespace mantissa::optim::detail
