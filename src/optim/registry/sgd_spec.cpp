// "sgd": LibTorch's SGD with the learning_rate and weight_decay of the arguments.
#include <torch/optim/sgd.h>

#include "optim/registry/builtin_optimizers.h"

namespace mantissa::optim::detail {
namespace {

StateTensors sgd_tensors(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const torch::optim::SGDParamState*>(&base);
  if (state == nullptr) return {};
  return {{"momentum_buffer", state->momentum_buffer()}};
}

std::vector<GroupOption> sgd_options(const torch::optim::OptimizerOptions& base) {
  const auto& options = static_cast<const torch::optim::SGDOptions&>(base);
  return {{"lr", options.lr()},
          {"momentum", options.momentum()},
          {"dampening", options.dampening(), /*non_negative=*/false},
          {"weight_decay", options.weight_decay()}};
}

}  // namespace

OptimizerSpec sgd_spec() {
  OptimizerSpec spec;
  spec.name = "sgd";
  spec.type = typeid(torch::optim::SGD);
  spec.family = "SGD";
  spec.family_marks = {"momentum", "dampening", "nesterov"};
  spec.build = [](OptimizerBuildInputs inputs) -> std::unique_ptr<torch::optim::Optimizer> {
    return build_in_decay_groups<torch::optim::SGD>(
        inputs, torch::optim::SGDOptions(inputs.args.learning_rate())
                    .weight_decay(inputs.args.weight_decay()));
  };
  spec.state_tensors = &sgd_tensors;
  spec.steps = [](const torch::optim::OptimizerParamState&) -> std::optional<double> {
    return std::nullopt;
  };
  spec.group_options = &sgd_options;
  return spec;
}

}  // namespace mantissa::optim::detail
