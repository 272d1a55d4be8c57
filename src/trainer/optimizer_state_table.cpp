#include "trainer/optimizer_state_table.h"

#include <cmath>
#include <optional>
#include <typeinfo>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>

#include "value_checks.h"

namespace mantissa::detail {
namespace {

// Each optimizer state tensor must have its parameter's shape, a floating dtype and finite
// values: a NaN or inf in a moment or a compensation would make every later step non-finite, and
// a negative sum of squares a NaN square root.
void check_state_tensor(const at::Tensor& param, const optim::StateTensor& state,
                        std::size_t index) {
  const auto& value = state.value;
  if (!value.defined() || state.codes) return;
  TORCH_CHECK_VALUE(!state.param_shaped || value.sizes() == param.sizes(), "the state '", state.name, "' of parameter ",
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

void check_group_options(const std::vector<optim::GroupOption>& options, std::size_t group) {
  for (const auto& option : options) {
    const bool ok = std::isfinite(option.value) && (!option.non_negative || option.value >= 0) &&
                    (!option.below_one || option.value < 1);
    TORCH_CHECK_VALUE(ok, "param_groups[", group, "]: '", option.name, "' is ", option.value,
                      ", but it must be a finite number",
                      option.below_one ? " in [0, 1)" : (option.non_negative ? " >= 0" : ""));
  }
}

}  // namespace

const optim::OptimizerSpec& optimizer_state_kind(const torch::optim::Optimizer& optimizer) {
  const auto* spec = optim::find_optimizer_of(optimizer);
  if (spec != nullptr && spec->state_tensors && spec->steps && spec->group_options) return *spec;
  TORCH_CHECK_VALUE(false, "checkpoints cannot hold the optimizer ",
                    c10::demangle(typeid(optimizer).name()),
                    ": its exact class has no entry with a state layout in the optimizer "
                    "registry (built in: mantissa::optim::FusedAdamW and torch::optim's AdamW, "
                    "Adam, SGD, Adagrad and RMSprop); register one with "
                    "mantissa::optim::register_optimizer, or use save_strategy=\"no\"");
}

void check_optimizer_state(const torch::optim::Optimizer& optimizer) {
  const auto& kind = optimizer_state_kind(optimizer);
  std::size_t index = 0;
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& group = optimizer.param_groups()[g];
    check_group_options(kind.group_options(group.options()), g);
    for (const auto& param : group.params()) {
      const auto it = optimizer.state().find(param.unsafeGetTensorImpl());
      if (it != optimizer.state().end()) {
        const auto& state = *it->second;
        const auto tensors = kind.state_tensors(state);
        TORCH_INTERNAL_ASSERT(!tensors.empty(), c10::demangle(kind.type.name()),
                              " holds a state of another class (",
                              c10::demangle(typeid(state).name()), ") for parameter ", index);
        if (const auto steps = kind.steps(state)) {
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
