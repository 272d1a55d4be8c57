// mantissa::Trainer: HF Trainer's inner training loop with mantissa's precision mechanics.
#include <mantissa/trainer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <mantissa/amp/autocast.h>
#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/amp/tf32_guard.h>
#include <mantissa/clip_grad.h>
#include <mantissa/io/filesystem.h>
#include <mantissa/io/safetensors.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/optim/fused_adamw.h>

#include "io/atomic_file.h"
#include "trainer/checkpoint.h"
#include "trainer/metrics_log.h"
#include "trainer/prefetch.h"
#include "trainer/precision_plan.h"
#include "trainer/progress.h"
#include "trainer/resume_check.h"
#include "trainer/schedule.h"
#include "trainer/step_graph.h"

namespace mantissa {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

c10::ScalarType floating_param_dtype(const torch::nn::Module& module) {
  std::optional<c10::ScalarType> dtype;
  for (const auto& item : module.named_parameters()) {
    const auto t = item.value().scalar_type();
    if (!c10::isFloatingType(t)) continue;
    if (!dtype) dtype = t;
    TORCH_CHECK_VALUE(*dtype == t, "the model mixes parameter dtypes (", *dtype, " and ", t, " in '",
                      item.key(), "'); the Trainer expects one floating dtype for all parameters");
  }
  TORCH_CHECK_VALUE(dtype.has_value(), "the model has no floating-point parameters to train");
  return *dtype;
}

/// HF's dataloader_pin_memory: a CPU batch bound for a GPU is first copied into page-locked
/// memory (LibTorch's caching host allocator), so that the copy to the device is asynchronous.
Batch to_device(Batch batch, const c10::Device& device, bool pin_memory) {
  // Two dispatched no-op `to()` calls per step otherwise (a batch gathered on the CPU for the CPU).
  if (batch.data.device() == device && batch.target.device() == device) return batch;
  auto move = [&](const torch::Tensor& t) {
    const bool pin = pin_memory && device.is_cuda() && t.is_cpu() && !t.is_pinned();
    return (pin ? t.pin_memory() : t).to(device, /*non_blocking=*/true);
  };
  return {move(batch.data), move(batch.target)};
}

}  // namespace

class Trainer::Impl {
 public:
  Impl(std::shared_ptr<torch::nn::Module> module, ForwardFn forward, TrainingArguments args, BatchSource train,
       std::optional<BatchSource> eval)
      : module_(std::move(module)),
        forward_(std::move(forward)),
        args_(std::move(args)),
        train_(std::move(train)),
        eval_(std::move(eval)),
        device_(c10::kCPU) {
    TORCH_CHECK_VALUE(module_ != nullptr, "Trainer: the model is null");
    args_.validate();
    device_ = args_.device();
    plan_ = detail::make_precision_plan(args_, floating_param_dtype(*module_));
  }

  // ---- setup -----------------------------------------------------------------------------

  /// Sizes that depend on the dataset: batches per epoch, update steps, epochs.
  void compute_schedule() {
    const auto schedule = detail::make_run_schedule(args_, train_.size);
    batches_per_epoch_ = schedule.batches_per_epoch;
    updates_per_epoch_ = schedule.updates_per_epoch;
    max_steps_ = schedule.max_steps;
    num_epochs_ = schedule.num_epochs;
  }

  /// Creates the masters, optimizer, scheduler and scaler once.
  void prepare() {
    if (prepared_) return;
    compute_schedule();
    if (plan_.param_dtype != floating_param_dtype(*module_)) module_->to(plan_.param_dtype);
    module_->to(device_);
    if (plan_.master_weights) masters_ = std::make_unique<amp::MasterWeights>(module_->parameters());
    if (plan_.pure_low_precision) amp::warn_pure_low_precision_once(plan_.param_dtype);

    // HF's weight-decay split: no decay for biases and normalisation weights (1-d tensors).
    std::vector<torch::Tensor> decay;
    std::vector<torch::Tensor> no_decay;
    for (const auto& param : module_->parameters()) {
      if (!param.requires_grad()) continue;
      (param.dim() >= 2 ? decay : no_decay).push_back(param);
    }
    auto optimized = [&](const std::vector<torch::Tensor>& params) {
      return masters_ ? masters_->masters_for(params) : params;
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (!decay.empty()) groups.emplace_back(optimized(decay));
    if (!no_decay.empty()) groups.emplace_back(optimized(no_decay));
    TORCH_CHECK_VALUE(!groups.empty(), "the model has no parameter that requires grad");
    optimizer_ = optimizer_factory_ ? optimizer_factory_(groups) : create_optimizer(groups, decay.empty());
    TORCH_CHECK_VALUE(optimizer_ != nullptr, "the optimizer factory returned null");
    for (const auto& group : optimizer_->param_groups()) {
      optimized_params_.insert(optimized_params_.end(), group.params().begin(), group.params().end());
    }
    fused_writes_back_ = [&] {
      auto* fused = dynamic_cast<optim::FusedAdamW*>(optimizer_.get());
      return fused != nullptr && fused->writes_back_to_model();
    }();
    scheduler_ = scheduler_factory_ ? scheduler_factory_(*optimizer_, max_steps_)
                                    : std::make_unique<LrScheduler>(*optimizer_, args_.lr_scheduler_type(),
                                                                    args_.get_warmup_steps(max_steps_), max_steps_);
    TORCH_CHECK_VALUE(scheduler_ != nullptr, "the scheduler factory returned null");
    scaler_ = amp::GradScaler(amp::GradScalerOptions()
                                  .enabled(plan_.loss_scaling)
                                  .init_scale(args_.init_loss_scale())
                                  .growth_interval(args_.loss_scale_window())
                                  .hysteresis(args_.hysteresis())
                                  .consecutive_hysteresis(args_.consecutive_hysteresis())
                                  .min_scale(args_.min_loss_scale())
                                  .max_scale(args_.max_loss_scale().value_or(std::numeric_limits<double>::infinity())));
    prepared_ = true;
  }

  /// The optimizer named by `args.optim`; group 0 decays, group 1 (if any) does not.
  std::unique_ptr<torch::optim::Optimizer> create_optimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                                            bool no_decay_only) {
    const auto& name = args_.optim();
    const double wd = args_.weight_decay();
    auto set_group_decay = [&](auto& options_for_group) {
      // Decay only in the first group, when the model has 2-d weights.
      for (size_t i = 0; i < groups.size(); ++i) {
        const bool decays = i == 0 && !no_decay_only;
        groups[i].set_options(options_for_group(decays ? wd : 0.0));
      }
    };
    if (name == "adamw_torch") {
      auto make = [&](double decay) {
        return std::make_unique<torch::optim::AdamWOptions>(
            torch::optim::AdamWOptions(args_.learning_rate())
                .betas({args_.adam_beta1(), args_.adam_beta2()})
                .eps(args_.adam_epsilon())
                .weight_decay(decay));
      };
      set_group_decay(make);
      return std::make_unique<torch::optim::AdamW>(std::move(groups),
                                                   torch::optim::AdamWOptions(args_.learning_rate()));
    }
    if (name == "adamw_torch_fused" || name == "adamw_mantissa_fused") {
      auto make = [&](double decay) {
        return std::make_unique<optim::FusedAdamWOptions>(optim::FusedAdamWOptions(args_.learning_rate())
                                                              .betas({args_.adam_beta1(), args_.adam_beta2()})
                                                              .eps(args_.adam_epsilon())
                                                              .weight_decay(decay));
      };
      set_group_decay(make);
      auto fused = std::make_unique<optim::FusedAdamW>(std::move(groups), optim::FusedAdamWOptions(args_.learning_rate()));
      // The fused step writes the updated fp32 masters back into the bf16/fp16 model itself.
      if (masters_ && masters_->has_low_precision()) fused->link_model_params(*masters_);
      return fused;
    }
    if (name == "sgd") {
      auto make = [&](double decay) {
        return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(args_.learning_rate()).weight_decay(decay));
      };
      set_group_decay(make);
      return std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(args_.learning_rate()));
    }
    TORCH_CHECK_VALUE(false, "optim: ", name, " is not a valid OptimizerNames");
    return nullptr;
  }

  void check_output_dir(bool resuming) {
    const auto& dir = args_.output_dir();
    // What this Trainer wrote itself (an evaluate() before train()) does not count.
    if (resuming || metrics_log_.wrote() || args_.overwrite_output_dir() || !io::is_directory(dir)) return;
    TORCH_CHECK_VALUE(io::list_directory(dir).empty(), "Output directory (", dir,
                      ") already exists and is not empty. Use --overwrite_output_dir to overcome, or "
                      "--resume_from_checkpoint latest to continue its run.");
  }

  // ---- one update step ---------------------------------------------------------------------

  torch::Tensor compute_loss(const Batch& batch) {
    if (compute_loss_) return compute_loss_(batch);
    auto logits = forward_(batch.data);
    return torch::nn::functional::cross_entropy(logits, batch.target);
  }

  /// Forward and backward of one micro-batch, whose loss counts 1/`in_group` of the step's.
  /// No sync.
  void forward_backward(const Batch& batch, std::int64_t in_group) {
    torch::Tensor loss;
    {
      // The weight-cast cache would keep casts made inside a captured graph: off then.
      amp::Autocast autocast(device_.type(), plan_.autocast ? plan_.compute_dtype : c10::kBFloat16, plan_.autocast,
                             /*cache_enabled=*/graph_ == nullptr);
      loss = compute_loss(batch);
    }
    // Dividing by 1 changes nothing but costs an op forward and one backward.
    if (in_group > 1) loss = loss / static_cast<double>(in_group);
    scaler_.scale(loss).backward();
    accumulate_loss(loss.detach().to(torch::kFloat));
  }

  /// The device half of the optimizer step at an accumulation boundary: unscale, clip, step,
  /// loss-scale update. No sync, so it can be captured in a CUDA graph (where the host-side
  /// callbacks do not belong: `with_callbacks` false).
  void optimizer_step_on_device(bool with_callbacks) {
    if (masters_) masters_->copy_grads_to_masters();
    if (args_.max_grad_norm() > 0) {
      // As HF (accelerator.clip_grad_norm_): unscale only to clip. Without clipping the
      // scaler's step unscales, inside FusedAdamW's single pass when that is the optimizer.
      scaler_.unscale_(*optimizer_);
      grad_norm_ = clip_grad_norm_(optimized_params_, args_.max_grad_norm());
    }
    if (with_callbacks) {
      for (auto& cb : callbacks_) cb->on_pre_optimizer_step(args_, state_, control_);
    }
    scaler_.step(*optimizer_);
    if (masters_ && !fused_writes_back_) masters_->copy_masters_to_model();
    // A device copy: read on the host only if the step turns out skipped (for the log line).
    scale_before_ = plan_.loss_scaling ? scaler_.scale_tensor().clone() : torch::Tensor();
    if (args_.dynamic_loss_scale()) {
      scaler_.update();
    } else {
      scaler_.update(args_.loss_scale());
    }
    if (graph_) window_steps_.add_(1);  // only a captured step needs the count on the device
  }

  /// The eager optimizer step. Returns whether it was skipped (fp16 overflow).
  bool optimizer_step() {
    optimizer_step_on_device(/*with_callbacks=*/true);
    return finish_optimizer_step(/*zero_grads=*/true);
  }

  /// The host half of the optimizer step: whether it was skipped (a sync, only when loss
  /// scaling is on), the scheduler, callbacks, and clearing the gradients.
  bool finish_optimizer_step(bool zero_grads) {
    const bool skipped = plan_.loss_scaling && scaler_.last_step_skipped();
    for (auto& cb : callbacks_) cb->on_optimizer_step(args_, state_, control_);
    if (skipped) {
      ++state_.skipped_steps;
      ++consecutive_skips_;
      progress_->print(fmt::format("step {}: gradients overflowed (inf/nan) at loss scale {:g}; optimizer step "
                                   "skipped, loss scale now {:g}",
                                   state_.global_step + 1, scale_before_.item<double>(), scaler_.get_scale()));
      TORCH_CHECK(args_.max_consecutive_nonfinite() == 0 || consecutive_skips_ < args_.max_consecutive_nonfinite(),
                  "training stopped: ", consecutive_skips_, " optimizer steps in a row were skipped because the fp16 "
                  "gradients overflowed (loss scale now ", scaler_.get_scale(), "). The run is diverging: try --bf16 "
                  "instead of --fp16, a lower --learning_rate, or a smaller --max_grad_norm.");
    } else {
      consecutive_skips_ = 0;
      scheduler_->step();  // HF: only when the optimizer step was not skipped
    }
    if (zero_grads) clear_grads();
    return skipped;
  }

  void clear_grads() {
    optimizer_->zero_grad();
    module_->zero_grad();
    if (masters_) masters_->zero_grad();
  }

  detail::RunShape run_shape() const {
    return {batches_per_epoch_, updates_per_epoch_, args_.gradient_accumulation_steps(),
            args_.per_device_train_batch_size()};
  }

  /// Restores the checkpoint in `dir` after checking that it can continue in this run: its
  /// arguments (errors for those that move the data position, warnings for the rest) and its
  /// saved position. This run's intervals and sizes replace the saved ones in the state.
  void load_for_resume(const std::string& dir) {
    if (const auto saved = detail::load_checkpoint_arguments(dir)) {
      const auto changes = detail::compare_resumed_arguments(args_, *saved);
      TORCH_CHECK_VALUE(changes.errors.empty(), "cannot resume from '", dir, "': ",
                        c10::Join("; ", changes.errors),
                        ". Resume with the saved values, or start a new run in another output_dir.");
      if (!changes.warnings.empty()) {
        TORCH_WARN("resuming from '", dir, "' with arguments that differ from its training_args.json: ",
                   c10::Join("; ", changes.warnings));
      }
    }
    const TrainerState fresh = state_;
    detail::CheckpointParts parts{module_.get(), masters_.get(), optimizer_.get(), scheduler_.get(), &scaler_,
                                  &state_,       &args_};
    parts.check_state = [this](const TrainerState& saved) { detail::resume_position(saved, run_shape()); };
    detail::load_checkpoint(dir, parts);
    state_.max_steps = fresh.max_steps;
    state_.logging_steps = fresh.logging_steps;
    state_.eval_steps = fresh.eval_steps;
    state_.save_steps = fresh.save_steps;
    state_.train_batch_size = fresh.train_batch_size;
    state_.num_train_epochs = fresh.num_train_epochs;
  }

  // ---- CUDA graphs ---------------------------------------------------------------------------

  /// Why `cuda_graph` cannot be honoured in this run, or nullopt.
  std::optional<std::string> cuda_graph_blocker() const {
    if (auto why = detail::cuda_graph_unavailable(device_)) return why;
    if (dynamic_cast<optim::FusedAdamW*>(optimizer_.get()) == nullptr) {
      return fmt::format("the optimizer ({}) is not mantissa's FusedAdamW, whose step reads the learning rate "
                         "and the loss scale on the device; use --optim adamw_torch_fused",
                         optimizer_factory_ ? "from set_optimizer_factory" : args_.optim());
    }
    if (args_.gradient_accumulation_steps() > 1) {
      return fmt::format("gradient_accumulation_steps is {}; a captured step is one micro-batch and one update",
                         args_.gradient_accumulation_steps());
    }
    if (plan_.loss_scaling && args_.dynamic_loss_scale() && args_.min_loss_scale() > 0) {
      return std::string("min_loss_scale > 0 checks the loss scale on the host after every overflow");
    }
    return std::nullopt;
  }

  /// The step of the cuda_graph mode: captured the first time, replayed after. Batches of
  /// another shape (a smaller last batch) run eagerly, with one log line per shape.
  void graphed_step(const Batch& batch) {
    auto& fused = dynamic_cast<optim::FusedAdamW&>(*optimizer_);
    if (graph_->captured() && !graph_->fits(batch)) {
      const auto shape = c10::str(batch.data.sizes());
      if (eager_shapes_logged_.insert(shape).second) {
        progress_->print(fmt::format("cuda_graph: a batch of shape {} does not fit the captured step ({}); it "
                                     "runs eagerly", shape, graph_->describe_captured()));
      }
      clear_grads();  // the captured gradients must not be accumulated into
      forward_backward(batch, 1);
      optimizer_step();
      // Show the graph's gradient tensors again (it keeps writing them on each replay).
      for (auto& [param, grad] : captured_grads_) param.mutable_grad() = grad;
      return;
    }
    if (!graph_->captured() && batch.data.size(0) != args_.per_device_train_batch_size()) {
      forward_backward(batch, 1);  // a short batch: capture the next full one instead
      optimizer_step();
      return;
    }
    if (!graph_->captured()) {
      clear_grads();  // captured from None, the backward writes the gradients, never adds
      graph_->capture(batch, [this](const Batch& inputs) {
        forward_backward(inputs, 1);
        optimizer_step_on_device(/*with_callbacks=*/false);
      });
      captured_grad_norm_ = grad_norm_;
      captured_scale_before_ = scale_before_;
      captured_grads_.clear();
      auto keep = [&](const std::vector<torch::Tensor>& params) {
        for (const auto& p : params) {
          if (p.grad().defined()) captured_grads_.emplace_back(p, p.grad());
        }
      };
      keep(module_->parameters());
      if (masters_) keep(masters_->master_params());
      progress_->print(fmt::format("cuda_graph: step {} captured ({}); replaying it from now on",
                                   state_.global_step + 1, graph_->describe_captured()));
    }
    for (auto& cb : callbacks_) cb->on_pre_optimizer_step(args_, state_, control_);
    fused.refresh_lr_tensors();
    graph_->replay(batch);
    grad_norm_ = captured_grad_norm_;
    scale_before_ = captured_scale_before_;
    finish_optimizer_step(/*zero_grads=*/false);
  }

  // ---- logging, evaluation, saving -----------------------------------------------------------

  void log(LogEntry logs) {
    logs["epoch"] = state_.epoch;
    LogEntry with_step = logs;
    with_step["step"] = static_cast<double>(state_.global_step);
    state_.log_history.push_back(with_step);
    progress_->print(detail::format_log(logs));
    metrics_log_.append(with_step);
    for (auto& cb : callbacks_) cb->on_log(args_, state_, control_, logs);
  }

  void log_training_progress() {
    const auto steps = state_.global_step - last_logged_step_;
    const double window_loss = tr_loss_.item<double>();
    const double loss = steps > 0 ? window_loss / static_cast<double>(steps) : 0.0;
    total_loss_ += window_loss;
    tr_loss_.zero_();
    window_steps_.zero_();
    const double elapsed = seconds_since(log_window_start_);
    LogEntry logs{{"loss", loss}, {"learning_rate", scheduler_->get_last_lr().at(0)}};
    if (grad_norm_.defined()) logs["grad_norm"] = grad_norm_.item<double>();
    if (plan_.loss_scaling) {
      logs["loss_scale"] = scaler_.get_scale();
      logs["skipped_steps"] = static_cast<double>(state_.skipped_steps);
    }
    if (elapsed > 0) {
      logs["samples_per_second"] = static_cast<double>(samples_since_log_) / elapsed;
      if (tokens_since_log_ > 0) logs["tokens_per_second"] = static_cast<double>(tokens_since_log_) / elapsed;
    }
    samples_since_log_ = 0;
    tokens_since_log_ = 0;
    log_window_start_ = Clock::now();
    last_logged_step_ = state_.global_step;
    check_nonfinite_losses();
    log(std::move(logs));
  }

  void check_nonfinite_losses() {
    if (args_.max_consecutive_nonfinite() == 0 || !nonfinite_streak_.defined()) return;
    const auto streak = nonfinite_streak_.item<std::int64_t>();
    TORCH_CHECK(streak < args_.max_consecutive_nonfinite(), "training stopped: the loss was not finite for ", streak,
                " micro-batches in a row (max_consecutive_nonfinite=", args_.max_consecutive_nonfinite(),
                "). The run diverged: try a lower --learning_rate, --bf16 instead of --fp16, or a smaller "
                "--max_grad_norm.");
  }

  void maybe_log_save_evaluate(bool epoch_end) {
    const auto step = state_.global_step;
    const bool steps_log = args_.logging_strategy() == "steps" &&
                           ((state_.logging_steps > 0 && step % state_.logging_steps == 0) ||
                            (step == 1 && args_.logging_first_step()));
    const bool epoch_log = epoch_end && args_.logging_strategy() == "epoch";
    if (!epoch_end && steps_log) control_.should_log = true;
    if (epoch_log) control_.should_log = true;
    if ((!epoch_end && args_.eval_strategy() == "steps" && step % state_.eval_steps == 0) ||
        (epoch_end && args_.eval_strategy() == "epoch")) {
      control_.should_evaluate = true;
    }
    if ((!epoch_end && args_.save_strategy() == "steps" && step % state_.save_steps == 0) ||
        (epoch_end && args_.save_strategy() == "epoch")) {
      control_.should_save = true;
    }
    if (control_.should_log && step > last_logged_step_) log_training_progress();
    control_.should_log = false;
    std::optional<LogEntry> metrics;
    if (control_.should_evaluate && eval_) {
      metrics = run_evaluation(/*during_train=*/true);
      if (args_.save_strategy() == "best" && improved_) control_.should_save = true;
    }
    control_.should_evaluate = false;
    if (control_.should_save) save_checkpoint();
    control_.should_save = false;
  }

  void save_checkpoint() {
    detail::CheckpointParts parts{module_.get(), masters_.get(), optimizer_.get(), scheduler_.get(), &scaler_,
                                  &state_, &args_};
    const auto path = detail::save_checkpoint(args_.output_dir(), parts);
    if (improved_) {
      state_.best_model_checkpoint = path;
      improved_ = false;
    }
    if (args_.save_total_limit()) {
      detail::rotate_checkpoints(args_.output_dir(), *args_.save_total_limit(), state_.best_model_checkpoint);
    }
    for (auto& cb : callbacks_) cb->on_save(args_, state_, control_);
  }

  LogEntry run_evaluation(bool during_train) {
    TORCH_CHECK_VALUE(eval_.has_value(), "Trainer: evaluation requires an eval_dataset");
    TORCH_CHECK_VALUE(eval_->size > 0, "the evaluation dataset is empty");
    const auto start = Clock::now();
    const bool full_eval = !during_train && (args_.bf16_full_eval() || args_.fp16_full_eval());
    if (full_eval) module_->to(args_.bf16_full_eval() ? c10::kBFloat16 : c10::kHalf);  // HF: only outside training
    module_->to(device_);
    const bool was_training = module_->is_training();
    module_->eval();
    torch::NoGradGuard no_grad;
    amp::Autocast autocast(device_.type(), plan_.autocast ? plan_.compute_dtype : c10::kBFloat16,
                           plan_.autocast && !full_eval);

    const auto n = static_cast<std::int64_t>(eval_->size);
    const auto batch_size = args_.per_device_eval_batch_size();
    auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
    auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device_));
    bool classification = !compute_loss_;
    std::vector<torch::Tensor> predictions;
    std::vector<torch::Tensor> targets;
    for (std::int64_t begin = 0; begin < n; begin += batch_size) {
      std::vector<std::size_t> indices;
      for (auto i = begin; i < std::min(n, begin + batch_size); ++i) indices.push_back(static_cast<std::size_t>(i));
      const auto batch = to_device(eval_->get_batch(indices), device_, args_.dataloader_pin_memory());
      torch::Tensor loss;
      torch::Tensor logits;
      if (compute_loss_) {
        loss = compute_loss_(batch);
        if (compute_metrics_) logits = forward_(batch.data);
      } else {
        logits = forward_(batch.data);
        loss = torch::nn::functional::cross_entropy(logits, batch.target);
      }
      const auto count = static_cast<double>(indices.size());
      loss_sum += loss.detach().to(torch::kDouble) * count;
      if (classification && logits.dim() == 2 && batch.target.dim() == 1 &&
          !c10::isFloatingType(batch.target.scalar_type())) {
        correct += logits.argmax(1).eq(batch.target).sum();
      } else {
        classification = false;
      }
      if (compute_metrics_) {
        predictions.push_back(logits.detach().to(torch::kFloat).cpu());
        targets.push_back(batch.target.cpu());
      }
    }
    LogEntry metrics{{"eval_loss", loss_sum.item<double>() / static_cast<double>(n)}};
    if (classification) metrics["eval_accuracy"] = static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(n);
    if (compute_metrics_) {
      for (const auto& [key, value] : compute_metrics_(torch::cat(predictions), torch::cat(targets))) {
        metrics[key.rfind("eval_", 0) == 0 ? key : "eval_" + key] = value;
      }
    }
    const double runtime = seconds_since(start);
    metrics["eval_runtime"] = runtime;
    metrics["eval_samples_per_second"] = runtime > 0 ? static_cast<double>(n) / runtime : 0.0;
    if (was_training) module_->train();

    const double value = metrics.at("eval_loss");
    if (std::isfinite(value) && (!state_.best_metric || value < *state_.best_metric)) {
      state_.best_metric = value;
      improved_ = true;
    }
    log(metrics);
    for (auto& cb : callbacks_) cb->on_evaluate(args_, state_, control_, metrics);
    return metrics;
  }

  // ---- the loop ------------------------------------------------------------------------------

  TrainOutput train(std::optional<std::string> resume) {
    if (!resume && args_.resume_from_checkpoint()) resume = *args_.resume_from_checkpoint();
    check_output_dir(resume.has_value());
    prepare();
    std::optional<amp::Tf32Guard> tf32;
    if (plan_.tf32) tf32.emplace(*plan_.tf32);

    torch::manual_seed(static_cast<std::uint64_t>(args_.seed()));
    state_ = TrainerState{};
    state_.max_steps = max_steps_;
    state_.logging_steps = TrainingArguments::resolve_steps(args_.logging_steps(), max_steps_);
    state_.eval_steps = TrainingArguments::resolve_steps(args_.resolved_eval_steps(), max_steps_);
    state_.save_steps = TrainingArguments::resolve_steps(args_.save_steps(), max_steps_);
    state_.train_batch_size = args_.per_device_train_batch_size();
    state_.num_train_epochs = num_epochs_;
    if (resume) load_for_resume(detail::resolve_checkpoint(*resume, args_.output_dir()));
    const bool progress_bar = detail::Progress::wanted(args_.disable_tqdm());
    detail::Progress progress(max_steps_, progress_bar);
    progress_ = &progress;
    struct ProgressScope {
      Impl& impl;
      ~ProgressScope() { impl.progress_ = &impl.quiet_; }
    } progress_scope{*this};
    progress.print(fmt::format("mantissa: {} on {}; {} examples, {} epochs, {} optimizer steps of batch {} x {} "
                               "accumulation{}",
                               plan_.describe(), device_.str(), train_.size, num_epochs_, max_steps_,
                               args_.per_device_train_batch_size(), args_.gradient_accumulation_steps(),
                               resume ? fmt::format(", resuming at step {}", state_.global_step) : ""));

    // cuda_graph: the whole run goes on the graph's own stream (see StepGraph); undone on return.
    struct GraphScope {
      Impl& impl;
      ~GraphScope() {
        if (!impl.graph_) return;
        // Gradients are None after train(), as after an eager step, and nothing outside the
        // graph keeps its memory.
        try {
          impl.clear_grads();
        } catch (const std::exception& e) {
          TORCH_WARN("cuda_graph: clearing the gradients after training failed: ", e.what());
        }
        impl.captured_grads_.clear();
        impl.captured_grad_norm_.reset();
        impl.captured_scale_before_.reset();
        if (auto* fused = dynamic_cast<optim::FusedAdamW*>(impl.optimizer_.get())) fused->set_capturable(false);
        impl.graph_.reset();
      }
    } graph_scope{*this};
    if (args_.cuda_graph()) {
      if (auto why = cuda_graph_blocker()) {
        progress.print(fmt::format("cuda_graph: off, training eagerly: {}", *why));
      } else {
        graph_ = std::make_unique<detail::StepGraph>(device_);
        dynamic_cast<optim::FusedAdamW&>(*optimizer_).set_capturable(true);
        eager_shapes_logged_.clear();
        progress.print(fmt::format("cuda_graph: the step is captured after {} eager warm-up steps",
                                   args_.cuda_graph_warmup_steps()));
      }
    }

    module_->train();
    tr_loss_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
    window_steps_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
    nonfinite_streak_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device_));
    total_loss_ = 0.0;
    last_logged_step_ = state_.global_step;
    samples_since_log_ = 0;
    tokens_since_log_ = 0;
    consecutive_skips_ = 0;
    const auto start = Clock::now();
    log_window_start_ = start;
    const auto start_step = state_.global_step;
    control_ = TrainerControl{};
    for (auto& cb : callbacks_) cb->on_train_begin(args_, state_, control_);

    const auto accumulation = args_.gradient_accumulation_steps();
    const auto batch_size = args_.per_device_train_batch_size();
    const auto n = static_cast<std::int64_t>(train_.size);
    const auto data_seed = static_cast<std::uint64_t>(args_.data_seed().value_or(args_.seed()));
    // Where a resumed run picks up: inside an epoch, or at the start of the next one.
    const auto position = detail::resume_position(state_, run_shape());
    const std::int64_t first_epoch = position.epoch;
    const std::int64_t first_skip = position.batches_done;
    std::int64_t samples_seen = 0;
    if (state_.global_step >= max_steps_) {
      // HF trains no step then; the loop below is skipped, the end-of-training events still run.
      progress.print(fmt::format("mantissa: the checkpoint is at step {}, and max_steps is {}: nothing left to train",
                                 state_.global_step, max_steps_));
      control_.should_training_stop = true;
    }

    for (std::int64_t epoch = first_epoch; epoch < num_epochs_ && !control_.should_training_stop; ++epoch) {
      // The data order of an epoch depends only on (data_seed, epoch), so a resumed run sees
      // exactly the batches the uninterrupted run would have seen.
      auto generator = at::detail::createCPUGenerator(data_seed + static_cast<std::uint64_t>(epoch));
      const auto order = torch::randperm(n, generator, torch::kLong);
      const auto* order_ptr = order.data_ptr<std::int64_t>();
      const std::int64_t skip = epoch == first_epoch ? first_skip : 0;
      state_.steps_in_epoch = skip;
      control_.should_epoch_stop = false;
      for (auto& cb : callbacks_) cb->on_epoch_begin(args_, state_, control_);
      auto indices_of = [order_ptr, n, batch_size](std::int64_t b) {
        std::vector<std::size_t> indices;
        const auto begin = b * batch_size;  // < n: b < batches_per_epoch_
        for (auto i = begin; i < begin + std::min(batch_size, n - begin); ++i) {
          indices.push_back(static_cast<std::size_t>(order_ptr[i]));
        }
        return indices;
      };
      detail::BatchPrefetcher batches(train_, indices_of, batches_per_epoch_, args_.dataloader_num_workers());

      for (std::int64_t b = skip; b < batches_per_epoch_; ++b) {
        const std::int64_t group_start = (b / accumulation) * accumulation;
        const std::int64_t in_group = std::min(accumulation, batches_per_epoch_ - group_start);
        const bool boundary = b == group_start + in_group - 1;
        if (b == group_start) {
          for (auto& cb : callbacks_) cb->on_step_begin(args_, state_, control_);
        }
        const auto batch = to_device(batches.get(b), device_, args_.dataloader_pin_memory());
        const auto batch_examples = batch.data.size(0);
        samples_since_log_ += batch_examples;
        samples_seen += batch_examples;
        if (!c10::isFloatingType(batch.data.scalar_type())) {
          tokens_since_log_ += batch.data.numel();
          state_.num_input_tokens_seen += batch.data.numel();
        }

        const bool graphed = graph_ != nullptr && state_.global_step - start_step >= args_.cuda_graph_warmup_steps();
        ++state_.steps_in_epoch;
        if (graphed) {
          graphed_step(batch);
        } else {
          forward_backward(batch, in_group);
          if (!boundary) continue;
          optimizer_step();
        }
        ++state_.global_step;
        state_.epoch = static_cast<double>(epoch) + static_cast<double>(b + 1) / static_cast<double>(batches_per_epoch_);
        for (auto& cb : callbacks_) cb->on_step_end(args_, state_, control_);
        progress.update(state_.global_step);
        maybe_log_save_evaluate(/*epoch_end=*/false);
        if (state_.global_step >= max_steps_) control_.should_training_stop = true;
        if (control_.should_training_stop || control_.should_epoch_stop) break;
      }
      for (auto& cb : callbacks_) cb->on_epoch_end(args_, state_, control_);
      maybe_log_save_evaluate(/*epoch_end=*/true);
    }
    progress.close();
    check_nonfinite_losses();

    const double runtime = seconds_since(start);
    total_loss_ += tr_loss_.item<double>();
    const auto steps_done = state_.global_step - start_step;
    const double train_loss = steps_done > 0 ? total_loss_ / static_cast<double>(steps_done) : 0.0;
    LogEntry metrics{{"train_runtime", runtime},
                     {"train_samples_per_second", runtime > 0 ? static_cast<double>(samples_seen) / runtime : 0.0},
                     {"train_steps_per_second", runtime > 0 ? static_cast<double>(steps_done) / runtime : 0.0},
                     {"train_loss", train_loss}};
    log(metrics);
    for (auto& cb : callbacks_) cb->on_train_end(args_, state_, control_);
    return TrainOutput{state_.global_step, train_loss, metrics};
  }

  /// HF's tr_loss with logging_nan_inf_filter, on the device: a non-finite micro-loss is
  /// replaced by the running average of this logging window, `tr_loss / (1 + global_step -
  /// globalstep_last_logged)`. In place, so that a captured step keeps accumulating into the
  /// same tensors (which then also count the steps on the device); and with few ops: this runs
  /// every micro-batch, and on a small model each dispatched op is a visible share of the step.
  void accumulate_loss(const torch::Tensor& step_loss) {
    // x - x is 0 exactly when x is finite (inf - inf and nan - nan are nan): two ops, where
    // at::isfinite dispatches six on the CPU.
    const auto finite = (step_loss - step_loss).eq(0);
    nonfinite_streak_.add_(1).masked_fill_(finite, 0);
    if (args_.logging_nan_inf_filter()) {
      const auto window_average =
          graph_ ? tr_loss_ / (window_steps_ + 1)
                 : tr_loss_ / static_cast<double>(1 + state_.global_step - last_logged_step_);
      tr_loss_.add_(torch::where(finite, step_loss, window_average));
    } else {
      tr_loss_.add_(step_loss);
    }
  }

  // ---- state -----------------------------------------------------------------------------------

  std::shared_ptr<torch::nn::Module> module_;
  ForwardFn forward_;
  TrainingArguments args_;
  BatchSource train_;
  std::optional<BatchSource> eval_;
  c10::Device device_;
  PrecisionPlan plan_;
  LossFn compute_loss_;
  MetricsFn compute_metrics_;
  OptimizerFactory optimizer_factory_;
  SchedulerFactory scheduler_factory_;
  std::vector<std::shared_ptr<TrainerCallback>> callbacks_;

  bool prepared_ = false;
  std::unique_ptr<amp::MasterWeights> masters_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<torch::Tensor> optimized_params_;  // every param group's tensors: what is clipped
  std::unique_ptr<LrScheduler> scheduler_;
  amp::GradScaler scaler_{amp::GradScalerOptions().enabled(false)};
  bool fused_writes_back_ = false;

  std::int64_t batches_per_epoch_ = 0;
  std::int64_t updates_per_epoch_ = 0;
  std::int64_t max_steps_ = 0;
  std::int64_t num_epochs_ = 0;

  TrainerState state_;
  TrainerControl control_;
  torch::Tensor tr_loss_;
  torch::Tensor window_steps_;  // cuda_graph: optimizer steps since the last log, on the device
  torch::Tensor nonfinite_streak_;
  torch::Tensor grad_norm_;
  torch::Tensor scale_before_;  // the loss scale the last step used (fp16), for the skip log line
  std::unique_ptr<detail::StepGraph> graph_;  // cuda_graph, during train() only
  torch::Tensor captured_grad_norm_;     // what the captured step writes, read after each replay
  torch::Tensor captured_scale_before_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> captured_grads_;  // (param, the graph's grad)
  std::set<std::string> eager_shapes_logged_;
  double total_loss_ = 0.0;
  std::int64_t last_logged_step_ = 0;
  std::int64_t samples_since_log_ = 0;
  std::int64_t tokens_since_log_ = 0;
  std::int64_t consecutive_skips_ = 0;
  bool improved_ = false;
  detail::MetricsLog metrics_log_{args_.output_dir()};
  Clock::time_point log_window_start_;
  detail::Progress quiet_{0, false};
  detail::Progress* progress_ = &quiet_;
};

// ---- Trainer: forwards to Impl ------------------------------------------------------------

Trainer::Trainer(std::shared_ptr<torch::nn::Module> module, ForwardFn forward, TrainingArguments args,
                 BatchSource train, std::optional<BatchSource> eval)
    : impl_(std::make_unique<Impl>(std::move(module), std::move(forward), std::move(args), std::move(train),
                                   std::move(eval))) {}

Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;
Trainer::~Trainer() = default;

Trainer& Trainer::set_compute_loss(LossFn fn) {
  impl_->compute_loss_ = std::move(fn);
  return *this;
}
Trainer& Trainer::set_compute_metrics(MetricsFn fn) {
  impl_->compute_metrics_ = std::move(fn);
  return *this;
}
Trainer& Trainer::set_optimizer_factory(OptimizerFactory factory) {
  TORCH_CHECK_VALUE(!impl_->prepared_, "set_optimizer_factory must be called before the optimizer is created");
  impl_->optimizer_factory_ = std::move(factory);
  return *this;
}
Trainer& Trainer::set_lr_scheduler_factory(SchedulerFactory factory) {
  TORCH_CHECK_VALUE(!impl_->prepared_, "set_lr_scheduler_factory must be called before training starts");
  impl_->scheduler_factory_ = std::move(factory);
  return *this;
}
Trainer& Trainer::add_callback(std::shared_ptr<TrainerCallback> callback) {
  TORCH_CHECK_VALUE(callback != nullptr, "add_callback: the callback is null");
  impl_->callbacks_.push_back(std::move(callback));
  return *this;
}

TrainOutput Trainer::train() { return impl_->train(std::nullopt); }
TrainOutput Trainer::train(const std::string& checkpoint) { return impl_->train(checkpoint); }

LogEntry Trainer::evaluate() {
  impl_->prepare();
  return impl_->run_evaluation(/*during_train=*/false);
}

void Trainer::save_model(const std::string& dir) const {
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
  return *impl_->optimizer_;
}

}  // namespace mantissa
