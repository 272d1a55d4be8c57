#pragma once
// What the Adam family's entries share: the moments' keys, the step count and the group
// options by their optimizer.pt names. Internal.

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <mantissa/optim/optimizer_registry.h>

namespace mantissa::optim::detail {

/// The family name and marks of Adam, AdamW and FusedAdamW, which read each other's state.
inline const char* const kAdamFamily = "Adam/AdamW";
inline std::vector<std::string> adam_family_marks() { return {"betas", "eps", "amsgrad"}; }

/// The three moments of a `State` of the Adam family (their accessors share the names).
template <typename State>
StateTensors adam_moments(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const State*>(&base);
  if (state == nullptr) return {};
  return {{"exp_avg", state->exp_avg()},
          {"exp_avg_sq", state->exp_avg_sq(), /*non_negative=*/true},
          {"max_exp_avg_sq", state->max_exp_avg_sq(), /*non_negative=*/true}};
}

/// The steps of a LibTorch state, which counts them in an int64_t.
template <typename State>
std::optional<double> counted_steps(const torch::optim::OptimizerParamState& base) {
  const auto* state = dynamic_cast<const State*>(&base);
  if (state == nullptr) return std::nullopt;
  return static_cast<double>(state->step());
}

/// lr, the betas, eps and weight_decay of an Adam-family group.
template <typename Options>
std::vector<GroupOption> adam_options(const torch::optim::OptimizerOptions& base) {
  const auto& options = static_cast<const Options&>(base);
  return {{"lr", options.lr()},
          {"betas[0]", std::get<0>(options.betas()), true, /*below_one=*/true},
          {"betas[1]", std::get<1>(options.betas()), true, /*below_one=*/true},
          {"eps", options.eps()},
          {"weight_decay", options.weight_decay()}};
}

}  // namespace mantissa::optim::detail
