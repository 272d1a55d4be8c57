#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

/// The per-tensor FP8 primitives: the largest finite value of each format, a saturating cast,
/// amax, and the scale of the current recipe. Every function stays on the tensor's device and
/// never syncs with it.
namespace mantissa::fp8 {

/// 448 for `Float8_e4m3fn`, 57344 for `Float8_e5m2`. Python: `torch.finfo(dtype).max`.
/// Throws `c10::ValueError` for any other dtype.
double float8_max(c10::ScalarType dtype);

/// `x` cast to `dtype` (e4m3fn or e5m2) with finite values beyond the format's range clamped
/// to ±max, instead of becoming NaN (e4m3) or inf (e5m2) as the plain cast of LibTorch 2.11
/// does. NaN stays NaN. Python: torchao's `to_fp8_saturated(x, dtype)`. No sync.
at::Tensor to_float8_saturated(const at::Tensor& x, c10::ScalarType dtype);

/// `x * scale` (computed in fp32) cast to `dtype` with saturation: the quantization step of
/// every FP8 GEMM operand. `scale` is a 1-element fp32 tensor on `x`'s device. Python:
/// `to_fp8_saturated(x.float() * scale, dtype)`. No sync.
at::Tensor quantize(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype);

/// max(|x|) as a 0-d fp32 tensor on `x`'s device (NaN when `x` holds one; 0 for an empty `x`).
/// Python: `torch.max(torch.abs(x)).float()`. No sync.
at::Tensor tensor_amax(const at::Tensor& x);

/// The current recipe's scale for a tensor with this `amax` (a 0-d tensor): `max / amax`,
/// computed in float64 with the amax clamped to at least 1e-12 and rounded to fp32 once, as
/// torchao's `amax_to_scale`. A non-finite amax gives a scale of 0 (inf) or NaN, so the cast
/// turns the offending values into NaN and a loss scaler still sees the overflow. No sync.
at::Tensor current_scale(const at::Tensor& amax, c10::ScalarType dtype);

}  // namespace mantissa::fp8
