#pragma once
// What a resumed run checks before it trusts a checkpoint: that the saved position fits this
// run's data (the dataset, the batch size, the accumulation), and how this run's arguments
// differ from the ones the checkpoint was written with. Pure functions of their inputs.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// The sizes of this run that a saved position is measured in.
struct RunShape {
  std::int64_t batches_per_epoch = 0;
  std::int64_t updates_per_epoch = 0;
  std::int64_t gradient_accumulation_steps = 1;
  std::int64_t per_device_train_batch_size = 1;
};

/// Where the loop picks up: the epoch to start in and the micro-batches of it already done.
struct ResumePosition {
  std::int64_t epoch = 0;
  std::int64_t batches_done = 0;
};

/// The position `state` was saved at. With mantissa's own `steps_in_epoch` it is read from
/// the state; a state without it (written by HF, or at step 0) is placed by `global_step`
/// the way HF's Trainer does (`epochs_trained`, `steps_trained_in_current_epoch`). Throws
/// `c10::ValueError` when the position cannot belong to a run of this shape: another
/// `train_batch_size`, more batches done than an epoch has, or a `global_step` that disagrees
/// with the epoch and batch counts (the dataset, `per_device_train_batch_size` or
/// `gradient_accumulation_steps` changed since the save).
ResumePosition resume_position(const TrainerState& state, const RunShape& run);

/// The differences between this run's arguments and the saved ones, sorted by how much they
/// matter. `errors` would put the run at the wrong place in its data; `warnings` say which
/// value this run uses.
struct ArgumentChanges {
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  /// The same global batch cut otherwise (`per_device_train_batch_size` or
  /// `gradient_accumulation_steps` changed with it): a saved step still means the same examples
  /// seen, but a position inside an epoch counts batches of the old size, so the run continues
  /// from `global_step` alone, placed as HF places it.
  bool batch_regrouped = false;
};

/// How many processes ran the saved run and run this one (the data-parallel world size). 0
/// for `saved`: unknown (a checkpoint without rng_state files), taken as `now`.
struct ProcessCounts {
  std::int64_t now = 1;
  std::int64_t saved = 1;
};

/// Whether a TrainingArguments field only says where and how a process runs (output_dir,
/// dataloader workers, the progress bar, CUDA graphs, reporting), not what it computes: such
/// fields may differ between a run and its resume, and between the processes of one job.
bool is_execution_detail(std::string_view field);

/// Compares every field of `now` with `saved` (the checkpoint's `training_args.json`).
/// Fields that only say where and how to run (output_dir, dataloader workers, progress bar,
/// CUDA graphs) are not reported. A changed `per_device_train_batch_size` or
/// `gradient_accumulation_steps` is judged by the global batch (per-device batch x processes x
/// accumulation, as in HF's `total_train_batch_size`): the same in both runs (an elastic job
/// that halves its processes and doubles the batch), a warning and `batch_regrouped`; another
/// global batch, an error, since the saved step would count other examples. A change of the
/// process count alone is not judged here (the Trainer warns about it).
ArgumentChanges compare_resumed_arguments(const TrainingArguments& now,
                                          const TrainingArguments& saved,
                                          ProcessCounts processes = {});

}  // namespace mantissa::detail
