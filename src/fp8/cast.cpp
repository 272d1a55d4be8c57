#include <mantissa/fp8/cast.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace mantissa::fp8 {

double float8_max(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat8_e4m3fn:
      return 448.0;
    case c10::kFloat8_e5m2:
      return 57344.0;
    default:
      TORCH_CHECK_VALUE(false, "FP8 training casts to Float8_e4m3fn or Float8_e5m2, not ", dtype);
  }
}

at::Tensor to_float8_saturated(const at::Tensor& x, c10::ScalarType dtype) {
  const double max = float8_max(dtype);
  return x.clamp(-max, max).to(dtype);
}

at::Tensor quantize(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType dtype) {
  const double max = float8_max(dtype);
  TORCH_CHECK_VALUE(scale.numel() == 1 && scale.scalar_type() == c10::kFloat,
                    "an FP8 scale is one float32 value, got a ", scale.scalar_type(),
                    " tensor of shape ", scale.sizes());
  // In fp32, whatever x's dtype, as torchao does; the scale is a 1-element tensor, so the
  // product keeps x's shape.
  return (x.to(c10::kFloat) * scale.reshape({})).clamp_(-max, max).to(dtype);
}

at::Tensor tensor_amax(const at::Tensor& x) {
  if (x.numel() == 0) return at::zeros({}, x.options().dtype(c10::kFloat));
  return x.abs().amax().to(c10::kFloat);
}

at::Tensor current_scale(const at::Tensor& amax, c10::ScalarType dtype) {
  const double max = float8_max(dtype);
  // torchao's amax_to_scale: float64, amax clamped to 1e-12, and Python's `max / t`, which is
  // `t.reciprocal() * max`; rounded to fp32 once at the end. Same bits as torchao.
  return amax.to(c10::kDouble).clamp_min(1e-12).reciprocal_().mul_(max).to(c10::kFloat);
}

}  // namespace mantissa::fp8
