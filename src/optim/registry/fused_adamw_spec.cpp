// "adamw_torch_fused" and "adamw_mantissa_fused": mantissa's FusedAdamW, under HF's name of the
// fused AdamW and under its own. The one optimizer with the low-precision update rules, a
// capturable step and a sharded form.
#include <mantissa/optim/fused_adamw.h>

#include "optim/registry/adam_family.h"
#include "optim/registry/builtin_optimizers.h"
#include "trainer/optimizer_factory.h"

namespace mantissa::optim::detail {
namespace {

// The moments and the Kahan compensation (bf16/fp16 parameters under kahan).
StateTensors fused_adamw_tensors(const torch::optim::OptimizerParamState& base) {
  auto tensors = adam_moments<FusedAdamWParamState>(base);
  if (const auto* state = dynamic_cast<const FusedAdamWParamState*>(&base)) {
    tensors.push_back({"kahan_comp", state->kahan_comp()});
  }
  return tensors;
}

// The step is a 0-d tensor (undefined: none taken yet). Syncs.
std::optional<double> fused_adamw_steps(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const FusedAdamWParamState*>(&base);
  if (state == nullptr || !state->step().defined()) return std::nullopt;
  TORCH_CHECK_VALUE(state->step().numel() == 1, "its 'step' holds ", state->step().numel(),
                    " values instead of one");
  return state->step().item<double>();
}

std::unique_ptr<torch::optim::Optimizer> build_fused_adamw(OptimizerBuildInputs inputs) {
  auto* masters = inputs.masters;
  auto fused = build_in_decay_groups<FusedAdamW>(
      inputs, mantissa::detail::fused_adamw_options(inputs.args, inputs.low_precision_update));
  // The fused step writes the updated fp32 masters back into the bf16/fp16 model itself.
  if (masters != nullptr && masters->has_low_precision()) fused->link_model_params(*masters);
  return fused;
}

OptimizerSpec fused_adamw_spec(const char* name) {
  OptimizerSpec spec;
  spec.name = name;
  spec.type = typeid(FusedAdamW);
  spec.family = kAdamFamily;
  spec.family_marks = adam_family_marks();
  spec.build = &build_fused_adamw;
  spec.state_tensors = &fused_adamw_tensors;
  spec.steps = &fused_adamw_steps;
  spec.group_options = &adam_options<FusedAdamWOptions>;
  spec.low_precision_rules = true;
  spec.shardable = true;
  return spec;
}

}  // namespace

std::vector<OptimizerSpec> fused_adamw_specs() {
  return {fused_adamw_spec("adamw_torch_fused"), fused_adamw_spec("adamw_mantissa_fused")};
}

}  // namespace mantissa::optim::detail
