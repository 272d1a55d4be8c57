#pragma once

#include <mantissa/choice.h>
#include <mantissa/fp8/recipe.h>

/// The enums behind the `TrainingArguments` fields that take one of a fixed set of names.
/// Names and spellings are Hugging Face's (`transformers.training_args.OptimizerNames`,
/// `transformers.trainer_utils.IntervalStrategy` / `SaveStrategy`, `SchedulerType`) where HF
/// has the enum; the spellings are what the command line and training_args.json hold.

namespace mantissa {

/// `--optim`'s built-in names. Python: `OptimizerNames` (the members mantissa implements). The
/// valid names are those of the optimizer registry (include/mantissa/optim/optimizer_registry.h),
/// which starts with these four and takes more at run time.
enum class OptimizerNames {
  kAdamWTorch,          ///< "adamw_torch": torch::optim::AdamW
  kAdamWTorchFused,     ///< "adamw_torch_fused": mantissa's FusedAdamW (as HF's fused AdamW)
  kAdamWMantissaFused,  ///< "adamw_mantissa_fused": the same FusedAdamW, by its own name
  kSgd,                 ///< "sgd": torch::optim::SGD
};

/// `--lr_scheduler_type`. Python: `SchedulerType` (the members mantissa implements, in HF's
/// order). Each schedule's own arguments come in `--lr_scheduler_kwargs`
/// (include/mantissa/lr_scheduler_kwargs.h lists them).
enum class SchedulerType {
  kLinear,                 ///< "linear": warmup, then linear decay to 0
  kCosine,                 ///< "cosine": warmup, then half a cosine down to 0 (num_cycles)
  kCosineWithRestarts,     ///< "cosine_with_restarts": warmup, then num_cycles cosines down to 0
  kPolynomial,             ///< "polynomial": warmup, then (1 - progress)^power down to lr_end
  kConstant,               ///< "constant": no warmup, no decay
  kConstantWithWarmup,     ///< "constant_with_warmup": warmup, then constant
  kInverseSqrt,            ///< "inverse_sqrt": warmup, then 1/sqrt(step/timescale)
  kCosineWithMinLr,        ///< "cosine_with_min_lr": warmup, then a cosine down to min_lr
  kCosineWarmupWithMinLr,  ///< "cosine_warmup_with_min_lr": the same with HF's shifted steps
  kWarmupStableDecay,      ///< "warmup_stable_decay": warmup, a constant stage, then a decay
};

/// `--logging_strategy`, `--eval_strategy`. Python: `IntervalStrategy`.
enum class IntervalStrategy {
  kNo,     ///< "no": never
  kSteps,  ///< "steps": every `*_steps` optimizer steps
  kEpoch,  ///< "epoch": at the end of each epoch
};

/// `--save_strategy`. Python: `SaveStrategy`.
enum class SaveStrategy {
  kNo,     ///< "no": never
  kSteps,  ///< "steps": every `save_steps` optimizer steps
  kEpoch,  ///< "epoch": at the end of each epoch
  kBest,   ///< "best": after an evaluation that improved the best metric
};

/// `--master_weights` (mantissa): whether a low-precision model keeps fp32 master copies.
enum class MasterWeightsMode {
  kAuto,  ///< "auto": masters when the model's own parameters are bf16/fp16
  kOn,    ///< "on": also for an fp32 model trained with --bf16/--fp16 (cast to that dtype)
  kOff,   ///< "off": update bf16 parameters in place (pure low precision)
};

/// `--low_precision_update` (mantissa): how a bf16/fp16 model without master copies writes each
/// update (`optim::LowPrecisionUpdate`, chosen by `kAuto` or named).
enum class LowPrecisionUpdateMode {
  kAuto,                ///< "auto": kahan with mantissa's FusedAdamW, else nearest
  kNearest,             ///< "nearest": round to nearest (updates below half an ulp are lost)
  kKahan,               ///< "kahan": carry the rounding error to the next step in a buffer
  kStochasticRounding,  ///< "stochastic_rounding": round up or down at random, right on average
};

/// `--ddp_comm_hook` (mantissa): how gradient buckets travel between the processes. Python:
/// `ddp_model.register_comm_hook(group, hook)` with a hook of
/// `torch.distributed.algorithms.ddp_comm_hooks.default_hooks`.
enum class DdpCommHook {
  kNone,          ///< "none": in the gradients' own dtype
  kFp16Compress,  ///< "fp16_compress": cast to fp16 for the allreduce (`fp16_compress_hook`)
  kBf16Compress,  ///< "bf16_compress": cast to bf16 for the allreduce (`bf16_compress_hook`)
};

template <>
struct ChoiceTraits<OptimizerNames> {
  static constexpr const char* enum_name = "OptimizerNames";
  static constexpr const char* names[] = {"adamw_torch", "adamw_torch_fused",
                                          "adamw_mantissa_fused", "sgd"};
};

template <>
struct ChoiceTraits<SchedulerType> {
  static constexpr const char* enum_name = "SchedulerType";
  static constexpr const char* names[] = {"linear",
                                          "cosine",
                                          "cosine_with_restarts",
                                          "polynomial",
                                          "constant",
                                          "constant_with_warmup",
                                          "inverse_sqrt",
                                          "cosine_with_min_lr",
                                          "cosine_warmup_with_min_lr",
                                          "warmup_stable_decay"};
};

template <>
struct ChoiceTraits<IntervalStrategy> {
  static constexpr const char* enum_name = "IntervalStrategy";
  static constexpr const char* names[] = {"no", "steps", "epoch"};
};

template <>
struct ChoiceTraits<SaveStrategy> {
  static constexpr const char* enum_name = "SaveStrategy";
  static constexpr const char* names[] = {"no", "steps", "epoch", "best"};
};

template <>
struct ChoiceTraits<MasterWeightsMode> {
  static constexpr const char* enum_name = "MasterWeightsMode";
  static constexpr const char* names[] = {"auto", "on", "off"};
};

template <>
struct ChoiceTraits<LowPrecisionUpdateMode> {
  static constexpr const char* enum_name = "LowPrecisionUpdateMode";
  static constexpr const char* names[] = {"auto", "nearest", "kahan", "stochastic_rounding"};
};

template <>
struct ChoiceTraits<DdpCommHook> {
  static constexpr const char* enum_name = "DdpCommHook";
  static constexpr const char* names[] = {"none", "fp16_compress", "bf16_compress"};
};

// The FP8 recipe's enums (include/mantissa/fp8/recipe.h), for `--fp8_recipe`, `--fp8_format` and
// `--fp8_amax_compute_algo`: TransformerEngine's spellings, as `fp8::to_string` writes them.
template <>
struct ChoiceTraits<fp8::ScalingRecipe> {
  static constexpr const char* enum_name = "ScalingRecipe";
  static constexpr const char* names[] = {"current", "delayed"};
};

template <>
struct ChoiceTraits<fp8::Float8Format> {
  static constexpr const char* enum_name = "Float8Format";
  static constexpr const char* names[] = {"HYBRID", "E4M3"};
};

template <>
struct ChoiceTraits<fp8::AmaxComputeAlgo> {
  static constexpr const char* enum_name = "AmaxComputeAlgo";
  static constexpr const char* names[] = {"max", "most_recent"};
};

// Each enum has one spelling per enumerator.
static_assert(Choice<OptimizerNames>::size() == static_cast<int>(OptimizerNames::kSgd) + 1);
static_assert(Choice<SchedulerType>::size() ==
              static_cast<int>(SchedulerType::kWarmupStableDecay) + 1);
static_assert(Choice<IntervalStrategy>::size() == static_cast<int>(IntervalStrategy::kEpoch) + 1);
static_assert(Choice<SaveStrategy>::size() == static_cast<int>(SaveStrategy::kBest) + 1);
static_assert(Choice<MasterWeightsMode>::size() == static_cast<int>(MasterWeightsMode::kOff) + 1);
static_assert(Choice<LowPrecisionUpdateMode>::size() ==
              static_cast<int>(LowPrecisionUpdateMode::kStochasticRounding) + 1);
static_assert(Choice<DdpCommHook>::size() == static_cast<int>(DdpCommHook::kBf16Compress) + 1);
static_assert(Choice<fp8::ScalingRecipe>::size() ==
              static_cast<int>(fp8::ScalingRecipe::kDelayed) + 1);
static_assert(Choice<fp8::Float8Format>::size() == static_cast<int>(fp8::Float8Format::kE4M3) + 1);
static_assert(Choice<fp8::AmaxComputeAlgo>::size() ==
              static_cast<int>(fp8::AmaxComputeAlgo::kMostRecent) + 1);

}  // namespace mantissa
