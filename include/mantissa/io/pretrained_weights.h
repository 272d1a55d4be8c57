#pragma once
// The weight files of a Hugging Face model folder, as `save_pretrained` writes them: one
// `model.safetensors`, or above `max_shard_size` the shards `model-0000k-of-0000n.safetensors`
// and `model.safetensors.index.json`, whose "weight_map" names each tensor's shard.

#include <cstdint>
#include <string>
#include <vector>

#include <mantissa/io/state_dict.h>

namespace mantissa::io {

/// HF's default `max_shard_size` of `save_pretrained` in transformers 5.x: "50GB".
inline constexpr std::int64_t kDefaultMaxShardSize = 50'000'000'000;

/// Reads a size as `save_pretrained(max_shard_size=...)` takes it: a byte count ("1000000") or
/// a number with a unit, decimal "KB", "MB", "GB" or binary "KiB", "MiB", "GiB" (any case;
/// "5GB" = 5 * 10^9 bytes). Throws `c10::ValueError` naming the text for anything else, zero,
/// a negative size or one past 9e18 bytes. Pure.
std::int64_t parse_shard_size(const std::string& text);

/// Writes `tensors` (name, tensor; in the model's order) into the folder `dir` (made when
/// missing): one model.safetensors when their bytes fit in `max_shard_size`, else shards in
/// the given order, a new one started when the next tensor would pass the limit (a tensor
/// larger than the limit gets a shard of its own), with model.safetensors.index.json
/// ("metadata": total_parameters, total_size; "weight_map"). Every file carries the metadata
/// "format": "pt" and is written atomically; weight files of an earlier save in `dir` that
/// this layout does not use are removed, so that a loader cannot pick up stale weights. Returns
/// the weight files written (with the index). Python: `huggingface_hub.save_torch_state_dict`,
/// what `model.save_pretrained(dir, max_shard_size=...)` calls. Throws `c10::ValueError` for a
/// size below 1 or no tensors, and what `save_safetensors` throws. Syncs with the device of
/// GPU tensors (the copies).
std::vector<std::string> save_pretrained_weights(
    const std::string& dir, const NamedTensors& tensors,
    std::int64_t max_shard_size = kDefaultMaxShardSize);

}  // namespace mantissa::io
