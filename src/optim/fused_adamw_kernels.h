#pragma once
// The kernels behind mantissa::optim::FusedAdamW. Internal: included by src/optim/*.cpp/.cu
// only. The CPU kernel is compiled once per instruction set (fused_adamw_cpu_{default,avx2,
// avx512}.cpp, each with its own CPU_CAPABILITY namespace, as ATen's kernels are) and chosen
// at run time; the CUDA kernel lives in fused_adamw_cuda.cu.
//
// Both compute, per element, exactly the operations of torch::optim::AdamW::step in fp32:
//   g  = float(grad) [* inv_scale] [negated if maximize]
//   p  = float(param) * decay                              decay = float(1 - lr * wd)
//   m  = fma(g, 1 - beta1, float(exp_avg) * beta1)         exp_avg.mul_(b1).add_(g, 1 - b1)
//   v  = fma((1 - beta2) * g, g, float(exp_avg_sq) * beta2)  exp_avg_sq.mul_(b2).addcmul_(g, g, 1 -
//   b2) vm = max(float(max_exp_avg_sq), v)                     amsgrad only d  = sqrt(v or vm) /
//   sqrt(bc2) + eps p  = p + (-(lr / bc1) * m) / d                         p.addcdiv_(m, d, -lr /
//   bc1)
// and store p, m, v (vm) rounded once to their dtype, plus p rounded to the model's dtype.
// The two fmas are where ATen's AVX2/AVX512 kernels fuse (its DEFAULT build does not, nor does
// ours). The one remaining difference from torch::optim::AdamW: ATen's CPU sqrt goes through
// MKL's vectorized sqrt, which is off by one ulp for about one value in six; ours is IEEE's.
//
// bf16/fp16 parameters without masters take one of three writes (LowPrecisionUpdate): nearest
// rounding (the above), Kahan compensation or stochastic rounding (low_precision_rounding.h).
// The latter two promise the same bits from every CPU build and from CUDA, so their AdamW
// arithmetic fuses nothing (the two fmas above become a multiply and an add, on every build)
// and their bias corrections use pow_by_squaring, not pow. Their moments may be kept in fp32.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include <mantissa/optim/low_precision_update.h>

namespace mantissa::optim::detail {

/// Storage dtypes the kernels handle. kNone: no model copy to write.
enum class KernelDtype : std::int8_t { kFloat, kBFloat16, kHalf, kNone };

/// Per-group values, already rounded to fp32 the way ATen rounds a double scalar.
struct AdamWScalars {
  float decay;            // float(1 - lr * weight_decay)
  float beta1;            // float(beta1)
  float one_minus_beta1;  // float(1 - beta1)
  float beta2;
  float one_minus_beta2;
  float eps;
  bool unscale;     // multiply grads by inv_scale
  float inv_scale;  // float(1 / double(scale))
  bool maximize;
};

/// One tensor of the CPU kernel: `numel` elements, laid out alike in every buffer.
struct AdamWCpuTensor {
  void* param;
  const void* grad;  // same dtype as param
  void* exp_avg;     // same dtype as param
  void* exp_avg_sq;
  void* max_exp_avg_sq;  // null unless amsgrad
  void* model;           // null unless the param is an fp32 master linked to a model param
  std::int64_t numel;
  float neg_step_size;          // float(-(lr / bias_correction1)) for this tensor's step
  float bias_correction2_sqrt;  // float(sqrt(bias_correction2))
  void* kahan_comp;             // param dtype; null unless the rule is kKahan
  std::uint32_t rng_tensor;  // stochastic rounding: the tensor's key (its index in the optimizer)
  std::uint32_t rng_step;    // stochastic rounding: the step being taken (1 for the first)
};

struct AdamWCpuArgs {
  KernelDtype param_dtype;
  KernelDtype model_dtype;  // kNone when no tensor has a model copy
  bool amsgrad;
  // bf16/fp16 params without a model copy only (fp32 params ignore both):
  LowPrecisionUpdate rule;  // kNearest unless set
  bool fp32_moments;        // exp_avg, exp_avg_sq, max_exp_avg_sq are fp32, not the param dtype
  std::uint64_t seed;       // stochastic rounding's Philox key
  AdamWScalars scalars;
  const AdamWCpuTensor* tensors;
  std::int64_t num_tensors;
};

// One definition per instruction set; fused_adamw_dispatch.cpp picks one with
// at::get_cpu_capability() (src/cpu_capability.h).
// `fused_adamw_cpu_calls` counts the calls of that build (one relaxed atomic add per call, not
// per element), so a test can tell which kernel a step really ran; 0 for a build that forwards
// to DEFAULT (not x86-64).
namespace DEFAULT {
void fused_adamw_cpu(const AdamWCpuArgs& args);
std::int64_t fused_adamw_cpu_calls();
}  // namespace DEFAULT
namespace AVX2 {
void fused_adamw_cpu(const AdamWCpuArgs& args);
std::int64_t fused_adamw_cpu_calls();
}  // namespace AVX2
namespace AVX512 {
void fused_adamw_cpu(const AdamWCpuArgs& args);
std::int64_t fused_adamw_cpu_calls();
}  // namespace AVX512

/// Runs the CPU kernel built for the best instruction set this CPU and ATen allow.
void fused_adamw_cpu(const AdamWCpuArgs& args);

/// The instruction set `fused_adamw_cpu` uses: "AVX512", "AVX2" or "DEFAULT".
const char* fused_adamw_cpu_capability();

#ifdef MANTISSA_WITH_CUDA
namespace cuda {

/// Per-group values for the CUDA kernel, which computes the bias corrections on the device
/// from each tensor's `step` (read before it is incremented).
struct AdamWCudaHyper {
  double lr;  // ignored when an lr tensor is given
  double beta1;
  double beta2;
  double weight_decay;   // with an lr tensor, the kernel computes decay = float(1 - lr * wd)
  AdamWScalars scalars;  // `unscale` and `inv_scale` are ignored: read from grad_scale
};

/// Multi-tensor fused AdamW on one CUDA device. All lists have the same length (max_exp_avg_sqs
/// empty unless amsgrad, models empty or with undefined entries where no copy is written);
/// params share one dtype, models one dtype. `lr` (0-d fp64 on the device: the capturable
/// form), `grad_scale` and `found_inf` (0-d fp32) may be undefined. Increments every
/// `steps[i]` unless `found_inf` is non-zero. Never syncs.
void fused_adamw(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                 const std::vector<at::Tensor>& exp_avgs,
                 const std::vector<at::Tensor>& exp_avg_sqs,
                 const std::vector<at::Tensor>& max_exp_avg_sqs,
                 const std::vector<at::Tensor>& models, const std::vector<at::Tensor>& steps,
                 const AdamWCudaHyper& hyper, bool amsgrad, const at::Tensor& lr,
                 const at::Tensor& grad_scale, const at::Tensor& found_inf);

/// The same for bf16/fp16 params without model copies under a low-precision rule: moments of
/// the param dtype or fp32 (`exp_avgs[0]`'s dtype), Kahan buffers (empty unless kKahan),
/// stochastic rounding keyed by `seed` and `rng_tensors[i]`. Bitwise equal to the CPU kernel
/// for kKahan and kStochasticRounding. Never syncs.
void fused_adamw_low_precision(
    const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
    const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
    const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& kahan_comps,
    const std::vector<std::uint32_t>& rng_tensors, const std::vector<at::Tensor>& steps,
    const AdamWCudaHyper& hyper, bool amsgrad, LowPrecisionUpdate rule, std::uint64_t seed,
    const at::Tensor& lr, const at::Tensor& grad_scale, const at::Tensor& found_inf);

}  // namespace cuda
#endif

}  // namespace mantissa::optim::detail
