#pragma once
// The reading of `fsdp` and `fsdp_config` (HF Transformers 5.x's FSDP arguments, FSDP2
// semantics), with the checks TrainingArguments::validate() runs. Internal.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mantissa::detail {

/// Which modules become sharding units (`fsdp_config`'s `auto_wrap_policy`, accelerate's
/// `FSDP_AUTO_WRAP_POLICY`).
enum class FsdpAutoWrap {
  kTransformerBased,  ///< TRANSFORMER_BASED_WRAP: blocks whose class is in the list
  kSizeBased,         ///< SIZE_BASED_WRAP: the model's blocks of at least `min_num_params`
  kNoWrap,            ///< NO_WRAP: the whole model is one unit
};

/// What `fsdp` and `fsdp_config` ask for, once checked.
struct FsdpSettings {
  /// Sharding is on: `fsdp` is bare, "true" or holds full_shard / shard_grad_op.
  bool enabled = false;
  /// FSDP2's `reshard_after_forward` (default true): parameters sharded between uses and
  /// gathered per unit (ZeRO-3); false keeps them whole on every process (ZeRO-2).
  bool reshard_after_forward = true;
  FsdpAutoWrap auto_wrap_policy = FsdpAutoWrap::kTransformerBased;
  /// Class names of the blocks to shard; unset: the model's `no_split_modules()`.
  std::optional<std::vector<std::string>> transformer_layer_cls_to_wrap;
  /// SIZE_BASED_WRAP's threshold (0 wraps nothing, as in accelerate).
  std::int64_t min_num_params = 0;
  /// `activation_checkpointing`: every unit's block recomputed in the backward.
  bool activation_checkpointing = false;
  /// `state_dict_type` SHARDED_STATE_DICT: each process writes its own shard files into a
  /// checkpoint; FULL_STATE_DICT (false, the default): rank 0 writes the whole state.
  bool sharded_state_dict = false;

  /// Gradients and optimizer state sharded, parameters whole (`--fsdp shard_grad_op`, ZeRO-2).
  bool shards_grad_op() const noexcept { return enabled && !reshard_after_forward; }
  /// Parameters sharded too (bare `--fsdp`, `full_shard`, ZeRO-3).
  bool shards_parameters() const noexcept { return enabled && reshard_after_forward; }
};

/// Reads `fsdp` (bare `--fsdp` arrives as "true"; else HF's legacy option strings, separated by
/// spaces or commas, case-sensitive) and `fsdp_config` (a JSON object, or the path of a JSON
/// file holding one; HF's `fsdp_` key prefix is dropped as HF drops it). A key of
/// `fsdp_config` wins over what a legacy string implies, as HF's `setdefault` lets it. Throws
/// c10::ValueError naming the option, key or value: the FSDP1-only options and `version` 1, an
/// unknown option or key, a value of the wrong type, CPU offload (not built), XLA. Python: `TrainingArguments._process_fsdp_args` and
/// accelerate's `FullyShardedDataParallelPlugin`. Warns once when legacy strings are used, and
/// when `fsdp_config` is set without sharding. Reads the file `fsdp_config` names; no device.
FsdpSettings read_fsdp_settings(const std::string& fsdp,
                                const std::optional<std::string>& fsdp_config);

}  // namespace mantissa::detail
