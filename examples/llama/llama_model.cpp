#include "llama_model.h"

#include <cmath>

#include <torch/torch.h>

#include <mantissa/nn/attention.h>
#include <mantissa/nn/linear_cross_entropy.h>

namespace mantissa::examples::llama {
namespace {

fp8::Float8Linear linear(std::int64_t in, std::int64_t out, bool bias) {
  return fp8::Float8Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// The second half of the last dimension, negated, followed by the first half.
torch::Tensor rotate_half(const torch::Tensor& x) {
  const auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// [batch, kv_heads, time, dim] -> [batch, kv_heads * groups, time, dim], each key/value head
// repeated for the query heads of its group.
torch::Tensor repeat_kv(const torch::Tensor& x, std::int64_t groups) {
  if (groups == 1) return x;
  const auto b = x.size(0), heads = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, heads, groups, t, d}).reshape({b, heads * groups, t, d});
}

}  // namespace

LlamaRMSNormImpl::LlamaRMSNormImpl(std::int64_t hidden_size, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({hidden_size}));
}

torch::Tensor LlamaRMSNormImpl::forward(const torch::Tensor& x) {
  const auto x32 = x.to(torch::kFloat);
  const auto variance = x32.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (x32 * torch::rsqrt(variance + eps)).to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c)
    : num_heads(c.num_attention_heads),
      num_key_value_heads(c.num_key_value_heads),
      head_dim(c.head_dim),
      attention_dropout(c.attention_dropout) {
  q_proj = register_module("q_proj", linear(c.hidden_size, num_heads * head_dim, c.attention_bias));
  k_proj = register_module("k_proj",
                           linear(c.hidden_size, num_key_value_heads * head_dim, c.attention_bias));
  v_proj = register_module("v_proj",
                           linear(c.hidden_size, num_key_value_heads * head_dim, c.attention_bias));
  o_proj = register_module("o_proj", linear(num_heads * head_dim, c.hidden_size, c.attention_bias));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const RotaryTables& rotary) {
  const auto batch = x.size(0), time = x.size(1);
  const auto heads = [&](const torch::Tensor& projected) {
    return projected.view({batch, time, -1, head_dim}).transpose(1, 2);
  };
  auto q = heads(q_proj(x));
  auto k = heads(k_proj(x));
  auto v = heads(v_proj(x));
  const auto cos = rotary.cos.unsqueeze(1);
  const auto sin = rotary.sin.unsqueeze(1);
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  const auto groups = num_heads / num_key_value_heads;
  auto y = nn::scaled_dot_product_attention(
      q, repeat_kv(k, groups), repeat_kv(v, groups), /*attn_mask=*/{},
      is_training() ? attention_dropout : 0.0, /*is_causal=*/time > 1,
      std::pow(static_cast<double>(head_dim), -0.5));
  return o_proj(y.transpose(1, 2).reshape({batch, time, -1}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) {
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size, c.mlp_bias));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c) {
  self_attn = register_module("self_attn", LlamaAttention(c));
  mlp = register_module("mlp", LlamaMLP(c));
  input_layernorm = register_module("input_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const RotaryTables& rotary) {
  auto h = x + self_attn(input_layernorm(x), rotary);
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c) : config(c) {
  config.validate();
  inv_freq = rope_inverse_frequencies(config);
  auto embedding = torch::nn::EmbeddingOptions(config.vocab_size, config.hidden_size);
  if (config.pad_token_id) embedding.padding_idx(*config.pad_token_id);
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(embedding));
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers->push_back(LlamaDecoderLayer(config));
  }
  register_module("layers", layers);
  norm = register_module("norm", LlamaRMSNorm(config.hidden_size, config.rms_norm_eps));
}

RotaryTables LlamaModelImpl::rotary_tables(std::int64_t time, c10::ScalarType dtype,
                                           c10::Device device) const {
  const auto positions = torch::arange(time, torch::dtype(torch::kFloat).device(device));
  const auto freqs = positions.unsqueeze(1) * inv_freq.to(device).unsqueeze(0);  // [time, dim/2]
  const auto angles = torch::cat({freqs, freqs}, -1).unsqueeze(0);               // [1, time, dim]
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& ids, const BlockRunner& run_block) {
  TORCH_CHECK_VALUE(ids.dim() == 2, "input_ids must be [batch, time], got shape ", ids.sizes());
  const auto time = ids.size(1);
  TORCH_CHECK_VALUE(time <= config.max_position_embeddings, "a sequence of ", time,
                    " tokens is longer than max_position_embeddings ",
                    config.max_position_embeddings);
  auto x = embed_tokens(ids);
  const auto rotary = rotary_tables(time, x.scalar_type(), x.device());
  for (const auto& layer : *layers) {
    auto* decoder_layer = layer->as<LlamaDecoderLayer>();
    // The tables by value: a checkpointed block is called again in the backward.
    const auto block = [decoder_layer, rotary](const torch::Tensor& h) {
      return decoder_layer->forward(h, rotary);
    };
    x = run_block ? run_block(*decoder_layer, block, x) : block(x);
  }
  return norm(x);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c) : config(c) {
  model = register_module("model", LlamaModel(config));
  if (!config.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear(config.hidden_size, config.vocab_size, false));
  }
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    auto& param = item.value();
    if (param.dim() >= 2) {
      param.normal_(0.0, config.initializer_range);
    } else if (item.key().size() >= 5 &&
               item.key().compare(item.key().size() - 5, 5, ".bias") == 0) {
      param.zero_();
    }
  }
  if (config.pad_token_id) model->embed_tokens->weight[*config.pad_token_id].zero_();
}

const torch::Tensor& LlamaForCausalLMImpl::output_embedding() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& ids) {
  auto hidden = model->forward(ids);
  return lm_head ? lm_head(hidden) : at::linear(hidden, output_embedding());
}

torch::Tensor shift_labels(const torch::Tensor& labels) {
  return torch::constant_pad_nd(labels, {0, 1}, -100).narrow(-1, 1, labels.size(-1));
}

mantissa::ModelOutput LlamaForCausalLMImpl::forward(const mantissa::Batch& batch) {
  const BlockRunner through_trainer = [this](const torch::nn::Module& layer, const auto& block,
                                             const torch::Tensor& x) {
    return run_block(layer, block, x);
  };
  auto hidden = model->forward(batch.at("input_ids"), through_trainer);
  const bool with_labels = batch.contains("labels");
  if (with_labels && fused_linear_cross_entropy) {
    auto loss = nn::linear_cross_entropy(hidden, output_embedding(), /*bias=*/{},
                                         shift_labels(batch.at("labels")), -100,
                                         linear_cross_entropy_chunk_size);
    return {std::move(loss), torch::Tensor()};
  }
  auto logits = lm_head ? lm_head(hidden) : at::linear(hidden, output_embedding());
  if (!with_labels) return logits;
  auto loss = torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat).view({-1, config.vocab_size}),
      shift_labels(batch.at("labels")).reshape(-1),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
  return {std::move(loss), std::move(logits)};
}

}  // namespace mantissa::examples::llama
