// torch::optim::RMSprop: reached through set_optimizer_factory; its checkpoints are checked.
#include <torch/optim/rmsprop.h>

#include "optim/registry/adam_family.h"
#include "optim/registry/builtin_optimizers.h"

namespace mantissa::optim::detail {
namespace {

StateTensors rmsprop_tensors(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const torch::optim::RMSpropParamState*>(&base);
  if (state == nullptr) return {};
  return {{"square_avg", state->square_avg(), /*non_negative=*/true},
          {"momentum_buffer", state->momentum_buffer()},
          {"grad_avg", state->grad_avg()}};
}

std::vector<GroupOption> rmsprop_options(const torch::optim::OptimizerOptions& base) {
  const auto& options = static_cast<const torch::optim::RMSpropOptions&>(base);
  return {{"lr", options.lr()},
          {"alpha", options.alpha()},
          {"eps", options.eps()},
          {"weight_decay", options.weight_decay()},
          {"momentum", options.momentum()}};
}

}  // namespace

OptimizerSpec rmsprop_spec() {
  OptimizerSpec spec;
  spec.type = typeid(torch::optim::RMSprop);
  spec.family = "RMSprop";
  spec.family_marks = {"alpha", "centered"};
  spec.state_tensors = &rmsprop_tensors;
  spec.steps = &counted_steps<torch::optim::RMSpropParamState>;
  spec.group_options = &rmsprop_options;
  return spec;
}

}  // namespace mantissa::optim::detail
