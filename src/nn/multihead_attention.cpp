#include <mantissa/nn/multihead_attention.h>

#include <mantissa/nn/attention.h>

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/init.h>

namespace mantissa::nn {
namespace {

// `mask` as an additive mask of `dtype`: a bool mask gives -inf where it is true and 0
// elsewhere; a float mask is cast.
at::Tensor additive(const at::Tensor& mask, c10::ScalarType dtype) {
  if (mask.scalar_type() == at::kBool) {
    return at::zeros(mask.sizes(), mask.options().dtype(dtype))
        .masked_fill_(mask, -std::numeric_limits<double>::infinity());
  }
  return mask.to(dtype);
}

void check_mask_dtype(const at::Tensor& mask, const char* name) {
  TORCH_CHECK_VALUE(mask.scalar_type() == at::kBool || at::isFloatingType(mask.scalar_type()),
                    "MultiheadAttention: ", name,
                    " must be bool (true = masked) or a floating-point mask added to the "
                    "scores, got ",
                    mask.scalar_type());
}

// Appends one column (key position) to the last dimension of `mask`: not masked.
at::Tensor pad_key_column(const at::Tensor& mask) {
  if (!mask.defined()) return mask;
  return at::constant_pad_nd(mask, {0, 1}, 0);
}

}  // namespace

MultiheadAttentionImpl::MultiheadAttentionImpl(
    const torch::nn::MultiheadAttentionOptions& options_, bool batch_first_)
    : options(options_), batch_first(batch_first_) {
  reset();
}

bool MultiheadAttentionImpl::same_embed_dim() const {
  return options.kdim() == options.embed_dim() && options.vdim() == options.embed_dim();
}

void MultiheadAttentionImpl::reset() {
  const auto e = options.embed_dim();
  TORCH_CHECK_VALUE(e > 0 && options.num_heads() > 0 && e % options.num_heads() == 0,
                    "MultiheadAttention: embed_dim (", e, ") must be a positive multiple of "
                    "num_heads (", options.num_heads(), ")");
  TORCH_CHECK_VALUE(options.kdim() > 0 && options.vdim() > 0,
                    "MultiheadAttention: kdim and vdim must be positive, got ", options.kdim(),
                    " and ", options.vdim());
  TORCH_CHECK_VALUE(options.dropout() >= 0 && options.dropout() < 1,
                    "MultiheadAttention: dropout must be in [0, 1), got ", options.dropout());
  if (same_embed_dim()) {
    in_proj_weight = register_parameter("in_proj_weight", torch::empty({3 * e, e}));
  } else {
    q_proj_weight = register_parameter("q_proj_weight", torch::empty({e, e}));
    k_proj_weight = register_parameter("k_proj_weight", torch::empty({e, options.kdim()}));
    v_proj_weight = register_parameter("v_proj_weight", torch::empty({e, options.vdim()}));
  }
  if (options.bias()) in_proj_bias = register_parameter("in_proj_bias", torch::empty({3 * e}));
  out_proj = register_module(
      "out_proj", torch::nn::Linear(torch::nn::LinearOptions(e, e).bias(options.bias())));
  if (options.add_bias_kv()) {
    bias_k = register_parameter("bias_k", torch::empty({1, 1, e}));
    bias_v = register_parameter("bias_v", torch::empty({1, 1, e}));
  }
  // PyTorch's _reset_parameters, in its order (the same random numbers for the same seed).
  torch::NoGradGuard no_grad;
  if (same_embed_dim()) {
    torch::nn::init::xavier_uniform_(in_proj_weight);
  } else {
    torch::nn::init::xavier_uniform_(q_proj_weight);
    torch::nn::init::xavier_uniform_(k_proj_weight);
    torch::nn::init::xavier_uniform_(v_proj_weight);
  }
  if (options.bias()) {
    in_proj_bias.zero_();
    out_proj->bias.zero_();
  }
  if (options.add_bias_kv()) {
    torch::nn::init::xavier_normal_(bias_k);
    torch::nn::init::xavier_normal_(bias_v);
  }
}

void MultiheadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "mantissa::nn::MultiheadAttention(embed_dim=" << options.embed_dim()
         << ", num_heads=" << options.num_heads();
  if (options.dropout() > 0) stream << ", dropout=" << options.dropout();
  if (!same_embed_dim()) stream << ", kdim=" << options.kdim() << ", vdim=" << options.vdim();
  if (batch_first) stream << ", batch_first=true";
  stream << ")";
}

std::tuple<at::Tensor, at::Tensor> MultiheadAttentionImpl::forward(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& key_padding_mask, bool need_weights, const at::Tensor& attn_mask,
    bool average_attn_weights, bool is_causal) {
  const auto e = options.embed_dim();
  const auto heads = options.num_heads();
  const auto head_dim = e / heads;
  TORCH_CHECK_VALUE(query.dim() == 2 || query.dim() == 3,
                    "MultiheadAttention: query must be [target, batch, embed] (or [target, "
                    "embed] unbatched), got ",
                    query.sizes());
  TORCH_CHECK_VALUE(key.dim() == query.dim() && value.dim() == query.dim(),
                    "MultiheadAttention: key and value must have the query's ", query.dim(),
                    " dimensions, got ", key.sizes(), " and ", value.sizes());
  TORCH_CHECK_VALUE(query.size(-1) == e, "MultiheadAttention: query's last dimension is ",
                    query.size(-1), ", embed_dim is ", e);
  TORCH_CHECK_VALUE(key.size(-1) == options.kdim() && value.size(-1) == options.vdim(),
                    "MultiheadAttention: key and value end in ", key.size(-1), " and ",
                    value.size(-1), " features, kdim and vdim are ", options.kdim(), " and ",
                    options.vdim());
  const bool unbatched = query.dim() == 2;
  // Everything below is batch first: [B, L, features].
  const auto batch_major = [&](const at::Tensor& x) {
    if (unbatched) return x.unsqueeze(0);
    return batch_first ? x : x.transpose(0, 1);
  };
  const auto q_in = batch_major(query);
  const auto k_in = batch_major(key);
  const auto v_in = batch_major(value);
  const auto b = q_in.size(0);
  const auto t = q_in.size(1);
  TORCH_CHECK_VALUE(k_in.size(0) == b && v_in.size(0) == b && k_in.size(1) == v_in.size(1),
                    "MultiheadAttention: query, key and value disagree on the batch or the "
                    "source length: ",
                    query.sizes(), ", ", key.sizes(), ", ", value.sizes(),
                    (batch_first ? " (batch first)" : " (sequence first)"));
  auto s = k_in.size(1);

  at::Tensor padding = key_padding_mask;
  if (padding.defined()) {
    check_mask_dtype(padding, "key_padding_mask");
    if (unbatched && padding.dim() == 1) padding = padding.unsqueeze(0);
    TORCH_CHECK_VALUE(padding.dim() == 2 && padding.size(0) == b && padding.size(1) == s,
                      "MultiheadAttention: key_padding_mask must be [batch, source] = [", b,
                      ", ", s, "], got ", key_padding_mask.sizes());
  }
  at::Tensor mask = attn_mask;
  if (!mask.defined() && is_causal) {
    TORCH_CHECK_VALUE(t == s, "MultiheadAttention: is_causal needs as many targets as sources, "
                              "got ", t, " and ", s);
    mask = at::ones({t, s}, q_in.options().dtype(at::kBool)).triu(1);
  }
  if (mask.defined()) {
    check_mask_dtype(mask, "attn_mask");
    const bool shared = mask.dim() == 2 && mask.size(0) == t && mask.size(1) == s;
    const bool per_head =
        mask.dim() == 3 && mask.size(0) == b * heads && mask.size(1) == t && mask.size(2) == s;
    TORCH_CHECK_VALUE(shared || per_head, "MultiheadAttention: attn_mask must be [target, "
                                          "source] = [",
                      t, ", ", s, "] or [batch * num_heads, target, source] = [", b * heads, ", ",
                      t, ", ", s, "], got ", mask.sizes());
    mask = mask.dim() == 2 ? mask.view({1, 1, t, s}) : mask.view({b, heads, t, s});
  }

  // The projections, in the autocast dtype when autocast is on.
  at::Tensor w_q, w_k, w_v, b_q, b_k, b_v;
  if (same_embed_dim()) {
    const auto w = in_proj_weight.chunk(3);
    w_q = w[0], w_k = w[1], w_v = w[2];
  } else {
    w_q = q_proj_weight, w_k = k_proj_weight, w_v = v_proj_weight;
  }
  if (in_proj_bias.defined()) {
    const auto bias = in_proj_bias.chunk(3);
    b_q = bias[0], b_k = bias[1], b_v = bias[2];
  }
  auto q = at::linear(q_in, w_q, b_q);
  auto k = at::linear(k_in, w_k, b_k);
  auto v = at::linear(v_in, w_v, b_v);
  if (options.add_bias_kv()) {
    k = at::cat({k, bias_k.to(k.scalar_type()).expand({b, 1, e})}, 1);
    v = at::cat({v, bias_v.to(v.scalar_type()).expand({b, 1, e})}, 1);
    mask = pad_key_column(mask);
    padding = pad_key_column(padding);
    ++s;
  }
  q = q.view({b, t, heads, head_dim}).transpose(1, 2);  // [B, H, T, D]
  k = k.view({b, s, heads, head_dim}).transpose(1, 2);  // [B, H, S, D]
  v = v.view({b, s, heads, head_dim}).transpose(1, 2);
  if (options.add_zero_attn()) {
    k = at::cat({k, at::zeros({b, heads, 1, head_dim}, k.options())}, 2);
    v = at::cat({v, at::zeros({b, heads, 1, head_dim}, v.options())}, 2);
    mask = pad_key_column(mask);
    padding = pad_key_column(padding);
    ++s;
  }

  // One additive mask in the scores' dtype, broadcast to [B, H, T, S].
  at::Tensor scores_mask;
  if (mask.defined()) scores_mask = additive(mask, q.scalar_type());
  if (padding.defined()) {
    const auto pad = additive(padding, q.scalar_type()).view({b, 1, 1, s});
    scores_mask = scores_mask.defined() ? scores_mask + pad : pad;
  }
  const double dropout = is_training() ? options.dropout() : 0.0;

  at::Tensor out;
  at::Tensor weights;
  if (!need_weights) {
    out = mantissa::nn::scaled_dot_product_attention(q, k, v, scores_mask, dropout);
  } else {
    // The weights themselves are wanted: the scores and the softmax spelled out.
    const auto q3 = q.reshape({b * heads, t, head_dim}) * (1.0 / std::sqrt(static_cast<double>(head_dim)));
    const auto k3 = k.reshape({b * heads, s, head_dim});
    const auto v3 = v.reshape({b * heads, s, head_dim});
    auto scores =
        scores_mask.defined()
            ? at::baddbmm(scores_mask.expand({b, heads, t, s}).reshape({b * heads, t, s}), q3,
                          k3.transpose(1, 2))
            : at::bmm(q3, k3.transpose(1, 2));
    weights = at::softmax(scores, -1);
    if (dropout > 0) weights = at::dropout(weights, dropout, /*train=*/true);
    out = at::bmm(weights, v3).view({b, heads, t, head_dim});
    weights = weights.view({b, heads, t, s});
    if (average_attn_weights) weights = weights.mean(1);
    if (unbatched) weights = weights.squeeze(0);
  }
  out = out.transpose(1, 2).reshape({b, t, e});  // heads back side by side
  out = out_proj(out);
  if (unbatched) return {out.squeeze(0), weights};
  return {batch_first ? out : out.transpose(0, 1), weights};
}

}  // namespace mantissa::nn
