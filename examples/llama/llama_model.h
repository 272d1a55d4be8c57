#pragma once
// LlamaForCausalLM as transformers 5.x defines it: token embedding, decoder layers of
// RMSNorm -> grouped-query attention with rotary position embedding -> residual, RMSNorm ->
// SwiGLU MLP -> residual, a final RMSNorm and an LM head (optionally tied to the embedding).
// Modules and parameters carry Hugging Face's names ("model.layers.0.self_attn.q_proj.weight",
// "lm_head.weight"), so a `model.safetensors` saved by `save_pretrained` loads by name, and
// what this model saves loads back with `from_pretrained`.
//
// The linear layers are `fp8::Float8Linear`s (a plain linear until `--fp8` converts them).

#include <cstdint>
#include <functional>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>

#include <mantissa/batch.h>
#include <mantissa/fp8/float8_linear.h>
#include <mantissa/model_output.h>
#include <mantissa/nn/pretrained_config.h>
#include <mantissa/nn/supports_gradient_checkpointing.h>

#include "llama_config.h"

namespace mantissa::examples::llama {

/// Root-mean-square normalization with a learned scale, computed in float32 and cast back to
/// the input's dtype before the scale. Python: `LlamaRMSNorm(hidden_size, eps)`. No sync.
struct LlamaRMSNormImpl : torch::nn::Module {
  LlamaRMSNormImpl(std::int64_t hidden_size, double eps);
  torch::Tensor forward(const torch::Tensor& x);

  double eps;
  torch::Tensor weight;  ///< [hidden_size], ones at construction
};
TORCH_MODULE(LlamaRMSNorm);

/// The rotary tables of one sequence: cos and sin, [1, time, head_dim], in the dtype of the
/// hidden states. Python: what `LlamaRotaryEmbedding.forward` returns.
struct RotaryTables {
  torch::Tensor cos, sin;
};

/// Causal self-attention with `num_key_value_heads` key/value heads shared by groups of query
/// heads, rotary embedding applied to queries and keys, through
/// `mantissa::nn::scaled_dot_product_attention`. Python: `LlamaAttention` with the "sdpa"
/// attention implementation. No sync.
struct LlamaAttentionImpl : torch::nn::Module {
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  /// x: [batch, time, hidden_size] -> [batch, time, hidden_size].
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rotary);

  std::int64_t num_heads, num_key_value_heads, head_dim;
  double attention_dropout;
  fp8::Float8Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};
TORCH_MODULE(LlamaAttention);

/// The gated MLP: down_proj(silu(gate_proj(x)) * up_proj(x)). Python: `LlamaMLP`. No sync.
struct LlamaMLPImpl : torch::nn::Module {
  explicit LlamaMLPImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  fp8::Float8Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

/// One decoder layer, pre-norm: x + self_attn(input_layernorm(x)), then
/// x + mlp(post_attention_layernorm(x)). Python: `LlamaDecoderLayer` (the block HF lists in
/// `_no_split_modules` and checkpoints). No sync.
struct LlamaDecoderLayerImpl : torch::nn::Module {
  explicit LlamaDecoderLayerImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rotary);

  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  LlamaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

/// Runs one decoder layer's call `block(x)`, `layer` being the decoder layer itself; the causal
/// LM passes one that goes through `run_block` (checkpointing, full sharding).
using BlockRunner = std::function<torch::Tensor(
    const torch::nn::Module& layer, const std::function<torch::Tensor(const torch::Tensor&)>& block,
    const torch::Tensor& x)>;

/// The decoder stack without a head. Python: `LlamaModel` (the `model.` prefix of the
/// causal LM's parameter names).
struct LlamaModelImpl : torch::nn::Module {
  explicit LlamaModelImpl(const LlamaConfig& config);
  /// ids [batch, time] (int64) -> the final norm's output, [batch, time, hidden_size]. Positions
  /// are 0..time-1 (no cache, no padding). `run_block` runs each layer (directly when empty).
  torch::Tensor forward(const torch::Tensor& ids, const BlockRunner& run_block = {});
  /// The rotary tables for positions 0..time-1, in `dtype` on `device`: computed in float32 and
  /// cast, as Python's `LlamaRotaryEmbedding.forward`.
  RotaryTables rotary_tables(std::int64_t time, c10::ScalarType dtype, c10::Device device) const;

  LlamaConfig config;
  /// [head_dim / 2] float32 on the CPU; a plain member, not a buffer (HF's is not persistent,
  /// so it is in no state dict). Copied to the input's device at each forward.
  torch::Tensor inv_freq;
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers;
  LlamaRMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

/// The causal language model. Python: `transformers.LlamaForCausalLM(config)`. Weights start
/// as HF's `_init_weights` draws them (normal with `initializer_range` for linear and
/// embedding weights, zero biases and padding row, RMSNorm scales 1), from the global torch
/// generator; `load_pretrained` (hf_checkpoint.h) replaces them with a checkpoint's.
///
/// With `gradient_checkpointing_enable()` (the Trainer's `--gradient_checkpointing`), each
/// decoder layer runs through `mantissa::nn::checkpoint` in training. Its `config.json` goes
/// beside the weights wherever the Trainer saves them (`save_model`, checkpoints).
struct LlamaForCausalLMImpl : torch::nn::Module,
                              mantissa::nn::SupportsGradientCheckpointing,
                              mantissa::nn::HasPretrainedConfig {
  explicit LlamaForCausalLMImpl(const LlamaConfig& config);
  /// ids [batch, time] -> logits [batch, time, vocab_size] in the compute dtype. No sync.
  torch::Tensor forward(const torch::Tensor& ids);
  /// What the Trainer calls, as `model(**batch)` in Python: the logits of `input_ids` and,
  /// with `labels` in the batch, HF's causal-LM loss: the labels shifted left by one inside
  /// the model (the last position has no target), -100 ignored, mean cross-entropy in
  /// float32. With `fused_linear_cross_entropy`, the loss comes from
  /// `mantissa::nn::linear_cross_entropy` and no logits are returned. `attention_mask` is not
  /// read: every sequence is full (grouped text has no padding). No sync.
  mantissa::ModelOutput forward(const mantissa::Batch& batch);
  /// The LM head's weight: lm_head's, or the embedding's when tied.
  const torch::Tensor& output_embedding() const;
  /// The decoder layers are the blocks (`--fsdp` shards them one at a time). Python:
  /// `LlamaPreTrainedModel._no_split_modules`.
  std::vector<std::string> no_split_modules() const override { return {"LlamaDecoderLayerImpl"}; }
  /// `config.to_json(dtype)`, as `save_pretrained` writes it.
  std::string pretrained_config_json(c10::ScalarType dtype) const override {
    return config.to_json(dtype).dump(2) + "\n";
  }

  LlamaConfig config;
  /// Compute the loss with the LM head a chunk of rows at a time (never all the logits).
  bool fused_linear_cross_entropy = false;
  /// Rows per chunk of the fused loss; 0 lets linear_cross_entropy choose.
  std::int64_t linear_cross_entropy_chunk_size = 0;
  LlamaModel model{nullptr};
  /// Null when `config.tie_word_embeddings` (there is then no "lm_head.weight" parameter,
  /// as in the files HF saves for tied models).
  fp8::Float8Linear lm_head{nullptr};
};
TORCH_MODULE(LlamaForCausalLM);

/// HF's causal-LM targets: `labels` shifted left by one position, -100 at the end. Python:
/// `F.pad(labels, (0, 1), value=-100)[..., 1:]`. No sync.
torch::Tensor shift_labels(const torch::Tensor& labels);

}  // namespace mantissa::examples::llama
