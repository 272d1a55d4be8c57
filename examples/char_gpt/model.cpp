#include "model.h"

#include <cmath>

#include <torch/torch.h>

#include <mantissa/nn/attention.h>
#include <mantissa/nn/gelu.h>
#include <mantissa/nn/linear_cross_entropy.h>

namespace mantissa::examples {

GptConfig GptConfig::preset(const std::string& name) {
  GptConfig c;
  if (name == "tiny") {
    c.n_layer = 2, c.n_head = 4, c.n_embd = 128, c.block_size = 128;
  } else if (name == "small") {
    c.n_layer = 6, c.n_head = 6, c.n_embd = 384, c.block_size = 256;
  } else if (name == "gpt2-small") {
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.block_size = 1024;
  } else {
    TORCH_CHECK_VALUE(false, "model_size: '", name, "' is not one of tiny, small, gpt2-small");
  }
  return c;
}

void GptConfig::validate() const {
  TORCH_CHECK_VALUE(vocab_size > 0, "vocab_size must be positive, got ", vocab_size);
  TORCH_CHECK_VALUE(block_size > 0, "block_size must be positive, got ", block_size);
  TORCH_CHECK_VALUE(n_layer > 0, "n_layer must be positive, got ", n_layer);
  TORCH_CHECK_VALUE(n_head > 0, "n_head must be positive, got ", n_head);
  TORCH_CHECK_VALUE(n_embd > 0 && n_embd % n_head == 0, "n_embd (", n_embd,
                    ") must be a positive multiple of n_head (", n_head, ")");
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& config) : n_head(config.n_head) {
  qkv = register_module("qkv", fp8::Float8Linear(config.n_embd, 3 * config.n_embd));
  proj = register_module("proj", fp8::Float8Linear(config.n_embd, config.n_embd));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const auto batch = x.size(0), time = x.size(1), channels = x.size(2);
  // unbind, not heads[0..2]: the backward of three select()s zero-fills three copies of the
  // whole [3, B, H, T, D] gradient and adds them up; unbind's backward stacks the three once
  // (Python's `q, k, v = t` unpacks with unbind too).
  const auto heads = qkv(x)
                         .view({batch, time, 3, n_head, channels / n_head})
                         .permute({2, 0, 3, 1, 4})  // 3 B H T D
                         .unbind(0);
  // ATen's kernel, or its math path where that is faster (short bf16 sequences on the CPU).
  auto y = nn::scaled_dot_product_attention(heads[0], heads[1], heads[2], /*attn_mask=*/{},
                                            /*dropout_p=*/0.0,
                                            /*is_causal=*/true);
  return proj(y.transpose(1, 2).reshape({batch, time, channels}));
}

BlockImpl::BlockImpl(const GptConfig& config) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  attn = register_module("attn", CausalSelfAttention(config));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  fc = register_module("fc", fp8::Float8Linear(config.n_embd, 4 * config.n_embd));
  fc_proj = register_module("fc_proj", fp8::Float8Linear(4 * config.n_embd, config.n_embd));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn(ln1(x));
  // GPT-2's tanh approximation; mantissa's keeps dGELU/dx for the backward (same bits as
  // torch::gelu, one tanh per element instead of two).
  return x + fc_proj(nn::gelu(fc(ln2(x)), "tanh"));
}

CharGptImpl::CharGptImpl(const GptConfig& cfg) : config(cfg) {
  config.validate();
  wte = register_module("wte", torch::nn::Embedding(config.vocab_size, config.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(config.block_size, config.n_embd));
  for (std::int64_t i = 0; i < config.n_layer; ++i) blocks->push_back(Block(config));
  register_module("blocks", blocks);
  ln_f =
      register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));

  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (auto& item : named_parameters()) {
    const auto& name = item.key();
    auto& param = item.value();
    if (param.dim() < 2) {
      if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) param.zero_();
      continue;  // LayerNorm weights stay 1
    }
    const bool residual = name.find("attn.proj.weight") != std::string::npos ||
                          name.find("fc_proj.weight") != std::string::npos;
    param.normal_(0.0, residual ? residual_std : 0.02);
  }
}

torch::Tensor CharGptImpl::hidden_states(const torch::Tensor& ids) {
  const auto time = ids.size(1);
  TORCH_CHECK_VALUE(time <= config.block_size, "sequence of ", time,
                    " tokens is longer than block_size ", config.block_size);
  auto positions = torch::arange(time, ids.options().dtype(torch::kLong));
  auto x = wte(ids) + wpe(positions);
  for (const auto& block : *blocks) {
    auto* b = block->as<Block>();
    x = run_block(*b, [b](const torch::Tensor& h) { return b->forward(h); }, x);
  }
  return ln_f(x);
}

torch::Tensor CharGptImpl::forward(const torch::Tensor& ids) {
  // The LM head shares the token embedding's weight (GPT-2's weight tying).
  return at::linear(hidden_states(ids), wte->weight);
}

mantissa::ModelOutput CharGptImpl::forward(const mantissa::Batch& batch) {
  if (fused_linear_cross_entropy && batch.contains("labels")) {
    auto loss = mantissa::nn::linear_cross_entropy(
        hidden_states(batch.at("input_ids")), wte->weight, /*bias=*/{}, batch.at("labels"),
        /*ignore_index=*/-100, linear_cross_entropy_chunk_size);
    return {std::move(loss), torch::Tensor()};
  }
  auto logits = forward(batch.at("input_ids"));
  if (!batch.contains("labels")) return logits;
  const auto& labels = batch.at("labels");
  auto loss = torch::nn::functional::cross_entropy(logits.flatten(0, 1), labels.flatten());
  return {std::move(loss), std::move(logits)};
}

torch::Tensor CharGptImpl::generate(torch::Tensor context, std::int64_t count, double temperature) {
  TORCH_CHECK_VALUE(temperature > 0, "temperature must be positive, got ", temperature);
  torch::NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();
  context = context.to(wte->weight.device());
  for (std::int64_t i = 0; i < count; ++i) {
    const auto start = std::max<std::int64_t>(0, context.size(1) - config.block_size);
    auto logits =
        forward(context.narrow(1, start, context.size(1) - start)).select(1, -1).to(torch::kFloat);
    auto next = torch::multinomial(torch::softmax(logits / temperature, -1), 1);
    context = torch::cat({context, next}, 1);
  }
  train(was_training);
  return context;
}

}  // namespace mantissa::examples
