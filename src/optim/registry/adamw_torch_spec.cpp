// "adamw_torch": LibTorch's AdamW with HF's arguments.
#include <torch/optim/adamw.h>

#include "optim/registry/adam_family.h"
#include "optim/registry/builtin_optimizers.h"

namespace mantissa::optim::detail {

OptimizerSpec adamw_torch_spec() {
  OptimizerSpec spec;
  spec.name = "adamw_torch";
  spec.type = typeid(torch::optim::AdamW);
  spec.family = kAdamFamily;
  spec.family_marks = adam_family_marks();
  spec.build = [](OptimizerBuildInputs inputs) -> std::unique_ptr<torch::optim::Optimizer> {
    const auto& args = inputs.args;
    return build_in_decay_groups<torch::optim::AdamW>(
        inputs, torch::optim::AdamWOptions(args.learning_rate())
                    .betas(std::make_tuple(args.adam_beta1(), args.adam_beta2()))
                    .eps(args.adam_epsilon())
                    .weight_decay(args.weight_decay()));
  };
  spec.state_tensors = &adam_moments<torch::optim::AdamWParamState>;
  spec.steps = &counted_steps<torch::optim::AdamWParamState>;
  spec.group_options = &adam_options<torch::optim::AdamWOptions>;
  return spec;
}

}  // namespace mantissa::optim::detail
