#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <mantissa/arg.h>
#include <mantissa/argument_enums.h>
#include <mantissa/distributed_backend.h>
#include <mantissa/gradient_checkpointing_kwargs.h>
#include <mantissa/lr_scheduler_kwargs.h>
#include <mantissa/report_to.h>

/// The fields of `mantissa::TrainingArguments`, one line each: `X(type, name, default, help)`.
///
/// This table is the single place a field is spelled out. It expands into the member
/// declarations (a `MANTISSA_ARG` each: chained setter, getter, in-class default), the
/// command-line flags (`--name`, with the help text and the default shown by `--help`) and
/// the JSON keys of `training_args.json`. The help text is the field's documentation;
/// docs/training_arguments.md shows each field beside its Python spelling.
///
/// Names and defaults are those of Hugging Face `transformers.TrainingArguments`; the loss
/// scaling fields HF lacks take DeepSpeed's names, with defaults that keep the behaviour of
/// `torch.amp.GradScaler`. Every getter and setter is a plain host value: none touches a
/// device.
// clang-format off
#define MANTISSA_TRAINING_ARGUMENTS_FIELDS(X)                                                      \
  /* ---- output ---------------------------------------------------------------------- */         \
  X(std::string, output_dir, "trainer_output",                                                     \
    "Folder that receives checkpoints, the final model and the training logs.")                    \
  X(bool, overwrite_output_dir, false,                                                             \
    "Allow training into an output_dir that already holds files (a resume may point there).")      \
  /* ---- how long, how big ------------------------------------------------------------ */        \
  X(double, num_train_epochs, 3.0,                                                                 \
    "How many passes over the training set; a fractional value stops part-way through the "        \
    "last one. Unused when max_steps > 0.")                                                        \
  X(int64_t, max_steps, -1,                                                                        \
    "When positive, the exact number of optimizer steps to take; num_train_epochs is then "        \
    "ignored.")                                                                                    \
  X(int64_t, per_device_train_batch_size, 8, "Training examples per batch on each device.")        \
  X(int64_t, per_device_eval_batch_size, 8, "Evaluation examples per batch on each device.")       \
  X(int64_t, gradient_accumulation_steps, 1,                                                       \
    "Micro-batches whose gradients are summed before one optimizer step.")                         \
  /* ---- optimizer -------------------------------------------------------------------- */        \
  X(Choice<OptimizerNames>, optim, OptimizerNames::kAdamWTorchFused,                               \
    "Optimizer, by its name in the optimizer registry. adamw_torch_fused and "                     \
    "adamw_mantissa_fused both select mantissa's FusedAdamW, which unscales, checks for "          \
    "inf/nan, steps and casts masters back in one pass without a host sync.")                      \
  X(std::optional<std::string>, optim_args, std::nullopt,                                          \
    "Extra arguments of the optimizer as HF's 'key=value,key=value' string (adafactor: "           \
    "clip_threshold, decay_rate, beta1, eps1, eps2; adamw_torch_8bit: block_size; muon: "          \
    "momentum, nesterov, ns_steps, adjust_lr_fn, ...; docs/optimizers.md lists them).")            \
  X(double, learning_rate, 5e-5, "Peak learning rate, reached after warmup.")                      \
  X(double, weight_decay, 0.0,                                                                     \
    "Decoupled weight decay of AdamW (or SGD's L2 term), applied to tensors of 2 or more "         \
    "dimensions only.")                                                                            \
  X(double, adam_beta1, 0.9, "AdamW's decay rate of the first-moment average.")                    \
  X(double, adam_beta2, 0.999, "AdamW's decay rate of the second-moment average.")                 \
  X(double, adam_epsilon, 1e-8, "AdamW's term added to the denominator for stability.")            \
  X(double, max_grad_norm, 1.0,                                                                    \
    "Clip the global L2 norm of the unscaled fp32 gradients to this value; 0 turns clipping "      \
    "off.")                                                                                        \
  /* ---- learning-rate schedule ------------------------------------------------------- */        \
  X(Choice<SchedulerType>, lr_scheduler_type, SchedulerType::kLinear,                              \
    "Shape of the learning rate over the run, after warmup.")                                      \
  X(int64_t, warmup_steps, 0,                                                                      \
    "Optimizer steps over which the learning rate ramps up from 0; takes precedence over "         \
    "warmup_ratio when positive.")                                                                 \
  X(double, warmup_ratio, 0.0,                                                                     \
    "Warmup length as a fraction of the run's optimizer steps.")                                   \
  X(LrSchedulerKwargs, lr_scheduler_kwargs, LrSchedulerKwargs{},                                   \
    "Arguments of the chosen schedule, a JSON object of numbers and strings such as "              \
    "'{\"num_cycles\": 2}' (docs/training_arguments.md lists what each schedule takes).")          \
  /* ---- evaluation ------------------------------------------------------------------- */        \
  X(Choice<IntervalStrategy>, eval_strategy, IntervalStrategy::kNo,                                \
    "When to evaluate during training: never, every eval_steps, or after each epoch.")             \
  X(std::optional<double>, eval_steps, std::nullopt,                                               \
    "Steps between evaluations with eval_strategy steps: a whole number, or a fraction in "        \
    "(0, 1) of the run's steps. Unset (or 0) follows logging_steps.")                              \
  X(std::optional<std::vector<std::string>>, label_names, std::nullopt,                           \
    "Names of the batch entries that hold labels (kept out of the predictions, compared by "      \
    "compute_metrics). Unset uses labels, or target for a LibTorch Example batch.")                \
  /* ---- logging ---------------------------------------------------------------------- */        \
  X(Choice<IntervalStrategy>, logging_strategy, IntervalStrategy::kSteps,                          \
    "When to write a training log line: never, every logging_steps, or after each epoch.")         \
  X(double, logging_steps, 500.0,                                                                  \
    "Steps between log lines with logging_strategy steps: a whole number, or a fraction in "       \
    "(0, 1) of the run's steps.")                                                                  \
  X(bool, logging_first_step, false, "Also log after the very first optimizer step.")              \
  X(bool, logging_nan_inf_filter, true,                                                            \
    "Leave losses that are inf or nan out of the logged average (each is counted as the mean "     \
    "of the finite ones); training is unaffected.")                                                \
  X(ReportTo, report_to, ReportTo(),                                                               \
    "Integrations to report the logs to besides trainer_log.jsonl: none, all (every registered "  \
    "one), or names, comma-separated.")                                                            \
  X(std::optional<std::string>, run_name, std::nullopt,                                            \
    "A name for the run; TensorBoard's folder becomes output_dir/runs/<run_name> instead of "      \
    "runs/<date>_<host>.")                                                                         \
  /* ---- checkpoints ------------------------------------------------------------------ */        \
  X(Choice<SaveStrategy>, save_strategy, SaveStrategy::kSteps,                                     \
    "When to write a checkpoint: never, every save_steps, after each epoch, or when an "           \
    "evaluation improves the best loss (best; needs an eval_strategy).")                           \
  X(double, save_steps, 500.0,                                                                     \
    "Steps between checkpoints with save_strategy steps: a whole number, or a fraction in "        \
    "(0, 1) of the run's steps.")                                                                  \
  X(std::optional<int64_t>, save_total_limit, std::nullopt,                                        \
    "Most checkpoints kept in output_dir; older ones are removed, but never the best one. Unset "  \
    "keeps them all.")                                                                             \
  X(bool, load_best_model_at_end, false,                                                           \
    "When training ends, load the weights of the checkpoint whose evaluation ranked best by "      \
    "metric_for_best_model. Needs save_strategy equal to eval_strategy (or best).")                \
  X(std::optional<std::string>, metric_for_best_model, std::nullopt,                               \
    "The evaluation metric that ranks checkpoints, with or without its eval_ prefix (loss, "       \
    "accuracy, or a compute_metrics key). Unset ranks by loss.")                                   \
  X(std::optional<bool>, greater_is_better, std::nullopt,                                          \
    "Whether a larger metric_for_best_model is better. Unset: false for a metric whose name "      \
    "ends in loss, true otherwise.")                                                               \
  X(std::optional<std::string>, resume_from_checkpoint, std::nullopt,                              \
    "Checkpoint folder to continue from, or 'latest' for the newest checkpoint-<step> in "         \
    "output_dir.")                                                                                 \
  /* ---- reproducibility -------------------------------------------------------------- */        \
  X(int64_t, seed, 42, "Seed of the random generators, set when training starts.")                 \
  X(std::optional<int64_t>, data_seed, std::nullopt,                                               \
    "Seed of the data shuffling alone; unset uses seed.")                                          \
  /* ---- mixed precision -------------------------------------------------------------- */        \
  X(bool, bf16, false,                                                                             \
    "Train with bf16 autocast (or a bf16 model). Needs an Ampere or newer GPU, or the CPU.")       \
  X(bool, fp16, false, "Train with fp16 autocast and dynamic loss scaling.")                       \
  X(std::optional<bool>, tf32, std::nullopt,                                                       \
    "Let fp32 matmuls and convolutions use TF32 tensor cores (Ampere or newer). Unset keeps "      \
    "LibTorch's current setting.")                                                                 \
  X(bool, bf16_full_eval, false,                                                                   \
    "Evaluate with the model itself cast to bf16, rather than under autocast.")                    \
  X(bool, fp16_full_eval, false,                                                                   \
    "Evaluate with the model itself cast to fp16, rather than under autocast.")                    \
  X(Choice<MasterWeightsMode>, master_weights, MasterWeightsMode::kAuto,                           \
    "fp32 master copies of the parameters: auto keeps them for a model whose own parameters "      \
    "are bf16/fp16, on also for an fp32 model cast down, off updates bf16 parameters in place.")   \
  X(Choice<LowPrecisionUpdateMode>, low_precision_update, LowPrecisionUpdateMode::kAuto,           \
    "How a bf16/fp16 model without master copies (master_weights off) writes each update: "        \
    "nearest rounds (an update below half an ulp of its weight is lost), kahan keeps the "         \
    "lost part in a buffer for the next step, stochastic_rounding rounds up or down at "           \
    "random, right on average; auto is kahan with an optimizer that has the rules (FusedAdamW, " \
    "adafactor, adamw_torch_8bit), else nearest.")                                                \
  /* ---- FP8 (mantissa; TransformerEngine's DelayedScaling names) -------------------- */      \
  X(bool, fp8, false,                                                                              \
    "Run the matmuls of the model's Float8Linear layers in FP8 (at::_scaled_mm), except the "      \
    "first and last linear layer and those whose sizes are not multiples of 16. Needs bf16 or "    \
    "fp16 (the autocast dtype of everything else).")                                               \
  X(Choice<fp8::ScalingRecipe>, fp8_recipe, fp8::ScalingRecipe::kDelayed,                          \
    "Where each FP8 tensor's scale comes from: delayed (an amax history of earlier steps, "        \
    "TransformerEngine's DelayedScaling, checkpointed) or current (the tensor's own amax, "        \
    "torchao's tensorwise recipe).")                                                               \
  X(int64_t, fp8_amax_history_len, 1024,                                                           \
    "Optimizer steps of amaxes the delayed recipe remembers; 1 to 4096.")                          \
  X(Choice<fp8::AmaxComputeAlgo>, fp8_amax_compute_algo, fp8::AmaxComputeAlgo::kMax,               \
    "How the delayed recipe turns its history into one amax: max (the largest) or most_recent.")   \
  X(int64_t, fp8_margin, 0,                                                                        \
    "The scales are divided by 2^fp8_margin, leaving headroom above the amax; in [0, 64].")        \
  X(Choice<fp8::Float8Format>, fp8_format, fp8::Float8Format::kHybrid,                             \
    "FP8 dtypes: HYBRID (e4m3 forward, e5m2 gradients) or E4M3 (e4m3 for all three).")             \
  /* ---- loss scaling (fp16): DeepSpeed's names, torch.amp.GradScaler's behaviour ------ */       \
  X(double, loss_scale, 0.0,                                                                       \
    "0 scales the loss dynamically (GradScaler); a positive value is a fixed scale.")              \
  X(int64_t, initial_scale_power, 16,                                                              \
    "The dynamic scale starts at 2 to this power (16 is GradScaler's init_scale of 65536).")       \
  X(int64_t, loss_scale_window, 2000,                                                              \
    "Clean steps in a row after which the dynamic scale doubles (GradScaler's "                    \
    "growth_interval).")                                                                           \
  X(int64_t, hysteresis, 1,                                                                        \
    "Overflows tolerated before the scale is halved; 1 halves on every overflow, as "              \
    "GradScaler does.")                                                                            \
  X(bool, consecutive_hysteresis, false,                                                           \
    "Restore the hysteresis budget after each clean step, so only overflows in a row halve "       \
    "the scale.")                                                                                  \
  X(double, min_loss_scale, 0.0, "Lowest value the dynamic scale may take; 0 sets no floor.")      \
  X(std::optional<double>, max_loss_scale, std::nullopt,                                           \
    "Highest value the dynamic scale may take; unset sets no ceiling.")                            \
  X(int64_t, max_consecutive_nonfinite, 100,                                                       \
    "Abort with an error once this many optimizer steps in a row saw an inf/nan loss or "          \
    "gradient; 0 never aborts.")                                                                   \
  /* ---- hardware and data loading ---------------------------------------------------- */        \
  X(bool, use_cpu, false, "Train on the CPU although a GPU is present.")                           \
  X(int64_t, dataloader_num_workers, 0,                                                            \
    "Threads that prepare batches ahead of the training step; 0 prepares them in the "             \
    "training thread.")                                                                            \
  X(bool, dataloader_drop_last, false,                                                             \
    "Skip the last batch of an epoch when it is smaller than the batch size.")                     \
  X(bool, dataloader_pin_memory, true,                                                             \
    "Put batches in page-locked memory, so their copy to the GPU does not block the host.")        \
  X(bool, disable_tqdm, false, "Print no progress bar.")                                           \
  /* ---- memory ----------------------------------------------------------------------- */        \
  X(bool, gradient_checkpointing, false,                                                           \
    "Keep only the inputs of the model's checkpointed blocks in the forward and recompute the "    \
    "rest in the backward (model.gradient_checkpointing_enable()): less memory, one more "         \
    "forward. Needs a model that implements mantissa::nn::SupportsGradientCheckpointing.")         \
  X(std::optional<GradientCheckpointingKwargs>, gradient_checkpointing_kwargs, std::nullopt,       \
    "Arguments of gradient checkpointing, a JSON object such as '{\"use_reentrant\": false}' "    \
    "(keys use_reentrant and preserve_rng_state).")                                                \
  X(bool, cpu_caching_allocator, true,                                                             \
    "On the CPU, keep the memory of freed tensors for the next step's tensors of the same size "   \
    "instead of handing it back to the system (mantissa; CUDA caches always). Saves the page "     \
    "faults of every step's activations; the process keeps its peak memory.")                      \
  /* ---- several processes (torchrun) ------------------------------------------------- */        \
  X(std::optional<std::string>, ddp_backend, std::nullopt,                                         \
    "Collective backend when the launcher starts several processes: gloo (CPU) or nccl (CUDA). "   \
    "Unset picks nccl for a CUDA device, gloo for the CPU.")                                       \
  X(int64_t, ddp_timeout, 1800,                                                                    \
    "Seconds a process waits for the others (joining, each collective, each save) before it "      \
    "stops with an error.")                                                                        \
  X(std::optional<bool>, ddp_find_unused_parameters, std::nullopt,                                 \
    "Walk the autograd graph after each forward to find parameters that get no gradient, so the "  \
    "gradient sync does not wait for them. Unset: true, as HF sets for models of its own kind "    \
    "without checkpointing.")                                                                      \
  X(std::optional<int64_t>, ddp_bucket_cap_mb, std::nullopt,                                       \
    "Size in MiB of the gradient buckets that are averaged across processes while backward "       \
    "still runs. Unset: 25 (the first bucket 1), as DistributedDataParallel.")                     \
  X(std::optional<bool>, ddp_broadcast_buffers, std::nullopt,                                      \
    "Copy rank 0's module buffers (batch-norm statistics) to every process before each forward. "  \
    "Unset: true, as DistributedDataParallel.")                                                    \
  X(Choice<DdpCommHook>, ddp_comm_hook, DdpCommHook::kNone,                                        \
    "How gradients travel between the processes: none (in their own dtype), fp16_compress or "     \
    "bf16_compress (cast to fp16 / bf16 for the allreduce, half the bytes, and back).")           \
  X(bool, save_on_each_node, false,                                                                \
    "Write checkpoints and the final model on the first process of every node, not only on "       \
    "rank 0 (for nodes that share no file system).")                                               \
  X(bool, log_on_each_node, true,                                                                  \
    "Print log lines and the progress bar on the first process of every node; false prints them "  \
    "on rank 0 alone.")                                                                            \
  X(std::string, fsdp, "",                                                                         \
    "Shard the training state across the processes, as HF's FSDP (version 2) does: a bare --fsdp " \
    "(or true) shards the parameters, gradients and optimizer state, gathering each block's "       \
    "parameters just before it runs and freeing them after (ZeRO-3); fsdp_config tunes it. HF's "  \
    "older option strings still work: full_shard (the same), shard_grad_op (parameters kept "       \
    "whole, ZeRO-2) and auto_wrap. Empty: every process holds the whole state (DDP).")              \
  X(std::optional<std::string>, fsdp_config, std::nullopt,                                        \
    "HF's FSDP settings: a JSON object, or the path of a JSON file that holds one. Read: version " \
    "(2), reshard_after_forward (true), auto_wrap_policy (TRANSFORMER_BASED_WRAP, "                 \
    "SIZE_BASED_WRAP or NO_WRAP), transformer_layer_cls_to_wrap (default: the model's "             \
    "no_split_modules), min_num_params, state_dict_type (FULL_STATE_DICT, or SHARDED_STATE_DICT "   \
    "for per-process shard files), "                                                                \
    "activation_checkpointing, cpu_ram_efficient_loading, cpu_offload; FSDP1's keys are accepted "  \
    "and change nothing; other keys are refused.")                                                 \
  /* ---- CUDA graphs (mantissa) ------------------------------------------------------ */         \
  X(bool, cuda_graph, false,                                                                       \
    "After the warm-up steps, record one whole training step (forward, backward, unscale, "        \
    "clip, optimizer step, scale update) as a CUDA graph and replay it. Needs a CUDA device, "     \
    "optim adamw_torch_fused or adamw_mantissa_fused and gradient_accumulation_steps 1; "          \
    "otherwise, and for batches of another shape, steps run eagerly.")                             \
  X(int64_t, cuda_graph_warmup_steps, 3,                                                           \
    "Optimizer steps run eagerly before the step is recorded (cuda_graph).")
// clang-format on

namespace mantissa {

/// Everything that configures a `Trainer` run: the fields of Hugging Face
/// `transformers.TrainingArguments` with HF's names and defaults, plus the loss-scaling knobs
/// HF lacks (DeepSpeed's names, `torch.amp.GradScaler`'s behaviour).
///
/// Python:
///
///     args = TrainingArguments(output_dir="out", bf16=True, learning_rate=3e-4)
///     args = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()[0]
///
/// C++:
///
///     auto args = mantissa::TrainingArguments().output_dir("out").bf16(true).learning_rate(3e-4);
///     auto args = mantissa::TrainingArguments::parse(argc, argv);  // --bf16 --learning_rate 3e-4
///
/// Each field `name` of type `T` in `MANTISSA_TRAINING_ARGUMENTS_FIELDS` has a chained setter
/// `TrainingArguments& name(T)` and getters `const T& name() const` / `T& name()`. Setting
/// a field checks nothing; `validate()` does (`parse`, `from_json` and the Trainer call it).
/// The fields that take one of a fixed set of names (`optim`, `lr_scheduler_type`, the three
/// strategies, `master_weights`, `low_precision_update`, `ddp_comm_hook`,
/// `fp8_recipe`, `fp8_amax_compute_algo`, `fp8_format`) hold a
/// `Choice` of an enum of include/mantissa/argument_enums.h: set them by enum or by spelling
/// (`.optim(OptimizerNames::kSgd)`, `.optim("sgd")`), compare them with the enum
/// (`args.optim() == OptimizerNames::kSgd`; a string comparison does not compile), and read the
/// enum with `.value()` (`args.optim().value()`). `optim` also takes the name of an optimizer a
/// program registered (include/mantissa/optim/optimizer_registry.h), set by spelling and read
/// with `.name()`; `.value()` throws for such a name.
/// `lr_scheduler_kwargs` holds the schedule's own arguments, an `LrSchedulerKwargs` (names to
/// integers, floats and strings; include/mantissa/lr_scheduler_kwargs.h):
/// `.lr_scheduler_kwargs({{"num_cycles", 3}})`; on the command line a JSON object.
/// `report_to` holds a `ReportTo` (include/mantissa/report_to.h), a list of integration names:
/// `.report_to("tensorboard")`, `.report_to({"tensorboard", "my_tracker"})`, `.report_to("all")`
/// (the integrations registered at that moment); on the command line comma-separated names.
/// Nothing here touches a device except `validate()` and `device()`, which query it.
class TrainingArguments {
 public:
  /// All fields at their defaults (those of HF `TrainingArguments()`).
  TrainingArguments() = default;

  // ---- validation -------------------------------------------------------------------------

  /// Checks every value and every combination, and that this machine supports the requested
  /// precision. Throws `c10::ValueError` naming the field and the value, in HF's words where
  /// HF has an error for it ("At most one of fp16 and bf16 can be True, but not both", "Your
  /// setup doesn't support bf16/gpu.", "--tf32 requires Ampere or a newer GPU arch, cuda>=11
  /// and torch>=1.7", "foo is not a valid SchedulerType, please select one of [...]").
  /// `lr_scheduler_kwargs` must suit `lr_scheduler_type` (`check_lr_scheduler_kwargs`, with
  /// `learning_rate` as the optimizer's lr): a key the schedule does not take is an error, as
  /// Python's `TypeError` at scheduler creation is in HF.
  /// Counts must fit in int64: examples per optimizer step
  /// (`per_device_train_batch_size x gradient_accumulation_steps`), the examples of the whole
  /// run (times `max_steps`, or at least `ceil(num_train_epochs)` steps), the epochs, and every
  /// interval (`logging_steps`, `save_steps`, `eval_steps`, whatever their strategy: the
  /// Trainer turns each into a step count); a loss scale must fit in float32.
  ///
  /// Python: what `TrainingArguments.__post_init__` checks. No device sync; when bf16, fp16
  /// or tf32 is requested it queries the CUDA device's compute capability once per process
  /// (which initialises CUDA) and probes LibTorch's fp16 CPU kernels once.
  void validate() const;

  // ---- command line -----------------------------------------------------------------------

  /// Reads HF's flags: `--learning_rate 3e-4`, `--learning_rate=3e-4`, `--learning-rate 3e-4`,
  /// `--bf16` (bare: true), `--bf16 true|false|yes|no|1|0`, `--bf16=false`, `--no_<name>` for
  /// the fields whose default is true, `--save_total_limit None` to unset an optional. The
  /// last occurrence of a flag wins. A single argument ending in `.json` loads that file
  /// instead (as HF's example scripts do). `-h`/`--help` prints `help_text()` to stdout and
  /// exits with status 0, as argparse does. Then `validate()`.
  ///
  /// Python: `HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()`.
  /// Throws `c10::ValueError` naming the flag and the value for an unknown flag
  /// ("unrecognized arguments: --foo"), a malformed value ("--learning_rate: invalid value
  /// 'abc' (expected a float)") or a value `validate()` rejects. Never syncs.
  static TrainingArguments parse(int argc, const char* const* argv);

  /// Same as `parse(argc, argv)`, for `main(int argc, char** argv)`.
  static TrainingArguments parse(int argc, char** argv);

  /// Same as `parse(argc, argv)` for the arguments alone (no program name first).
  static TrainingArguments parse(const std::vector<std::string>& args);

  /// Like `parse`, but arguments it does not know are returned, in their order, instead of
  /// raising, so a program can read its own flags from them. Malformed values of known flags
  /// still raise. Python: `parse_args_into_dataclasses(return_remaining_strings=True)`.
  static std::pair<TrainingArguments, std::vector<std::string>> parse_known(
      int argc, const char* const* argv);

  /// Same as `parse_known(argc, argv)`, for `main(int argc, char** argv)`.
  static std::pair<TrainingArguments, std::vector<std::string>> parse_known(int argc, char** argv);

  /// Same as `parse_known(argc, argv)` for the arguments alone (no program name first).
  static std::pair<TrainingArguments, std::vector<std::string>> parse_known(
      const std::vector<std::string>& args);

  /// The `--help` text: every flag with its type, help and default (argparse's
  /// `ArgumentDefaultsHelpFormatter` style, "(default: 5e-05)").
  static std::string help_text(const std::string& program_name = "train");

  /// The flags of `help_text` without its usage line and `-h`, for a program that prints its
  /// own usage and flags first (as `HfArgumentParser((ProgramArguments, TrainingArguments))`
  /// lists both dataclasses under one usage). Each flag's "(default: ...)" is TrainingArguments'
  /// own with `default_flags` applied: the program's defaults in the command line's spelling,
  /// `{"--learning_rate", "3e-3"}` (what `ArgumentParser::set_defaults` keeps), as argparse's
  /// help shows `set_defaults`. They are read without `validate()`; flags TrainingArguments
  /// does not have are skipped, a malformed value raises `c10::ValueError`.
  static std::string flags_help_text(const std::vector<std::string>& default_flags = {});

  // ---- JSON (training_args.json) -----------------------------------------------------------

  /// Every field, in declaration order, as pretty-printed JSON (2-space indent); unset
  /// optionals are `null`. Doubles are written with enough digits to read back bit-exact.
  /// Python: `TrainingArguments.to_json_string()`. Never syncs.
  std::string to_json() const;

  /// Reads what `to_json()` wrote. Missing keys keep their defaults; an unknown key, a value
  /// of the wrong type or malformed JSON raises `c10::ValueError` naming the key and the
  /// value. Then `validate()`, unless `validate` is false (to inspect a file written on a
  /// machine with other hardware). Python: `HfArgumentParser.parse_json_file` /
  /// `parse_dict`. Never syncs.
  static TrainingArguments from_json(const std::string& text, bool validate = true);

  /// Writes `to_json()` to `path` atomically (a temporary file in the same folder, renamed
  /// over `path`), so a crash never leaves half a file. Raises `c10::Error` naming the path
  /// when it cannot be written.
  void save_json(const std::string& path) const;

  /// Reads a file written by `save_json`. A missing, unreadable or corrupt file raises an
  /// error naming the path. See `from_json` for `validate`.
  static TrainingArguments load_json(const std::string& path, bool validate = true);

  // ---- derived values for the Trainer -----------------------------------------------------

  /// The autocast compute dtype: `kBFloat16` for bf16, `kHalf` for fp16, else `kFloat`
  /// (autocast off). Python: what HF's `mixed_precision` ("bf16"/"fp16"/"no") selects.
  c10::ScalarType compute_dtype() const;

  /// Where training runs: the CPU when `use_cpu` is set or no CUDA device is present, else
  /// `cuda:<LOCAL_RANK>` (`cuda:0` for a lone process). Python: `TrainingArguments.device`.
  /// Queries CUDA's device count (initialising CUDA); no sync. Throws `c10::ValueError` when
  /// the launcher's variables are malformed or `LOCAL_RANK` names a device this node lacks.
  c10::Device device() const;

  /// The collective backend of a run on `device`: `ddp_backend` when set, else `nccl` for a
  /// CUDA device and `gloo` for the CPU (HF leaves the choice to accelerate, which does this).
  /// Throws `c10::ValueError` for a `ddp_backend` that names neither (which `validate()`
  /// refuses). Host only.
  distributed::Backend resolved_ddp_backend(const c10::Device& device) const;
  /// `ddp_find_unused_parameters`, true when unset (HF's value for a model that is not a
  /// `PreTrainedModel`).
  bool resolved_ddp_find_unused_parameters() const;
  /// `ddp_bucket_cap_mb`, 25 when unset (`DistributedDataParallel`'s `bucket_cap_mb`).
  int64_t resolved_ddp_bucket_cap_mb() const;
  /// `ddp_broadcast_buffers`, true when unset (`DistributedDataParallel`'s default).
  bool resolved_ddp_broadcast_buffers() const;
  /// Whether `fsdp` asks for `shard_grad_op` (ZeRO-2: gradients and optimizer state sharded).
  bool fsdp_shards_grad_op() const;
  /// Whether `fsdp` and `fsdp_config` ask for the parameters sharded too (a bare `--fsdp`,
  /// `full_shard`, or `reshard_after_forward` true: ZeRO-3).
  bool fsdp_shards_parameters() const;

  /// The FP8 recipe of `fp8_recipe`, `fp8_format`, `fp8_amax_history_len`,
  /// `fp8_amax_compute_algo` and `fp8_margin` (meaningful when `fp8`). Python: TE's
  /// `DelayedScaling(margin=..., fp8_format=..., amax_history_len=..., amax_compute_algo=...)`.
  /// Throws `c10::ValueError` for a choice that names no recipe, format or algorithm. Host only.
  fp8::Float8Recipe float8_recipe() const;

  /// The first loss scale: `loss_scale` when a static scale is set, else
  /// `2^initial_scale_power` (65536 by default, `torch.amp.GradScaler`'s `init_scale`).
  double init_loss_scale() const;

  /// True for dynamic loss scaling (`loss_scale == 0`), false for a static scale.
  bool dynamic_loss_scale() const { return loss_scale_ == 0.0; }

  /// The metric that ranks evaluations and checkpoints: `metric_for_best_model` with the
  /// `eval_` prefix added when it lacks one, `eval_loss` when unset. Python: what
  /// `Trainer._determine_best_metric` looks up.
  std::string resolved_metric_for_best_model() const;
  /// `greater_is_better` when set, else whether the metric's name does not end in `loss`
  /// (HF's default).
  bool resolved_greater_is_better() const;

  /// `eval_steps` when set and non-zero, else `logging_steps` (HF's fallback). May be a ratio
  /// (< 1) of the total steps: see `resolve_steps`.
  double resolved_eval_steps() const;

  /// Turns an interval that may be a ratio into a step count: values < 1 are
  /// `ceil(ratio * max_steps)` steps, others are whole steps. Python: how `Trainer` computes
  /// `state.logging_steps` / `eval_steps` / `save_steps` from `max_steps`. Throws
  /// `c10::ValueError` when `steps` is negative or not below 2^63 (not a step count), or
  /// `max_steps` is negative.
  static int64_t resolve_steps(double steps, int64_t max_steps);

  /// Warmup length for a run of `num_training_steps`: `warmup_steps` when > 0, else
  /// `ceil(num_training_steps * warmup_ratio)` (`num_training_steps` where that passes int64).
  /// Python: `TrainingArguments.get_warmup_steps`.
  int64_t get_warmup_steps(int64_t num_training_steps) const;

  /// Field-by-field equality (doubles compared exactly).
  bool operator==(const TrainingArguments& other) const;
  /// Negation of `operator==`.
  bool operator!=(const TrainingArguments& other) const { return !(*this == other); }

  // ---- the fields (see MANTISSA_TRAINING_ARGUMENTS_FIELDS above) ---------------------------

#define MANTISSA_TRAINING_ARGUMENTS_DECLARE_(type, name, default_value, help) \
  MANTISSA_ARG(type, name) = default_value;
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TRAINING_ARGUMENTS_DECLARE_)
#undef MANTISSA_TRAINING_ARGUMENTS_DECLARE_
};

}  // namespace mantissa
