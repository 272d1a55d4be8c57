#include "trainer/optimizer_state_table.h"

#include <array>
#include <cmath>
#include <optional>
#include <typeindex>
#include <typeinfo>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <mantissa/optim/fused_adamw.h>

#include "value_checks.h"

namespace mantissa::detail {
namespace {

// The three moments of the Adam family, whose states share the accessor names.
template <typename State>
StateTensors adam_moments(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const State*>(&base);
  if (state == nullptr) return {};
  return {{"exp_avg", state->exp_avg()},
          {"exp_avg_sq", state->exp_avg_sq(), /*non_negative=*/true},
          {"max_exp_avg_sq", state->max_exp_avg_sq(), /*non_negative=*/true}};
}

// FusedAdamW's moments and its Kahan compensation (bf16/fp16 parameters under kahan).
StateTensors fused_adamw_tensors(const torch::optim::OptimizerParamState& base) {
  auto tensors = adam_moments<optim::FusedAdamWParamState>(base);
  if (const auto* state = dynamic_cast<const optim::FusedAdamWParamState*>(&base)) {
    tensors.push_back({"kahan_comp", state->kahan_comp()});
  }
  return tensors;
}

StateTensors sgd_tensors(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const torch::optim::SGDParamState*>(&base);
  if (state == nullptr) return {};
  return {{"momentum_buffer", state->momentum_buffer()}};
}

StateTensors adagrad_tensors(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const torch::optim::AdagradParamState*>(&base);
  if (state == nullptr) return {};
  return {{"sum", state->sum(), /*non_negative=*/true}};
}

StateTensors rmsprop_tensors(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const torch::optim::RMSpropParamState*>(&base);
  if (state == nullptr) return {};
  return {{"square_avg", state->square_avg(), /*non_negative=*/true},
          {"momentum_buffer", state->momentum_buffer()},
          {"grad_avg", state->grad_avg()}};
}

// LibTorch's states count their steps in an int64_t.
template <typename State>
std::optional<double> counted_steps(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const State*>(&base);
  if (state == nullptr) return std::nullopt;
  return static_cast<double>(state->step());
}

// FusedAdamW's `step` is a 0-d tensor (undefined: none taken yet).
std::optional<double> fused_adamw_steps(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const optim::FusedAdamWParamState*>(&base);
  if (state == nullptr || !state->step().defined()) return std::nullopt;
  TORCH_CHECK_VALUE(state->step().numel() == 1, "its 'step' holds ", state->step().numel(),
                    " values instead of one");
  return state->step().item<double>();
}

std::optional<double> no_steps(const torch::optim::OptimizerParamState&) { return std::nullopt; }

template <typename Options>
std::vector<GroupOption> adam_options(const torch::optim::OptimizerOptions& base) {
  const auto& options = static_cast<const Options&>(base);
  return {{"lr", options.lr()},
          {"betas[0]", std::get<0>(options.betas()), true, /*below_one=*/true},
          {"betas[1]", std::get<1>(options.betas()), true, /*below_one=*/true},
          {"eps", options.eps()},
          {"weight_decay", options.weight_decay()}};
}

std::vector<GroupOption> sgd_options(const torch::optim::OptimizerOptions& base) {
  const auto& options = static_cast<const torch::optim::SGDOptions&>(base);
  return {{"lr", options.lr()},
          {"momentum", options.momentum()},
          {"dampening", options.dampening(), /*non_negative=*/false},
          {"weight_decay", options.weight_decay()}};
}

std::vector<GroupOption> adagrad_options(const torch::optim::OptimizerOptions& base) {
  const auto& options = static_cast<const torch::optim::AdagradOptions&>(base);
  return {{"lr", options.lr()},
          {"lr_decay", options.lr_decay()},
          {"weight_decay", options.weight_decay()},
          {"initial_accumulator_value", options.initial_accumulator_value()},
          {"eps", options.eps()}};
}

std::vector<GroupOption> rmsprop_options(const torch::optim::OptimizerOptions& base) {
  const auto& options = static_cast<const torch::optim::RMSpropOptions&>(base);
  return {{"lr", options.lr()},
          {"alpha", options.alpha()},
          {"eps", options.eps()},
          {"weight_decay", options.weight_decay()},
          {"momentum", options.momentum()}};
}

struct Entry {
  std::type_index type;
  OptimizerStateKind kind;
};

const std::array<Entry, 6>& table() {
  static const std::array<Entry, 6> entries{{
      {typeid(optim::FusedAdamW),
       {"mantissa::optim::FusedAdamW", &fused_adamw_tensors, &fused_adamw_steps,
        &adam_options<optim::FusedAdamWOptions>}},
      {typeid(torch::optim::AdamW),
       {"torch::optim::AdamW", &adam_moments<torch::optim::AdamWParamState>,
        &counted_steps<torch::optim::AdamWParamState>, &adam_options<torch::optim::AdamWOptions>}},
      {typeid(torch::optim::Adam),
       {"torch::optim::Adam", &adam_moments<torch::optim::AdamParamState>,
        &counted_steps<torch::optim::AdamParamState>, &adam_options<torch::optim::AdamOptions>}},
      {typeid(torch::optim::SGD), {"torch::optim::SGD", &sgd_tensors, &no_steps, &sgd_options}},
      {typeid(torch::optim::Adagrad),
       {"torch::optim::Adagrad", &adagrad_tensors, &counted_steps<torch::optim::AdagradParamState>,
        &adagrad_options}},
      {typeid(torch::optim::RMSprop),
       {"torch::optim::RMSprop", &rmsprop_tensors, &counted_steps<torch::optim::RMSpropParamState>,
        &rmsprop_options}},
  }};
  return entries;
}

// Each optimizer state tensor must have its parameter's shape, a floating dtype and finite
// values: a NaN or inf in a moment or a compensation would make every later step non-finite, and
// a negative sum of squares a NaN square root.
void check_state_tensor(const at::Tensor& param, const StateTensor& state, std::size_t index) {
  const auto& value = state.value;
  if (!value.defined()) return;
  TORCH_CHECK_VALUE(value.sizes() == param.sizes(), "the state '", state.name, "' of parameter ",
                    index, " has shape ", value.sizes(), " but the parameter has shape ",
                    param.sizes());
  TORCH_CHECK_VALUE(c10::isFloatingType(value.scalar_type()), "the state '", state.name,
                    "' of parameter ", index, " is ", value.scalar_type(),
                    ", not a floating-point tensor");
  if (const auto bad = find_nonfinite(value)) {
    TORCH_CHECK_VALUE(false, "the state '", state.name, "' of parameter ", index,
                      " holds NaN or infinite values: ", bad->text(),
                      "; a run resumed from it would only produce non-finite steps");
  }
  if (!state.non_negative) return;
  if (const auto bad = find_bad_values(value, value.lt(0))) {
    TORCH_CHECK_VALUE(false, "the state '", state.name, "' of parameter ", index,
                      " holds negative values: ", bad->text(),
                      "; it sums squares, and the update takes its square root");
  }
}

void check_group_options(const std::vector<GroupOption>& options, std::size_t group) {
  for (const auto& option : options) {
    const bool ok = std::isfinite(option.value) && (!option.non_negative || option.value >= 0) &&
                    (!option.below_one || option.value < 1);
    TORCH_CHECK_VALUE(ok, "param_groups[", group, "]: '", option.name, "' is ", option.value,
                      ", but it must be a finite number",
                      option.below_one ? " in [0, 1)" : (option.non_negative ? " >= 0" : ""));
  }
}

}  // namespace

const OptimizerStateKind& optimizer_state_kind(const torch::optim::Optimizer& optimizer) {
  const std::type_index type(typeid(optimizer));
  for (const auto& entry : table()) {
    if (entry.type == type) return entry.kind;
  }
  TORCH_CHECK_VALUE(false, "checkpoints cannot hold the optimizer ", c10::demangle(type.name()),
                    ": only mantissa::optim::FusedAdamW and torch::optim's AdamW, Adam, SGD, "
                    "Adagrad and RMSprop (exactly these classes) have their state checked when "
                    "optimizer.pt is loaded; add the class to src/trainer/optimizer_state_table.cpp"
                    " or use save_strategy=\"no\"");
}

void check_optimizer_state(const torch::optim::Optimizer& optimizer) {
  const auto& kind = optimizer_state_kind(optimizer);
  std::size_t index = 0;
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& group = optimizer.param_groups()[g];
    check_group_options(kind.options(group.options()), g);
    for (const auto& param : group.params()) {
      const auto it = optimizer.state().find(param.unsafeGetTensorImpl());
      if (it != optimizer.state().end()) {
        const auto& state = *it->second;
        const auto tensors = kind.tensors(state);
        TORCH_INTERNAL_ASSERT(!tensors.empty(), kind.name, " holds a state of another class (",
                              c10::demangle(typeid(state).name()), ") for parameter ", index);
        if (const auto steps = kind.step(state)) {
          TORCH_CHECK_VALUE(std::isfinite(*steps) && *steps >= 0, "the state 'step' of parameter ",
                            index, " is ", *steps,
                            ", but it counts the steps taken: a finite number >= 0");
        }
        for (const auto& tensor : tensors) check_state_tensor(param, tensor, index);
      }
      ++index;
    }
  }
}

}  // namespace mantissa::detail
