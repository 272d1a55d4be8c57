#pragma once

#include <cstdint>
#include <ostream>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/options/activation.h>
#include <torch/nn/pimpl.h>

namespace mantissa::nn {

/// Multi-head attention with the options, parameter names and initialization of
/// `torch::nn::MultiheadAttention`, that trains under bf16/fp16 autocast and with a padded
/// batch. Python: `torch.nn.MultiheadAttention(embed_dim, num_heads, ...)`.
///
/// Where it differs from LibTorch's module: its masks may be bool or additive float in any
/// dtype (LibTorch's C++ forward fills masks through a float-only dispatch and fails under
/// bf16 autocast), `key_padding_mask` is per example ([batch, source]), `attn_mask` may be
/// [target, source] or per head ([batch * num_heads, target, source]), and with
/// `need_weights` false the attention runs in `mantissa::nn::scaled_dot_product_attention`
/// (ATen's fused kernels on the CPU and CUDA, its math path for short bf16 sequences on the
/// CPU). Inputs are [target, batch, embed] (sequence first, as PyTorch's default) unless
/// `batch_first`. A query whose every key is masked gets NaN outputs, as in PyTorch. No host
/// sync.
///
/// Parameters: `in_proj_weight` [3E, E] and `in_proj_bias` [3E] when kdim == vdim == E,
/// else `q_proj_weight` [E, E], `k_proj_weight` [E, kdim], `v_proj_weight` [E, vdim] and
/// `in_proj_bias`; `out_proj.weight`, `out_proj.bias`; `bias_k`, `bias_v` [1, 1, E] with
/// `add_bias_kv`. The biases exist only with `bias(true)`.
class MultiheadAttentionImpl : public torch::nn::Cloneable<MultiheadAttentionImpl> {
 public:
  MultiheadAttentionImpl(int64_t embed_dim, int64_t num_heads)
      : MultiheadAttentionImpl(torch::nn::MultiheadAttentionOptions(embed_dim, num_heads)) {}
  /// `batch_first`: inputs and outputs are [batch, sequence, embed] (PyTorch's
  /// `batch_first=True`; LibTorch's options have no such field).
  explicit MultiheadAttentionImpl(const torch::nn::MultiheadAttentionOptions& options,
                                  bool batch_first = false);

  /// Creates and registers the parameters, initialized as PyTorch's `_reset_parameters`:
  /// xavier-uniform projections, zero input and output biases, xavier-normal `bias_k`/`bias_v`.
  void reset() override;
  /// "mantissa::nn::MultiheadAttention(embed_dim=64, num_heads=4, batch_first=true)".
  void pretty_print(std::ostream& stream) const override;

  /// Attends from `query` [T, B, E] to `key` [S, B, kdim] and `value` [S, B, vdim] (batch
  /// first: [B, T, E], ...; unbatched [T, E] works too). `key_padding_mask` [B, S]: true (or
  /// -inf added) where a key is padding. `attn_mask` [T, S] or [B * num_heads, T, S]: true
  /// where attention is not allowed, or added to the scores. `is_causal` without `attn_mask`
  /// masks the future (T == S). Returns the output [T, B, E] and, with `need_weights`, the
  /// attention weights [B, T, S] (averaged over the heads) or [B, num_heads, T, S], else an
  /// undefined tensor. Python: `forward(query, key, value, key_padding_mask, need_weights,
  /// attn_mask, average_attn_weights, is_causal)`.
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& query, const at::Tensor& key,
                                             const at::Tensor& value,
                                             const at::Tensor& key_padding_mask = {},
                                             bool need_weights = true,
                                             const at::Tensor& attn_mask = {},
                                             bool average_attn_weights = true,
                                             bool is_causal = false);

  /// The options this module was built with.
  torch::nn::MultiheadAttentionOptions options;
  /// Inputs and outputs are [batch, sequence, embed].
  bool batch_first = false;

  at::Tensor in_proj_weight;  ///< [3E, E]; undefined when kdim or vdim differ from E
  at::Tensor q_proj_weight;   ///< [E, E]; only when kdim or vdim differ from E
  at::Tensor k_proj_weight;   ///< [E, kdim]
  at::Tensor v_proj_weight;   ///< [E, vdim]
  at::Tensor in_proj_bias;    ///< [3E]; undefined without bias
  at::Tensor bias_k;          ///< [1, 1, E]; only with add_bias_kv
  at::Tensor bias_v;          ///< [1, 1, E]
  torch::nn::Linear out_proj = nullptr;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(at::Tensor())},
                           {4, torch::nn::AnyValue(true)},
                           {5, torch::nn::AnyValue(at::Tensor())},
                           {6, torch::nn::AnyValue(true)},
                           {7, torch::nn::AnyValue(false)})

 private:
  bool same_embed_dim() const;
};
TORCH_MODULE(MultiheadAttention);

}  // namespace mantissa::nn
