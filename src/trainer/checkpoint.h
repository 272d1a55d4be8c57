#pragma once
// Checkpoint folders in Hugging Face's layout, written atomically.
//
//   output_dir/checkpoint-<step>/
//     model.safetensors      model parameters and buffers (Python's safetensors reads it)
//     optimizer.pt           the optimizer (LibTorch archive)
//     scheduler.pt           the LR scheduler (torch.save format, LambdaLR's keys)
//     scaler.pt              the GradScaler (torch.save format, PyTorch's keys)
//     master_weights.pt      fp32 master weights, when the model is low-precision
//     rng_state.pth          CPU and CUDA generator states (torch.save format)
//     trainer_state.json     TrainerState
//     training_args.json     TrainingArguments
//
// A checkpoint is written into a temporary folder beside it and renamed into place, so a
// crash or a full disk during a save leaves the previous checkpoints as they were.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// Everything a checkpoint holds. `masters` may be null.
struct CheckpointParts {
  torch::nn::Module* model = nullptr;
  amp::MasterWeights* masters = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  LrScheduler* scheduler = nullptr;
  amp::GradScaler* scaler = nullptr;
  TrainerState* state = nullptr;
  const TrainingArguments* args = nullptr;
  /// Loading only: called with the saved TrainerState before anything else is restored; it
  /// throws when the state cannot continue in this run (the model is left untouched then).
  std::function<void(const TrainerState&)> check_state;
  /// This process's rank and the number of processes: with more than one, each process's
  /// random state is `rng_state_<rank>.pth` (HF's names), else `rng_state.pth`.
  std::int64_t process_index = 0;
  std::int64_t num_processes = 1;
};

/// `checkpoint-<step>` as a folder name.
std::string checkpoint_name(std::int64_t step);

/// Writes `output_dir/checkpoint-<state.global_step>` atomically and returns its path.
std::string save_checkpoint(const std::string& output_dir, const CheckpointParts& parts);

// ---- a save in steps, for several processes ----------------------------------------------
// `save_checkpoint` is these in order. A data-parallel save runs them with the other processes
// in between: the writing process begins and writes the files, every process adds its random
// state, the writer publishes; a failure anywhere abandons the folder on every writer.

/// Makes the empty folder a new `checkpoint-<step>` is written in, after cleaning interrupted
/// saves. `shared_name`: a fixed name (`tmp-checkpoint-<step>-shared`) that other processes can
/// find without being told, instead of a unique one; an old folder of that name is replaced.
std::string begin_checkpoint(const std::string& output_dir, std::int64_t step, bool shared_name);
/// The fixed folder name `begin_checkpoint(..., shared_name=true)` makes.
std::string shared_checkpoint_folder(const std::string& output_dir, std::int64_t step);
/// Writes everything of `parts` into `folder` except the random state.
void write_checkpoint_files(const std::string& folder, const CheckpointParts& parts);
/// Writes this process's random state (CPU and CUDA generators) into `folder`:
/// `rng_state.pth` for a lone process, else `rng_state_<process_index>.pth`.
void write_rng_state(const std::string& folder, std::int64_t process_index,
                     std::int64_t num_processes);
/// Renames a complete `folder` to `output_dir/checkpoint-<step>`, replacing an older one of
/// that step only then, and returns the final path.
std::string publish_checkpoint(const std::string& output_dir, const std::string& folder,
                               std::int64_t step);
/// Removes a folder that will not be published; never throws.
void abandon_checkpoint(const std::string& folder) noexcept;
/// How many processes wrote the checkpoint in `dir`: the number of `rng_state_<n>.pth` files,
/// 1 for a single `rng_state.pth`, 0 when it has neither (HF checkpoints without them).
std::int64_t saved_process_count(const std::string& dir);

/// Removes what a save or rotation killed half-way left in `output_dir` (`tmp-checkpoint-*`,
/// `deleting-checkpoint-*`), and puts back a checkpoint that was moved aside to be re-saved
/// (`old-checkpoint-<step>-*`) when no `checkpoint-<step>` replaced it. Called by every save.
void clean_interrupted_saves(const std::string& output_dir);

/// Restores everything from a checkpoint folder. A missing or corrupt file raises a c10::Error
/// naming the file.
void load_checkpoint(const std::string& checkpoint_dir, const CheckpointParts& parts);

/// Loads only the weights of a checkpoint into `model`, and into `masters` when not null (from
/// master_weights.pt, so that they are exact; from the model when the file is absent). What
/// `load_best_model_at_end` does. A missing or corrupt file raises a c10::Error naming it.
void load_checkpoint_weights(const std::string& checkpoint_dir, torch::nn::Module& model,
                             amp::MasterWeights* masters);

/// The arguments a checkpoint was saved with (`training_args.json`, read without validating
/// them against this machine), or nullopt when the folder has none (a checkpoint of HF's
/// Trainer). A corrupt file raises a c10::Error naming it.
std::optional<TrainingArguments> load_checkpoint_arguments(const std::string& checkpoint_dir);

/// The `checkpoint-<n>` folders in `output_dir`, oldest (smallest n) first.
std::vector<std::string> sorted_checkpoints(const std::string& output_dir);

/// Resolves `resume_from_checkpoint`: "latest" is the newest checkpoint in `output_dir`.
std::string resolve_checkpoint(const std::string& requested, const std::string& output_dir);

/// Deletes the oldest checkpoints until `limit` remain, never the newest (`keep_latest`, to
/// resume from) nor the best one: with both protected and `limit` 1, two remain. Python: HF's
/// `rotate_checkpoints`; `keep_latest` false is what HF does at the end of a run with
/// `save_total_limit=1` (only the best stays).
void rotate_checkpoints(const std::string& output_dir, std::int64_t limit,
                        const std::optional<std::string>& best_checkpoint, bool keep_latest = true);

/// Called with each file's path before the checkpoint writer writes it; tests throw from it
/// to simulate a failing disk. Empty in normal runs.
extern std::function<void(const std::string& path)> checkpoint_write_hook;

/// Called with the renamed folder of a rotated-out checkpoint before it is deleted; tests
/// throw from it to simulate a process killed half-way through a rotation. Empty in normal runs.
extern std::function<void(const std::string& path)> checkpoint_remove_hook;

}  // namespace mantissa::detail
