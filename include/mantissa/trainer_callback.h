#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <mantissa/training_arguments.h>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace mantissa {

namespace amp {
class GradScaler;
}
class LrScheduler;
namespace detail {
class CallbackHandler;
}

/// One entry of `TrainerState::log_history`: what a log line or an evaluation reported
/// (`loss`, `learning_rate`, `grad_norm`, `eval_loss`, `epoch`, `step`, ...).
using LogEntry = std::map<std::string, double>;

/// Where training stands; saved as `trainer_state.json` in every checkpoint.
/// Python: `transformers.TrainerState`, with the same field names.
struct TrainerState {
  /// Fractional epoch reached (2.5 = half-way through the third epoch).
  double epoch = 0.0;
  /// Optimizer steps taken (skipped fp16 overflow steps included, as in HF).
  std::int64_t global_step = 0;
  /// Total optimizer steps this run will take.
  std::int64_t max_steps = 0;
  std::int64_t logging_steps = 500;
  std::int64_t eval_steps = 500;
  std::int64_t save_steps = 500;
  std::int64_t train_batch_size = 0;
  std::int64_t num_train_epochs = 0;
  /// Every log and evaluation entry so far, in order.
  std::vector<LogEntry> log_history;
  /// Best value so far of the metric checkpoints are ranked by (`metric_for_best_model`, by
  /// default `eval_loss`), once evaluated.
  std::optional<double> best_metric;
  /// The step whose evaluation gave `best_metric`, when it falls on a saved checkpoint's run.
  std::optional<std::int64_t> best_global_step;
  /// The checkpoint folder holding the weights of `best_metric`, once saved.
  std::optional<std::string> best_model_checkpoint;
  /// Input tokens seen so far (counted when batches hold integer token ids).
  std::int64_t num_input_tokens_seen = 0;
  /// mantissa: micro-batches of the current epoch already consumed, so a resumed run skips
  /// exactly those (HF recomputes this from global_step).
  std::int64_t steps_in_epoch = 0;
  /// mantissa: optimizer steps skipped because the gradients overflowed (fp16).
  std::int64_t skipped_steps = 0;
  /// Whether this process is the first of its node (local rank 0); always true for a lone
  /// process. Python: `TrainerState.is_local_process_zero`.
  bool is_local_process_zero = true;
  /// Whether this process is rank 0, the one that logs and saves; always true for a lone
  /// process. Callbacks that write files check it. Python: `TrainerState.is_world_process_zero`.
  bool is_world_process_zero = true;

  /// `trainer_state.json`'s text. Python: `TrainerState.save_to_json` (same keys).
  std::string to_json() const;
  /// Reads what `to_json` wrote; a malformed document raises c10::Error naming the problem.
  static TrainerState from_json(const std::string& text);
};

/// What the loop should do next; callbacks set these flags. Python: `transformers.TrainerControl`.
struct TrainerControl {
  bool should_training_stop = false;
  bool should_epoch_stop = false;
  bool should_save = false;
  bool should_evaluate = false;
  bool should_log = false;
};

/// What a callback event reaches besides the arguments, state and control flags: the objects
/// HF passes to its events as keyword arguments (`model`, `optimizer`, `lr_scheduler`).
/// Valid during the event only; the Trainer owns everything it points to.
struct TrainerCallbackContext {
  /// The model being trained (cast and on its device once training has started).
  torch::nn::Module* model = nullptr;
  /// The optimizer; null before the Trainer created it.
  torch::optim::Optimizer* optimizer = nullptr;
  /// The learning-rate scheduler; null before the Trainer created it.
  LrScheduler* lr_scheduler = nullptr;
  /// The loss scaler (disabled unless fp16); null before the Trainer configured it.
  const amp::GradScaler* scaler = nullptr;

  /// The learning rate of the first param group, as the scheduler last set it (0 before the
  /// scheduler exists). Host value; no sync.
  double learning_rate() const;
  /// The current loss scale; 1 when loss scaling is off. Syncs with the device when on.
  double loss_scale() const;
};

/// Hooks into the training loop. Override the events you need; each gets the arguments, the
/// state and the control flags it may set, and reaches the model, optimizer and scheduler
/// through `context()`. Python: `transformers.TrainerCallback` (same event names). Called on
/// the host between steps; none of them is made to sync with the device.
class TrainerCallback {
 public:
  virtual ~TrainerCallback() = default;
  virtual void on_train_begin(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_train_end(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_epoch_begin(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_epoch_end(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_step_begin(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  /// After the optimizer step, the scale update and the scheduler step of one update step.
  virtual void on_step_end(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  /// Right before the optimizer step (gradients unscaled and clipped).
  virtual void on_pre_optimizer_step(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_optimizer_step(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_evaluate(const TrainingArguments&, TrainerState&, TrainerControl&,
                           const LogEntry& /*metrics*/) {}
  /// After a checkpoint folder was written and renamed into place.
  virtual void on_save(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_log(const TrainingArguments&, TrainerState&, TrainerControl&,
                      const LogEntry& /*logs*/) {}
  /// After `Trainer::predict()` computed its metrics.
  virtual void on_predict(const TrainingArguments&, TrainerState&, TrainerControl&,
                          const LogEntry& /*metrics*/) {}

 protected:
  /// The Trainer's objects, during an event. Python: the event's `**kwargs`. Throws
  /// `c10::Error` when called outside an event fired by a Trainer.
  const TrainerCallbackContext& context() const;

 private:
  friend class detail::CallbackHandler;
  const TrainerCallbackContext* context_ = nullptr;
};

/// Stops training when the evaluation metric has not improved for `patience` evaluations.
/// Python: `transformers.EarlyStoppingCallback(early_stopping_patience, early_stopping_threshold)`.
/// The metric and its direction are the arguments' `metric_for_best_model` and
/// `greater_is_better` (HF's), unless given here (`"eval_loss"`, `false`).
class EarlyStoppingCallback : public TrainerCallback {
 public:
  explicit EarlyStoppingCallback(std::int64_t patience = 1, double threshold = 0.0,
                                 std::optional<std::string> metric = std::nullopt,
                                 std::optional<bool> greater_is_better = std::nullopt);
  void on_evaluate(const TrainingArguments& args, TrainerState& state, TrainerControl& control,
                   const LogEntry& metrics) override;
  /// Evaluations in a row without improvement so far.
  std::int64_t patience_counter() const noexcept { return patience_counter_; }

 private:
  std::int64_t patience_;
  double threshold_;
  std::optional<std::string> metric_;
  std::optional<bool> greater_is_better_;
  std::optional<double> best_;
  std::int64_t patience_counter_ = 0;
};

}  // namespace mantissa
