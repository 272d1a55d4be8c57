#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <mantissa/arg.h>

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
#define MANTISSA_TRAINING_ARGUMENTS_FIELDS(X)                                                     \
  /* ---- output ---------------------------------------------------------------------- */      \
  X(std::string, output_dir, "trainer_output",                                                     \
    "The output directory where the model predictions and checkpoints will be written.")           \
  X(bool, overwrite_output_dir, false,                                                             \
    "Overwrite the content of the output directory. Use this to continue training if "             \
    "output_dir points to a checkpoint directory.")                                                \
  /* ---- how long, how big ------------------------------------------------------------ */      \
  X(double, num_train_epochs, 3.0,                                                                 \
    "Total number of training epochs to perform (a fraction runs part of the last epoch). "        \
    "Ignored when max_steps > 0.")                                                                 \
  X(int64_t, max_steps, -1,                                                                        \
    "If > 0: set total number of training steps to perform. Override num_train_epochs.")           \
  X(int64_t, per_device_train_batch_size, 8, "Batch size per device for training.")               \
  X(int64_t, per_device_eval_batch_size, 8, "Batch size per device for evaluation.")              \
  X(int64_t, gradient_accumulation_steps, 1,                                                       \
    "Number of update steps to accumulate the gradients for, before performing a "                 \
    "backward/update pass.")                                                                       \
  /* ---- optimizer -------------------------------------------------------------------- */      \
  X(std::string, optim, "adamw_torch_fused",                                                       \
    "The optimizer to use: adamw_torch, adamw_torch_fused or adamw_mantissa_fused (both "          \
    "mantissa's fused AdamW: unscale, inf check, step and master-weight cast in one pass, no "     \
    "host sync) or sgd.")                                                                          \
  X(double, learning_rate, 5e-5, "The initial learning rate for the optimizer.")                  \
  X(double, weight_decay, 0.0, "Weight decay for AdamW if we apply some.")                        \
  X(double, adam_beta1, 0.9, "Beta1 for AdamW optimizer.")                                         \
  X(double, adam_beta2, 0.999, "Beta2 for AdamW optimizer.")                                       \
  X(double, adam_epsilon, 1e-8, "Epsilon for AdamW optimizer.")                                    \
  X(double, max_grad_norm, 1.0,                                                                    \
    "Max gradient norm, applied to the unscaled fp32 gradients. 0 disables clipping.")             \
  /* ---- learning-rate schedule ------------------------------------------------------- */      \
  X(std::string, lr_scheduler_type, "linear",                                                      \
    "The scheduler type to use: linear, cosine, constant or constant_with_warmup.")                \
  X(int64_t, warmup_steps, 0,                                                                      \
    "Linear warmup over warmup_steps. Overrides warmup_ratio when > 0.")                           \
  X(double, warmup_ratio, 0.0,                                                                     \
    "Linear warmup over warmup_ratio fraction of total steps.")                                    \
  /* ---- evaluation ------------------------------------------------------------------- */      \
  X(std::string, eval_strategy, "no",                                                              \
    "The evaluation strategy to use: no, steps or epoch.")                                         \
  X(std::optional<double>, eval_steps, std::nullopt,                                               \
    "Run an evaluation every X steps (eval_strategy=steps). An integer, or a float in (0, 1) "     \
    "meaning a ratio of total training steps. Defaults to logging_steps when unset.")              \
  /* ---- logging ---------------------------------------------------------------------- */      \
  X(std::string, logging_strategy, "steps",                                                        \
    "The logging strategy to use: no, steps or epoch.")                                            \
  X(double, logging_steps, 500.0,                                                                  \
    "Log every X updates steps. Should be an integer or a float in range (0, 1). If smaller "      \
    "than 1, will be interpreted as ratio of total training steps.")                               \
  X(bool, logging_first_step, false, "Log the first global_step.")                                \
  X(bool, logging_nan_inf_filter, true,                                                            \
    "Filter nan and inf losses for logging: a non-finite loss is logged as the average of the "    \
    "finite ones. Does not change the training itself.")                                           \
  X(std::string, report_to, "none",                                                                \
    "Where to report logs besides trainer_log.jsonl: none, tensorboard (event files for "          \
    "tensorboard --logdir), all (every integration mantissa has), or several, comma-separated.")   \
  X(std::optional<std::string>, run_name, std::nullopt,                                            \
    "A name for the run; TensorBoard's folder becomes output_dir/runs/<run_name> instead of "      \
    "runs/<date>_<host>.")                                                                         \
  /* ---- checkpoints ------------------------------------------------------------------ */      \
  X(std::string, save_strategy, "steps",                                                           \
    "The checkpoint save strategy to use: no, steps, epoch or best (save when the evaluation "     \
    "loss improves; needs an eval_strategy).")                                                     \
  X(double, save_steps, 500.0,                                                                     \
    "Save checkpoint every X updates steps. Should be an integer or a float in range (0, 1). "     \
    "If smaller than 1, will be interpreted as ratio of total training steps.")                    \
  X(std::optional<int64_t>, save_total_limit, std::nullopt,                                        \
    "If set, keep at most this many checkpoints in output_dir, deleting the oldest.")              \
  X(std::optional<std::string>, resume_from_checkpoint, std::nullopt,                              \
    "Resume training from this checkpoint folder, or from the newest checkpoint-<step> in "        \
    "output_dir when set to 'latest'.")                                                            \
  /* ---- reproducibility -------------------------------------------------------------- */      \
  X(int64_t, seed, 42, "Random seed that will be set at the beginning of training.")              \
  X(std::optional<int64_t>, data_seed, std::nullopt,                                               \
    "Random seed to be used with data samplers. Uses seed when unset.")                            \
  /* ---- mixed precision -------------------------------------------------------------- */      \
  X(bool, bf16, false,                                                                             \
    "Whether to use bf16 (mixed) precision instead of 32-bit. Requires an Ampere or newer "        \
    "GPU, or the CPU.")                                                                            \
  X(bool, fp16, false,                                                                             \
    "Whether to use fp16 (mixed) precision instead of 32-bit, with dynamic loss scaling.")         \
  X(std::optional<bool>, tf32, std::nullopt,                                                       \
    "Whether to enable tf32 mode, available in Ampere and newer GPU architectures. Unset "         \
    "leaves LibTorch's setting alone.")                                                            \
  X(bool, bf16_full_eval, false,                                                                   \
    "Whether to use full bfloat16 evaluation instead of 32-bit.")                                  \
  X(bool, fp16_full_eval, false,                                                                   \
    "Whether to use full float16 evaluation instead of 32-bit.")                                   \
  X(std::string, master_weights, "auto",                                                           \
    "fp32 master copies of the parameters: auto (kept when the model's own parameters are "        \
    "fp16/bf16), on or off.")                                                                      \
  /* ---- loss scaling (fp16): DeepSpeed's names, torch.amp.GradScaler's behaviour ------ */      \
  X(double, loss_scale, 0.0,                                                                       \
    "0 = dynamic loss scaling (GradScaler); > 0 = a static loss scale of this value.")             \
  X(int64_t, initial_scale_power, 16,                                                              \
    "The dynamic loss scale starts at 2^initial_scale_power (16: GradScaler's init_scale "         \
    "65536).")                                                                                     \
  X(int64_t, loss_scale_window, 2000,                                                              \
    "Grow the loss scale after this many consecutive steps without inf/nan (GradScaler's "         \
    "growth_interval).")                                                                           \
  X(int64_t, hysteresis, 1,                                                                        \
    "Back off the loss scale only after this many overflows (1 = on every overflow, as "           \
    "GradScaler).")                                                                                \
  X(bool, consecutive_hysteresis, false,                                                           \
    "Refill the hysteresis budget after every step without overflow, so only consecutive "         \
    "overflows back off.")                                                                         \
  X(double, min_loss_scale, 0.0, "Floor of the dynamic loss scale (0 = no floor).")               \
  X(std::optional<double>, max_loss_scale, std::nullopt,                                           \
    "Ceiling of the dynamic loss scale (unset = no ceiling).")                                     \
  X(int64_t, max_consecutive_nonfinite, 100,                                                       \
    "Stop training with an error after this many consecutive steps with a non-finite loss or "     \
    "gradients (0 = never stop).")                                                                 \
  /* ---- hardware and data loading ---------------------------------------------------- */      \
  X(bool, use_cpu, false,                                                                          \
    "Train on the CPU even when a GPU is available.")                                              \
  X(int64_t, dataloader_num_workers, 0,                                                            \
    "Number of worker threads for data loading. 0 means that the data will be loaded in the "      \
    "main thread.")                                                                                \
  X(bool, dataloader_drop_last, false,                                                             \
    "Drop the last incomplete batch if it is not divisible by the batch size.")                    \
  X(bool, dataloader_pin_memory, true,                                                             \
    "Whether or not to pin memory for data loaders (page-locked batches copy to the GPU "          \
    "without blocking the host).")                                                                 \
  X(bool, disable_tqdm, false, "Whether or not to disable the progress bars.")                    \
  /* ---- CUDA graphs (mantissa) ------------------------------------------------------ */      \
  X(bool, cuda_graph, false,                                                                       \
    "Capture the training step (forward, backward, unscale, clip, optimizer step, loss-scale "     \
    "update) in a CUDA graph after the warm-up steps and replay it. Needs a CUDA device, "         \
    "optim adamw_torch_fused or adamw_mantissa_fused and gradient_accumulation_steps 1; "          \
    "otherwise, and for batches of another shape, the step runs eagerly.")                        \
  X(int64_t, cuda_graph_warmup_steps, 3,                                                           \
    "Eager optimizer steps before the step is captured (cuda_graph).")
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
  static std::pair<TrainingArguments, std::vector<std::string>> parse_known(int argc,
                                                                            char** argv);

  /// Same as `parse_known(argc, argv)` for the arguments alone (no program name first).
  static std::pair<TrainingArguments, std::vector<std::string>> parse_known(
      const std::vector<std::string>& args);

  /// The `--help` text: every flag with its type, help and default (argparse's
  /// `ArgumentDefaultsHelpFormatter` style, "(default: 5e-05)").
  static std::string help_text(const std::string& program_name = "train");

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
  /// `cuda:0`. Python: `TrainingArguments.device` (single process). Queries CUDA's device
  /// count (initialising CUDA); no sync.
  c10::Device device() const;

  /// The first loss scale: `loss_scale` when a static scale is set, else
  /// `2^initial_scale_power` (65536 by default, `torch.amp.GradScaler`'s `init_scale`).
  double init_loss_scale() const;

  /// True for dynamic loss scaling (`loss_scale == 0`), false for a static scale.
  bool dynamic_loss_scale() const { return loss_scale_ == 0.0; }

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
