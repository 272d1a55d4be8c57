// torch::optim::Adam: no `--optim` name (HF has none either), reached through
// set_optimizer_factory; its checkpoints are checked like AdamW's.
#include <torch/optim/adam.h>

#include "optim/registry/adam_family.h"
#include "optim/registry/builtin_optimizers.h"

namespace mantissa::optim::detail {

OptimizerSpec adam_torch_spec() {
  OptimizerSpec spec;
  spec.type = typeid(torch::optim::Adam);
  spec.family = kAdamFamily;
  spec.family_marks = adam_family_marks();
  spec.state_tensors = &adam_moments<torch::optim::AdamParamState>;
  spec.steps = &counted_steps<torch::optim::AdamParamState>;
  spec.group_options = &adam_options<torch::optim::AdamOptions>;
  return spec;
}

}  // namespace mantissa::optim::detail
