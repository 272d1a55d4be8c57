#pragma once
// HF's inner training loop as a class of its own: epochs and micro-batches from a resumed
// position, the events in HF's order, what the interval policy says is due after each update.
// How a micro-batch and an update execute is the step engine's business, what spans processes
// the strategy's, and logging, evaluating and saving the Trainer's (handed in as `LoopActions`),
// so tests drive the loop with a fake engine, a fake strategy and recording actions.

#include <chrono>
#include <cstdint>
#include <functional>

#include <c10/core/Device.h>

#include <mantissa/batch.h>
#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

#include "trainer/callback_handler.h"
#include "trainer/interval_policy.h"
#include "trainer/loss_window.h"
#include "trainer/progress.h"
#include "trainer/run_schedule.h"
#include "trainer/step_engine.h"
#include "trainer/strategy.h"

namespace mantissa::detail {

/// What the loop asks of the Trainer around it.
struct LoopActions {
  /// Records and prints a log line and fires `on_log` (Python: `Trainer.log`).
  std::function<void(LogEntry)> log;
  /// Runs the evaluation that is due during training and returns whether the best metric
  /// improved since the last checkpoint; empty when the Trainer has no eval dataset.
  std::function<bool()> evaluate;
  /// Writes the checkpoint that is due (Python: `Trainer._save_checkpoint`).
  std::function<void()> save_checkpoint;
  /// Adds what the optimizer side reports to a training log line: `learning_rate`, and with
  /// loss scaling `loss_scale` and `skipped_steps`.
  std::function<void(LogEntry&)> add_optimizer_values;
  /// After each update, before `on_step_end`. May be empty.
  std::function<void()> after_update;
  /// After the last step, before `on_train_end`: the best model loaded back, the final
  /// rotation of checkpoints. May be empty.
  std::function<void()> finish;
};

/// What a loop works on. References to objects that outlive the loop.
struct LoopParts {
  const TrainingArguments& args;
  const RunSchedule& schedule;
  const IntervalPolicy& intervals;
  const BatchSource& train;
  c10::Device device;
  const Strategy& strategy;
  StepEngine& engine;
  const CallbackHandler& callbacks;
  TrainerState& state;
  TrainerControl& control;
  /// The engine adds each micro-batch's loss here; the loop closes a window per log line.
  LossWindow& loss_window;
  Progress& progress;
  LoopActions actions;
};

/// What a finished loop reports.
struct LoopResult {
  /// Mean training loss per update of this run, over the processes.
  double training_loss = 0.0;
  /// train_runtime, train_samples_per_second, train_steps_per_second, train_loss.
  LogEntry metrics;
};

/// One `train()`'s loop, from `on_train_begin` to `on_train_end`. Python:
/// `Trainer._inner_training_loop`.
class TrainingLoop {
 public:
  explicit TrainingLoop(LoopParts parts);

  /// Trains from the state's position (a resumed run's `global_step` and `steps_in_epoch`) to
  /// `max_steps` or until a callback stops it, logs the run's metrics (`train_runtime`,
  /// `train_samples_per_second`, `train_steps_per_second`, `train_loss`) and returns them.
  /// Syncs at each log line and at the end.
  LoopResult run();

 private:
  using Clock = std::chrono::steady_clock;

  /// One epoch from micro-batch `skip` on: on_epoch_begin, the batches (on_step_begin at each
  /// accumulation group, the engine, on_step_end and what is due after each update),
  /// on_epoch_end and what is due then.
  void train_epoch(std::int64_t epoch, std::int64_t skip);
  /// Asks the interval policy and the callbacks' flags whether to log, evaluate and save, and
  /// does so. Python: `Trainer._maybe_log_save_evaluate`.
  void maybe_log_save_evaluate(bool epoch_end);
  /// The training log line of the window that ends now. Syncs.
  void log_training_progress();
  /// Adds every process's tokens since the last call to the state's count and to the log
  /// window's (a collective among several processes).
  void share_token_counts();
  /// The loss window's inf/nan streak check; every process stops when any does.
  void check_nonfinite();
  /// The seed of every epoch's data order: `data_seed`, else `seed`.
  std::uint64_t data_seed() const;

  LoopParts parts_;
  std::int64_t samples_seen_ = 0;  // examples trained on by this loop, on every process
  std::int64_t samples_since_log_ = 0;
  std::int64_t tokens_since_log_ = 0;
  // Tokens this process saw that are not yet counted in the state: summed over the processes
  // when a log line, a checkpoint or the end of the run needs the total.
  std::int64_t tokens_unshared_ = 0;
  Clock::time_point log_window_start_;
};

}  // namespace mantissa::detail
