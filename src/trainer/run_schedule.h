#pragma once
// The run's schedule: how many batches an epoch has, how they group into optimizer updates,
// how many updates and epochs the run takes. Pure functions of the dataset size and the
// arguments, tested without training (tests/run_schedule_test.cpp).

#include <cstddef>
#include <cstdint>
#include <vector>

#include <mantissa/training_arguments.h>

#include "trainer/resume_check.h"

namespace mantissa::detail {

/// Where micro-batch `b` of an epoch sits in its gradient-accumulation group.
struct GroupPosition {
  /// The group's first micro-batch.
  std::int64_t group_start = 0;
  /// Micro-batches in the group: `gradient_accumulation_steps`, fewer for the last group of
  /// an epoch whose batch count is not a multiple of it. Each micro-loss counts 1/in_group.
  std::int64_t in_group = 1;
  /// Whether `b` is the group's last micro-batch: the optimizer update runs after it.
  bool boundary = true;
};

/// The sizes of one run. Python: what `Trainer._inner_training_loop` computes before its loop
/// (`num_update_steps_per_epoch`, `max_steps`, `num_train_epochs`).
struct RunSchedule {
  /// Examples in the training dataset.
  std::int64_t num_examples = 0;
  /// `per_device_train_batch_size`.
  std::int64_t batch_size = 1;
  /// Micro-batches per optimizer update (`gradient_accumulation_steps`).
  std::int64_t gradient_accumulation_steps = 1;
  /// Micro-batches per epoch (the last one partial unless `dataloader_drop_last`).
  std::int64_t batches_per_epoch = 0;
  /// Optimizer updates per epoch; a partial last accumulation group makes one update too.
  std::int64_t updates_per_epoch = 0;
  /// Optimizer updates of the whole run.
  std::int64_t max_steps = 0;
  /// Epochs the loop starts (the last may end early at `max_steps`).
  std::int64_t num_epochs = 0;

  /// Position of micro-batch `b` (0-based within its epoch) in its accumulation group.
  GroupPosition group_of(std::int64_t b) const;

  /// The dataset indices of micro-batch `b` of an epoch whose shuffled order is `order`
  /// (`num_examples` entries). Python: the `BatchSampler` over a `RandomSampler`.
  std::vector<std::size_t> batch_indices(const std::int64_t* order, std::int64_t b) const;

  /// `TrainerState::epoch` once micro-batch `b` of epoch `epoch` is done: 2.5 is half-way
  /// through the third epoch.
  double fractional_epoch(std::int64_t epoch, std::int64_t b) const;

  /// The sizes a saved position is checked against when resuming.
  RunShape run_shape() const;
};

/// The schedule of a run over `dataset_size` examples. `max_steps > 0` wins over
/// `num_train_epochs`, which may be fractional (1.5 epochs: 1.5 x updates_per_epoch updates,
/// rounded up). Throws `c10::ValueError` for an empty dataset, a batch larger than the dataset
/// with `dataloader_drop_last`, a run of no update, and a count of the run (steps, epochs,
/// examples drawn) that does not fit in int64, naming the flag and its value. No device work.
RunSchedule make_run_schedule(std::size_t dataset_size, const TrainingArguments& args);

}  // namespace mantissa::detail
