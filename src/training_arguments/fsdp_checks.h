#pragma once
// The checks of `fsdp` and `fsdp_config` that TrainingArguments::validate() runs, and the
// reading of both. Internal.

#include <optional>
#include <string>

namespace mantissa::detail {

/// What `fsdp` and `fsdp_config` ask for, once checked.
struct FsdpSettings {
  bool shard_grad_op = false;  ///< `fsdp` holds `shard_grad_op`
};

/// Reads `fsdp` (HF's FSDP options, separated by spaces or commas) and `fsdp_config` (a JSON
/// object, or the path of a JSON file holding one; HF's `fsdp_` key prefix is dropped as HF
/// drops it). Throws c10::ValueError naming the option, key or value that mantissa does not
/// run: `full_shard`, `hybrid_shard`, `hybrid_shard_zero2` and `offload` (parameters sharded
/// or moved to the CPU), `no_shard` with another option, an unknown key, a value of the wrong type, `state_dict_type` other than FULL_STATE_DICT,
/// `reshard_after_forward` true, CPU offload, activation checkpointing and XLA. Python: what
/// `TrainingArguments.__post_init__` and accelerate's `FullyShardedDataParallelPlugin` check.
/// An `fsdp_config` without sharding is checked and warned about once (as HF warns). Reads the
/// file `fsdp_config` names; no device.
FsdpSettings read_fsdp_settings(const std::string& fsdp,
                                const std::optional<std::string>& fsdp_config);

}  // namespace mantissa::detail
