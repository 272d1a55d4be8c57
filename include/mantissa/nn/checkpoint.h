#pragma once
// Activation (gradient) checkpointing: run a block without keeping its activations, and run it
// again in the backward to get them.

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace mantissa::nn {

/// The function `checkpoint` runs twice: tensors in, tensors out.
using CheckpointedFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// Runs `fn(inputs)` without recording its graph, keeping only `inputs`; the backward runs
/// `fn` again with grad enabled on detached copies of the inputs and backpropagates through
/// that recomputed graph. Memory: the block's intermediate activations exist only while its
/// backward runs; time: one more forward of the block. Python:
/// `torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=..., preserve_rng_state=...)`.
///
/// The recompute sees what the first run saw: the CPU and CUDA autocast settings (enabled and
/// dtype) of the call, and, with `preserve_rng_state`, the CPU random generator and the CUDA
/// generators of the devices the inputs are on, as they were when `fn` first ran (so dropout
/// draws the same mask). The generators are put back afterwards: the random numbers after the
/// backward are those the caller would have had without the recompute. The autocast cast
/// cache is off inside `fn` (a cast made without grad must not serve the recompute).
///
/// The parameters `fn` uses get their gradients from the recompute's own backward (they
/// accumulate into `.grad`, as with the reentrant variant); they do so even when no input
/// requires grad. Other tensors `fn` uses must be leaves (parameters): the recompute's
/// backward would run into the graph outside `fn`. Inputs must be defined tensors, outputs floating
/// point (else `c10::ValueError`). With grad mode off (evaluation) this is `fn(inputs)`. `fn` must
/// compute the same thing both times: no side effects that differ between the runs. `fn` is
/// kept and called again in the backward, after the caller has returned: it must own what it
/// uses (capture tensors made by the caller's forward, such as RoPE tables or masks, by value,
/// never by reference). Not for
/// `torch::autograd::grad` (use `backward`), nor inside a CUDA graph capture (the generators'
/// states cannot be read there). No host sync beyond reading the generators' states.
std::vector<at::Tensor> checkpoint(const CheckpointedFunction& fn,
                                   const std::vector<at::Tensor>& inputs,
                                   bool preserve_rng_state = true);

/// `checkpoint` of a function of one tensor to one tensor (a transformer block).
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn,
                      const at::Tensor& input, bool preserve_rng_state = true);

}  // namespace mantissa::nn
