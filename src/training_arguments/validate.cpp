// TrainingArguments::validate: every value and combination, in HF's words where HF has them.
// One function per concern; validate() runs them in a fixed order, which decides the error a
// user sees when several values are wrong at once.
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <mantissa/optim/optimizer_registry.h>
#include <mantissa/training_arguments.h>

#include "checked_math.h"
#include "device_info.h"
#include "training_arguments/fsdp_checks.h"
#include "training_arguments/python_repr.h"
#include "training_arguments/reporting_checks.h"

namespace mantissa {
namespace {

constexpr std::int64_t kMaxDdpTimeoutSeconds = 2147483647;  // 2^31 - 1

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

// ddp_comm_hook has a message of its own, given with the distributed checks.
void check_choice(const char* /*field*/, const Choice<DdpCommHook>& /*v*/) {}

// optim names an entry of the optimizer registry: the OptimizerNames spellings and what a
// program registered.
void check_choice(const char* field, const Choice<OptimizerNames>& v) {
  TORCH_CHECK_VALUE(optim::find_optimizer(v.name()) != nullptr, field, ": ", v.name(),
                    " is not a valid ", ChoiceTraits<OptimizerNames>::enum_name,
                    ", please select one of ", optim::optimizer_names_text());
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

// save_strategy best and load_best_model_at_end. The latter loads a checkpoint that holds an
// evaluation: each evaluation must fall on a saved step, which HF checks the same way.
void check_best_model(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(
      args.save_strategy() != SaveStrategy::kBest || args.eval_strategy() != IntervalStrategy::kNo,
      "save_strategy best saves when ", args.resolved_metric_for_best_model(),
      " improves, so it requires an eval_strategy of steps or epoch, got eval_strategy='no'");
  const auto& metric = args.metric_for_best_model();
  TORCH_CHECK_VALUE(!metric || (!metric->empty() && *metric != "eval_"),
                    "metric_for_best_model must name a metric (loss, accuracy, ...), got ",
                    detail::repr(metric));
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

// JSON cannot hold inf or nan, and no field means anything with them.
void check_finite_fields(const TrainingArguments& args) {
#define MANTISSA_TA_CHECK_FINITE_(type, name, default_value, help) check_finite(#name, args.name());
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_CHECK_FINITE_)
#undef MANTISSA_TA_CHECK_FINITE_
}

// The enum fields name one of their enum's spellings (HF's ExplicitEnum wording), and
// low_precision_update is a rule the chosen optimizer has.
void check_choice_fields(const TrainingArguments& args) {
#define MANTISSA_TA_CHECK_CHOICE_(type, name, default_value, help) check_choice(#name, args.name());
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TA_CHECK_CHOICE_)
#undef MANTISSA_TA_CHECK_CHOICE_
  const auto* spec = optim::find_optimizer(args.optim().name());
  if (spec->check_arguments) spec->check_arguments(args);
  const bool update_rules = spec->low_precision_rules;
  const auto& update = args.low_precision_update();
  TORCH_CHECK_VALUE(update_rules || update == LowPrecisionUpdateMode::kAuto ||
                        update == LowPrecisionUpdateMode::kNearest,
                    "low_precision_update ", update, " is not a rule optim ", args.optim(),
                    " has (mantissa's FusedAdamW, Adafactor and 8-bit AdamW have it); use one "
                    "of those, or low_precision_update nearest");
}

void check_reporting(const TrainingArguments& args) {
  detail::check_report_to(args.report_to());
  detail::check_run_name(args.run_name());
}

// Which precision flags go together (HF's texts).
void check_precision_flags(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(
      !(args.fp16() && args.bf16()),
      "At most one of fp16 and bf16 can be True, but not both (fp16=True, bf16=True)");
  TORCH_CHECK_VALUE(!(args.fp16_full_eval() && args.bf16_full_eval()),
                    "At most one of fp16 and bf16 can be True for full eval, but not both "
                    "(fp16_full_eval=True, bf16_full_eval=True)");
}

// FP8 runs the converted layers' matmuls in FP8 and everything else under autocast, whose
// dtype is the one the FP8 GEMMs write; the recipe's numbers are checked by the recipe itself
// (its messages name the fields). Checked whether or not fp8 is on, as HF checks every field.
void check_fp8(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(!args.fp8() || args.bf16() || args.fp16(),
                    "fp8 needs bf16 or fp16 mixed precision for the layers and outputs that stay "
                    "in high precision: add --bf16 (or --fp16) (fp8=True, bf16=False, "
                    "fp16=False)");
  args.float8_recipe().validate();
}

void check_output_dir(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(!args.output_dir().empty(), "output_dir must not be empty, got ''");
}

// How long the run is and how big its batches are.
void check_run_length(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(args.max_steps() > 0 || args.num_train_epochs() > 0,
                    "num_train_epochs must be positive when max_steps <= 0, got num_train_epochs=",
                    detail::repr(args.num_train_epochs()), " and max_steps=", args.max_steps());
  TORCH_CHECK_VALUE(args.per_device_train_batch_size() > 0,
                    "per_device_train_batch_size must be positive, got ",
                    args.per_device_train_batch_size());
  TORCH_CHECK_VALUE(args.per_device_eval_batch_size() > 0,
                    "per_device_eval_batch_size must be positive, got ",
                    args.per_device_eval_batch_size());
  TORCH_CHECK_VALUE(args.gradient_accumulation_steps() >= 1,
                    "gradient_accumulation_steps must be at least 1, got ",
                    args.gradient_accumulation_steps());
  check_counts_fit(args);
}

// The optimizer's hyperparameters (torch.optim's limits).
void check_optimizer(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(args.learning_rate() >= 0, "learning_rate must be non-negative, got ",
                    detail::repr(args.learning_rate()));
  TORCH_CHECK_VALUE(args.weight_decay() >= 0, "weight_decay must be non-negative, got ",
                    detail::repr(args.weight_decay()));
  TORCH_CHECK_VALUE(args.adam_beta1() >= 0 && args.adam_beta1() < 1,
                    "adam_beta1 must be in [0, 1), got ", detail::repr(args.adam_beta1()));
  TORCH_CHECK_VALUE(args.adam_beta2() >= 0 && args.adam_beta2() < 1,
                    "adam_beta2 must be in [0, 1), got ", detail::repr(args.adam_beta2()));
  TORCH_CHECK_VALUE(args.adam_epsilon() >= 0, "adam_epsilon must be non-negative, got ",
                    detail::repr(args.adam_epsilon()));
  TORCH_CHECK_VALUE(args.max_grad_norm() >= 0,
                    "max_grad_norm must be non-negative (0 disables clipping), got ",
                    detail::repr(args.max_grad_norm()));
}

// The learning-rate schedule: warmup, and the schedule's own arguments.
void check_schedule(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(args.warmup_steps() >= 0, "warmup_steps must be non-negative, got ",
                    args.warmup_steps());
  TORCH_CHECK_VALUE(args.warmup_ratio() >= 0 && args.warmup_ratio() <= 1,
                    "warmup_ratio must lie in range [0,1], got ",
                    detail::repr(args.warmup_ratio()));
  // Relative to the optimizer's lr (which the Trainer sets to learning_rate) where a schedule
  // reads it.
  check_lr_scheduler_kwargs(args.lr_scheduler_type(), args.lr_scheduler_kwargs(),
                            args.learning_rate());
}

// The logging, evaluation and save intervals. HF: a value above 1 must be a whole number of
// steps; below 1 it is a ratio.
void check_intervals(const TrainingArguments& args) {
  const auto check_interval = [](const char* field, double steps) {
    TORCH_CHECK_VALUE(steps <= 1 || steps == std::floor(steps), "--", field,
                      " must be an integer if bigger than 1: ", detail::repr(steps));
  };
  if (args.logging_strategy() == IntervalStrategy::kSteps) {
    TORCH_CHECK_VALUE(args.logging_steps() > 0,
                      "logging strategy steps requires non-zero --logging_steps (a positive "
                      "number of steps, or a ratio in (0, 1)), got logging_steps=",
                      detail::repr(args.logging_steps()));
    check_interval("logging_steps", args.logging_steps());
  }
  if (args.eval_strategy() == IntervalStrategy::kSteps) {
    TORCH_CHECK_VALUE(!args.eval_steps() || *args.eval_steps() >= 0,
                      "eval_steps must be positive (or unset to follow logging_steps), got ",
                      detail::repr(args.eval_steps()));
    TORCH_CHECK_VALUE(args.resolved_eval_steps() > 0,
                      "evaluation strategy steps requires either non-zero --eval_steps or "
                      "--logging_steps, got eval_steps=",
                      detail::repr(args.eval_steps()),
                      " and logging_steps=", detail::repr(args.logging_steps()));
    check_interval("eval_steps", args.resolved_eval_steps());
  }
  if (args.save_strategy() == SaveStrategy::kSteps) {
    TORCH_CHECK_VALUE(args.save_steps() > 0,
                      "save strategy steps requires a positive --save_steps (a number of steps, or "
                      "a ratio in (0, 1)), got save_steps=",
                      detail::repr(args.save_steps()));
    check_interval("save_steps", args.save_steps());
  }
  // Whatever the strategy, the Trainer turns each interval into a step count (and records it in
  // trainer_state.json, as HF does), so each must be one: not negative, and within int64.
  check_step_count("logging_steps", args.logging_steps());
  check_step_count("save_steps", args.save_steps());
  if (args.eval_steps()) check_step_count("eval_steps", *args.eval_steps());
}

void check_label_names(const TrainingArguments& args) {
  if (!args.label_names()) return;
  for (const auto& name : *args.label_names()) {
    TORCH_CHECK_VALUE(!name.empty(), "label_names: a name is empty, in ",
                      detail::repr(*args.label_names()));
  }
}

// How many checkpoints are kept, and which one a run continues from.
void check_checkpoints(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(!args.save_total_limit() || *args.save_total_limit() >= 1,
                    "save_total_limit must be at least 1 (or None to keep every checkpoint), got ",
                    detail::repr(args.save_total_limit()));
  TORCH_CHECK_VALUE(!args.resume_from_checkpoint() || !args.resume_from_checkpoint()->empty(),
                    "resume_from_checkpoint must be a checkpoint folder or 'latest', got ''");
}

// The fp16 loss scaler's settings.
void check_loss_scaling(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(args.loss_scale() >= 0,
                    "loss_scale must be non-negative (0 = dynamic loss scaling), got ",
                    detail::repr(args.loss_scale()));
  TORCH_CHECK_VALUE(args.initial_scale_power() >= 0 && args.initial_scale_power() <= 127,
                    "initial_scale_power must be in [0, 127] (2^128 overflows float32), got ",
                    args.initial_scale_power());
  TORCH_CHECK_VALUE(args.loss_scale_window() >= 1, "loss_scale_window must be at least 1, got ",
                    args.loss_scale_window());
  TORCH_CHECK_VALUE(args.hysteresis() >= 1,
                    "hysteresis must be at least 1 (1 = back off on every overflow), got ",
                    args.hysteresis());
  TORCH_CHECK_VALUE(args.min_loss_scale() >= 0, "min_loss_scale must be non-negative, got ",
                    detail::repr(args.min_loss_scale()));
  // The scale lives in a float32 tensor (as torch.amp.GradScaler's does): a larger value would
  // be inf there, and every step would overflow.
  const auto check_float32 = [](const char* field, double scale) {
    TORCH_CHECK_VALUE(scale <= std::numeric_limits<float>::max(), "--", field, " ",
                      detail::repr(scale),
                      " does not fit in the float32 that holds the loss scale (at most ",
                      detail::repr(static_cast<double>(std::numeric_limits<float>::max())), ")");
  };
  check_float32("loss_scale", args.loss_scale());
  check_float32("min_loss_scale", args.min_loss_scale());
  if (const auto& max_scale = args.max_loss_scale()) {
    check_float32("max_loss_scale", *max_scale);
    TORCH_CHECK_VALUE(*max_scale > 0 && *max_scale >= args.min_loss_scale(),
                      "max_loss_scale must be positive and >= min_loss_scale, got max_loss_scale=",
                      detail::repr(*max_scale),
                      " and min_loss_scale=", detail::repr(args.min_loss_scale()));
  }
  TORCH_CHECK_VALUE(args.max_consecutive_nonfinite() >= 0,
                    "max_consecutive_nonfinite must be non-negative (0 = never stop), got ",
                    args.max_consecutive_nonfinite());
}

void check_data_loading(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(args.dataloader_num_workers() >= 0,
                    "dataloader_num_workers must be non-negative, got ",
                    args.dataloader_num_workers());
}

void check_cuda_graph(const TrainingArguments& args) {
  TORCH_CHECK_VALUE(args.cuda_graph_warmup_steps() >= 1,
                    "cuda_graph_warmup_steps must be at least 1 (the optimizer state is made by an "
                    "eager step), got ",
                    args.cuda_graph_warmup_steps());
}

// Gradient checkpointing re-runs each checkpointed block's forward inside the backward.
void check_gradient_checkpointing(const TrainingArguments& args) {
  if (!args.gradient_checkpointing()) return;
  TORCH_CHECK_VALUE(!args.cuda_graph(),
                    "gradient_checkpointing saves and restores the random generators' states "
                    "around each recomputed block, which a CUDA graph capture does not allow; "
                    "cuda_graph must be false");
  TORCH_CHECK_VALUE(!args.fp8(),
                    "gradient_checkpointing with fp8: the recomputed forward would record the FP8 "
                    "layers' amaxes a second time, which mantissa does not support yet; train "
                    "without one of --gradient_checkpointing and --fp8");
}

// Several processes: the backend, the gradient hook, the timeout and the bucket size.
void check_distributed(const TrainingArguments& args) {
  if (const auto& backend = args.ddp_backend()) {
    const bool known_to_hf = *backend == "mpi" || *backend == "xccl" || *backend == "hccl" ||
                             *backend == "cncl" || *backend == "mccl" || *backend == "ccl";
    TORCH_CHECK_VALUE(
        Choice<distributed::Backend>(*backend).is_valid(), "ddp_backend: ", detail::repr(*backend),
        known_to_hf ? " is a backend mantissa does not build; " : " is not a collective backend; ",
        "choose gloo (CPU) or nccl (CUDA), or leave it unset");
  }
  TORCH_CHECK_VALUE(args.ddp_comm_hook().is_valid(),
                    "ddp_comm_hook: ", detail::repr(args.ddp_comm_hook()), " is not one of ",
                    Choice<DdpCommHook>::names_text());
  // c10d adds the timeout to the wall clock in int64 nanoseconds: past ~7e9 s from 2026 the
  // deadline overflows and every process waits forever. 2^31 - 1 s (68 years) is far from that.
  TORCH_CHECK_VALUE(args.ddp_timeout() > 0,
                    "ddp_timeout must be a positive number of seconds, got ", args.ddp_timeout());
  TORCH_CHECK_VALUE(args.ddp_timeout() <= kMaxDdpTimeoutSeconds, "ddp_timeout is ",
                    args.ddp_timeout(), " s, more than the largest the collectives can wait, ",
                    kMaxDdpTimeoutSeconds,
                    " s (about 68 years); to wait as good as forever, pass that value");
  const auto& bucket_cap = args.ddp_bucket_cap_mb();
  TORCH_CHECK_VALUE(!bucket_cap || (*bucket_cap > 0 && *bucket_cap <= (int64_t{1} << 43)),
                    "ddp_bucket_cap_mb must be a positive number of MiB (at most 2^43) or None, "
                    "got ",
                    detail::repr(bucket_cap));
}

// Sharding (fsdp): the options, and what a sharded run cannot combine with.
void check_fsdp(const TrainingArguments& args) {
  const auto settings = detail::read_fsdp_settings(args.fsdp(), args.fsdp_config());
  if (!settings.enabled) return;
  const char* mode = settings.shards_parameters() ? "fsdp (full sharding)" : "fsdp shard_grad_op";
  const auto* spec = optim::find_optimizer(args.optim().name());
  if (!spec->shardable) {
    std::vector<std::string> by_tensor;
    for (const auto& entry : optim::registered_optimizers()) {
      if (entry.shards_whole_tensors && !entry.name.empty()) by_tensor.push_back(entry.name);
    }
    TORCH_CHECK_VALUE(spec->shards_whole_tensors, mode,
                      " shards the state of adamw_torch_fused by flat element ranges, and that of ",
                      c10::Join(", ", by_tensor), " by whole tensors; optim ",
                      detail::repr(args.optim()),
                      " cannot be sharded: use adamw_torch_fused (the default)");
  }
  TORCH_CHECK_VALUE(!args.bf16_full_eval() && !args.fp16_full_eval(), mode,
                    " ties the optimizer's tensors to the parameters' storage (flat buffers, or "
                    "each process's own tensors and masters), which casting the model for "
                    "bf16_full_eval or fp16_full_eval would replace; evaluate under autocast "
                    "instead (--bf16 or --fp16 without full_eval)");
  TORCH_CHECK_VALUE(!args.save_on_each_node(), mode,
                    " writes one checkpoint for the whole job (put together on rank 0, or each "
                    "process's shards in one folder), which a copy per node would not hold; "
                    "save_on_each_node must be false");
  TORCH_CHECK_VALUE(!args.cuda_graph(), mode,
                    " reduces gradients from autograd hooks, which a CUDA graph cannot replay; "
                    "cuda_graph must be false");
  TORCH_CHECK_VALUE(!(settings.activation_checkpointing && args.gradient_checkpointing()),
                    "fsdp_config's activation_checkpointing and --gradient_checkpointing both "
                    "ask to recompute the blocks in the backward; set one of them (HF refuses "
                    "both too)");
}

// Whether this machine can run the requested precision. Only asked when a precision mode needs
// it, so that plain fp32 runs never touch CUDA.
void check_hardware(const TrainingArguments& args) {
  if (args.bf16() || args.fp16() || args.bf16_full_eval() || args.fp16_full_eval() ||
      args.tf32().value_or(false)) {
    detail::check_precision_support(args, detail::query_device_info());
  }
}

}  // namespace

void TrainingArguments::validate() const {
  check_finite_fields(*this);
  check_choice_fields(*this);
  check_reporting(*this);
  check_precision_flags(*this);
  check_fp8(*this);
  check_output_dir(*this);
  check_run_length(*this);
  check_optimizer(*this);
  check_schedule(*this);
  check_intervals(*this);
  check_best_model(*this);
  check_label_names(*this);
  check_checkpoints(*this);
  check_loss_scaling(*this);
  check_data_loading(*this);
  check_cuda_graph(*this);
  check_gradient_checkpointing(*this);
  check_distributed(*this);
  check_fsdp(*this);
  check_hardware(*this);
}

}  // namespace mantissa
