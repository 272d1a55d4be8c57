// Trainer::Impl: construction, resume, evaluation and saving; prepare() is in
// trainer_prepare.cpp, train() in trainer_train.cpp, the facade in trainer.cpp.
#include "trainer/trainer_impl.h"

#include <c10/util/StringUtil.h>
#include <fmt/format.h>

#include <mantissa/io/pretrained_weights.h>
#include <mantissa/io/safetensors.h>

#include "io/filesystem.h"
#include "shorten.h"

#include "trainer/batch_roles.h"
#include "trainer/best_metric.h"
#include "trainer/checkpoint.h"
#include "trainer/evaluation.h"
#include "trainer/precision_plan.h"
#include "trainer/reporting.h"
#include "trainer/resume_check.h"

namespace mantissa {

Trainer::Impl::Impl(std::shared_ptr<torch::nn::Module> module, ForwardFn forward,
                    TrainingArguments args, BatchSource train, std::optional<BatchSource> eval)
    : module_(std::move(module)),
      forward_(std::move(forward)),
      args_(std::move(args)),
      train_(std::move(train)),
      eval_(std::move(eval)),
      device_(c10::kCPU) {
  TORCH_CHECK_VALUE(module_ != nullptr, "Trainer: the model is null");
  args_.validate();
  device_ = args_.device();
  strategy_ = detail::make_strategy(args_, device_);
  mark_process(state_);
  plan_ = detail::make_precision_plan(args_, detail::floating_param_dtype(*module_));
  converters_ = detail::make_model_converters(plan_);
  intervals_ = detail::make_interval_policy(args_);
  // trainer_log.jsonl is written first, on the processes that save; report_to's callbacks come
  // next, before those the user adds, as in HF.
  if (strategy_->should_save()) callbacks_.add(metrics_log_);
  for (auto& callback : detail::make_reporting_callbacks(args_)) {
    callbacks_.add(std::move(callback));
  }
  update_callback_context();
}

void Trainer::Impl::update_callback_context() {
  callback_context_.model = module_.get();
  callback_context_.optimizer = objects_.optimizer.optimizer.get();
  callback_context_.lr_scheduler = objects_.scheduler.get();
  callback_context_.scaler = prepared() ? &objects_.scaler : nullptr;
}

void Trainer::Impl::check_output_dir(bool resuming) const {
  const auto& dir = args_.output_dir();
  const bool accepted = strategy_->passed_everywhere([&] {
    // What this Trainer wrote itself (an evaluate() before train()) does not count.
    if (!strategy_->should_save() || resuming || metrics_log_->wrote() ||
        args_.overwrite_output_dir() || !io::is_directory(dir)) {
      return;
    }
    TORCH_CHECK_VALUE(io::list_directory(dir).empty(), "Output directory (",
                      detail::shorten_path(dir),
                      ") already exists and is not empty. Use --overwrite_output_dir to overcome, "
                      "or --resume_from_checkpoint latest to continue its run.");
  });
  TORCH_CHECK_VALUE(accepted, "rank ", strategy_->rank(),
                    ": another process refused the output_dir '", detail::shorten_path(dir),
                    "' (see rank 0's error)");
}

void Trainer::Impl::mark_process(TrainerState& state) const {
  state.is_world_process_zero = strategy_->is_main_process();
  state.is_local_process_zero = strategy_->is_local_main_process();
}

// ---- run state ----------------------------------------------------------------------------

void Trainer::Impl::start_state() {
  const auto max_steps = objects_.schedule.max_steps;
  state_ = TrainerState{};
  mark_process(state_);
  state_.max_steps = max_steps;
  state_.logging_steps = TrainingArguments::resolve_steps(args_.logging_steps(), max_steps);
  state_.eval_steps = TrainingArguments::resolve_steps(args_.resolved_eval_steps(), max_steps);
  state_.save_steps = TrainingArguments::resolve_steps(args_.save_steps(), max_steps);
  state_.train_batch_size = args_.per_device_train_batch_size();
  state_.num_train_epochs = objects_.schedule.num_epochs;
}

std::optional<std::string> Trainer::Impl::checkpoint_to_resume(
    const std::optional<std::string>& resume) const {
  // Every process resolves its own ("latest" looks at its output_dir), then all agree, before
  // any of them starts the collectives of a resume that the others would not run.
  std::optional<std::string> dir;
  const bool found = strategy_->passed_everywhere([&] {
    if (resume) dir = detail::resolve_checkpoint(*resume, args_.output_dir());
  });
  TORCH_CHECK_VALUE(found, "rank ", strategy_->rank(),
                    ": another process cannot find the checkpoint to resume from (see its error)");
  strategy_->check_same_text(dir.value_or("(none: a fresh start)"),
                             "the checkpoint to resume from");
  return dir;
}

void Trainer::Impl::load_for_resume(const std::string& dir) {
  // A run of another size: its position within an epoch means other batches here, so the
  // run continues at its global_step placed as HF places it (whole epochs of this run's size).
  // One count: it reads an rng_state file.
  const auto saved_processes = io::is_directory(dir) ? detail::saved_process_count(dir) : 0;
  const bool other_world_size = saved_processes > 0 && saved_processes != strategy_->world_size();
  bool batch_regrouped = false;
  if (other_world_size) {
    if (state_.is_world_process_zero) {
      TORCH_WARN("resuming from '", dir, "', which a run of ", saved_processes,
                 " process(es) saved, with ", strategy_->world_size(),
                 " process(es): the examples each step sees (and the random states) now differ "
                 "from those of an uninterrupted run");
    }
  }
  if (const auto saved = detail::load_checkpoint_arguments(dir)) {
    const auto changes = detail::compare_resumed_arguments(
        args_, *saved, {strategy_->world_size(), saved_processes});
    TORCH_CHECK_VALUE(changes.errors.empty(), "cannot resume from '", dir,
                      "': ", c10::Join("; ", changes.errors),
                      ". Resume with the saved values, or start a new run in another output_dir.");
    if (!changes.warnings.empty()) {
      TORCH_WARN("resuming from '", dir,
                 "' with arguments that differ from its training_args.json: ",
                 c10::Join("; ", changes.warnings));
    }
    batch_regrouped = changes.batch_regrouped;
  }
  const TrainerState fresh = state_;
  auto parts = checkpoint_parts();
  // The same global batch cut otherwise (compare_resumed_arguments) is placed by global_step
  // too: its position in the epoch and its train_batch_size count batches of the old size.
  const bool by_global_step = other_world_size || batch_regrouped;
  parts.check_state = [this, by_global_step, batch_regrouped](TrainerState saved) {
    if (by_global_step) saved.steps_in_epoch = 0;
    if (batch_regrouped) saved.train_batch_size = 0;
    detail::resume_position(saved, objects_.schedule.run_shape());
  };
  strategy_->load_checkpoint(dir, parts);
  if (by_global_step) state_.steps_in_epoch = 0;
  mark_process(state_);
  // What the interrupted run logged past its checkpoint is logged again from here.
  if (strategy_->should_save()) metrics_log_->drop_after(state_.global_step);
  state_.max_steps = fresh.max_steps;
  state_.logging_steps = fresh.logging_steps;
  state_.eval_steps = fresh.eval_steps;
  state_.save_steps = fresh.save_steps;
  state_.train_batch_size = fresh.train_batch_size;
  state_.num_train_epochs = fresh.num_train_epochs;
}

detail::CheckpointParts Trainer::Impl::checkpoint_parts() {
  detail::CheckpointParts parts;
  parts.model = module_.get();
  parts.masters = objects_.masters.get();
  parts.optimizer = objects_.optimizer.optimizer.get();
  parts.scheduler = objects_.scheduler.get();
  parts.scaler = &objects_.scaler;
  parts.state = &state_;
  parts.args = &args_;
  parts.process_index = strategy_->rank();
  parts.num_processes = strategy_->world_size();
  parts.saved_states = &objects_.saved_states;
  return parts;
}

torch::Tensor Trainer::Impl::compute_loss(const Batch& batch) {
  if (hooks_.compute_loss) return hooks_.compute_loss(batch).first;
  return detail::required_default_loss(args_, forward_(batch), batch);
}

detail::StepParts Trainer::Impl::step_parts(detail::LossWindow& loss_window) {
  return detail::StepParts{args_,
                           plan_,
                           device_,
                           *module_,
                           [this](const Batch& batch) { return compute_loss(batch); },
                           objects_.masters.get(),
                           *objects_.optimizer.optimizer,
                           objects_.optimizer.fused,
                           objects_.optimizer.params,
                           *objects_.scheduler,
                           objects_.scaler,
                           callbacks_,
                           state_,
                           loss_window,
                           *progress_,
                           *strategy_,
                           &objects_.saved_states};
}
// ---- logging, evaluation, saving ------------------------------------------------------------

void Trainer::Impl::log(LogEntry logs) {
  logs["epoch"] = state_.epoch;
  LogEntry with_step = logs;
  with_step["step"] = static_cast<double>(state_.global_step);
  state_.log_history.push_back(std::move(with_step));
  if (strategy_->should_log()) progress_->print(detail::format_log(logs));
  // The first callback on a saving process appends the entry to trainer_log.jsonl.
  callbacks_.fire(&TrainerCallback::on_log, logs);
}

detail::EvaluationParts Trainer::Impl::evaluation_parts() {
  return {args_,
          plan_,
          device_,
          *module_,
          forward_,
          hooks_.compute_loss,
          hooks_.compute_metrics,
          hooks_.preprocess_logits,
          *strategy_,
          warned_metric_replacements_};
}

LogEntry Trainer::Impl::evaluate(const BatchSource* dataset, const std::string& prefix,
                                 bool during_train) {
  if (dataset == nullptr) {
    TORCH_CHECK_VALUE(eval_.has_value(),
                      "Trainer: evaluation requires an eval_dataset (give one to the Trainer's "
                      "constructor, or to evaluate())");
    dataset = &*eval_;
  }
  const auto metrics = detail::run_evaluation(evaluation_parts(), *dataset, prefix, during_train,
                                              /*keep_predictions=*/false)
                           .metrics;
  if (during_train && update_best_metric(metrics)) best_unsaved_ = true;
  log(metrics);
  callbacks_.fire(&TrainerCallback::on_evaluate, metrics);
  return metrics;
}

PredictionOutput Trainer::Impl::predict(const BatchSource& dataset, const std::string& prefix) {
  auto result = detail::run_evaluation(evaluation_parts(), dataset, prefix, /*during_train=*/false,
                                       /*keep_predictions=*/true);
  callbacks_.fire(&TrainerCallback::on_predict, result.metrics);
  return PredictionOutput{std::move(result.predictions), std::move(result.label_ids),
                          std::move(result.metrics)};
}

bool Trainer::Impl::update_best_metric(const LogEntry& metrics) {
  const auto best = detail::improved_best_metric(args_, metrics, state_.best_metric);
  if (!best) return false;
  state_.best_metric = *best;
  state_.best_global_step = state_.global_step;
  return true;
}

void Trainer::Impl::load_best_model() {
  const auto& dir = *state_.best_model_checkpoint;
  progress_->print(fmt::format(
      "mantissa: loading the best model from {} ({} {})", dir,
      args_.resolved_metric_for_best_model(),
      state_.best_metric ? fmt::format("{:g}", *state_.best_metric) : std::string("unknown")));
  strategy_->load_checkpoint_weights(*module_, dir, objects_.masters.get());
}

void Trainer::Impl::save_checkpoint() {
  // A checkpoint that holds the best evaluation so far names itself in its own
  // trainer_state.json, as HF's do; a failed save leaves the state as it was.
  const auto previous_best = state_.best_model_checkpoint;
  if (best_unsaved_) {
    state_.best_model_checkpoint =
        io::join_path(args_.output_dir(), detail::checkpoint_name(state_.global_step));
  }
  try {
    strategy_->save_checkpoint(args_.output_dir(), checkpoint_parts());
  } catch (...) {
    state_.best_model_checkpoint = previous_best;
    throw;
  }
  best_unsaved_ = false;
  if (args_.save_total_limit() && strategy_->should_save()) {
    detail::rotate_checkpoints(args_.output_dir(), *args_.save_total_limit(),
                               state_.best_model_checkpoint);
  }
  callbacks_.fire(&TrainerCallback::on_save);
}

void Trainer::Impl::add_optimizer_values(LogEntry& logs) const {
  logs["learning_rate"] = objects_.scheduler->get_last_lr().at(0);
  if (plan_.loss_scaling) {
    logs["loss_scale"] = objects_.scaler.get_scale();
    logs["skipped_steps"] = static_cast<double>(state_.skipped_steps);
  }
}

void Trainer::Impl::finish_training() {
  if (args_.load_best_model_at_end() && state_.best_model_checkpoint) load_best_model();
  if (args_.load_best_model_at_end() && !state_.best_model_checkpoint &&
      strategy_->is_main_process()) {
    TORCH_WARN(
        "load_best_model_at_end: no best model was found (no evaluation of this run "
        "saved a checkpoint), so the model keeps the weights of its last step");
  }
  if (state_.best_model_checkpoint && args_.save_total_limit() == 1 && strategy_->should_save()) {
    // HF: with a limit of one, the run ends with the best checkpoint alone.
    detail::rotate_checkpoints(args_.output_dir(), 1, state_.best_model_checkpoint,
                               /*keep_latest=*/false);
  }
}

io::NamedTensors Trainer::Impl::model_state_dict() const {
  auto state = strategy_->model_state_dict(*module_);
  if (!strategy_->should_save()) state.clear();
  return state;
}

void Trainer::Impl::save_model(const std::string& dir) const {
  // Every process hands over its part of the state; only those that save write it (HF).
  const auto state = strategy_->model_state_dict(*module_);
  if (!strategy_->should_save()) return;
  io::create_directories(dir);
  // One model.safetensors, or shards with their index above HF's 50 GB, as save_pretrained.
  io::save_pretrained_weights(dir, state);
  detail::write_pretrained_config(dir, *module_, state);
  args_.save_json(io::join_path(dir, "training_args.json"));
}

}  // namespace mantissa
