// FusedAdamW: torch::optim::AdamW's arithmetic in one pass per tensor (kernels in
// fused_adamw_cpu_kernel.inc and fused_adamw_cuda.cu), plus an ATen fallback for what the
// kernels do not cover.
#include <mantissa/optim/fused_adamw.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Version.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include "cuda_capture.h"
#include "optim/fused_adamw_kernels.h"
#include "optim/fused_adamw_lists.h"
#include "optim/low_precision_rounding.h"

namespace mantissa::optim {

// ---- options and state ----------------------------------------------------------------

FusedAdamWOptions::FusedAdamWOptions(double lr) : lr_(lr) {}

bool operator==(const FusedAdamWOptions& lhs, const FusedAdamWOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.betas() == rhs.betas() && lhs.eps() == rhs.eps() &&
         lhs.weight_decay() == rhs.weight_decay() && lhs.amsgrad() == rhs.amsgrad() &&
         lhs.maximize() == rhs.maximize() &&
         lhs.low_precision_update() == rhs.low_precision_update() &&
         lhs.stochastic_rounding_seed() == rhs.stochastic_rounding_seed() &&
         lhs.fp32_moments() == rhs.fp32_moments();
}

void FusedAdamWOptions::serialize(torch::serialize::OutputArchive& archive) const {
  // torch::optim::AdamWOptions' keys, so that AdamW reads them (and skips the rest, ours).
  archive.write("lr", c10::IValue(lr()));
  archive.write("betas", c10::IValue(betas()));
  archive.write("eps", c10::IValue(eps()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("amsgrad", c10::IValue(amsgrad()));
  archive.write("maximize", c10::IValue(maximize()));
  archive.write("low_precision_update",
                c10::IValue(std::string(to_string(low_precision_update()))));
  // IValue holds int64: the seed's bits, reinterpreted.
  archive.write("stochastic_rounding_seed",
                c10::IValue(static_cast<std::int64_t>(stochastic_rounding_seed())));
  archive.write("fp32_moments", c10::IValue(fp32_moments()));
}

void FusedAdamWOptions::serialize(torch::serialize::InputArchive& archive) {
  auto read = [&](const char* key) {
    c10::IValue value;
    TORCH_CHECK_VALUE(archive.try_read(key, value), "FusedAdamW options: the archive has no '", key,
                      "'");
    return value;
  };
  lr(read("lr").toDouble());
  betas(read("betas").to<betas_t>());
  eps(read("eps").toDouble());
  weight_decay(read("weight_decay").toDouble());
  amsgrad(read("amsgrad").toBool());
  c10::IValue value;
  maximize(archive.try_read("maximize", value) ? value.toBool() : false);  // absent in AdamW's
  // Absent in AdamW's archives and in ours before these options: today's nearest rounding.
  low_precision_update(archive.try_read("low_precision_update", value)
                           ? parse_low_precision_update(value.toStringRef())
                           : LowPrecisionUpdate::kNearest);
  stochastic_rounding_seed(archive.try_read("stochastic_rounding_seed", value)
                               ? static_cast<std::uint64_t>(value.toInt())
                               : 0);
  fp32_moments(archive.try_read("fp32_moments", value) ? value.toBool() : false);
}

double FusedAdamWOptions::get_lr() const { return lr(); }
void FusedAdamWOptions::set_lr(const double lr) { this->lr(lr); }

void FusedAdamWParamState::serialize(torch::serialize::OutputArchive& archive) const {
  const std::int64_t steps =
      step().defined() ? static_cast<std::int64_t>(step().item<double>()) : 0;
  archive.write("step", c10::IValue(steps));
  if (exp_avg().defined()) archive.write("exp_avg", exp_avg());
  if (exp_avg_sq().defined()) archive.write("exp_avg_sq", exp_avg_sq());
  if (max_exp_avg_sq().defined()) archive.write("max_exp_avg_sq", max_exp_avg_sq());
  if (kahan_comp().defined()) archive.write("kahan_comp", kahan_comp());
}

void FusedAdamWParamState::serialize(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  if (archive.try_read("step", value)) {
    if (value.isTensor()) {
      step(value.toTensor().detach().to(at::kFloat).reshape({}).clone());
    } else {
      step(at::full({}, value.isInt() ? static_cast<double>(value.toInt()) : value.toDouble(),
                    at::kFloat));
    }
  }
  auto read_tensor = [&](const char* key) {
    c10::IValue tensor;
    return archive.try_read(key, tensor) ? tensor.toTensor() : at::Tensor();
  };
  exp_avg(read_tensor("exp_avg"));
  exp_avg_sq(read_tensor("exp_avg_sq"));
  max_exp_avg_sq(read_tensor("max_exp_avg_sq"));
  kahan_comp(read_tensor("kahan_comp"));
}

// ---- construction ---------------------------------------------------------------------

namespace {

void check_options(const FusedAdamWOptions& options) {
  TORCH_CHECK_VALUE(options.lr() >= 0, "Invalid learning rate: ", options.lr());
  TORCH_CHECK_VALUE(options.eps() >= 0, "Invalid epsilon value: ", options.eps());
  const auto [beta1, beta2] = options.betas();
  TORCH_CHECK_VALUE(0 <= beta1 && beta1 < 1.0, "Invalid beta parameter at index 0: ", beta1);
  TORCH_CHECK_VALUE(0 <= beta2 && beta2 < 1.0, "Invalid beta parameter at index 1: ", beta2);
  TORCH_CHECK_VALUE(options.weight_decay() >= 0,
                    "Invalid weight_decay value: ", options.weight_decay());
}

// The rule a parameter's write takes: only bf16/fp16 parameters have a choice (fp32 results
// stored in fp32 lose nothing to a rule; fp64 takes the ATen fallback).
LowPrecisionUpdate effective_rule(const FusedAdamWOptions& options, c10::ScalarType dtype) {
  return amp::is_low_precision(dtype) ? options.low_precision_update()
                                      : LowPrecisionUpdate::kNearest;
}

c10::ScalarType moment_dtype(const FusedAdamWOptions& options, c10::ScalarType param_dtype) {
  return options.fp32_moments() && amp::is_low_precision(param_dtype) ? at::kFloat : param_dtype;
}

bool kernel_dtype(c10::ScalarType dtype, detail::KernelDtype* out) {
  switch (dtype) {
    case at::kFloat:
      *out = detail::KernelDtype::kFloat;
      return true;
    case at::kBFloat16:
      *out = detail::KernelDtype::kBFloat16;
      return true;
    case at::kHalf:
      *out = detail::KernelDtype::kHalf;
      return true;
    default:
      return false;
  }
}

}  // namespace

FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       FusedAdamWOptions defaults)
    : torch::optim::Optimizer(param_groups, std::make_unique<FusedAdamWOptions>(defaults)) {
  check_options(defaults);
  for (std::size_t g = 0; g < param_groups_.size(); ++g) {
    check_options(static_cast<const FusedAdamWOptions&>(param_groups_[g].options()));
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

void FusedAdamW::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedAdamWParamState, FusedAdamWOptions>(archive, *this);
}

void FusedAdamW::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<FusedAdamWParamState, FusedAdamWOptions>(archive, *this);
  // The archive's tensors come back on the CPU, in the dtype they were saved with.
  std::size_t index = 0;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const FusedAdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      auto it = state_.find(p.unsafeGetTensorImpl());
      const auto position = index++;
      if (it == state_.end()) continue;
      auto& state = static_cast<FusedAdamWParamState&>(*it->second);
      // Refused before the cast below would hide it (an integer moment holds no fraction).
      for (const auto& [name, t] : {std::pair<const char*, at::Tensor>{"exp_avg", state.exp_avg()},
                                    {"exp_avg_sq", state.exp_avg_sq()},
                                    {"max_exp_avg_sq", state.max_exp_avg_sq()},
                                    {"kahan_comp", state.kahan_comp()}}) {
        TORCH_CHECK_VALUE(!t.defined() || at::isFloatingType(t.scalar_type()), "the state '", name,
                          "' of parameter ", position, " is ", t.scalar_type(),
                          ", not a floating-point tensor");
      }
      const auto on = p.options().requires_grad(false);
      const auto moments = on.dtype(moment_dtype(options, p.scalar_type()));
      if (!state.step().defined()) state.step(at::zeros({}, on.dtype(at::kFloat)));
      state.step(state.step().to(on.dtype(at::kFloat)));
      if (state.exp_avg().defined()) state.exp_avg(state.exp_avg().to(moments));
      if (state.exp_avg_sq().defined()) state.exp_avg_sq(state.exp_avg_sq().to(moments));
      if (state.max_exp_avg_sq().defined())
        state.max_exp_avg_sq(state.max_exp_avg_sq().to(moments));
      if (state.kahan_comp().defined()) state.kahan_comp(state.kahan_comp().to(on));
    }
  }
}

// ---- the step -------------------------------------------------------------------------

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

struct Item {
  at::Tensor param;
  at::Tensor grad;
  FusedAdamWParamState* state;
  at::Tensor model;  // undefined: no model copy
  LowPrecisionUpdate rule;
  std::uint32_t index;   // the parameter's position over all groups: stochastic rounding's key
  std::size_t group;     // where the parameter is, for messages
  std::size_t position;  // in its group
};

// One kernel call: same device, param dtype, model dtype, moment dtype, rule.
struct BucketKey {
  c10::Device device;
  c10::ScalarType param_dtype;
  c10::ScalarType model_dtype;  // Undefined when no model copy
  c10::ScalarType moment_dtype;
  LowPrecisionUpdate rule;
  auto tied() const {
    return std::make_tuple(static_cast<int>(device.type()), device.index(),
                           static_cast<int>(param_dtype), static_cast<int>(model_dtype),
                           static_cast<int>(moment_dtype), static_cast<int>(rule));
  }
  bool operator<(const BucketKey& other) const { return tied() < other.tied(); }
};

// The kernels walk `numel` elements of raw memory, so every buffer must be dense and laid out
// like the parameter.
bool same_dense_layout(const at::Tensor& reference, const at::Tensor& t) {
  return !t.defined() || (t.is_non_overlapping_and_dense() && t.strides() == reference.strides() &&
                          t.sizes() == reference.sizes());
}

bool kernel_can_run(const Item& item, bool amsgrad) {
  const auto& p = item.param;
  detail::KernelDtype dtype;
  if (!kernel_dtype(p.scalar_type(), &dtype)) return false;
  if (p.is_cpu()) {
    // fine
  } else if (p.is_cuda()) {
#ifndef MANTISSA_WITH_CUDA
    return false;
#endif
  } else {
    return false;
  }
  if (!p.is_non_overlapping_and_dense()) return false;
  const auto& s = *item.state;
  // Moments of the param dtype, or fp32 for a bf16/fp16 param; a Kahan buffer of the param dtype.
  const auto moments = s.exp_avg().scalar_type();
  if (moments != p.scalar_type() && moments != at::kFloat) return false;
  if (s.exp_avg_sq().scalar_type() != moments) return false;
  if (amsgrad && s.max_exp_avg_sq().scalar_type() != moments) return false;
  if (item.rule == LowPrecisionUpdate::kKahan && s.kahan_comp().scalar_type() != p.scalar_type()) {
    return false;
  }
  return same_dense_layout(p, item.grad) && same_dense_layout(p, s.exp_avg()) &&
         same_dense_layout(p, s.exp_avg_sq()) &&
         (!amsgrad || same_dense_layout(p, s.max_exp_avg_sq())) &&
         same_dense_layout(p, item.model) &&
         (item.rule != LowPrecisionUpdate::kKahan || same_dense_layout(p, s.kahan_comp()));
}

// 1 - beta^step. The rules that promise the same bits on the CPU and on CUDA take
// pow_by_squaring (the CUDA kernel does the same); nearest keeps std::pow, as AdamW.
double bias_correction(double beta, double step, LowPrecisionUpdate rule) {
  if (rule == LowPrecisionUpdate::kNearest) return 1 - std::pow(beta, step);
  return detail::exact_bias_correction(beta, static_cast<std::uint32_t>(step));
}

detail::AdamWScalars group_scalars(const FusedAdamWOptions& o, double lr) {
  const auto [beta1, beta2] = o.betas();
  detail::AdamWScalars s{};
  // Each value is computed in double and rounded to fp32 once, as ATen does with a double
  // scalar applied to a float tensor in torch::optim::AdamW.
  s.decay = static_cast<float>(1 - lr * o.weight_decay());
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.eps = static_cast<float>(o.eps());
  s.maximize = o.maximize();
  return s;
}

// Any device and dtype, plain ATen ops; no sync: a skipped step writes back the old values.
// `lr_tensor` (capturable) replaces `o.lr()` so that a captured graph reads the current rate.
void adamw_fallback(const Item& item, const FusedAdamWOptions& o, const at::Tensor& lr_tensor,
                    const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  auto& s = *item.state;
  auto param = item.param;
  const auto opmath = param.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto [beta1, beta2] = o.betas();
  auto g = item.grad.to(opmath);
  if (grad_scale.defined()) {
    g = g * grad_scale.to(g.device(), at::kDouble).reciprocal().to(opmath);
  }
  if (o.maximize()) g = g.neg();
  const auto step = s.step() + 1;
  const auto step_d = step.to(at::kDouble);
  const auto bias_correction1 = 1 - at::pow(beta1, step_d);
  const auto bias_correction2 = 1 - at::pow(beta2, step_d);
  const auto lr =
      lr_tensor.defined() ? lr_tensor.to(param.device()) : at::scalar_tensor(o.lr(), at::kDouble);
  auto p = param.to(opmath).mul((1 - lr * o.weight_decay()).to(opmath));
  auto m = s.exp_avg().to(opmath).mul(beta1).add_(g, 1 - beta1);
  auto v = s.exp_avg_sq().to(opmath).mul(beta2).addcmul_(g, g, 1 - beta2);
  at::Tensor vmax;
  if (o.amsgrad()) vmax = at::maximum(s.max_exp_avg_sq().to(opmath), v);
  const auto denom =
      ((o.amsgrad() ? vmax : v).sqrt() / bias_correction2.sqrt().to(opmath)).add_(o.eps());
  p.add_((-lr.to(bias_correction1.device()) / bias_correction1).to(opmath) * m / denom);

  auto commit = [&](at::Tensor dst, const at::Tensor& value) {
    if (found_inf.defined()) {
      const auto skip = found_inf.to(dst.device()).reshape({}).ne(0);
      dst.copy_(at::where(skip, dst, value.to(dst.scalar_type())));
    } else {
      dst.copy_(value);
    }
  };
  commit(param, p);
  commit(s.exp_avg(), m);
  commit(s.exp_avg_sq(), v);
  if (o.amsgrad()) commit(s.max_exp_avg_sq(), vmax);
  commit(s.step(), step);
  if (item.model.defined()) commit(item.model, p);
}

void run_cpu(const BucketKey& key, std::vector<Item>& items, const FusedAdamWOptions& o,
             const at::Tensor& lr_tensor, const at::Tensor& grad_scale,
             const at::Tensor& found_inf) {
  // On the CPU, reading the flag, the scale and the rate is a memory read, not a device sync.
  if (found_inf.defined() && found_inf.to(at::kCPU, at::kFloat).item<float>() != 0.f) return;
  const double lr = lr_tensor.defined() ? lr_tensor.to(at::kCPU).item<double>() : o.lr();
  auto scalars = group_scalars(o, lr);
  if (grad_scale.defined()) {
    scalars.unscale = true;
    scalars.inv_scale =
        static_cast<float>(1.0 / grad_scale.to(at::kCPU, at::kDouble).item<double>());
  }
  const auto [beta1, beta2] = o.betas();
  std::vector<detail::AdamWCpuTensor> tensors;
  tensors.reserve(items.size());
  for (auto& item : items) {
    auto& s = *item.state;
    float* step = s.step().data_ptr<float>();
    *step += 1;
    const double bias_correction1 = bias_correction(beta1, *step, key.rule);
    const double bias_correction2 = bias_correction(beta2, *step, key.rule);
    detail::AdamWCpuTensor t{};
    t.param = item.param.data_ptr();
    t.grad = item.grad.const_data_ptr();
    t.exp_avg = s.exp_avg().data_ptr();
    t.exp_avg_sq = s.exp_avg_sq().data_ptr();
    t.max_exp_avg_sq = o.amsgrad() ? s.max_exp_avg_sq().data_ptr() : nullptr;
    t.model = item.model.defined() ? item.model.data_ptr() : nullptr;
    t.numel = item.param.numel();
    t.neg_step_size = static_cast<float>(-(lr / bias_correction1));
    t.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    t.kahan_comp = key.rule == LowPrecisionUpdate::kKahan ? s.kahan_comp().data_ptr() : nullptr;
    t.rng_tensor = item.index;
    t.rng_step = static_cast<std::uint32_t>(*step);
    tensors.push_back(t);
  }
  detail::AdamWCpuArgs args{};
  TORCH_INTERNAL_ASSERT(kernel_dtype(key.param_dtype, &args.param_dtype));
  args.model_dtype = detail::KernelDtype::kNone;
  if (key.model_dtype != c10::ScalarType::Undefined) {
    TORCH_INTERNAL_ASSERT(kernel_dtype(key.model_dtype, &args.model_dtype));
  }
  args.amsgrad = o.amsgrad();
  args.rule = key.rule;
  args.fp32_moments = key.moment_dtype != key.param_dtype;
  args.seed = o.stochastic_rounding_seed();
  args.scalars = scalars;
  args.tensors = tensors.data();
  args.num_tensors = static_cast<std::int64_t>(tensors.size());
  detail::fused_adamw_cpu(args);
}

#ifdef MANTISSA_WITH_CUDA
void run_cuda(const BucketKey& key, std::vector<Item>& items, const FusedAdamWOptions& o,
              const at::Tensor& lr_tensor, const at::Tensor& grad_scale,
              const at::Tensor& found_inf) {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, models, steps;
  for (auto& item : items) {
    auto& s = *item.state;
    params.push_back(item.param);
    grads.push_back(item.grad);
    exp_avgs.push_back(s.exp_avg());
    exp_avg_sqs.push_back(s.exp_avg_sq());
    if (o.amsgrad()) max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
    models.push_back(item.model);
    steps.push_back(s.step());
  }
  const auto [beta1, beta2] = o.betas();
  detail::cuda::AdamWCudaHyper hyper{o.lr(), beta1, beta2, o.weight_decay(),
                                     group_scalars(o, o.lr())};
  // Flags on another device are copied without blocking (GradScaler keeps one per device).
  auto on_device = [&](const at::Tensor& t, c10::ScalarType dtype) {
    return t.defined() ? t.to(key.device, dtype, /*non_blocking=*/true) : t;
  };
  if (key.rule != LowPrecisionUpdate::kNearest || key.moment_dtype != key.param_dtype) {
    std::vector<at::Tensor> kahan_comps;
    std::vector<std::uint32_t> rng_tensors;
    for (auto& item : items) {
      if (key.rule == LowPrecisionUpdate::kKahan) kahan_comps.push_back(item.state->kahan_comp());
      rng_tensors.push_back(item.index);
    }
    detail::cuda::fused_adamw_low_precision(
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, kahan_comps, rng_tensors, steps,
        hyper, o.amsgrad(), key.rule, o.stochastic_rounding_seed(),
        on_device(lr_tensor, at::kDouble), on_device(grad_scale, at::kFloat),
        on_device(found_inf, at::kFloat));
    return;
  }
  detail::cuda::fused_adamw(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, models, steps,
                            hyper, o.amsgrad(), on_device(lr_tensor, at::kDouble),
                            on_device(grad_scale, at::kFloat), on_device(found_inf, at::kFloat));
}
#endif

// Sends each item to a kernel (one call per bucket of alike tensors) or to the ATen fallback,
// and runs them.
void run_items(std::vector<Item>& items, const FusedAdamWOptions& options,
               const at::Tensor& lr_tensor, const at::Tensor& grad_scale,
               const at::Tensor& found_inf) {
  std::map<BucketKey, std::vector<Item>> buckets;
  std::vector<Item> fallback;
  for (auto& item : items) {
    const auto& p = item.param;
    const auto rule = item.rule;
    if (rule != LowPrecisionUpdate::kNearest && !kernel_can_run(item, options.amsgrad()) &&
        p.is_non_overlapping_and_dense() && !same_dense_layout(p, item.grad)) {
      // The compensated rules have no ATen fallback: a gradient laid out unlike its
      // parameter is copied into the parameter's layout for the kernel.
      item.grad = at::empty_like(p, at::MemoryFormat::Preserve).copy_(item.grad);
    }
    if (kernel_can_run(item, options.amsgrad())) {
      const BucketKey key{
          p.device(), p.scalar_type(),
          item.model.defined() ? item.model.scalar_type() : c10::ScalarType::Undefined,
          item.state->exp_avg().scalar_type(), rule};
      buckets[key].push_back(std::move(item));
    } else {
      TORCH_CHECK_VALUE(rule == LowPrecisionUpdate::kNearest,
                        "FusedAdamW: low_precision_update=", to_string(rule),
                        " needs a dense parameter on the CPU or a CUDA device, with "
                        "its state laid out alike; parameter ",
                        item.position, " of group ", item.group, " is a ", p.scalar_type(),
                        " tensor on ", p.device(), " with strides ", p.strides());
      fallback.push_back(std::move(item));
    }
  }
  for (auto& [key, bucket] : buckets) {
    if (key.device.is_cpu()) {
      run_cpu(key, bucket, options, lr_tensor, grad_scale, found_inf);
    } else {
#ifdef MANTISSA_WITH_CUDA
      run_cuda(key, bucket, options, lr_tensor, grad_scale, found_inf);
#else
      TORCH_INTERNAL_ASSERT(false, "FusedAdamW: no kernel for ", key.device);
#endif
    }
  }
  for (auto& item : fallback) adamw_fallback(item, options, lr_tensor, grad_scale, found_inf);
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
    std::vector<Item> items;
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
        const auto moments = p.options().dtype(moment_dtype(options, p.scalar_type()));
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
      const auto rule = effective_rule(options, p.scalar_type());
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
      items.push_back(Item{p, grad, state, model, rule,
                           group_first_index + static_cast<std::uint32_t>(i), g, i});
    }
    run_items(items, options, lr_tensor, grad_scale_, found_inf_);
  }
  return loss;
}

// ---- the list entry point (torch.ops bridge) -------------------------------------------

namespace detail {

void fused_adamw_lists_(const FusedAdamWLists& lists, const FusedAdamWOptions& options,
                        const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  check_options(options);
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
  std::vector<FusedAdamWParamState> states(n);
  std::vector<Item> items;
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
    const auto rule = effective_rule(options, target.scalar_type());
    if (rule == LowPrecisionUpdate::kKahan) {
      TORCH_CHECK_VALUE(!lists.kahan_comps.empty(),
                        "fused_adamw_: low_precision_update=kahan "
                        "needs kahan_comps for the bfloat16/float16 params; none were given");
      state.kahan_comp(lists.kahan_comps[i]);
    }
    TORCH_CHECK_VALUE(lists.indices[i] >= 0 && lists.indices[i] <= UINT32_MAX,
                      "fused_adamw_: param_indices[", i, "] must be in [0, 2^32); got ",
                      lists.indices[i]);
    items.push_back(Item{target, has_master ? grad.to(target.scalar_type()) : grad, &state,
                         has_master ? model : at::Tensor(), rule,
                         static_cast<std::uint32_t>(lists.indices[i]), 0, i});
  }
  run_items(items, options, at::Tensor(), grad_scale, found_inf);
}

}  // namespace detail

// ---- CPU kernel choice ----------------------------------------------------------------

namespace detail {
namespace {

using CpuKernel = void (*)(const AdamWCpuArgs&);

struct CpuChoice {
  CpuKernel kernel;
  const char* name;
};

CpuChoice choose_cpu_kernel() {
  // ATen's own choice (cpuinfo, capped by the ATEN_CPU_CAPABILITY environment variable), so
  // that the fused step and ATen's kernels run the same instruction set.
  const std::string capability = at::get_cpu_capability();
  if (capability == "AVX512") return {&AVX512::fused_adamw_cpu, "AVX512"};
  if (capability == "AVX2") return {&AVX2::fused_adamw_cpu, "AVX2"};
  return {&DEFAULT::fused_adamw_cpu, "DEFAULT"};
}

const CpuChoice& cpu_choice() {
  static const CpuChoice choice = choose_cpu_kernel();
  return choice;
}

}  // namespace

void fused_adamw_cpu(const AdamWCpuArgs& args) { cpu_choice().kernel(args); }

const char* fused_adamw_cpu_capability() { return cpu_choice().name; }

}  // namespace detail
}  // namespace mantissa::optim
