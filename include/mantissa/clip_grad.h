#pragma once
// Gradient clipping by total norm without a host sync: the C++ twin of Python's
// torch.nn.utils.clip_grad_norm_ (foreach implementation).
//
// LibTorch's torch::nn::utils::clip_grad_norm_ returns the norm as a double, which reads it
// back from the device on every call; these functions return it as a device tensor instead,
// so a training step on the GPU keeps running ahead of the host.

#include <vector>

#include <ATen/core/Tensor.h>

namespace mantissa {

/// Scales the gradients of `parameters` in place so that their total `norm_type`-norm (the
/// norm of all gradients viewed as one vector) is at most `max_norm`, and returns that total
/// norm as measured before clipping. Python: `torch.nn.utils.clip_grad_norm_(parameters,
/// max_norm, norm_type, error_if_nonfinite)`, computed the same way, op for op:
///
///     grads grouped by (device, dtype); per group norms = torch._foreach_norm(grads, norm_type)
///     total = torch.linalg.vector_norm(torch.stack(norms on the first grad's device), norm_type)
///     coef = clamp(max_norm / (total + 1e-6), max=1.0); torch._foreach_mul_(grads, coef)
///
/// `norm_type` may be `INFINITY` (the largest absolute value). Parameters without a gradient
/// are skipped; with no gradients at all it returns `torch.tensor(0.0)` (fp32, CPU) and
/// changes nothing.
///
/// The result is a 0-d tensor on the device of the first gradient, of the dtype Python
/// returns: fp32 for fp32 gradients, and the promoted dtype of the per-tensor norms otherwise
/// (fp32 when fp32 and bf16/fp16 grads are mixed, bf16 when all grads are bf16, fp64 when all
/// are fp64). A non-finite gradient gives a non-finite norm, and the gradients are then
/// multiplied by 0 or nan, as in Python.
///
/// No host sync, unless `error_if_nonfinite` is true: then the norm is read on the host once
/// (one sync) and a non-finite norm raises, before any gradient changes, PyTorch's error
/// "The total norm of order 2.0 for gradients from `parameters` is non-finite, so it cannot
/// be clipped. ...".
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                           double norm_type = 2.0, bool error_if_nonfinite = false);

/// The total `norm_type`-norm of `tensors` (typically gradients), viewed as one vector, as a
/// 0-d device tensor. Python: `torch.nn.utils.get_total_norm(tensors, norm_type,
/// error_if_nonfinite)`. Empty input gives `torch.tensor(0.0)`. No sync unless
/// `error_if_nonfinite` (one sync, and PyTorch's error on a non-finite norm).
at::Tensor get_total_norm(const std::vector<at::Tensor>& tensors, double norm_type = 2.0,
                          bool error_if_nonfinite = false);

/// `get_total_norm` in two halves, for tensors that no one process holds all of (a sharded
/// run computes each tensor's norm where the tensor lies whole, then brings the norms
/// together): `get_total_norm(t) == total_norm_of_norms(per_tensor_norms(t))`, bit for bit.
///
/// The `norm_type`-norm of each tensor, in the order of `tensors`: a 0-d tensor of that
/// tensor's dtype on its device, computed by `_foreach_norm` over the tensors of its (device,
/// dtype) group, as `get_total_norm` does. A tensor's norm does not depend on which other
/// tensors are in the list. No sync.
std::vector<at::Tensor> per_tensor_norms(const std::vector<at::Tensor>& tensors,
                                         double norm_type = 2.0);

/// The total norm from per-tensor norms such as `per_tensor_norms` returns (`norms[i]` of
/// tensor i's dtype and device, in the tensors' order): stacked in the order `get_total_norm`
/// stacks them, on the first norm's device, and normed. Empty input gives `torch.tensor(0.0)`.
/// No sync unless `error_if_nonfinite` (as `get_total_norm`).
at::Tensor total_norm_of_norms(const std::vector<at::Tensor>& norms, double norm_type = 2.0,
                               bool error_if_nonfinite = false);

/// Multiplies the gradients of `parameters` by `min(max_norm / (total_norm + 1e-6), 1)`, in
/// place, with a `total_norm` computed beforehand (for example over the fp32 master copies).
/// Python: `torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total_norm)`. No sync.
void clip_grads_with_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                           const at::Tensor& total_norm);

}  // namespace mantissa
