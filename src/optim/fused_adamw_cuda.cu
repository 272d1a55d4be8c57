// Fused AdamW on CUDA: one multi-tensor kernel launch updates many tensors (each block takes
// one chunk of one tensor, as ATen's multi_tensor_apply), reading the loss scale and the
// found-inf flag from device memory. When found_inf != 0 every block returns before writing,
// and the step counters are left as they were: no host sync anywhere.
//
// The arithmetic is the CPU kernel's (fused_adamw_cpu_kernel.inc), written with explicit
// round-to-nearest intrinsics so that nvcc's FMA contraction cannot change it: each fp32
// multiply, add, divide and square root rounds once, and only the two fmas ATen's own AVX2/AVX512
// kernels use (add_ with alpha, and addcmul) are fused.
//
// bf16/fp16 params under Kahan compensation or stochastic rounding take a second kernel whose
// results equal the CPU kernel's bit for bit: nothing is fused, the bias corrections come from
// pow_by_squaring, and the write is low_precision_rounding.h's integer code. Each thread takes
// four neighbouring elements, the four that share one Philox draw.
#include <cstdint>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "optim/fused_adamw_cuda_launch.cuh"
#include "optim/fused_adamw_kernels.h"
#include "optim/low_precision_rounding.h"

namespace mantissa::optim::detail::cuda {
namespace {

struct Hyper {
  double lr, beta1, beta2, weight_decay;
  const double* lr_on_device;  // capturable: read the rate here (and derive decay from it)
  float decay, beta1_f, one_minus_beta1, beta2_f, one_minus_beta2, eps;
  bool maximize;
};

template <typename T>
__device__ __forceinline__ float load_float(const void* base, std::int64_t i) {
  return static_cast<float>(static_cast<const T*>(base)[i]);
}

template <typename T>
__device__ __forceinline__ void store_float(void* base, std::int64_t i, float value) {
  static_cast<T*>(base)[i] = static_cast<T>(value);  // round to nearest even
}

template <typename P, typename M, bool kModel, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads)
    fused_adamw_kernel(TensorListMeta meta, Hyper h, const float* grad_scale,
                       const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.f) return;
  const int t = meta.block_to_tensor[blockIdx.x];
  const std::int64_t begin =
      static_cast<std::int64_t>(meta.block_to_chunk[blockIdx.x]) * kChunkSize;
  const std::int64_t end = min(meta.numel[t], begin + kChunkSize);

  // The step is incremented by a later launch; this one uses its value + 1, as AdamW does
  // after `state.step(state.step() + 1)`.
  const double step = static_cast<double>(*meta.step[t]) + 1.0;
  const double bias_correction1 = 1.0 - pow(h.beta1, step);
  const double bias_correction2 = 1.0 - pow(h.beta2, step);
  // The host's double arithmetic, rounded the same way: float(1 - lr * wd), -(lr / bc1).
  const double lr = h.lr_on_device != nullptr ? *h.lr_on_device : h.lr;
  const float decay = h.lr_on_device != nullptr
                          ? static_cast<float>(__dsub_rn(1.0, __dmul_rn(lr, h.weight_decay)))
                          : h.decay;
  const float neg_step_size = static_cast<float>(-__ddiv_rn(lr, bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(sqrt(bias_correction2));
  const bool unscale = grad_scale != nullptr;
  const float inv_scale =
      unscale ? static_cast<float>(1.0 / static_cast<double>(*grad_scale)) : 1.f;

  void* param = meta.param[t];
  const void* grad = meta.grad[t];
  void* exp_avg = meta.exp_avg[t];
  void* exp_avg_sq = meta.exp_avg_sq[t];
  void* max_exp_avg_sq = meta.max_exp_avg_sq[t];
  void* model = meta.model[t];

  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float g = load_float<P>(grad, i);
    if (unscale) g = __fmul_rn(g, inv_scale);
    if (h.maximize) g = -g;
    float p = __fmul_rn(load_float<P>(param, i), decay);
    const float m = __fmaf_rn(g, h.one_minus_beta1, __fmul_rn(load_float<P>(exp_avg, i), h.beta1));
    const float v = __fmaf_rn(__fmul_rn(h.one_minus_beta2, g), g,
                              __fmul_rn(load_float<P>(exp_avg_sq, i), h.beta2_f));
    float second = v;
    if constexpr (kAmsgrad) {
      const float old = load_float<P>(max_exp_avg_sq, i);
      second = isnan(old) ? old : (isnan(v) ? v : fmaxf(old, v));  // at::maximum keeps nan
      store_float<P>(max_exp_avg_sq, i, second);
    }
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(second), bias_correction2_sqrt), h.eps);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(neg_step_size, m), denom));
    store_float<P>(param, i, p);
    store_float<P>(exp_avg, i, m);
    store_float<P>(exp_avg_sq, i, v);
    if constexpr (kModel) store_float<M>(model, i, p);
  }
}


// ---- bf16/fp16 params under a low-precision rule -----------------------------------------

struct LowPrecisionMeta {
  void* param[kMaxTensors];
  const void* grad[kMaxTensors];
  void* exp_avg[kMaxTensors];
  void* exp_avg_sq[kMaxTensors];
  void* max_exp_avg_sq[kMaxTensors];
  void* kahan_comp[kMaxTensors];
  const float* step[kMaxTensors];
  std::int64_t numel[kMaxTensors];
  std::uint32_t rng_tensor[kMaxTensors];
  unsigned char block_to_tensor[kMaxBlocks];
  int block_to_chunk[kMaxBlocks];
};
static_assert(sizeof(LowPrecisionMeta) + sizeof(Hyper) + 32 <= 4000, "kernel arguments too large");

// P: the param dtype (bf16/fp16), S: the moments' (P or float). kNearest here only serves fp32
// moments, with the fused arithmetic of the kernel above.
template <typename P, typename S, bool kAmsgrad, LowPrecisionUpdate R>
__global__ void __launch_bounds__(kThreads)
    fused_adamw_low_precision_kernel(LowPrecisionMeta meta, Hyper h, std::uint64_t seed,
                                     const float* grad_scale, const float* found_inf) {
  constexpr bool kBf16 = std::is_same_v<P, c10::BFloat16>;
  constexpr bool kExact = R != LowPrecisionUpdate::kNearest;
  if (found_inf != nullptr && *found_inf != 0.f) return;
  const int t = meta.block_to_tensor[blockIdx.x];
  const std::int64_t begin =
      static_cast<std::int64_t>(meta.block_to_chunk[blockIdx.x]) * kChunkSize;
  const std::int64_t end = min(meta.numel[t], begin + kChunkSize);

  const double step = static_cast<double>(*meta.step[t]) + 1.0;
  const auto step_count = static_cast<std::uint32_t>(step);
  const double bias_correction1 =
      kExact ? exact_bias_correction(h.beta1, step_count) : 1.0 - pow(h.beta1, step);
  const double bias_correction2 =
      kExact ? exact_bias_correction(h.beta2, step_count) : 1.0 - pow(h.beta2, step);
  const double lr = h.lr_on_device != nullptr ? *h.lr_on_device : h.lr;
  const float decay = h.lr_on_device != nullptr
                          ? static_cast<float>(__dsub_rn(1.0, __dmul_rn(lr, h.weight_decay)))
                          : h.decay;
  const float neg_step_size = static_cast<float>(-__ddiv_rn(lr, bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(__dsqrt_rn(bias_correction2));
  const bool unscale = grad_scale != nullptr;
  const float inv_scale =
      unscale ? static_cast<float>(__drcp_rn(static_cast<double>(*grad_scale))) : 1.f;

  void* param = meta.param[t];
  const void* grad = meta.grad[t];
  void* exp_avg = meta.exp_avg[t];
  void* exp_avg_sq = meta.exp_avg_sq[t];
  void* max_exp_avg_sq = meta.max_exp_avg_sq[t];
  auto* comp = static_cast<std::uint16_t*>(meta.kahan_comp[t]);
  auto* param_bits = static_cast<std::uint16_t*>(param);

  // begin is a multiple of 4 (kChunkSize is), so each quad is one Philox counter.
  for (std::int64_t quad = begin + 4 * static_cast<std::int64_t>(threadIdx.x); quad < end;
       quad += 4 * static_cast<std::int64_t>(blockDim.x)) {
    Philox4 random{};
    if constexpr (R == LowPrecisionUpdate::kStochasticRounding) {
      const auto counter = static_cast<std::uint64_t>(quad) >> 2;
      random =
          philox4x32_10(static_cast<std::uint32_t>(counter),
                        static_cast<std::uint32_t>(counter >> 32), meta.rng_tensor[t], step_count,
                        static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const std::int64_t i = quad + k;
      if (i >= end) break;
      float g = load_float<P>(grad, i);
      if (unscale) g = __fmul_rn(g, inv_scale);
      if (h.maximize) g = -g;
      const float w = load_float<P>(param, i);
      float p = __fmul_rn(w, decay);
      const float m_old = __fmul_rn(load_float<S>(exp_avg, i), h.beta1_f);
      const float v_old = __fmul_rn(load_float<S>(exp_avg_sq, i), h.beta2_f);
      float m, v;
      if constexpr (kExact) {
        m = __fadd_rn(__fmul_rn(g, h.one_minus_beta1), m_old);
        v = __fadd_rn(__fmul_rn(__fmul_rn(h.one_minus_beta2, g), g), v_old);
      } else {
        m = __fmaf_rn(g, h.one_minus_beta1, m_old);
        v = __fmaf_rn(__fmul_rn(h.one_minus_beta2, g), g, v_old);
      }
      float second = v;
      if constexpr (kAmsgrad) {
        const float old = load_float<S>(max_exp_avg_sq, i);
        second = isnan(old) ? old : (isnan(v) ? v : fmaxf(old, v));  // at::maximum keeps nan
        store_float<S>(max_exp_avg_sq, i, second);
      }
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(second), bias_correction2_sqrt), h.eps);
      p = __fadd_rn(p, __fdiv_rn(__fmul_rn(neg_step_size, m), denom));
      if constexpr (R == LowPrecisionUpdate::kKahan) {
        std::uint16_t c = comp[i];
        param_bits[i] = kahan_write<kBf16>(w, p, &c);
        comp[i] = c;
      } else if constexpr (R == LowPrecisionUpdate::kStochasticRounding) {
        param_bits[i] = round_stochastic<kBf16>(p, random.word[k]);
      } else {
        store_float<P>(param, i, p);
      }
      store_float<S>(exp_avg, i, m);
      store_float<S>(exp_avg_sq, i, v);
    }
  }
}

template <typename P, typename M, bool kModel, bool kAmsgrad>
void launch_all(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                const std::vector<at::Tensor>& max_exp_avg_sqs,
                const std::vector<at::Tensor>& models, const std::vector<at::Tensor>& steps,
                const Hyper& h, const float* grad_scale, const float* found_inf) {
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto set_slot = [&](TensorListMeta& meta, int slot, std::size_t i) {
    meta.param[slot] = params[i].data_ptr();
    meta.grad[slot] = grads[i].const_data_ptr();
    meta.exp_avg[slot] = exp_avgs[i].data_ptr();
    meta.exp_avg_sq[slot] = exp_avg_sqs[i].data_ptr();
    meta.max_exp_avg_sq[slot] = kAmsgrad ? max_exp_avg_sqs[i].data_ptr() : nullptr;
    meta.model[slot] = kModel ? models[i].data_ptr() : nullptr;
    meta.step[slot] = steps[i].const_data_ptr<float>();
  };
  auto launch = [&](const TensorListMeta& meta, int blocks) {
    fused_adamw_kernel<P, M, kModel, kAmsgrad>
        <<<blocks, kThreads, 0, stream>>>(meta, h, grad_scale, found_inf);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  const auto nonempty = multi_tensor_apply<TensorListMeta>(params, set_slot, launch);
  // Only now, after every launch that reads them, the steps move on (unless found_inf).
  increment_steps(steps, nonempty, found_inf, stream);
}

template <typename P, typename M, bool kModel>
void dispatch_amsgrad(bool amsgrad, const std::vector<at::Tensor>& params,
                      const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& exp_avgs,
                      const std::vector<at::Tensor>& exp_avg_sqs,
                      const std::vector<at::Tensor>& max_exp_avg_sqs,
                      const std::vector<at::Tensor>& models, const std::vector<at::Tensor>& steps,
                      const Hyper& h, const float* grad_scale, const float* found_inf) {
  if (amsgrad) {
    launch_all<P, M, kModel, true>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, models,
                                   steps, h, grad_scale, found_inf);
  } else {
    launch_all<P, M, kModel, false>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, models,
                                    steps, h, grad_scale, found_inf);
  }
}

template <typename P, typename S, bool kAmsgrad, LowPrecisionUpdate R>
void launch_low_precision(
    const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
    const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
    const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& kahan_comps,
    const std::vector<std::uint32_t>& rng_tensors, const std::vector<at::Tensor>& steps,
    const Hyper& h, std::uint64_t seed, const float* grad_scale, const float* found_inf) {
  constexpr bool kComp = R == LowPrecisionUpdate::kKahan;
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto set_slot = [&](LowPrecisionMeta& meta, int slot, std::size_t i) {
    meta.param[slot] = params[i].data_ptr();
    meta.grad[slot] = grads[i].const_data_ptr();
    meta.exp_avg[slot] = exp_avgs[i].data_ptr();
    meta.exp_avg_sq[slot] = exp_avg_sqs[i].data_ptr();
    meta.max_exp_avg_sq[slot] = kAmsgrad ? max_exp_avg_sqs[i].data_ptr() : nullptr;
    meta.kahan_comp[slot] = kComp ? kahan_comps[i].data_ptr() : nullptr;
    meta.step[slot] = steps[i].const_data_ptr<float>();
    meta.rng_tensor[slot] = rng_tensors[i];
  };
  auto launch = [&](const LowPrecisionMeta& meta, int blocks) {
    fused_adamw_low_precision_kernel<P, S, kAmsgrad, R>
        <<<blocks, kThreads, 0, stream>>>(meta, h, seed, grad_scale, found_inf);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  const auto nonempty = multi_tensor_apply<LowPrecisionMeta>(params, set_slot, launch);
  increment_steps(steps, nonempty, found_inf, stream);
}

template <typename P, typename S, LowPrecisionUpdate R>
void low_precision_amsgrad(
    bool amsgrad, const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
    const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
    const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& kahan_comps,
    const std::vector<std::uint32_t>& rng_tensors, const std::vector<at::Tensor>& steps,
    const Hyper& h, std::uint64_t seed, const float* grad_scale, const float* found_inf) {
  if (amsgrad) {
    launch_low_precision<P, S, true, R>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                        kahan_comps, rng_tensors, steps, h, seed, grad_scale,
                                        found_inf);
  } else {
    launch_low_precision<P, S, false, R>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                         kahan_comps, rng_tensors, steps, h, seed, grad_scale,
                                         found_inf);
  }
}

Hyper make_hyper(const AdamWCudaHyper& hyper, const at::Tensor& lr) {
  Hyper h{};
  h.lr = hyper.lr;
  h.beta1 = hyper.beta1;
  h.beta2 = hyper.beta2;
  h.weight_decay = hyper.weight_decay;
  TORCH_INTERNAL_ASSERT(!lr.defined() ||
                        (lr.scalar_type() == at::kDouble && lr.is_cuda() && lr.numel() == 1));
  h.lr_on_device = lr.defined() ? lr.const_data_ptr<double>() : nullptr;
  h.decay = hyper.scalars.decay;
  h.beta1_f = hyper.scalars.beta1;
  h.one_minus_beta1 = hyper.scalars.one_minus_beta1;
  h.beta2_f = hyper.scalars.beta2;
  h.one_minus_beta2 = hyper.scalars.one_minus_beta2;
  h.eps = hyper.scalars.eps;
  h.maximize = hyper.scalars.maximize;
  return h;
}

}  // namespace

void fused_adamw_low_precision(
    const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
    const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
    const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& kahan_comps,
    const std::vector<std::uint32_t>& rng_tensors, const std::vector<at::Tensor>& steps,
    const AdamWCudaHyper& hyper, bool amsgrad, LowPrecisionUpdate rule, std::uint64_t seed,
    const at::Tensor& lr, const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  if (params.empty()) return;
  const auto n = params.size();
  TORCH_INTERNAL_ASSERT(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                        steps.size() == n && rng_tensors.size() == n &&
                        (!amsgrad || max_exp_avg_sqs.size() == n) &&
                        (rule != LowPrecisionUpdate::kKahan || kahan_comps.size() == n));
  const c10::cuda::CUDAGuard device_guard(params[0].device());
  const auto dtype = params[0].scalar_type();
  const auto moments = exp_avgs[0].scalar_type();
  TORCH_INTERNAL_ASSERT(dtype == at::kBFloat16 || dtype == at::kHalf);
  TORCH_INTERNAL_ASSERT(moments == dtype || moments == at::kFloat);
  for (std::size_t i = 0; i < n; ++i) {
    TORCH_INTERNAL_ASSERT(params[i].is_cuda() && params[i].device() == params[0].device() &&
                          params[i].scalar_type() == dtype &&
                          exp_avgs[i].scalar_type() == moments &&
                          exp_avg_sqs[i].scalar_type() == moments);
    TORCH_INTERNAL_ASSERT(steps[i].scalar_type() == at::kFloat && steps[i].is_cuda());
    if (rule == LowPrecisionUpdate::kKahan)
      TORCH_INTERNAL_ASSERT(kahan_comps[i].scalar_type() == dtype);
  }
  const Hyper h = make_hyper(hyper, lr);
  const float* scale_ptr = grad_scale.defined() ? grad_scale.const_data_ptr<float>() : nullptr;
  const float* inf_ptr = found_inf.defined() ? found_inf.const_data_ptr<float>() : nullptr;
  using c10::BFloat16;
  using c10::Half;
  using Rule = LowPrecisionUpdate;
#define MANTISSA_LP_CASE(P, S, R)                                                                  \
  return low_precision_amsgrad<P, S, R>(amsgrad, params, grads, exp_avgs, exp_avg_sqs,             \
                                        max_exp_avg_sqs, kahan_comps, rng_tensors, steps, h, seed, \
                                        scale_ptr, inf_ptr)
#define MANTISSA_LP_RULES(P, S)                          \
  switch (rule) {                                        \
    case Rule::kNearest:                                 \
      MANTISSA_LP_CASE(P, S, Rule::kNearest);            \
    case Rule::kKahan:                                   \
      MANTISSA_LP_CASE(P, S, Rule::kKahan);              \
    case Rule::kStochasticRounding:                      \
      MANTISSA_LP_CASE(P, S, Rule::kStochasticRounding); \
  }
  const bool fp32_moments = moments == at::kFloat;
  if (dtype == at::kBFloat16 && fp32_moments) MANTISSA_LP_RULES(BFloat16, float)
  if (dtype == at::kBFloat16 && !fp32_moments) MANTISSA_LP_RULES(BFloat16, BFloat16)
  if (dtype == at::kHalf && fp32_moments) MANTISSA_LP_RULES(Half, float)
  if (dtype == at::kHalf && !fp32_moments) MANTISSA_LP_RULES(Half, Half)
#undef MANTISSA_LP_RULES
#undef MANTISSA_LP_CASE
  TORCH_INTERNAL_ASSERT(false, "fused_adamw_low_precision (CUDA): unsupported dtypes ", dtype,
                        " / ", moments);
}

void fused_adamw(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                 const std::vector<at::Tensor>& exp_avgs,
                 const std::vector<at::Tensor>& exp_avg_sqs,
                 const std::vector<at::Tensor>& max_exp_avg_sqs,
                 const std::vector<at::Tensor>& models, const std::vector<at::Tensor>& steps,
                 const AdamWCudaHyper& hyper, bool amsgrad, const at::Tensor& lr,
                 const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  if (params.empty()) return;
  const auto n = params.size();
  TORCH_INTERNAL_ASSERT(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                        steps.size() == n && models.size() == n &&
                        (!amsgrad || max_exp_avg_sqs.size() == n));
  const c10::cuda::CUDAGuard device_guard(params[0].device());
  for (std::size_t i = 0; i < n; ++i) {
    TORCH_INTERNAL_ASSERT(params[i].is_cuda() && params[i].device() == params[0].device() &&
                          params[i].scalar_type() == params[0].scalar_type());
    TORCH_INTERNAL_ASSERT(steps[i].scalar_type() == at::kFloat && steps[i].is_cuda());
  }
  const bool with_model = models[0].defined();
  for (const auto& m : models) TORCH_INTERNAL_ASSERT(m.defined() == with_model);

  const Hyper h = make_hyper(hyper, lr);
  const float* scale_ptr = grad_scale.defined() ? grad_scale.const_data_ptr<float>() : nullptr;
  const float* inf_ptr = found_inf.defined() ? found_inf.const_data_ptr<float>() : nullptr;

  const auto dtype = params[0].scalar_type();
  const auto model_dtype = with_model ? models[0].scalar_type() : at::kFloat;
#define MANTISSA_ADAMW_CASE(P, M, MODEL)                                              \
  return dispatch_amsgrad<P, M, MODEL>(amsgrad, params, grads, exp_avgs, exp_avg_sqs, \
                                       max_exp_avg_sqs, models, steps, h, scale_ptr, inf_ptr)
  if (dtype == at::kFloat && !with_model) MANTISSA_ADAMW_CASE(float, float, false);
  if (dtype == at::kFloat && model_dtype == at::kBFloat16)
    MANTISSA_ADAMW_CASE(float, c10::BFloat16, true);
  if (dtype == at::kFloat && model_dtype == at::kHalf) MANTISSA_ADAMW_CASE(float, c10::Half, true);
  if (dtype == at::kBFloat16 && !with_model) MANTISSA_ADAMW_CASE(c10::BFloat16, float, false);
  if (dtype == at::kHalf && !with_model) MANTISSA_ADAMW_CASE(c10::Half, float, false);
#undef MANTISSA_ADAMW_CASE
  TORCH_INTERNAL_ASSERT(false, "fused_adamw (CUDA): unsupported dtypes ", dtype, " / ",
                        model_dtype);
}

}  // namespace mantissa::optim::detail::cuda
