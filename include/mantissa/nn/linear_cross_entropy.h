#pragma once
// The LM head and its cross-entropy loss in one pass over chunks of rows, without the full
// [tokens, vocab] logits.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace mantissa::nn {

/// The mean cross-entropy of `linear(hidden, weight, bias)` against `targets`, computed a chunk
/// of rows at a time so that at most [chunk_size, vocab] logits exist at once. Python:
/// `F.cross_entropy(F.linear(hidden, weight, bias), targets, ignore_index=ignore_index)`, which
/// Liger-Kernel's `LigerFusedLinearCrossEntropyLoss` fuses the same way.
///
/// `hidden` [..., in] (any leading shape, flattened to N rows), `weight` [vocab, in], `bias`
/// [vocab] or undefined, `targets` integer, N elements. Returns a 0-d float32 loss: the sum
/// over the rows whose target is not `ignore_index`, divided by their number (PyTorch's mean
/// reduction); NaN when every row is ignored, as in PyTorch (whose gradients are then zero,
/// and so are these).
///
/// With grad enabled, each chunk's gradients (with respect to `hidden`, `weight` and `bias`)
/// are computed in the forward itself, right after its loss, and kept (the size of `hidden`,
/// `weight` and `bias`, in float32); the backward only multiplies them by the loss's gradient.
/// Under autocast the matmul runs in the autocast dtype and the softmax and loss in float32,
/// as autocast runs `linear` and `cross_entropy`. Under fp16 autocast the gradient matmuls run
/// in float32: they happen before the loss scale is known, and fp16 would flush the small
/// gradients of a large vocabulary to zero.
///
/// `chunk_size` rows per chunk; 0 picks the larger of Liger's size (N / ceil(vocab / in): a
/// chunk's logits about the size of `hidden`) and the rows whose float32 logits fill 128 MiB,
/// as a power of two (512 rows at vocab 50257), at most N. Each chunk adds its product into
/// the whole weight gradient, so small chunks cost time (BENCHMARKS.md). A target outside
/// [0, vocab) other than `ignore_index` fails as in PyTorch (an error on the CPU, a device-side
/// assert on CUDA). Bad shapes or dtypes raise `c10::ValueError` naming them. No host sync.
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                const at::Tensor& bias, const at::Tensor& targets,
                                int64_t ignore_index = -100, int64_t chunk_size = 0);

}  // namespace mantissa::nn
