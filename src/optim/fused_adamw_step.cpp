// FusedAdamW::step: each parameter with a gradient gets its state (made on first use, never inside
// a CUDA graph capture) and its rule, and the group's parameters go to the kernels together.
#include <mantissa/optim/fused_adamw.h>

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "cuda_capture.h"
#include "optim/fused_adamw_dispatch.h"
#include "optim/fused_adamw_options.h"

namespace mantissa::optim {
namespace {

// Whether the step is being captured into a CUDA graph (on the first CUDA parameter's device).
bool is_capturing(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  for (const auto& group : groups) {
    for (const auto& p : group.params()) {
      if (p.is_cuda()) return mantissa::detail::is_capturing_on(p.device());
    }
  }
  return false;
}

}  // namespace

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  const bool capturing = is_capturing(param_groups_);
  TORCH_CHECK(
      !capturing || capturable_,
      "FusedAdamW: the step is being captured in a CUDA graph, but the optimizer is not "
      "capturable: the "
      "learning rate would be baked into the graph. Call set_capturable(true) first (Python: "
      "capturable=True).");
  if (capturable_) {
    if (capturing) {
      TORCH_CHECK(lr_tensors_.size() == param_groups_.size(),
                  "FusedAdamW: a param group was added after the learning-rate tensors were made; "
                  "call refresh_lr_tensors() before capturing the step");
    } else {
      refresh_lr_tensors();
    }
  }
  std::uint32_t first_index = 0;  // of the group's first parameter, over all groups
  for (std::size_t g = 0; g < param_groups_.size(); ++g) {
    auto& group = param_groups_[g];
    const auto& options = static_cast<const FusedAdamWOptions&>(group.options());
    const auto group_first_index = first_index;
    first_index += static_cast<std::uint32_t>(group.params().size());
    const at::Tensor lr_tensor = capturable_ ? lr_tensors_[g] : at::Tensor();
    std::vector<detail::FusedAdamWItem> items;
    for (std::size_t i = 0; i < group.params().size(); ++i) {
      auto& p = group.params()[i];
      const auto& grad = p.grad();
      if (!grad.defined()) continue;
      TORCH_CHECK_VALUE(!grad.is_sparse(), "FusedAdamW does not support sparse gradients");
      TORCH_CHECK_VALUE(grad.scalar_type() == p.scalar_type() && grad.device() == p.device(),
                        "FusedAdamW: a gradient must have its parameter's dtype and device; got ",
                        grad.scalar_type(), " on ", grad.device(), " for a ", p.scalar_type(),
                        " parameter on ", p.device());
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) {
        TORCH_CHECK(!capturing, "FusedAdamW: parameter ", i, " of group ", g,
                    " has no optimizer state yet and the "
                    "step is being captured in a CUDA graph, where making the state (zeros) would "
                    "run again on every "
                    "replay. Run an eager step first; this parameter got its first gradient inside "
                    "the capture.");
        const auto moments = p.options().dtype(detail::moment_dtype_for(options, p.scalar_type()));
        auto fresh = std::make_unique<FusedAdamWParamState>();
        fresh->step(at::zeros({}, p.options().dtype(at::kFloat).requires_grad(false)));
        fresh->exp_avg(at::zeros_like(p, moments, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, moments, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto* state = static_cast<FusedAdamWParamState*>(slot.get());
      if (options.amsgrad() && !state->max_exp_avg_sq().defined()) {
        TORCH_CHECK(!capturing,
                    "FusedAdamW: amsgrad was turned on inside a CUDA graph capture; run an eager "
                    "step first");
        state->max_exp_avg_sq(at::zeros_like(state->exp_avg(), at::MemoryFormat::Preserve));
      }
      const auto rule = detail::update_rule_for(options, p.scalar_type());
      if (rule == LowPrecisionUpdate::kKahan && !state->kahan_comp().defined()) {
        // Also after loading a state saved under another rule: the compensation starts at zero.
        TORCH_CHECK(!capturing, "FusedAdamW: parameter ", i, " of group ", g,
                    " has no kahan_comp yet and the "
                    "step is being captured in a CUDA graph; run an eager step with "
                    "low_precision_update=kahan first");
        state->kahan_comp(at::zeros_like(p, at::MemoryFormat::Preserve));
      }
      at::Tensor model;
      if (auto linked = model_of_.find(p.unsafeGetTensorImpl()); linked != model_of_.end()) {
        model = linked->second;
      }
      items.push_back(detail::FusedAdamWItem{
          p, grad, state, model, rule, group_first_index + static_cast<std::uint32_t>(i), g, i});
    }
    detail::run_fused_adamw_items(items, options, lr_tensor, grad_scale_, found_inf_);
  }
  return loss;
}

}  // namespace mantissa::optim
