// mantissa::Trainer: construction, setup, evaluation and saving; the loop is in trainer_loop.cpp.
#include <mantissa/trainer.h>

#include <cmath>
#include <limits>

#include <c10/util/StringUtil.h>
#include <fmt/format.h>

#include <mantissa/io/safetensors.h>
#include <torch/serialize.h>

#include "io/filesystem.h"

#include "trainer/batch_roles.h"
#include "trainer/checkpoint.h"
#include "trainer/evaluation.h"
#include "trainer/precision_plan.h"
#include "trainer/reporting.h"
#include "trainer/resume_check.h"
#include "trainer/trainer_impl.h"

namespace mantissa {
namespace {

c10::ScalarType floating_param_dtype(const torch::nn::Module& module) {
  std::optional<c10::ScalarType> dtype;
  for (const auto& item : module.named_parameters()) {
    const auto t = item.value().scalar_type();
    if (!c10::isFloatingType(t)) continue;
    if (!dtype) dtype = t;
    TORCH_CHECK_VALUE(*dtype == t, "the model mixes parameter dtypes (", *dtype, " and ", t,
                      " in '", item.key(),
                      "'); the Trainer expects one floating dtype for all parameters");
  }
  TORCH_CHECK_VALUE(dtype.has_value(), "the model has no floating-point parameters to train");
  return *dtype;
}

}  // namespace

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
  data_parallel_ = detail::DataParallel::join_if_launched(args_, device_);
  if (data_parallel_) data_parallel_->check_same_arguments(args_);
  mark_process(state_);
  plan_ = detail::make_precision_plan(args_, floating_param_dtype(*module_));
  intervals_ = detail::make_interval_policy(args_);
  // report_to's callbacks come before those the user adds, as in HF.
  for (auto& callback : detail::make_reporting_callbacks(args_)) {
    callbacks_.add(std::move(callback));
  }
  update_callback_context();
}

void Trainer::Impl::update_callback_context() {
  callback_context_.model = module_.get();
  callback_context_.optimizer = optimizer_.optimizer.get();
  callback_context_.lr_scheduler = scheduler_.get();
  callback_context_.scaler = prepared() ? &scaler_ : nullptr;
}

// ---- setup ----------------------------------------------------------------------------------

void Trainer::Impl::prepare() {
  if (prepared()) return;
  schedule_ = detail::make_run_schedule(static_cast<std::size_t>(examples_per_process()), args_);
  if (plan_.param_dtype != floating_param_dtype(*module_)) module_->to(plan_.param_dtype);
  module_->to(device_);
  if (data_parallel_) {
    // DDP's constructor: the same model everywhere, then rank 0's weights everywhere (before
    // the fp32 masters copy them).
    data_parallel_->check_same_parameters(*module_);
    data_parallel_->broadcast_module_states(*module_, args_.resolved_ddp_broadcast_buffers());
  }
  if (plan_.weights == WeightsMode::kFp32Masters) {
    masters_ = std::make_unique<amp::MasterWeights>(module_->parameters());
  }
  optimizer_ = detail::make_trainer_optimizer(args_, module_->parameters(), masters_.get(),
                                              plan_.low_precision_update, optimizer_factory_);
  if (optimizer_factory_) {
    // A user's optimizer writes low-precision weights its own way.
    const auto& groups = optimizer_.optimizer->param_groups();
    plan_.low_precision_update =
        optimizer_.fused != nullptr
            ? static_cast<const optim::FusedAdamWOptions&>(groups.front().options())
                  .low_precision_update()
            : optim::LowPrecisionUpdate::kNearest;
  }
  if (plan_.weights == WeightsMode::kPureLowPrecision &&
      plan_.low_precision_update == optim::LowPrecisionUpdate::kNearest) {
    amp::warn_pure_low_precision_once(plan_.param_dtype);
  }
  auto& optimizer = *optimizer_.optimizer;
  const auto max_steps = schedule_.max_steps;
  auto scheduler = scheduler_factory_
                       ? scheduler_factory_(optimizer, max_steps)
                       : std::make_unique<LrScheduler>(optimizer, args_.lr_scheduler_type().value(),
                                                       args_.get_warmup_steps(max_steps), max_steps,
                                                       args_.lr_scheduler_kwargs());
  TORCH_CHECK_VALUE(scheduler != nullptr, "the scheduler factory returned null");
  scaler_ = amp::GradScaler(
      amp::GradScalerOptions()
          .enabled(plan_.loss_scaling)
          .init_scale(args_.init_loss_scale())
          .growth_interval(args_.loss_scale_window())
          .hysteresis(args_.hysteresis())
          .consecutive_hysteresis(args_.consecutive_hysteresis())
          .min_scale(args_.min_loss_scale())
          .max_scale(args_.max_loss_scale().value_or(std::numeric_limits<double>::infinity())));
  if (data_parallel_) {
    gradient_sync_ = std::make_unique<detail::GradientSync>(*data_parallel_, *module_, args_);
  }
  scheduler_ = std::move(scheduler);  // last: it marks the Trainer prepared
  update_callback_context();
}

void Trainer::Impl::check_output_dir(bool resuming) const {
  const auto& dir = args_.output_dir();
  // What this Trainer wrote itself (an evaluate() before train()) does not count.
  if (resuming || metrics_log_.wrote() || args_.overwrite_output_dir() || !io::is_directory(dir)) {
    return;
  }
  TORCH_CHECK_VALUE(io::list_directory(dir).empty(), "Output directory (", dir,
                    ") already exists and is not empty. Use --overwrite_output_dir to overcome, or "
                    "--resume_from_checkpoint latest to continue its run.");
}

// ---- several processes ------------------------------------------------------------------

bool Trainer::Impl::should_save() const {
  if (!data_parallel_) return true;
  const auto& env = data_parallel_->env();
  return env.is_main_process() || (args_.save_on_each_node() && env.is_local_main_process());
}

bool Trainer::Impl::should_log() const {
  if (!data_parallel_) return true;
  const auto& env = data_parallel_->env();
  return args_.log_on_each_node() ? env.is_local_main_process() : env.is_main_process();
}

std::int64_t Trainer::Impl::examples_per_process() const {
  const auto n = static_cast<std::int64_t>(train_.size);
  if (!data_parallel_) return n;
  return static_cast<std::int64_t>(
      distributed::distributed_sampler_indices(n, world_size(), data_parallel_->rank(), 0, 0,
                                               /*shuffle=*/false, args_.dataloader_drop_last())
          .size());
}

std::vector<double> Trainer::Impl::sum_over_processes(std::vector<double> values) const {
  return data_parallel_ ? data_parallel_->sum(std::move(values)) : values;
}

void Trainer::Impl::mark_process(TrainerState& state) const {
  state.is_world_process_zero = !data_parallel_ || data_parallel_->env().is_main_process();
  state.is_local_process_zero = !data_parallel_ || data_parallel_->env().is_local_main_process();
}

void Trainer::Impl::check_output_dir_on_all(bool resuming) const {
  if (!data_parallel_) return check_output_dir(resuming);
  const bool accepted = data_parallel_->passed_everywhere([&] {
    if (should_save()) check_output_dir(resuming);
  });
  TORCH_CHECK_VALUE(accepted, "rank ", data_parallel_->rank(),
                    ": another process refused the output_dir '", args_.output_dir(),
                    "' (see rank 0's error)");
}

void Trainer::Impl::broadcast_scaler_state() {
  if (!data_parallel_ || !scaler_.is_enabled()) return;
  const auto mine = torch::pickle_save(c10::IValue(scaler_.state_dict()));
  const auto rank0 = data_parallel_->broadcast_bytes(std::string(mine.begin(), mine.end()));
  if (data_parallel_->rank() == 0) return;
  scaler_.load_state_dict(
      torch::pickle_load(std::vector<char>(rank0.begin(), rank0.end())).toGenericDict());
}

void Trainer::Impl::save_checkpoint_with_peers(const detail::CheckpointParts& parts) {
  auto& dp = *data_parallel_;
  const auto& dir = args_.output_dir();
  const auto step = state_.global_step;
  const bool writer = should_save();
  const auto folder = detail::shared_checkpoint_folder(dir, step);
  // Where a process without a writer of its own adds its random state: rank 0's folder (its
  // output_dir may differ from this process's; on a shared file system it is visible here).
  const auto rank0_folder = dp.broadcast_bytes(folder);
  std::string error;
  const auto attempt = [&error](const auto& body) {
    if (!error.empty()) return;
    try {
      body();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  const auto agreed = [&](const char* stage) {
    if (dp.all_ok(error.empty())) return;
    if (writer) detail::abandon_checkpoint(folder);
    TORCH_CHECK(false, "rank ", dp.rank(), ": saving ", detail::checkpoint_name(step),
                " failed while ", stage,
                error.empty() ? std::string(" on another process (see its error)") : ": " + error);
  };
  if (writer) {
    attempt([&] {
      detail::begin_checkpoint(dir, step, /*shared_name=*/true);
      detail::write_checkpoint_files(folder, parts);
    });
  }
  agreed("writing the model, optimizer and state");
  attempt([&] {
    const auto& target = io::is_directory(folder) ? folder : rank0_folder;
    if (io::is_directory(target)) {
      detail::write_rng_state(target, dp.rank(), dp.world_size());
    } else {
      // A node that has no writer and does not share rank 0's file system.
      TORCH_WARN_ONCE("rank ", dp.rank(), ": no checkpoint folder is visible to this process ('",
                      folder, "' nor rank 0's '", rank0_folder,
                      "'), so its random state is not saved; a resume starts it afresh");
    }
  });
  agreed("writing each process's random state");
  if (writer) attempt([&] { detail::publish_checkpoint(dir, folder, step); });
  agreed("moving the checkpoint into place");
}

// ---- run state ----------------------------------------------------------------------------

void Trainer::Impl::start_state() {
  const auto max_steps = schedule_.max_steps;
  state_ = TrainerState{};
  mark_process(state_);
  state_.max_steps = max_steps;
  state_.logging_steps = TrainingArguments::resolve_steps(args_.logging_steps(), max_steps);
  state_.eval_steps = TrainingArguments::resolve_steps(args_.resolved_eval_steps(), max_steps);
  state_.save_steps = TrainingArguments::resolve_steps(args_.save_steps(), max_steps);
  state_.train_batch_size = args_.per_device_train_batch_size();
  state_.num_train_epochs = schedule_.num_epochs;
}

void Trainer::Impl::load_for_resume(const std::string& dir) {
  // A run of another size: its position within an epoch means other batches here, so the
  // run continues at its global_step placed as HF places it (whole epochs of this run's size).
  const bool other_world_size = io::is_directory(dir) && detail::saved_process_count(dir) > 0 &&
                                detail::saved_process_count(dir) != world_size();
  if (other_world_size) {
    const auto saved_processes = detail::saved_process_count(dir);
    if (state_.is_world_process_zero) {
      TORCH_WARN("resuming from '", dir, "', which a run of ", saved_processes,
                 " process(es) saved, with ", world_size(),
                 " process(es): the examples each step sees (and the random states) now differ "
                 "from those of an uninterrupted run");
    }
  }
  if (const auto saved = detail::load_checkpoint_arguments(dir)) {
    const auto changes = detail::compare_resumed_arguments(args_, *saved);
    TORCH_CHECK_VALUE(changes.errors.empty(), "cannot resume from '", dir,
                      "': ", c10::Join("; ", changes.errors),
                      ". Resume with the saved values, or start a new run in another output_dir.");
    if (!changes.warnings.empty()) {
      TORCH_WARN("resuming from '", dir,
                 "' with arguments that differ from its training_args.json: ",
                 c10::Join("; ", changes.warnings));
    }
  }
  const TrainerState fresh = state_;
  auto parts = checkpoint_parts();
  parts.check_state = [this, other_world_size](TrainerState saved) {
    if (other_world_size) saved.steps_in_epoch = 0;
    detail::resume_position(saved, schedule_.run_shape());
  };
  detail::load_checkpoint(dir, parts);
  if (other_world_size) state_.steps_in_epoch = 0;
  mark_process(state_);
  // What the interrupted run logged past its checkpoint is logged again from here.
  if (should_save()) metrics_log_.drop_after(state_.global_step);
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
  parts.masters = masters_.get();
  parts.optimizer = optimizer_.optimizer.get();
  parts.scheduler = scheduler_.get();
  parts.scaler = &scaler_;
  parts.state = &state_;
  parts.args = &args_;
  if (data_parallel_) {
    parts.process_index = data_parallel_->rank();
    parts.num_processes = data_parallel_->world_size();
  }
  return parts;
}

torch::Tensor Trainer::Impl::compute_loss(const Batch& batch) {
  if (compute_loss_) return compute_loss_(batch).first;
  return detail::required_default_loss(args_, forward_(batch), batch);
}

detail::StepParts Trainer::Impl::step_parts(detail::LossWindow& loss_window) {
  return detail::StepParts{args_,
                           plan_,
                           device_,
                           *module_,
                           [this](const Batch& batch) { return compute_loss(batch); },
                           masters_.get(),
                           *optimizer_.optimizer,
                           optimizer_.fused,
                           optimizer_.params,
                           *scheduler_,
                           scaler_,
                           callbacks_,
                           state_,
                           loss_window,
                           *progress_,
                           gradient_sync_.get()};
}

// ---- logging, evaluation, saving ------------------------------------------------------------

void Trainer::Impl::log(LogEntry logs) {
  logs["epoch"] = state_.epoch;
  LogEntry with_step = logs;
  with_step["step"] = static_cast<double>(state_.global_step);
  state_.log_history.push_back(with_step);
  if (should_log()) progress_->print(detail::format_log(logs));
  if (should_save()) metrics_log_.append(with_step);
  callbacks_.fire(&TrainerCallback::on_log, logs);
}

detail::EvaluationParts Trainer::Impl::evaluation_parts() {
  return {args_,
          plan_,
          device_,
          *module_,
          forward_,
          compute_loss_,
          compute_metrics_,
          preprocess_logits_,
          data_parallel_.get()};
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
  const auto metric = args_.resolved_metric_for_best_model();
  const auto it = metrics.find(metric);
  if (it == metrics.end()) {
    std::vector<std::string> names;
    for (const auto& entry : metrics) names.push_back(entry.first);
    TORCH_CHECK_VALUE(false, "metric_for_best_model is '", metric,
                      "', but the evaluation reported no such metric; it reported ",
                      c10::Join(", ", names),
                      ". Set metric_for_best_model to one of them, or add it in compute_metrics.");
  }
  const double value = it->second;
  if (!std::isfinite(value)) return false;  // a nan or inf evaluation never ranks best
  const bool greater = args_.resolved_greater_is_better();
  if (state_.best_metric &&
      !(greater ? value > *state_.best_metric : value < *state_.best_metric)) {
    return false;
  }
  state_.best_metric = value;
  state_.best_global_step = state_.global_step;
  return true;
}

void Trainer::Impl::load_best_model() {
  const auto& dir = *state_.best_model_checkpoint;
  progress_->print(fmt::format(
      "mantissa: loading the best model from {} ({} {})", dir,
      args_.resolved_metric_for_best_model(),
      state_.best_metric ? fmt::format("{:g}", *state_.best_metric) : std::string("unknown")));
  detail::load_checkpoint_weights(dir, *module_, masters_.get());
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
    if (data_parallel_) {
      save_checkpoint_with_peers(checkpoint_parts());
    } else {
      detail::save_checkpoint(args_.output_dir(), checkpoint_parts());
    }
  } catch (...) {
    state_.best_model_checkpoint = previous_best;
    throw;
  }
  best_unsaved_ = false;
  if (args_.save_total_limit() && should_save()) {
    detail::rotate_checkpoints(args_.output_dir(), *args_.save_total_limit(),
                               state_.best_model_checkpoint);
  }
  callbacks_.fire(&TrainerCallback::on_save);
}

// ---- Trainer: forwards to Impl ----------------------------------------------------------------

Trainer::Trainer(std::shared_ptr<torch::nn::Module> module, ForwardFn forward,
                 TrainingArguments args, BatchSource train, std::optional<BatchSource> eval)
    : impl_(std::make_unique<Impl>(std::move(module), std::move(forward), std::move(args),
                                   std::move(train), std::move(eval))) {}

Trainer::Trainer(std::shared_ptr<torch::nn::Module> module,
                 std::function<torch::Tensor(const torch::Tensor&)> forward, TrainingArguments args,
                 BatchSource train, std::optional<BatchSource> eval)
    : Trainer(std::move(module), forward_of_first_entry(std::move(forward)), std::move(args),
              std::move(train), std::move(eval)) {}

Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;
Trainer::~Trainer() = default;

Trainer& Trainer::set_compute_loss(LossFn fn) {
  TORCH_CHECK_VALUE(fn != nullptr, "set_compute_loss: the function is empty");
  impl_->compute_loss_ = [fn = std::move(fn)](const Batch& batch) {
    return std::pair<torch::Tensor, ModelOutput>(fn(batch), ModelOutput());
  };
  return *this;
}
Trainer& Trainer::set_compute_loss(LossWithOutputsFn fn) {
  TORCH_CHECK_VALUE(fn != nullptr, "set_compute_loss: the function is empty");
  impl_->compute_loss_ = std::move(fn);
  return *this;
}
Trainer& Trainer::set_compute_loss_func(LossFromOutputsFn fn) {
  TORCH_CHECK_VALUE(fn != nullptr, "set_compute_loss_func: the function is empty");
  impl_->compute_loss_ = [fn = std::move(fn), forward = impl_->forward_](const Batch& batch) {
    auto outputs = forward(batch);
    auto loss = fn(outputs, batch);
    return std::pair<torch::Tensor, ModelOutput>(std::move(loss), std::move(outputs));
  };
  return *this;
}
Trainer& Trainer::set_compute_metrics(MetricsFn fn) {
  impl_->compute_metrics_ = std::move(fn);
  return *this;
}
Trainer& Trainer::set_preprocess_logits_for_metrics(PreprocessLogitsFn fn) {
  impl_->preprocess_logits_ = std::move(fn);
  return *this;
}
Trainer& Trainer::set_optimizer_factory(OptimizerFactory factory) {
  TORCH_CHECK_VALUE(!impl_->prepared(),
                    "set_optimizer_factory must be called before the optimizer is created");
  impl_->optimizer_factory_ = std::move(factory);
  return *this;
}
Trainer& Trainer::set_lr_scheduler_factory(SchedulerFactory factory) {
  TORCH_CHECK_VALUE(!impl_->prepared(),
                    "set_lr_scheduler_factory must be called before training starts");
  impl_->scheduler_factory_ = std::move(factory);
  return *this;
}
Trainer& Trainer::add_callback(std::shared_ptr<TrainerCallback> callback) {
  TORCH_CHECK_VALUE(callback != nullptr, "add_callback: the callback is null");
  impl_->callbacks_.add(std::move(callback));
  return *this;
}

TrainOutput Trainer::train() { return impl_->train(std::nullopt); }
TrainOutput Trainer::train(const std::string& checkpoint) { return impl_->train(checkpoint); }

LogEntry Trainer::evaluate() { return evaluate(std::string("eval")); }

LogEntry Trainer::evaluate(const std::string& metric_key_prefix) {
  impl_->prepare();
  return impl_->evaluate(nullptr, metric_key_prefix, /*during_train=*/false);
}

LogEntry Trainer::evaluate(BatchSource dataset, const std::string& metric_key_prefix) {
  impl_->prepare();
  return impl_->evaluate(&dataset, metric_key_prefix, /*during_train=*/false);
}

PredictionOutput Trainer::predict(BatchSource dataset, const std::string& metric_key_prefix) {
  impl_->prepare();
  return impl_->predict(dataset, metric_key_prefix);
}

void Trainer::save_model(const std::string& dir) const {
  if (!impl_->should_save()) return;  // HF: only the processes that save write the model
  io::create_directories(dir);
  io::save_module_safetensors(io::join_path(dir, "model.safetensors"), *impl_->module_);
  impl_->args_.save_json(io::join_path(dir, "training_args.json"));
}

const TrainerState& Trainer::state() const { return impl_->state_; }
const TrainingArguments& Trainer::args() const { return impl_->args_; }
const PrecisionPlan& Trainer::precision_plan() const { return impl_->plan_; }
const amp::GradScaler& Trainer::scaler() const { return impl_->scaler_; }
torch::optim::Optimizer& Trainer::optimizer() {
  impl_->prepare();
  return *impl_->optimizer_.optimizer;
}
LrScheduler& Trainer::lr_scheduler() {
  impl_->prepare();
  return *impl_->scheduler_;
}

}  // namespace mantissa
