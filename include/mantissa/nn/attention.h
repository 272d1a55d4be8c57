#pragma once
// Scaled dot-product attention that takes ATen's math path for short bfloat16 sequences on the CPU.

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace mantissa::nn {

/// Whether `scaled_dot_product_attention` takes ATen's math path (two batched matmuls and a
/// softmax, in float32) instead of the kernel ATen would pick: on the CPU, for bfloat16, when
/// neither sequence is longer than 128, the lengths at which ATen's fused (flash) CPU kernel is
/// the slower of the two, forward and backward (BENCHMARKS.md, "Pointers from the code"). Pure.
bool prefers_math_attention(c10::DeviceType device, c10::ScalarType dtype,
                            std::int64_t query_length, std::int64_t key_length);

/// Attention of `query` [..., L, E] over `key` [..., S, E] and `value` [..., S, Ev]. Python:
/// `torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
/// is_causal, scale)`, and the same ATen code underneath: where `prefers_math_attention` says
/// so, ATen's math path, exactly what PyTorch runs under
/// `torch.nn.attention.sdpa_kernel(SDPBackend.MATH)` (bf16 autocast casts the inputs first, as
/// it does for at::scaled_dot_product_attention); otherwise at::scaled_dot_product_attention
/// itself. The math path keeps [..., L, S] float32 weights for the backward, which is why it is
/// chosen only for short sequences. Never syncs with a device.
at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key,
                                        const at::Tensor& value,
                                        const std::optional<at::Tensor>& attn_mask = {},
                                        double dropout_p = 0.0, bool is_causal = false,
                                        std::optional<double> scale = std::nullopt);

}  // namespace mantissa::nn
