#pragma once
// Trainer::Impl: what a Trainer owns. Internal: shared by trainer.cpp (construction, setup,
// evaluation, saving) and trainer_loop.cpp (train()).

#include <memory>
#include <optional>
#include <string>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/trainer.h>

#include "trainer/callback_handler.h"
#include "trainer/checkpoint.h"
#include "trainer/data_parallel.h"
#include "trainer/evaluation.h"
#include "trainer/gradient_sync.h"
#include "trainer/interval_policy.h"
#include "trainer/metrics_log.h"
#include "trainer/optimizer_factory.h"
#include "trainer/progress.h"
#include "trainer/run_schedule.h"
#include "trainer/step_engine.h"

namespace mantissa {

/// The Trainer's objects and the steps that use them. Members are public: this class is the
/// Trainer's inside, reached only through `Trainer`'s methods.
class Trainer::Impl {
 public:
  /// Validates `args` and decides the precision plan; creates nothing on the device yet.
  Impl(std::shared_ptr<torch::nn::Module> module, ForwardFn forward, TrainingArguments args,
       BatchSource train, std::optional<BatchSource> eval);

  // ---- setup (trainer.cpp) ----------------------------------------------------------------

  /// Computes the schedule and creates the masters, optimizer, scheduler and scaler, once.
  /// The model is cast and moved to the device here. No sync.
  void prepare();
  /// Whether `prepare()` has completed.
  bool prepared() const noexcept { return scheduler_ != nullptr; }
  /// Refuses a non-empty output_dir that this run did not write, unless resuming or
  /// `overwrite_output_dir`. Python: the same check in `Trainer.train`.
  void check_output_dir(bool resuming) const;
  /// A fresh TrainerState for this run: its sizes and intervals, step 0.
  void start_state();
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

  // ---- several processes (trainer.cpp) -----------------------------------------------------

  /// Whether this process writes checkpoints, trainer_log.jsonl and saved models: rank 0, and
  /// with `save_on_each_node` the first process of every node. Python: `args.should_save`.
  bool should_save() const;
  /// Whether this process prints log lines and the progress bar: the first process of every
  /// node with `log_on_each_node`, else rank 0 alone. Python: `args.should_log`.
  bool should_log() const;
  /// Processes in the run (1 alone).
  std::int64_t world_size() const { return data_parallel_ ? data_parallel_->world_size() : 1; }
  /// Training examples this process visits per epoch: its `DistributedSampler` share.
  std::int64_t examples_per_process() const;
  /// The sum of `values` over the processes (the values themselves for a lone process).
  std::vector<double> sum_over_processes(std::vector<double> values) const;
  /// Sets `state`'s process flags (`is_world_process_zero`, `is_local_process_zero`).
  void mark_process(TrainerState& state) const;
  /// `check_output_dir` by the processes that write, agreed by all: every process stops when
  /// one refuses.
  void check_output_dir_on_all(bool resuming) const;
  /// Copies rank 0's loss-scaler state to every process (loss scaling only), so that every
  /// rank skips the same steps.
  void broadcast_scaler_state();
  /// A checkpoint written together: the writers write it, every process adds its random
  /// state, and all leave only once it is published (or abandoned everywhere).
  void save_checkpoint_with_peers(const detail::CheckpointParts& parts);

  // ---- logging, evaluation, saving (trainer.cpp) ------------------------------------------

  /// Records `logs` (with the epoch, and the step in the history and trainer_log.jsonl),
  /// prints it and fires `on_log`. Python: `Trainer.log`.
  void log(LogEntry logs);
  /// Evaluates `dataset` (the eval dataset when null), logs the metrics and fires
  /// `on_evaluate`; during training also updates the best metric. Python: `Trainer.evaluate`.
  /// Syncs.
  LogEntry evaluate(const BatchSource* dataset, const std::string& prefix, bool during_train);
  /// What an evaluation or a prediction runs on: this Trainer's model, functions and plan.
  detail::EvaluationParts evaluation_parts();
  /// Runs `dataset` as an evaluation, keeping the predictions; fires `on_predict`.
  PredictionOutput predict(const BatchSource& dataset, const std::string& prefix);
  /// Whether `metrics` improve the best metric (`metric_for_best_model`); records it, and the
  /// step, when they do. Python: `Trainer._determine_best_metric`.
  bool update_best_metric(const LogEntry& metrics);
  /// Loads the weights of `best_model_checkpoint` into the model (and its masters).
  /// Python: `Trainer._load_best_model`.
  void load_best_model();
  /// Writes `checkpoint-<global_step>`, rotates old ones, fires `on_save`. Syncs.
  void save_checkpoint();

  // ---- the loop (trainer_loop.cpp) --------------------------------------------------------

  /// The per-call state of one `train()`: the loss window, the step engine, throughput.
  struct Run;
  /// Python: `Trainer.train` / `_inner_training_loop`.
  TrainOutput train(std::optional<std::string> resume);
  /// One epoch from micro-batch `skip` (a resumed run's position) on: on_epoch_begin, the
  /// batches (on_step_begin at each accumulation group, the engine, on_step_end and what is
  /// due after each update), on_epoch_end and what is due then. Stops early when the control
  /// flags say so or `max_steps` is reached.
  void train_epoch(Run& run, std::int64_t epoch, std::int64_t skip);
  /// The seed of every epoch's data order: `data_seed`, else `seed`.
  std::uint64_t data_seed() const;
  /// Asks the interval policy and the callbacks' flags whether to log, evaluate and save, and
  /// does so. Python: `Trainer._maybe_log_save_evaluate`.
  void maybe_log_save_evaluate(Run& run, bool epoch_end);
  /// The training log line of the window that ends now. Syncs.
  void log_training_progress(Run& run);
  /// Several processes: adds every process's tokens since the last call to the state's count
  /// and the log window's. A collective.
  void share_token_counts(Run& run);
  /// The checkpoint folder `resume` names (`latest` resolved), or nullopt for a fresh start.
  /// Several processes agree on it first (a collective): all resume the same one, or all stop.
  std::optional<std::string> checkpoint_to_resume(const std::optional<std::string>& resume) const;
  /// The loss window's inf/nan streak check; with several processes every one stops when any
  /// does (a collective).
  void check_nonfinite_on_all(Run& run) const;

  // ---- what the Trainer was given ----------------------------------------------------------

  std::shared_ptr<torch::nn::Module> module_;  ///< the model (cast and moved by prepare())
  ForwardFn forward_;                          ///< its forward pass
  TrainingArguments args_;                     ///< validated at construction
  BatchSource train_;                          ///< the training dataset
  std::optional<BatchSource> eval_;            ///< the evaluation dataset, if any
  c10::Device device_;                         ///< where the model trains (`args.device()`)
  PrecisionPlan plan_;                         ///< decided at construction
  detail::IntervalPolicy intervals_;           ///< the strategies, parsed at construction
  LossWithOutputsFn compute_loss_;             ///< set_compute_loss*; empty: the default loss
  MetricsFn compute_metrics_;                  ///< set_compute_metrics; empty: none
  PreprocessLogitsFn preprocess_logits_;       ///< set_preprocess_logits_for_metrics
  OptimizerFactory optimizer_factory_;         ///< set_optimizer_factory; empty: args.optim
  SchedulerFactory scheduler_factory_;         ///< set_lr_scheduler_factory; empty: args'

  /// The process group of a run started as several processes; null for a lone process.
  std::shared_ptr<detail::DataParallel> data_parallel_;

  // ---- where training stands ---------------------------------------------------------------

  TrainerState state_;      ///< reset by each train(), restored when resuming
  TrainerControl control_;  ///< the flags callbacks set
  /// What callback events reach through `context()`; filled by update_callback_context().
  TrainerCallbackContext callback_context_;
  /// The callbacks, bound to `args_`, `state_`, `control_` and the context (declared before).
  detail::CallbackHandler callbacks_{args_, state_, control_, callback_context_};
  /// An evaluation improved `best_metric` since the last checkpoint: the next one is the best.
  bool best_unsaved_ = false;

  // ---- created by prepare() ----------------------------------------------------------------

  detail::RunSchedule schedule_;                 ///< batches, updates, epochs of this dataset
  std::unique_ptr<amp::MasterWeights> masters_;  ///< null without fp32 masters
  detail::TrainerOptimizer optimizer_;           ///< the optimizer, its FusedAdamW view, params
  std::unique_ptr<detail::GradientSync> gradient_sync_;  ///< with data_parallel_ only
  std::unique_ptr<LrScheduler> scheduler_;               ///< set last: non-null means prepared
  /// Disabled until prepare() configures it from the plan (loss scaling for fp16).
  amp::GradScaler scaler_{amp::GradScalerOptions().enabled(false)};

  // ---- output ------------------------------------------------------------------------------

  detail::MetricsLog metrics_log_{args_.output_dir()};  ///< trainer_log.jsonl
  detail::Progress quiet_{0, false};                    ///< the output outside train()
  detail::Progress* progress_ = &quiet_;                ///< a bar during train(), else quiet_
};

}  // namespace mantissa
