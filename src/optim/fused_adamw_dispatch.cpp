// FusedAdamW's dispatch: parameters grouped into buckets of alike tensors, one kernel call per
// bucket (the CPU kernel of ATen's instruction set, or the CUDA kernel), and an ATen fallback for
// what no kernel covers.
#include "optim/fused_adamw_dispatch.h"

#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>

#include "cpu_capability.h"
#include "optim/fused_adamw_kernels.h"
#include "optim/low_precision_rounding.h"

namespace mantissa::optim::detail {
namespace {

bool kernel_dtype(c10::ScalarType dtype, KernelDtype* out) {
  switch (dtype) {
    case at::kFloat:
      *out = KernelDtype::kFloat;
      return true;
    case at::kBFloat16:
      *out = KernelDtype::kBFloat16;
      return true;
    case at::kHalf:
      *out = KernelDtype::kHalf;
      return true;
    default:
      return false;
  }
}

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

bool kernel_can_run(const FusedAdamWItem& item, bool amsgrad) {
  const auto& p = item.param;
  KernelDtype dtype;
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
  return exact_bias_correction(beta, static_cast<std::uint32_t>(step));
}

AdamWScalars group_scalars(const FusedAdamWOptions& o, double lr) {
  const auto [beta1, beta2] = o.betas();
  AdamWScalars s{};
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
void adamw_fallback(const FusedAdamWItem& item, const FusedAdamWOptions& o,
                    const at::Tensor& lr_tensor, const at::Tensor& grad_scale,
                    const at::Tensor& found_inf) {
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

void run_cpu(const BucketKey& key, std::vector<FusedAdamWItem>& items, const FusedAdamWOptions& o,
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
  std::vector<AdamWCpuTensor> tensors;
  tensors.reserve(items.size());
  for (auto& item : items) {
    auto& s = *item.state;
    float* step = s.step().data_ptr<float>();
    *step += 1;
    const double bias_correction1 = bias_correction(beta1, *step, key.rule);
    const double bias_correction2 = bias_correction(beta2, *step, key.rule);
    AdamWCpuTensor t{};
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
  AdamWCpuArgs args{};
  TORCH_INTERNAL_ASSERT(kernel_dtype(key.param_dtype, &args.param_dtype));
  args.model_dtype = KernelDtype::kNone;
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
  fused_adamw_cpu(args);
}

#ifdef MANTISSA_WITH_CUDA
void run_cuda(const BucketKey& key, std::vector<FusedAdamWItem>& items, const FusedAdamWOptions& o,
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
  cuda::AdamWCudaHyper hyper{o.lr(), beta1, beta2, o.weight_decay(), group_scalars(o, o.lr())};
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
    cuda::fused_adamw_low_precision(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                    kahan_comps, rng_tensors, steps, hyper, o.amsgrad(), key.rule,
                                    o.stochastic_rounding_seed(), on_device(lr_tensor, at::kDouble),
                                    on_device(grad_scale, at::kFloat),
                                    on_device(found_inf, at::kFloat));
    return;
  }
  cuda::fused_adamw(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, models, steps, hyper,
                    o.amsgrad(), on_device(lr_tensor, at::kDouble),
                    on_device(grad_scale, at::kFloat), on_device(found_inf, at::kFloat));
}
#endif

}  // namespace

void run_fused_adamw_items(std::vector<FusedAdamWItem>& items, const FusedAdamWOptions& options,
                           const at::Tensor& lr_tensor, const at::Tensor& grad_scale,
                           const at::Tensor& found_inf) {
  std::map<BucketKey, std::vector<FusedAdamWItem>> buckets;
  std::vector<FusedAdamWItem> fallback;
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

// ---- CPU kernel choice ----------------------------------------------------------------

namespace {

using CpuKernel = void (*)(const AdamWCpuArgs&);

struct CpuChoice {
  CpuKernel kernel;
  const char* name;
};

// The kernel of ATen's instruction set, so that the fused step and ATen's kernels run the same
// vector code; the portable build where ATen runs a level we have no build for.
CpuChoice choose_cpu_kernel() {
  switch (mantissa::detail::aten_cpu_capability()) {
    case mantissa::detail::CpuCapability::kAvx512:
      return {&AVX512::fused_adamw_cpu, "AVX512"};
    case mantissa::detail::CpuCapability::kAvx2:
      return {&AVX2::fused_adamw_cpu, "AVX2"};
    case mantissa::detail::CpuCapability::kDefault:
    case mantissa::detail::CpuCapability::kOther:
      break;
  }
  return {&DEFAULT::fused_adamw_cpu, "DEFAULT"};
}

const CpuChoice& cpu_choice() {
  static const CpuChoice choice = choose_cpu_kernel();
  return choice;
}

}  // namespace

void fused_adamw_cpu(const AdamWCpuArgs& args) { cpu_choice().kernel(args); }

const char* fused_adamw_cpu_capability() { return cpu_choice().name; }

}  // namespace mantissa::optim::detail
