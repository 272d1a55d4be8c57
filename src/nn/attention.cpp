#include <mantissa/nn/attention.h>

#include <algorithm>
#include <limits>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace mantissa::nn {

namespace {

// Up to this length on both sides the math path beats ATen's flash kernel in bfloat16 on the
// CPU (BENCHMARKS.md: 1.6-2.2x at 64, 1.3-1.6x at 128, 0.7-0.9x at 192).
constexpr std::int64_t kMathAttentionMaxLength = 128;

// Whether CPU autocast would cast `t`: a floating tensor other than float64.
bool autocast_casts(const at::Tensor& t) {
  return t.defined() && t.is_floating_point() && t.scalar_type() != at::kDouble;
}

// The dtype at::scaled_dot_product_attention computes in: CPU autocast casts the floating
// inputs to its dtype (the op is on autocast's lower-precision list).
c10::ScalarType compute_dtype(const at::Tensor& query) {
  if (query.device().is_cpu() && at::autocast::is_autocast_enabled(at::kCPU) &&
      autocast_casts(query)) {
    return at::autocast::get_autocast_dtype(at::kCPU);
  }
  return query.scalar_type();
}

at::Tensor to_dtype(const at::Tensor& t, c10::ScalarType dtype) {
  return autocast_casts(t) && t.scalar_type() != dtype ? t.to(dtype) : t;
}

}  // namespace

bool prefers_math_attention(c10::DeviceType device, c10::ScalarType dtype,
                            std::int64_t query_length, std::int64_t key_length) {
  return device == c10::DeviceType::CPU && dtype == c10::ScalarType::BFloat16 &&
         std::max(query_length, key_length) <= kMathAttentionMaxLength;
}

at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key,
                                        const at::Tensor& value,
                                        const std::optional<at::Tensor>& attn_mask,
                                        double dropout_p, bool is_causal,
                                        std::optional<double> scale) {
  // An optional holding an undefined tensor (a module's "no mask") means no mask.
  std::optional<at::Tensor> mask = attn_mask;
  if (mask.has_value() && !mask->defined()) mask.reset();
  const bool math = at::globalContext().userEnabledMathSDP() && query.defined() && key.defined() &&
                    value.defined() && !query.is_nested() && !key.is_nested() &&
                    !value.is_nested() && query.dim() >= 2 && key.dim() >= 2 &&
                    prefers_math_attention(query.device().type(), compute_dtype(query),
                                           query.size(-2), key.size(-2));
  if (!math) {
    return at::scaled_dot_product_attention(query, key, value, mask, dropout_p, is_causal, scale);
  }
  // What autocast's wrapper of scaled_dot_product_attention does: cast the floating inputs,
  // then run the op with autocast off inside it.
  const auto dtype = compute_dtype(query);
  at::Tensor q = query, k = key, v = value;
  if (at::autocast::is_autocast_enabled(at::kCPU)) {
    q = to_dtype(query, dtype);
    k = to_dtype(key, dtype);
    v = to_dtype(value, dtype);
    if (mask.has_value()) mask = to_dtype(*mask, dtype);
  }
  // What at::scaled_dot_product_attention does before its math path: a bool mask (true: may
  // attend) becomes an additive one in the query's dtype, 0 or -inf.
  if (mask.has_value() && mask->scalar_type() == at::kBool) {
    mask = at::zeros_like(*mask, q.options())
               .masked_fill_(mask->logical_not(), -std::numeric_limits<double>::infinity());
  }
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return std::get<0>(at::_scaled_dot_product_attention_math(q, k, v, mask, dropout_p, is_causal,
                                                            /*dropout_mask=*/std::nullopt, scale));
}

}  // namespace mantissa::nn
