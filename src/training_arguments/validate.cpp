// TrainingArguments::validate: every value and combination, in HF's words where HF has them.
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include <c10/util/Exception.h>

#include <mantissa/training_arguments.h>

#include "checked_math.h"
#include "device_info.h"
#include "trainer/reporting.h"
#include "training_arguments/python_repr.h"

namespace mantissa {
namespace {

template <class T>
void check_finite(const char* field, const T& v) {
  if constexpr (std::is_same_v<T, double>) {
    TORCH_CHECK_VALUE(std::isfinite(v), field, " must be a finite number, got ", detail::repr(v));
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    TORCH_CHECK_VALUE(!v || std::isfinite(*v), field, " must be a finite number or None, got ",
                      detail::repr(v));
  }
}

template <class T>
void check_choice(const char* /*field*/, const T& /*v*/) {}

template <class E>
void check_choice(const char* field, const Choice<E>& v) {
  TORCH_CHECK_VALUE(v.is_valid(), field, ": ", v.name(), " is not a valid ",
                    ChoiceTraits<E>::enum_name, ", please select one of ",
                    Choice<E>::choices_text());
}

// The run's counts (examples per optimizer step, optimizer steps, epochs, examples drawn) are
// int64 in the Trainer and its state. Those that follow from the arguments alone are checked
// here, so that an impossible size is an error naming its flag rather than a wrapped count;
// make_run_schedule (src/trainer/run_schedule.cpp) checks those that depend on the dataset.
void check_counts_fit(const TrainingArguments& args) {
  const auto batch = args.per_device_train_batch_size();
  const auto accumulation = args.gradient_accumulation_steps();
  const auto examples_per_step = detail::checked_mul(batch, accumulation);
  TORCH_CHECK_VALUE(examples_per_step.has_value(), "--per_device_train_batch_size ", batch,
                    " x --gradient_accumulation_steps ", accumulation,
                    " examples per optimizer step is more than a 64-bit count holds (at most ",
                    detail::kMaxCount, ")");
  if (args.max_steps() > 0) {
    TORCH_CHECK_VALUE(detail::checked_mul(args.max_steps(), *examples_per_step).has_value(),
                      "--max_steps ", args.max_steps(), " optimizer steps of ", *examples_per_step,
                      " examples each (--per_device_train_batch_size ", batch,
                      " x --gradient_accumulation_steps ", accumulation,
                      ") is more examples than a 64-bit count holds (at most ", detail::kMaxCount,
                      "); lower --max_steps");
    return;
  }
  const double epochs = args.num_train_epochs();
  TORCH_CHECK_VALUE(detail::fits_int64(std::ceil(epochs)), "--num_train_epochs ",
                    detail::repr(epochs), " is more epochs than a 64-bit count holds (at most ",
                    detail::kMaxCount, ")");
  // Every epoch takes at least one optimizer step, whatever the dataset.
  const auto min_steps = static_cast<int64_t>(std::ceil(epochs));
  TORCH_CHECK_VALUE(
      detail::checked_mul(min_steps, *examples_per_step).has_value(), "--num_train_epochs ",
      detail::repr(epochs), " (at least ", min_steps, " optimizer steps) of ", *examples_per_step,
      " examples per step (--per_device_train_batch_size ", batch,
      " x --gradient_accumulation_steps ", accumulation,
      ") is more examples than a 64-bit count holds (at most ", detail::kMaxCount, ")");
}

// An interval in steps (or a ratio below 1 of the run): what `resolve_steps` can turn into a
// step count.
void check_step_count(const char* field, double steps) {
  TORCH_CHECK_VALUE(steps >= 0 && steps < 0x1p63, "--", field, " ", detail::repr(steps),
                    " is not a number of steps: it must lie in [0, ", detail::kMaxCount, "]");
}

// load_best_model_at_end loads a checkpoint that holds an evaluation: each evaluation must
// fall on a saved step, which HF checks the same way.
void check_best_model_settings(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(!args.metric_for_best_model() || !args.metric_for_best_model()->empty() &&
                                                         *args.metric_for_best_model() != "eval_",
                    "metric_for_best_model must name a metric (loss, accuracy, ...), got ",
                    detail::repr(args.metric_for_best_model()));
  if (!args.load_best_model_at_end() || args.save_strategy() == SaveStrategy::kBest) return;
  const auto eval = args.eval_strategy().name();
  const auto save = args.save_strategy().name();
  TORCH_CHECK_VALUE(eval == save,
                    "load_best_model_at_end needs checkpoints at the evaluations: save_strategy "
                    "must equal eval_strategy (or be best), but eval_strategy is '",
                    eval, "' and save_strategy is '", save, "'");
  if (args.eval_strategy() != IntervalStrategy::kSteps) return;
  const double eval_steps = args.resolved_eval_steps();
  const double save_steps = args.save_steps();
  if (eval_steps >= 1 && save_steps >= 1) {
    TORCH_CHECK_VALUE(std::fmod(save_steps, eval_steps) == 0,
                      "load_best_model_at_end needs every save to fall on an evaluation: "
                      "save_steps (",
                      detail::repr(save_steps), ") must be a whole multiple of eval_steps (",
                      detail::repr(eval_steps), ")");
    return;
  }
  TORCH_CHECK_VALUE(eval_steps < 1 && save_steps < 1,
                    "load_best_model_at_end cannot check that saves fall on evaluations when one "
                    "of save_steps (",
                    detail::repr(save_steps), ") and eval_steps (", detail::repr(eval_steps),
                    ") is a ratio of the run and the other a number of steps; give both the same "
                    "way");
  // Both ratios: compared in millionths, as HF does, so that 0.2 and 0.1 divide.
  const auto millionths = [](double ratio) { return std::llround(ratio * 1e6); };
  for (const auto& [name, ratio] :
       {std::pair{"eval_steps", eval_steps}, {"save_steps", save_steps}}) {
    TORCH_CHECK_VALUE(millionths(ratio) > 0,
                      "load_best_model_at_end compares save_steps and "
                      "eval_steps in millionths of the run, and ",
                      name, " (", detail::repr(ratio),
                      ") rounds to zero of them; give a ratio of at least 5e-07 or a number of "
                      "steps");
  }
  TORCH_CHECK_VALUE(
      millionths(eval_steps) > 0 && millionths(save_steps) % millionths(eval_steps) == 0,
      "load_best_model_at_end needs every save to fall on an evaluation: save_steps (",
      detail::repr(save_steps), ") must be a whole multiple of eval_steps (",
      detail::repr(eval_steps), ")");
}

}  // namespace

void TrainingArguments::validate() const {
  // JSON cannot hold inf or nan, and no field means anything with them.
#define MANTISSA_TA_CHECK_FINITE_(type, name, default_value, help) check_finite(#name, name##_);
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_CHECK_FINITE_)
#undef MANTISSA_TA_CHECK_FINITE_

  // Names of enum fields, in HF's ExplicitEnum wording.
#define MANTISSA_TA_CHECK_CHOICE_(type, name, default_value, help) check_choice(#name, name##_);
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_CHECK_CHOICE_)
#undef MANTISSA_TA_CHECK_CHOICE_
  const bool fused_optimizer = is_fused_adamw(optim_.value());  // valid: checked above
  TORCH_CHECK_VALUE(fused_optimizer || low_precision_update_ == LowPrecisionUpdateMode::kAuto ||
                        low_precision_update_ == LowPrecisionUpdateMode::kNearest,
                    "low_precision_update ", low_precision_update_,
                    " is a rule of mantissa's FusedAdamW, but optim is ", optim_,
                    "; use --optim adamw_torch_fused (or low_precision_update nearest)");
  detail::parse_report_to(report_to_);  // report_to and run_name: trainer/reporting.h
  detail::check_run_name(run_name_);

  // Precision combinations (HF's texts).
  TORCH_CHECK_VALUE(
      !(fp16_ && bf16_),
      "At most one of fp16 and bf16 can be True, but not both (fp16=True, bf16=True)");
  TORCH_CHECK_VALUE(!(fp16_full_eval_ && bf16_full_eval_),
                    "At most one of fp16 and bf16 can be True for full eval, but not both "
                    "(fp16_full_eval=True, bf16_full_eval=True)");

  TORCH_CHECK_VALUE(!output_dir_.empty(), "output_dir must not be empty, got ''");

  // Length and batch.
  TORCH_CHECK_VALUE(max_steps_ > 0 || num_train_epochs_ > 0,
                    "num_train_epochs must be positive when max_steps <= 0, got num_train_epochs=",
                    detail::repr(num_train_epochs_), " and max_steps=", max_steps_);
  TORCH_CHECK_VALUE(per_device_train_batch_size_ > 0,
                    "per_device_train_batch_size must be positive, got ",
                    per_device_train_batch_size_);
  TORCH_CHECK_VALUE(per_device_eval_batch_size_ > 0,
                    "per_device_eval_batch_size must be positive, got ",
                    per_device_eval_batch_size_);
  TORCH_CHECK_VALUE(gradient_accumulation_steps_ >= 1,
                    "gradient_accumulation_steps must be at least 1, got ",
                    gradient_accumulation_steps_);
  check_counts_fit(*this);

  // Optimizer (torch.optim's limits).
  TORCH_CHECK_VALUE(learning_rate_ >= 0, "learning_rate must be non-negative, got ",
                    detail::repr(learning_rate_));
  TORCH_CHECK_VALUE(weight_decay_ >= 0, "weight_decay must be non-negative, got ",
                    detail::repr(weight_decay_));
  TORCH_CHECK_VALUE(adam_beta1_ >= 0 && adam_beta1_ < 1, "adam_beta1 must be in [0, 1), got ",
                    detail::repr(adam_beta1_));
  TORCH_CHECK_VALUE(adam_beta2_ >= 0 && adam_beta2_ < 1, "adam_beta2 must be in [0, 1), got ",
                    detail::repr(adam_beta2_));
  TORCH_CHECK_VALUE(adam_epsilon_ >= 0, "adam_epsilon must be non-negative, got ",
                    detail::repr(adam_epsilon_));
  TORCH_CHECK_VALUE(max_grad_norm_ >= 0,
                    "max_grad_norm must be non-negative (0 disables clipping), got ",
                    detail::repr(max_grad_norm_));

  // Schedule.
  TORCH_CHECK_VALUE(warmup_steps_ >= 0, "warmup_steps must be non-negative, got ", warmup_steps_);
  TORCH_CHECK_VALUE(warmup_ratio_ >= 0 && warmup_ratio_ <= 1,
                    "warmup_ratio must lie in range [0,1], got ", detail::repr(warmup_ratio_));
  // The schedule's own arguments, relative to the optimizer's lr (which the Trainer sets to
  // learning_rate) where a schedule reads it.
  check_lr_scheduler_kwargs(lr_scheduler_type_, lr_scheduler_kwargs_, learning_rate_);

  // Intervals. HF: a value above 1 must be a whole number of steps; below 1 it is a ratio.
  const auto check_interval = [](const char* field, double steps) {
    TORCH_CHECK_VALUE(steps <= 1 || steps == std::floor(steps), "--", field,
                      " must be an integer if bigger than 1: ", detail::repr(steps));
  };
  if (logging_strategy_ == IntervalStrategy::kSteps) {
    TORCH_CHECK_VALUE(logging_steps_ > 0,
                      "logging strategy steps requires non-zero --logging_steps (a positive "
                      "number of steps, or a ratio in (0, 1)), got logging_steps=",
                      detail::repr(logging_steps_));
    check_interval("logging_steps", logging_steps_);
  }
  if (eval_strategy_ == IntervalStrategy::kSteps) {
    TORCH_CHECK_VALUE(!eval_steps_ || *eval_steps_ >= 0,
                      "eval_steps must be positive (or unset to follow logging_steps), got ",
                      detail::repr(eval_steps_));
    TORCH_CHECK_VALUE(resolved_eval_steps() > 0,
                      "evaluation strategy steps requires either non-zero --eval_steps or "
                      "--logging_steps, got eval_steps=",
                      detail::repr(eval_steps_),
                      " and logging_steps=", detail::repr(logging_steps_));
    check_interval("eval_steps", resolved_eval_steps());
  }
  if (save_strategy_ == SaveStrategy::kSteps) {
    TORCH_CHECK_VALUE(save_steps_ > 0,
                      "save strategy steps requires a positive --save_steps (a number of steps, or "
                      "a ratio in (0, 1)), got save_steps=",
                      detail::repr(save_steps_));
    check_interval("save_steps", save_steps_);
  }
  // Whatever the strategy, the Trainer turns each interval into a step count (and records it in
  // trainer_state.json, as HF does), so each must be one: not negative, and within int64.
  check_step_count("logging_steps", logging_steps_);
  check_step_count("save_steps", save_steps_);
  if (eval_steps_) check_step_count("eval_steps", *eval_steps_);
  TORCH_CHECK_VALUE(
      save_strategy_ != SaveStrategy::kBest || eval_strategy_ != IntervalStrategy::kNo,
      "save_strategy best saves when ", resolved_metric_for_best_model(),
      " improves, so it requires an eval_strategy of steps or epoch, got eval_strategy='no'");
  check_best_model_settings(*this);
  if (label_names_) {
    for (const auto& name : *label_names_) {
      TORCH_CHECK_VALUE(!name.empty(), "label_names: a name is empty, in ",
                        detail::repr(*label_names_));
    }
  }
  TORCH_CHECK_VALUE(!save_total_limit_ || *save_total_limit_ >= 1,
                    "save_total_limit must be at least 1 (or None to keep every checkpoint), got ",
                    detail::repr(save_total_limit_));
  TORCH_CHECK_VALUE(!resume_from_checkpoint_ || !resume_from_checkpoint_->empty(),
                    "resume_from_checkpoint must be a checkpoint folder or 'latest', got ''");

  // Loss scaling.
  TORCH_CHECK_VALUE(loss_scale_ >= 0,
                    "loss_scale must be non-negative (0 = dynamic loss scaling), got ",
                    detail::repr(loss_scale_));
  TORCH_CHECK_VALUE(initial_scale_power_ >= 0 && initial_scale_power_ <= 127,
                    "initial_scale_power must be in [0, 127] (2^128 overflows float32), got ",
                    initial_scale_power_);
  TORCH_CHECK_VALUE(loss_scale_window_ >= 1, "loss_scale_window must be at least 1, got ",
                    loss_scale_window_);
  TORCH_CHECK_VALUE(hysteresis_ >= 1,
                    "hysteresis must be at least 1 (1 = back off on every overflow), got ",
                    hysteresis_);
  TORCH_CHECK_VALUE(min_loss_scale_ >= 0, "min_loss_scale must be non-negative, got ",
                    detail::repr(min_loss_scale_));
  // The scale lives in a float32 tensor (as torch.amp.GradScaler's does): a larger value would
  // be inf there, and every step would overflow.
  const auto check_float32 = [](const char* field, double scale) {
    TORCH_CHECK_VALUE(scale <= std::numeric_limits<float>::max(), "--", field, " ",
                      detail::repr(scale),
                      " does not fit in the float32 that holds the loss scale (at most ",
                      detail::repr(static_cast<double>(std::numeric_limits<float>::max())), ")");
  };
  check_float32("loss_scale", loss_scale_);
  check_float32("min_loss_scale", min_loss_scale_);
  if (max_loss_scale_) check_float32("max_loss_scale", *max_loss_scale_);
  if (max_loss_scale_) {
    TORCH_CHECK_VALUE(*max_loss_scale_ > 0 && *max_loss_scale_ >= min_loss_scale_,
                      "max_loss_scale must be positive and >= min_loss_scale, got max_loss_scale=",
                      detail::repr(*max_loss_scale_),
                      " and min_loss_scale=", detail::repr(min_loss_scale_));
  }
  TORCH_CHECK_VALUE(max_consecutive_nonfinite_ >= 0,
                    "max_consecutive_nonfinite must be non-negative (0 = never stop), got ",
                    max_consecutive_nonfinite_);

  // Data loading.
  TORCH_CHECK_VALUE(dataloader_num_workers_ >= 0,
                    "dataloader_num_workers must be non-negative, got ", dataloader_num_workers_);
  TORCH_CHECK_VALUE(cuda_graph_warmup_steps_ >= 1,
                    "cuda_graph_warmup_steps must be at least 1 (the optimizer state is made by an "
                    "eager step), got ",
                    cuda_graph_warmup_steps_);

  // Several processes.
  if (ddp_backend_) {
    const auto& backend = *ddp_backend_;
    const bool known_to_hf = backend == "mpi" || backend == "xccl" || backend == "hccl" ||
                             backend == "cncl" || backend == "mccl" || backend == "ccl";
    TORCH_CHECK_VALUE(
        backend == "gloo" || backend == "nccl", "ddp_backend: ", detail::repr(backend),
        known_to_hf ? " is a backend mantissa does not build; " : " is not a collective backend; ",
        "choose gloo (CPU) or nccl (CUDA), or leave it unset");
  }
  TORCH_CHECK_VALUE(ddp_comm_hook_ == "none" || ddp_comm_hook_ == "fp16_compress" ||
                        ddp_comm_hook_ == "bf16_compress",
                    "ddp_comm_hook: ", detail::repr(ddp_comm_hook_),
                    " is not one of none, fp16_compress, bf16_compress");
  // In milliseconds the timeout must still fit in int64 (std::chrono::milliseconds).
  TORCH_CHECK_VALUE(ddp_timeout_ > 0 && ddp_timeout_ <= std::numeric_limits<int64_t>::max() / 1000,
                    "ddp_timeout must be a positive number of seconds, got ", ddp_timeout_);
  TORCH_CHECK_VALUE(
      !ddp_bucket_cap_mb_ || (*ddp_bucket_cap_mb_ > 0 && *ddp_bucket_cap_mb_ <= (int64_t{1} << 43)),
      "ddp_bucket_cap_mb must be a positive number of MiB (at most 2^43) or None, "
      "got ",
      detail::repr(ddp_bucket_cap_mb_));

  // Hardware: only asked when a precision mode needs it, so plain fp32 runs never touch CUDA.
  if (bf16_ || fp16_ || bf16_full_eval_ || fp16_full_eval_ || tf32_.value_or(false)) {
    detail::check_precision_support(*this, detail::query_device_info());
  }
}

}  // namespace mantissa
