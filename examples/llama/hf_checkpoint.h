#pragma once
// A Hugging Face model folder, read and written: `config.json` beside `model.safetensors`, or
// beside the shards that `model.safetensors.index.json` maps. What `save_pretrained` writes and
// `from_pretrained` reads.

#include <cstdint>
#include <string>

#include <mantissa/io/pretrained_weights.h>

#include "llama_model.h"

namespace mantissa::examples::llama {

/// HF's default `max_shard_size` of `save_pretrained` in transformers 5.x: "50GB".
inline constexpr std::int64_t kDefaultMaxShardSize = io::kDefaultMaxShardSize;

/// `io::parse_shard_size`: "5GB", "500MiB", a byte count.
using io::parse_shard_size;

/// Whether `dir` holds weights `load_pretrained` can read: model.safetensors or
/// model.safetensors.index.json.
bool has_pretrained_weights(const std::string& dir);

/// Copies the weights of a model folder into `model`: model.safetensors, or, when absent, the
/// shards listed by model.safetensors.index.json. Python: the weight loading of
/// `LlamaForCausalLM.from_pretrained(dir)`. Tensors are matched by HF's names and converted to
/// each parameter's dtype (a bfloat16 checkpoint loads into a float32 model). A tied model
/// ignores a stored "lm_head.weight". Everything else must match: a missing parameter, an
/// unexpected tensor, or a shape that differs raises a c10::Error naming the file and the
/// tensor (before anything of that file is copied). Syncs with the device of GPU parameters.
void load_pretrained(LlamaForCausalLM& model, const std::string& dir);

/// Writes `model` as a folder `from_pretrained` reads: config.json (`config.to_json`, dtype
/// from the parameters) and the weights under HF's names through `io::save_pretrained_weights`
/// (one model.safetensors up to `max_shard_size` bytes, else shards with their index; stale
/// weight files of an earlier save removed). Python:
/// `model.save_pretrained(dir, max_shard_size=...)`. Each file is written atomically. Syncs
/// with the device (copies to the CPU).
void save_pretrained(const LlamaForCausalLM& model, const std::string& dir,
                     std::int64_t max_shard_size = kDefaultMaxShardSize);
/// The same with the weights given: `parameters` (name, tensor) in the model's parameter order,
/// as `mantissa::Trainer::model_state_dict` gathers them under full sharding, where the
/// model's own parameters are shards.
void save_pretrained(const LlamaConfig& config,
                     const std::vector<std::pair<std::string, torch::Tensor>>& parameters,
                     const std::string& dir, std::int64_t max_shard_size = kDefaultMaxShardSize);

}  // namespace mantissa::examples::llama
