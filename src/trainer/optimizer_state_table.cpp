#include "trainer/optimizer_state_table.h"

#include <array>
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

namespace mantissa::detail {
namespace {

// The three moments of the Adam family, whose states share the accessor names.
template <typename State>
StateTensors adam_moments(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const State*>(&base);
  if (state == nullptr) return {};
  return {{"exp_avg", state->exp_avg()},
          {"exp_avg_sq", state->exp_avg_sq()},
          {"max_exp_avg_sq", state->max_exp_avg_sq()}};
}

// FusedAdamW's moments and its Kahan compensation (bf16/fp16 parameters under kahan).
StateTensors fused_adamw_tensors(const torch::optim::OptimizerParamState& base) {
  auto tensors = adam_moments<optim::FusedAdamWParamState>(base);
  if (const auto* state = dynamic_cast<const optim::FusedAdamWParamState*>(&base)) {
    tensors.emplace_back("kahan_comp", state->kahan_comp());
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
  return {{"sum", state->sum()}};
}

StateTensors rmsprop_tensors(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const torch::optim::RMSpropParamState*>(&base);
  if (state == nullptr) return {};
  return {{"square_avg", state->square_avg()},
          {"momentum_buffer", state->momentum_buffer()},
          {"grad_avg", state->grad_avg()}};
}

struct Entry {
  std::type_index type;
  OptimizerStateKind kind;
};

const std::array<Entry, 6>& table() {
  static const std::array<Entry, 6> entries{{
      {typeid(optim::FusedAdamW),
       {"mantissa::optim::FusedAdamW", &fused_adamw_tensors}},
      {typeid(torch::optim::AdamW),
       {"torch::optim::AdamW", &adam_moments<torch::optim::AdamWParamState>}},
      {typeid(torch::optim::Adam),
       {"torch::optim::Adam", &adam_moments<torch::optim::AdamParamState>}},
      {typeid(torch::optim::SGD), {"torch::optim::SGD", &sgd_tensors}},
      {typeid(torch::optim::Adagrad), {"torch::optim::Adagrad", &adagrad_tensors}},
      {typeid(torch::optim::RMSprop), {"torch::optim::RMSprop", &rmsprop_tensors}},
  }};
  return entries;
}

// Each optimizer state tensor must have its parameter's shape, a floating dtype and finite
// values: a NaN or inf in a moment or a compensation would make every later step non-finite.
void check_state_tensor(const at::Tensor& param, const at::Tensor& value, std::size_t index,
                        const char* name) {
  if (!value.defined()) return;
  TORCH_CHECK_VALUE(value.sizes() == param.sizes(), "the state '", name, "' of parameter ", index,
                    " has shape ", value.sizes(), " but the parameter has shape ", param.sizes());
  TORCH_CHECK_VALUE(c10::isFloatingType(value.scalar_type()), "the state '", name,
                    "' of parameter ", index, " is ", value.scalar_type(),
                    ", not a floating-point tensor");
  const auto bad = value.numel() - value.isfinite().sum().item<std::int64_t>();
  TORCH_CHECK_VALUE(bad == 0, "the state '", name, "' of parameter ", index, " holds ", bad,
                    " NaN or infinite value(s) of its ", value.numel(),
                    "; a run resumed from it would only produce non-finite steps");
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
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      const auto it = optimizer.state().find(param.unsafeGetTensorImpl());
      if (it != optimizer.state().end()) {
        const auto& state = *it->second;
        const auto tensors = kind.tensors(state);
        TORCH_INTERNAL_ASSERT(!tensors.empty(), kind.name, " holds a state of another class (",
                              c10::demangle(typeid(state).name()), ") for parameter ", index);
        for (const auto& [name, value] : tensors) check_state_tensor(param, value, index, name);
      }
      ++index;
    }
  }
}

}  // namespace mantissa::detail
