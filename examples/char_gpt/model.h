#pragma once
// A decoder-only transformer (GPT-2's layout): token and position embeddings, pre-LayerNorm
// blocks of causal self-attention and a GELU MLP, a final LayerNorm, and an LM head tied to
// the token embedding. The linear layers are `Float8Linear`s, which `--fp8` switches to FP8
// (all but the first and the last, docs/fp8.md); otherwise they are `torch::nn::Linear`s.

#include <cstdint>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <mantissa/batch.h>
#include <mantissa/fp8/float8_linear.h>
#include <mantissa/model_output.h>
#include <mantissa/nn/supports_gradient_checkpointing.h>

namespace mantissa::examples {

/// The shape of a `CharGpt`. Python: nanoGPT's `GPTConfig`, or `transformers.GPT2Config`
/// (`n_layer`, `n_head`, `n_embd`, `n_positions` = block_size).
struct GptConfig {
  std::int64_t vocab_size = 0;
  std::int64_t block_size = 128;
  std::int64_t n_layer = 2;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 128;

  /// A named preset: "tiny" (2 layers, 4 heads, 128 wide, block 128), "small" (6, 6, 384,
  /// block 256: nanoGPT's Shakespeare-char model) or "gpt2-small" (12, 12, 768, block 1024:
  /// GPT-2 small's body). Raises c10::ValueError for any other name.
  static GptConfig preset(const std::string& name);
  /// Raises c10::ValueError naming the field when a size is not positive or n_embd is not a
  /// multiple of n_head.
  void validate() const;
};

/// Multi-head causal self-attention through `mantissa::nn::scaled_dot_product_attention`
/// (is_causal): ATen's flash or memory-efficient kernels where the device has them, its math
/// path for short bf16 sequences on the CPU.
struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GptConfig& config);
  /// x: [batch, time, n_embd] -> [batch, time, n_embd].
  torch::Tensor forward(const torch::Tensor& x);

  std::int64_t n_head;
  fp8::Float8Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

/// One pre-LayerNorm block: x + attn(ln1(x)), then x + mlp(ln2(x)) with a 4x GELU MLP.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const GptConfig& config);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  fp8::Float8Linear fc{nullptr}, fc_proj{nullptr};
};
TORCH_MODULE(Block);

/// The language model. `forward(ids [batch, time])` returns logits [batch, time, vocab_size].
/// Weights start as GPT-2's: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer).
/// With `gradient_checkpointing_enable()` (the Trainer's `--gradient_checkpointing`) each
/// block runs through `mantissa::nn::checkpoint` in training.
struct CharGptImpl : torch::nn::Module, mantissa::nn::SupportsGradientCheckpointing {
  explicit CharGptImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& ids);
  /// The LM head's input: the blocks' output after ln_f, [batch, time, n_embd].
  torch::Tensor hidden_states(const torch::Tensor& ids);
  /// What the Trainer calls, as HF's `GPT2LMHeadModel(**batch)`: the logits of
  /// `batch["input_ids"]` and, when the batch has `labels` (the next token at each position),
  /// their mean cross-entropy as the loss. With `fused_linear_cross_entropy` and labels, the
  /// loss comes from `mantissa::nn::linear_cross_entropy` and no logits are returned.
  mantissa::ModelOutput forward(const mantissa::Batch& batch);
  /// Appends `count` tokens sampled at `temperature` from the model to `context` ([1, time]
  /// ids), cropping the context to the last block_size tokens. No grad; the model's device.
  torch::Tensor generate(torch::Tensor context, std::int64_t count, double temperature = 1.0);
  /// The transformer blocks: what `--gradient_checkpointing` recomputes and `--fsdp` shards one
  /// at a time. Python: `GPT2PreTrainedModel._no_split_modules`.
  std::vector<std::string> no_split_modules() const override { return {"BlockImpl"}; }

  GptConfig config;
  /// Compute the loss with the LM head in chunks of rows, never holding all the logits.
  bool fused_linear_cross_entropy = false;
  /// Rows per chunk of the fused loss; 0 lets linear_cross_entropy choose.
  std::int64_t linear_cross_entropy_chunk_size = 0;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(CharGpt);

}  // namespace mantissa::examples
