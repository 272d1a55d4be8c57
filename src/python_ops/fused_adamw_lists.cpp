// The torch.ops bridge's checks of the lists Python passes: one entry per parameter in every list,
// each tensor of the shape, dtype and device its parameter needs; then the lists become the items
// FusedAdamW's dispatch runs (src/optim/fused_adamw_dispatch.h).
#include "python_ops/fused_adamw_lists.h"

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "optim/fused_adamw_dispatch.h"
#include "optim/fused_adamw_options.h"

namespace mantissa::python_ops {

void fused_adamw_lists_(const FusedAdamWLists& lists, const optim::FusedAdamWOptions& options,
                        const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  optim::detail::check_fused_adamw_options(options);
  TORCH_CHECK_VALUE(!options.amsgrad(), "fused_adamw_: amsgrad is not supported here");
  const auto n = lists.params.size();
  const auto same_length = [&](const std::vector<at::Tensor>& list, const char* name,
                               bool may_be_empty) {
    TORCH_CHECK_VALUE(list.size() == n || (may_be_empty && list.empty()), "fused_adamw_: ", name,
                      " has ", list.size(), " tensors but params has ", n);
  };
  same_length(lists.grads, "grads", false);
  same_length(lists.exp_avgs, "exp_avgs", false);
  same_length(lists.exp_avg_sqs, "exp_avg_sqs", false);
  same_length(lists.steps, "state_steps", false);
  same_length(lists.masters, "master_params", true);
  same_length(lists.kahan_comps, "kahan_comps", true);
  TORCH_CHECK_VALUE(lists.indices.size() == n, "fused_adamw_: param_indices has ",
                    lists.indices.size(), " entries but params has ", n);
  // The items point into `states`, which must not move while they run.
  std::vector<optim::FusedAdamWParamState> states(n);
  std::vector<optim::detail::FusedAdamWItem> items;
  items.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const bool has_master = !lists.masters.empty();
    const auto& model = lists.params[i];
    const auto& target = has_master ? lists.masters[i] : model;
    TORCH_CHECK_VALUE(target.scalar_type() == at::kFloat || target.scalar_type() == at::kBFloat16 ||
                          target.scalar_type() == at::kHalf || target.scalar_type() == at::kDouble,
                      "fused_adamw_: supports float32, bfloat16, float16 and float64 tensors; "
                      "tensor ",
                      i, " is ", target.scalar_type());
    TORCH_CHECK_VALUE(
        !has_master || (target.scalar_type() == at::kFloat && target.sizes() == model.sizes() &&
                        target.device() == model.device()),
        "fused_adamw_: master_params[", i, "] must be a float32 tensor of params[", i,
        "]'s shape and device; got a ", target.scalar_type(), " tensor of shape ", target.sizes(),
        " on ", target.device(), " for a param of shape ", model.sizes(), " on ", model.device());
    const auto& grad = lists.grads[i];
    TORCH_CHECK_VALUE(grad.sizes() == model.sizes() && grad.device() == model.device() &&
                          grad.scalar_type() == model.scalar_type() && !grad.is_sparse(),
                      "fused_adamw_: grads[", i, "] must be a dense tensor of params[", i,
                      "]'s shape, dtype and device");
    for (const auto* moment : {&lists.exp_avgs[i], &lists.exp_avg_sqs[i]}) {
      TORCH_CHECK_VALUE(moment->sizes() == target.sizes() && moment->device() == target.device(),
                        "fused_adamw_: the moments of tensor ", i,
                        " must have the shape and device of the tensor they update (",
                        target.sizes(), " on ", target.device(), ")");
    }
    const auto& step = lists.steps[i];
    TORCH_CHECK_VALUE(
        step.numel() == 1 && step.scalar_type() == at::kFloat && step.device() == target.device(),
        "fused_adamw_: state_steps[", i,
        "] must be a one-element float32 tensor on the parameter's device; got ",
        step.scalar_type(), " of ", step.numel(), " elements on ", step.device());
    auto& state = states[i];
    state.step(step).exp_avg(lists.exp_avgs[i]).exp_avg_sq(lists.exp_avg_sqs[i]);
    const auto rule = optim::detail::update_rule_for(options, target.scalar_type());
    if (rule == optim::LowPrecisionUpdate::kKahan) {
      TORCH_CHECK_VALUE(!lists.kahan_comps.empty(),
                        "fused_adamw_: low_precision_update=kahan "
                        "needs kahan_comps for the bfloat16/float16 params; none were given");
      state.kahan_comp(lists.kahan_comps[i]);
    }
    TORCH_CHECK_VALUE(lists.indices[i] >= 0 && lists.indices[i] <= UINT32_MAX,
                      "fused_adamw_: param_indices[", i, "] must be in [0, 2^32); got ",
                      lists.indices[i]);
    items.push_back(
        optim::detail::FusedAdamWItem{target, has_master ? grad.to(target.scalar_type()) : grad,
                                      &state, has_master ? model : at::Tensor(), rule,
                                      static_cast<std::uint32_t>(lists.indices[i]), 0, i});
  }
  optim::detail::run_fused_adamw_items(items, options, at::Tensor(), grad_scale, found_inf);
}

}  // namespace mantissa::python_ops
