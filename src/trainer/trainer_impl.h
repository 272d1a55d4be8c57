#pragma once
// Trainer::Impl: what a Trainer owns, and the wiring between its pieces. Internal: shared by
// trainer_impl.cpp (construction, resume, evaluation, saving), trainer_prepare.cpp (prepare()),
// trainer_train.cpp (train(): the engines and the loop wired together) and trainer.cpp (the
// facade).

#include <memory>
#include <optional>
#include <set>
#include <string>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/trainer.h>

#include "trainer/callback_handler.h"
#include "trainer/checkpoint.h"
#include "trainer/evaluation.h"
#include "trainer/interval_policy.h"
#include "trainer/metrics_log.h"
#include "trainer/model_converter.h"
#include "trainer/optimizer_factory.h"
#include "trainer/progress.h"
#include "trainer/run_schedule.h"
#include "trainer/saved_state.h"
#include "trainer/step_engine.h"
#include "trainer/strategy.h"

namespace mantissa {

/// The functions a user handed to the Trainer's setters; each empty when not set.
struct UserHooks {
  LossWithOutputsFn compute_loss;        ///< set_compute_loss*; empty: the default loss
  MetricsFn compute_metrics;             ///< set_compute_metrics
  PreprocessLogitsFn preprocess_logits;  ///< set_preprocess_logits_for_metrics
  OptimizerFactory optimizer_factory;    ///< set_optimizer_factory; empty: args.optim
  SchedulerFactory scheduler_factory;    ///< set_lr_scheduler_factory; empty: args'
};

/// What `prepare()` creates from the model and the arguments, once: what an update touches
/// and a checkpoint holds.
struct TrainingObjects {
  detail::RunSchedule schedule;                 ///< batches, updates, epochs of this dataset
  std::unique_ptr<amp::MasterWeights> masters;  ///< null without fp32 masters
  detail::TrainerOptimizer optimizer;           ///< the optimizer, its FusedAdamW view, params
  std::unique_ptr<LrScheduler> scheduler;       ///< set last: non-null means prepared
  /// Disabled until prepare() configures it from the plan (loss scaling for fp16).
  amp::GradScaler scaler{amp::GradScalerOptions().enabled(false)};
  /// The pieces of state with files of their own in checkpoints (the model converters'),
  /// registered as prepare() creates them.
  detail::SavedStates saved_states;
};

/// The Trainer's objects and the steps that wire them together. Reached only through
/// `Trainer`'s methods.
class Trainer::Impl {
 public:
  /// Validates `args`, joins a job of several processes when launched as one (the strategy),
  /// and decides the precision plan; creates nothing on the device yet.
  Impl(std::shared_ptr<torch::nn::Module> module, ForwardFn forward, TrainingArguments args,
       BatchSource train, std::optional<BatchSource> eval);

  /// What the Trainer's setters fill in; settable until `prepare()` for the factories.
  UserHooks& hooks() noexcept { return hooks_; }
  /// Appends a callback (not null).
  void add_callback(std::shared_ptr<TrainerCallback> callback) {
    callbacks_.add(std::move(callback));
  }
  const ForwardFn& forward() const noexcept { return forward_; }

  /// Computes the schedule and creates the masters, optimizer, scheduler and scaler, once.
  /// The model is cast and moved to the device, and handed to the strategy, here. No sync.
  void prepare();
  /// Whether `prepare()` has completed.
  bool prepared() const noexcept { return objects_.scheduler != nullptr; }

  /// Python: `Trainer.train` (trainer_train.cpp).
  TrainOutput train(std::optional<std::string> resume);
  /// Evaluates `dataset` (the eval dataset when null), logs the metrics and fires
  /// `on_evaluate`; during training also updates the best metric. Python: `Trainer.evaluate`.
  /// Syncs.
  LogEntry evaluate(const BatchSource* dataset, const std::string& prefix, bool during_train);
  /// Runs `dataset` as an evaluation, keeping the predictions; fires `on_predict`.
  PredictionOutput predict(const BatchSource& dataset, const std::string& prefix);
  /// Writes model.safetensors and training_args.json into `dir`, on the processes that save.
  void save_model(const std::string& dir) const;
  io::NamedTensors model_state_dict() const;

  const TrainerState& state() const noexcept { return state_; }
  const TrainingArguments& args() const noexcept { return args_; }
  const PrecisionPlan& plan() const noexcept { return plan_; }
  const amp::GradScaler& scaler() const noexcept { return objects_.scaler; }
  /// After `prepare()`.
  torch::optim::Optimizer& optimizer() { return *objects_.optimizer.optimizer; }
  /// After `prepare()`.
  LrScheduler& lr_scheduler() { return *objects_.scheduler; }
  /// The model converter of type `T` the plan asked for, or null; set up before `prepare()`,
  /// its state read after.
  template <typename T>
  T* model_converter() const {
    return detail::find_model_converter<T>(converters_);
  }

 private:
  // ---- setup (trainer_prepare.cpp) and resume (trainer_impl.cpp) ----------------------------

  /// Refuses a non-empty output_dir that this run did not write, unless resuming or
  /// `overwrite_output_dir`; checked by the processes that write, agreed by all. Python: the
  /// same check in `Trainer.train`.
  void check_output_dir(bool resuming) const;
  // --gradient_checkpointing: model.gradient_checkpointing_enable(), or an error naming the flag.
  void enable_gradient_checkpointing();
  /// A fresh TrainerState for this run: its sizes and intervals, step 0.
  void start_state();
  /// Sets `state`'s process flags (`is_world_process_zero`, `is_local_process_zero`).
  void mark_process(TrainerState& state) const;
  /// The checkpoint folder `resume` names (`latest` resolved), or nullopt for a fresh start.
  /// Every process agrees on it first (a collective): all resume the same one, or all stop.
  std::optional<std::string> checkpoint_to_resume(const std::optional<std::string>& resume) const;
  /// Restores the checkpoint in `dir` after checking that it can continue in this run: its
  /// arguments (errors for those that move the data position, warnings for the rest) and its
  /// saved position. This run's intervals and sizes replace the saved ones in the state.
  void load_for_resume(const std::string& dir);
  /// What a checkpoint saves and restores: the model, masters, optimizer, scheduler, scaler,
  /// state and arguments.
  detail::CheckpointParts checkpoint_parts();
  /// The training loss of one batch: the user's, else the model's own, else cross-entropy of
  /// the logits against the labels. Called under autocast by the step engines.
  torch::Tensor compute_loss(const Batch& batch);
  /// Points the callback context at what exists now (after prepare(), the optimizer too).
  void update_callback_context();
  /// What a step engine works on during a `train()` that reports through `progress_`.
  detail::StepParts step_parts(detail::LossWindow& loss_window);
  /// What an evaluation or a prediction runs on: this Trainer's model, functions and plan.
  detail::EvaluationParts evaluation_parts();

  // ---- logging, evaluation, saving (trainer_impl.cpp) ---------------------------------------

  /// Records `logs` (with the epoch, and the step in the history and trainer_log.jsonl),
  /// prints it and fires `on_log`. Python: `Trainer.log`.
  void log(LogEntry logs);
  /// `learning_rate`, and with loss scaling `loss_scale` and `skipped_steps`, into `logs`.
  void add_optimizer_values(LogEntry& logs) const;
  /// Whether `metrics` improve the best metric (`metric_for_best_model`); records it, and the
  /// step, when they do. Python: `Trainer._determine_best_metric`.
  bool update_best_metric(const LogEntry& metrics);
  /// Loads the weights of `best_model_checkpoint` into the model (and its masters).
  /// Python: `Trainer._load_best_model`.
  void load_best_model();
  /// Writes `checkpoint-<global_step>`, rotates old ones, fires `on_save`. Syncs.
  void save_checkpoint();
  /// After the first update of this Trainer, on the process that logs: the bytes of
  /// optimizer state (and fp32 masters) it holds, unless the strategy described its own at the
  /// start. Python has no such line.
  void report_optimizer_state_once();
  /// At the end of `train()`: the best model loaded back (`load_best_model_at_end`), and with
  /// `save_total_limit` 1 only the best checkpoint kept.
  void finish_training();

  // ---- what the Trainer was given ----------------------------------------------------------

  std::shared_ptr<torch::nn::Module> module_;   ///< the model (cast and moved by prepare())
  ForwardFn forward_;                           ///< its forward pass
  TrainingArguments args_;                      ///< validated at construction
  BatchSource train_;                           ///< the training dataset
  std::optional<BatchSource> eval_;             ///< the evaluation dataset, if any
  c10::Device device_;                          ///< where the model trains (`args.device()`)
  std::unique_ptr<detail::Strategy> strategy_;  ///< what spans processes; chosen once
  PrecisionPlan plan_;                          ///< decided at construction
  /// What the plan converts in the model (prepare() runs them); made at construction.
  std::vector<std::unique_ptr<detail::ModelConverter>> converters_;
  detail::IntervalPolicy intervals_;  ///< the strategies, parsed at construction
  UserHooks hooks_;

  // ---- where training stands ---------------------------------------------------------------

  TrainerState state_;      ///< reset by each train(), restored when resuming
  TrainerControl control_;  ///< the flags callbacks set
  /// What callback events reach through `context()`; filled by update_callback_context().
  TrainerCallbackContext callback_context_;
  /// The callbacks, bound to `args_`, `state_`, `control_` and the context (declared before).
  detail::CallbackHandler callbacks_{args_, state_, control_, callback_context_};
  /// An evaluation improved `best_metric` since the last checkpoint: the next one is the best.
  bool best_unsaved_ = false;
  /// The optimizer state's size has been reported (report_optimizer_state_once).
  bool optimizer_state_reported_ = false;
  /// Built-in metrics that a compute_metrics value replaced and that were warned about.
  std::set<std::string> warned_metric_replacements_;

  TrainingObjects objects_;  ///< created by prepare()

  // ---- output ------------------------------------------------------------------------------

  /// trainer_log.jsonl: the first callback on the processes that save.
  std::shared_ptr<detail::MetricsLog> metrics_log_ =
      std::make_shared<detail::MetricsLog>(args_.output_dir());
  detail::Progress quiet_{0, false};      ///< the output outside train()
  detail::Progress* progress_ = &quiet_;  ///< a bar during train(), else quiet_
};

}  // namespace mantissa
