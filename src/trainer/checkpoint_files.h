#pragma once
// What each file of a checkpoint folder holds, in Hugging Face's layout:
//
//   checkpoint-<step>/
//     model.safetensors      model parameters and buffers (Python's safetensors reads it)
//     config.json            for a model that has one (nn::HasPretrainedConfig), as
//                            save_pretrained writes it
//     optimizer.pt           the optimizer (LibTorch archive)
//     scheduler.pt           the LR scheduler (torch.save format, LambdaLR's keys)
//     scaler.pt              the GradScaler (torch.save format, PyTorch's keys)
//     master_weights.pt      fp32 master weights, when the model is low-precision
//     model_shards/, optimizer_shards/
//                            instead of the three above, with fsdp SHARDED_STATE_DICT: each
//                            process's pieces of them (trainer/sharded/shard_files.h)
//     <registered files>     one per piece of the run's saved-state registry
//                            (trainer/saved_state.h), such as fp8_state.pt with
//                            --fp8 --fp8_recipe delayed
//     rng_state.pth          CPU and CUDA generator states (torch.save format); with several
//                            processes one rng_state_<rank>.pth each
//     trainer_state.json     TrainerState
//     training_args.json     TrainingArguments
//
// Written into a folder checkpoint_folder.h made, each file atomically; read back with every
// value checked, each error naming the file.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/io/state_dict.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

#include "trainer/checkpoint_faults.h"
#include "trainer/saved_state.h"

namespace mantissa::detail {

/// Puts the tensors of the model.safetensors at `path` into the model, naming the file in
/// errors. What a strategy's `load_model_file` does.
using ModelFileLoader = std::function<void(const std::string& path)>;

/// Everything a checkpoint holds. `masters` may be null.
struct CheckpointParts {
  /// The model. The files see its state only through the strategy (`write_checkpoint_files`'s
  /// `model_state`, `load_model_state`).
  torch::nn::Module* model = nullptr;
  /// Loading: how model.safetensors goes into `model`; empty: straight into its tensors.
  ModelFileLoader load_model_file;
  amp::MasterWeights* masters = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  LrScheduler* scheduler = nullptr;
  amp::GradScaler* scaler = nullptr;
  TrainerState* state = nullptr;
  const TrainingArguments* args = nullptr;
  /// The weights, the optimizer state and the masters are in per-process shard files, which
  /// the strategy writes and reads (fsdp SHARDED_STATE_DICT, sharded/shard_files.h):
  /// model.safetensors, optimizer.pt and master_weights.pt are neither written nor read.
  bool in_shards = false;
  /// The run's registered pieces of state, each with a file of its own; null for none.
  const SavedStates* saved_states = nullptr;
  /// Loading only: called with the saved TrainerState before anything else is restored; it
  /// throws when the state cannot continue in this run (the model is left untouched then).
  std::function<void(const TrainerState&)> check_state;
  /// This process's rank and the number of processes: with more than one, each process's
  /// random state is `rng_state_<rank>.pth` (HF's names), else `rng_state.pth`.
  std::int64_t process_index = 0;
  std::int64_t num_processes = 1;
};

/// Writes `model_state` (the model's full state, from the strategy) as model.safetensors, then
/// each piece of state (optimizer, scheduler, scaler, masters, the registered `saved_states`,
/// saved_state.h's entries walked in that order), then trainer_state.json and
/// training_args.json into `folder`; not the random state. A c10::ValueError naming
/// the optimizer's class, before any file is written, when optimizer.pt could not be checked on
/// loading (optimizer_state_table.h). `faults.before_write` sees each path first. Python: HF's
/// `Trainer._save_checkpoint` less the folder handling. Syncs (copies tensors to the host).
void write_checkpoint_files(const std::string& folder, const CheckpointParts& parts,
                            const io::NamedTensors& model_state, const FileFaults& faults = {});

/// Writes `config.json` into `dir` when `model` is an `nn::HasPretrainedConfig`, with the dtype
/// of `model_state`'s first tensor (or of the model's first parameter when `model_state` is
/// empty); nothing otherwise. Python: what `save_pretrained` writes beside the weights. No sync.
void write_pretrained_config(const std::string& dir, const torch::nn::Module& model,
                             const io::NamedTensors& model_state);

/// Writes this process's random state (CPU and CUDA generators) and `num_processes` (key
/// `world_size`) into `folder`: `rng_state.pth` for a lone process, else
/// `rng_state_<process_index>.pth`. Python: HF's `Trainer._save_rng_state`. Syncs.
void write_rng_state(const std::string& folder, std::int64_t process_index,
                     std::int64_t num_processes, const FileFaults& faults = {});

/// How many processes wrote the checkpoint in `dir`: the `world_size` its rng_state files
/// record (so a deleted file does not change the answer); for files that do not record it (HF's),
/// the number of `rng_state_<n>.pth` files, 1 for a single `rng_state.pth`, 0 when it has
/// neither. An unreadable rng_state file raises an error naming it.
std::int64_t saved_process_count(const std::string& dir);

/// The rng_state file that process `process_index` of a run of `num_processes` restores from a
/// checkpoint that `saved_processes` processes saved (`saved_process_count`): the one that
/// process wrote, named by the saving run's size (`rng_state.pth` when one process saved it,
/// else `rng_state_<process_index>.pth`), or nullopt for a process the saving run did not have,
/// whose random state starts afresh. A checkpoint that does not say (0) is read by this run's
/// size, as HF does. Pure.
std::optional<std::string> rng_state_to_restore(std::int64_t process_index,
                                                std::int64_t num_processes,
                                                std::int64_t saved_processes);

/// Restores everything from a checkpoint folder; a null `parts.optimizer` leaves optimizer.pt
/// unread (a sharded run reads it on rank 0 alone). A missing or corrupt file raises a
/// c10::Error naming the file. The trainer state comes first (`check_state`), then the model,
/// then each piece of state in the order they are written (optimizer, scheduler, scaler,
/// masters, the registered `saved_states`); a piece whose file is missing decides what that
/// means when it says (`SavedState::load_missing`). The random state comes from the file
/// `rng_state_to_restore` names: a process the
/// saving run did not have starts afresh with a warning; one that it had and whose file is
/// missing is an error. Python: HF's `_load_from_checkpoint` + `_load_optimizer_and_scheduler`
/// + `_load_rng_state`. Syncs.
void load_checkpoint(const std::string& checkpoint_dir, const CheckpointParts& parts);

/// `parts` for a checkpoint whose weights and optimizer state the strategy keeps in per-process
/// shard files: `in_shards` set, no optimizer and no masters, so that only the run's files
/// (scheduler, scaler, trainer state, registered pieces) are written or read through them.
CheckpointParts sharded_run_files(const CheckpointParts& parts);

/// Loads only the weights of a checkpoint: model.safetensors through `load_model_file`, and
/// `masters` when not null (from master_weights.pt, so that they are exact; from the model when
/// the file is absent). What `load_best_model_at_end` does. A missing or corrupt file raises a
/// c10::Error naming it. Syncs.
void load_checkpoint_weights(const std::string& checkpoint_dir,
                             const ModelFileLoader& load_model_file, amp::MasterWeights* masters);

/// The arguments a checkpoint was saved with (`training_args.json`, read without validating
/// them against this machine), or nullopt when the folder has none (a checkpoint of HF's
/// Trainer). A corrupt file raises a c10::Error naming it. No device sync.
std::optional<TrainingArguments> load_checkpoint_arguments(const std::string& checkpoint_dir);

}  // namespace mantissa::detail
