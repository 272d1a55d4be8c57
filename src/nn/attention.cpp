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
// CPU; longer, the kernel wins (BENCHMARKS.md, "Pointers from the code").
constexpr std::int64_t kMathAttentionMaxLength = 128;

// The dtype at::scaled_dot_product_attention computes in: it is on CPU autocast's
// lower-precision list, so autocast casts an eligible query (and the other tensors) to its dtype.
c10::ScalarType compute_dtype(const at::Tensor& query) {
  return at::autocast::is_autocast_enabled(at::kCPU) &&
                 at::autocast::is_eligible(query, c10::DeviceType::CPU)
             ? at::autocast::get_autocast_dtype(at::kCPU)
             : query.scalar_type();
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
  // What autocast's wrapper of scaled_dot_product_attention does: cast every eligible tensor
  // argument (autocast's own cached_cast), then run the op with autocast off inside it.
  at::Tensor q = query, k = key, v = value;
  if (at::autocast::is_autocast_enabled(at::kCPU)) {
    const auto dtype = at::autocast::get_autocast_dtype(at::kCPU);
    q = at::autocast::cached_cast(dtype, query, c10::DeviceType::CPU);
    k = at::autocast::cached_cast(dtype, key, c10::DeviceType::CPU);
    v = at::autocast::cached_cast(dtype, value, c10::DeviceType::CPU);
    mask = at::autocast::cached_cast(dtype, mask, c10::DeviceType::CPU);
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
