#pragma once

#include <torch/nn/module.h>

#include <mantissa/precision_plan.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// The precision plan for a model whose floating-point parameters are `param_dtype`:
///   fp32 model:  fp32 | bf16 autocast | fp16 autocast + loss scaling;
///                with master_weights=on, the model is cast to bf16/fp16 and keeps fp32 masters
///   bf16 model:  bf16 + fp32 masters (master_weights auto/on) | pure bf16 (off)
///   fp16 model:  fp16 + fp32 masters + loss scaling (pure fp16 is refused)
/// Contradictions (a bf16 model with --fp16, ...) raise c10::ValueError saying what to change.
/// The rule `args.low_precision_update` names; `auto` is Kahan when `args.optim`'s entry in the
/// optimizer registry has the low-precision rules (mantissa's FusedAdamW), else nearest.
optim::LowPrecisionUpdate low_precision_update_rule(const TrainingArguments& args);

PrecisionPlan make_precision_plan(const TrainingArguments& args, c10::ScalarType param_dtype);

/// The one floating-point dtype of `module`'s parameters, what `make_precision_plan` is given.
/// Throws `c10::ValueError` naming the parameter when they mix dtypes, or when there is none.
c10::ScalarType floating_param_dtype(const torch::nn::Module& module);

}  // namespace mantissa::detail
