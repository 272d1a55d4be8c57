#pragma once
// How long a run is: batches and optimizer steps per epoch, total steps, epochs. A pure function
// of the arguments and the dataset's size, so that it is tested without training.

#include <cstddef>
#include <cstdint>

#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// The sizes of one run, as HF Trainer derives them before its loop (`num_update_steps_per_epoch`,
/// `max_steps`, `num_train_epochs`).
struct RunSchedule {
  std::int64_t batches_per_epoch = 0;  ///< micro-batches in one pass over the data
  std::int64_t updates_per_epoch = 0;  ///< optimizer steps in one pass (at least 1)
  std::int64_t max_steps = 0;          ///< optimizer steps of the whole run
  std::int64_t num_epochs = 0;         ///< passes the loop starts (the last may stop early)
};

/// The schedule of a run of `args` over `dataset_size` examples: `max_steps` when it is > 0
/// (with enough epochs to reach it), else `ceil(num_train_epochs * updates_per_epoch)` steps.
/// Throws `c10::ValueError` when the dataset is empty, when `dataloader_drop_last` leaves no
/// batch, and when a count of the run (steps, epochs, examples drawn) does not fit in int64,
/// naming the flag and its value. No device work.
RunSchedule make_run_schedule(const TrainingArguments& args, std::size_t dataset_size);

}  // namespace mantissa::detail
