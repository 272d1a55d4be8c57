#pragma once
// What FusedAdamWOptions mean for one parameter, shared by the optimizer's construction, its step,
// its state loading and the torch.ops bridge (src/python_ops/). Internal; defined in
// fused_adamw.cpp.

#include <c10/core/ScalarType.h>

#include <mantissa/optim/fused_adamw.h>

namespace mantissa::optim::detail {

/// Throws `c10::ValueError` in torch::optim::AdamW's words ("Invalid learning rate: -1") for a
/// negative lr, eps or weight_decay and a beta outside [0, 1). Host only.
void check_fused_adamw_options(const FusedAdamWOptions& options);

/// The rule a parameter of `dtype` is written with: the option for bf16/fp16 parameters, nearest
/// for the rest (fp32 results stored in fp32 lose nothing to a rule; fp64 takes the ATen
/// fallback). Pure.
LowPrecisionUpdate update_rule_for(const FusedAdamWOptions& options, c10::ScalarType dtype);

/// The dtype of a parameter's moments: float32 for a bf16/fp16 parameter under `fp32_moments`,
/// else the parameter's own. Pure.
c10::ScalarType moment_dtype_for(const FusedAdamWOptions& options, c10::ScalarType param_dtype);

}  // namespace mantissa::optim::detail
