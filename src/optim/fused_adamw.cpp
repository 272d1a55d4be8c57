// FusedAdamW: torch::optim::AdamW's arithmetic in one pass per tensor. This file: the options and
// their checks, the constructors, the links to model copies and the capturable learning rates.
// The step is in fused_adamw_step.cpp, the kernels' dispatch in fused_adamw_dispatch.cpp, the
// archives in fused_adamw_serialize.cpp.
#include <mantissa/optim/fused_adamw.h>

#include <ATen/ATen.h>

#include "optim/fused_adamw_options.h"

namespace mantissa::optim {

FusedAdamWOptions::FusedAdamWOptions(double lr) : lr_(lr) {}

bool operator==(const FusedAdamWOptions& lhs, const FusedAdamWOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.betas() == rhs.betas() && lhs.eps() == rhs.eps() &&
         lhs.weight_decay() == rhs.weight_decay() && lhs.amsgrad() == rhs.amsgrad() &&
         lhs.maximize() == rhs.maximize() &&
         lhs.low_precision_update() == rhs.low_precision_update() &&
         lhs.stochastic_rounding_seed() == rhs.stochastic_rounding_seed() &&
         lhs.fp32_moments() == rhs.fp32_moments();
}

double FusedAdamWOptions::get_lr() const { return lr(); }
void FusedAdamWOptions::set_lr(const double lr) { this->lr(lr); }

namespace detail {

void check_fused_adamw_options(const FusedAdamWOptions& options) {
  TORCH_CHECK_VALUE(options.lr() >= 0, "Invalid learning rate: ", options.lr());
  TORCH_CHECK_VALUE(options.eps() >= 0, "Invalid epsilon value: ", options.eps());
  const auto [beta1, beta2] = options.betas();
  TORCH_CHECK_VALUE(0 <= beta1 && beta1 < 1.0, "Invalid beta parameter at index 0: ", beta1);
  TORCH_CHECK_VALUE(0 <= beta2 && beta2 < 1.0, "Invalid beta parameter at index 1: ", beta2);
  TORCH_CHECK_VALUE(options.weight_decay() >= 0,
                    "Invalid weight_decay value: ", options.weight_decay());
}

LowPrecisionUpdate update_rule_for(const FusedAdamWOptions& options, c10::ScalarType dtype) {
  return amp::is_low_precision(dtype) ? options.low_precision_update()
                                      : LowPrecisionUpdate::kNearest;
}

c10::ScalarType moment_dtype_for(const FusedAdamWOptions& options, c10::ScalarType param_dtype) {
  return options.fp32_moments() && amp::is_low_precision(param_dtype) ? at::kFloat : param_dtype;
}

}  // namespace detail

FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       FusedAdamWOptions defaults)
    : torch::optim::Optimizer(param_groups, std::make_unique<FusedAdamWOptions>(defaults)) {
  detail::check_fused_adamw_options(defaults);
  for (std::size_t g = 0; g < param_groups_.size(); ++g) {
    detail::check_fused_adamw_options(
        static_cast<const FusedAdamWOptions&>(param_groups_[g].options()));
    const auto& params = param_groups_[g].params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto dtype = params[i].scalar_type();
      TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf ||
                            dtype == at::kDouble,
                        "FusedAdamW supports float32, bfloat16, float16 and float64 parameters; "
                        "parameter ",
                        i, " of group ", g, " is ", dtype);
    }
  }
}

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, FusedAdamWOptions defaults)
    : FusedAdamW(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                     std::move(params))},
                 std::move(defaults)) {}

FusedAdamW::FusedAdamW(const mantissa::amp::MasterWeights& masters, FusedAdamWOptions defaults)
    : FusedAdamW(masters.master_params(), std::move(defaults)) {
  link_model_params(masters);
}

void FusedAdamW::link_model_params(const mantissa::amp::MasterWeights& masters) {
  link_model_params(masters.master_params(), masters.model_params());
}

void FusedAdamW::link_model_params(const std::vector<at::Tensor>& params,
                                   const std::vector<at::Tensor>& model_params) {
  TORCH_CHECK_VALUE(params.size() == model_params.size(),
                    "FusedAdamW::link_model_params: ", params.size(), " params but ",
                    model_params.size(), " model params");
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& param = params[i];
    const auto& model = model_params[i];
    TORCH_CHECK_VALUE(param.defined() && model.defined(), "FusedAdamW::link_model_params: pair ", i,
                      " holds an undefined tensor");
    if (param.is_same(model)) continue;
    TORCH_CHECK_VALUE(param.scalar_type() == at::kFloat, "FusedAdamW::link_model_params: param ", i,
                      " must be float32 (a master), got ", param.scalar_type());
    TORCH_CHECK_VALUE(amp::is_low_precision(model.scalar_type()),
                      "FusedAdamW::link_model_params: model param ", i,
                      " must be bfloat16 or float16, got ", model.scalar_type());
    TORCH_CHECK_VALUE(param.sizes() == model.sizes() && param.device() == model.device(),
                      "FusedAdamW::link_model_params: pair ", i,
                      " differs in shape or device: ", param.sizes(), " on ", param.device(),
                      " vs ", model.sizes(), " on ", model.device());
    model_of_[param.unsafeGetTensorImpl()] = model;
  }
  writes_back_ = true;
}

void FusedAdamW::set_amp_scaling(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  grad_scale_ = grad_scale;
  found_inf_ = found_inf;
}

void FusedAdamW::clear_amp_scaling() {
  grad_scale_.reset();
  found_inf_.reset();
}

void FusedAdamW::set_capturable(bool capturable) {
  capturable_ = capturable;
  if (capturable_) {
    refresh_lr_tensors();
  } else {
    lr_tensors_.clear();
  }
}

void FusedAdamW::refresh_lr_tensors() {
  if (!capturable_) return;
  for (std::size_t g = 0; g < param_groups_.size(); ++g) {
    const double lr = param_groups_[g].options().get_lr();
    if (g < lr_tensors_.size()) {
      lr_tensors_[g].fill_(lr);  // in place: a captured step keeps reading this memory
      continue;
    }
    const auto& params = param_groups_[g].params();
    const auto device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
    lr_tensors_.push_back(at::full({}, lr, at::TensorOptions().dtype(at::kDouble).device(device)));
  }
}

const at::Tensor& FusedAdamW::lr_tensor(std::size_t group) const {
  TORCH_CHECK(capturable_,
              "FusedAdamW::lr_tensor: the optimizer is not capturable (set_capturable(true))");
  TORCH_CHECK_INDEX(group < lr_tensors_.size(), "FusedAdamW::lr_tensor: group ", group, " of ",
                    lr_tensors_.size());
  return lr_tensors_[group];
}

}  // namespace mantissa::optim
