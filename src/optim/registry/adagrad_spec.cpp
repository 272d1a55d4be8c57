// torch::optim::Adagrad: reached through set_optimizer_factory; its checkpoints are checked.
#include <torch/optim/adagrad.h>

#include "optim/registry/adam_family.h"
#include "optim/registry/builtin_optimizers.h"

namespace mantissa::optim::detail {
namespace {

StateTensors adagrad_tensors(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const torch::optim::AdagradParamState*>(&base);
  if (state == nullptr) return {};
  return {{"sum", state->sum(), /*non_negative=*/true}};
}

std::vector<GroupOption> adagrad_options(const torch::optim::OptimizerOptions& base) {
  const auto& options = static_cast<const torch::optim::AdagradOptions&>(base);
  return {{"lr", options.lr()},
          {"lr_decay", options.lr_decay()},
          {"weight_decay", options.weight_decay()},
          {"initial_accumulator_value", options.initial_accumulator_value()},
          {"eps", options.eps()}};
}

}  // namespace

OptimizerSpec adagrad_spec() {
  OptimizerSpec spec;
  spec.type = typeid(torch::optim::Adagrad);
  spec.family = "Adagrad";
  spec.family_marks = {"lr_decay", "initial_accumulator_value"};
  spec.state_tensors = &adagrad_tensors;
  spec.steps = &counted_steps<torch::optim::AdagradParamState>;
  spec.group_options = &adagrad_options;
  return spec;
}

}  // namespace mantissa::optim::detail
