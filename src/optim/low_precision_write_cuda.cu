// The low-precision rules' write on the GPU: the fp32 result another optimizer (Adafactor,
// AdamW8bit, Muon) computed, written into a bf16/fp16 parameter by Kahan compensation or
// stochastic rounding with low_precision_rounding.h's integer code, so that each element gets
// the host's bits (and FusedAdamW's). One thread per element in a grid-stride loop; the four
// elements that share a Philox draw each compute it (as the host does).
#include "optim/low_precision_write_cuda.h"

#include <algorithm>
#include <cstdint>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "optim/low_precision_rounding.h"

namespace mantissa::optim::detail::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65535;

template <bool kBf16>
__global__ void __launch_bounds__(kThreads)
    write_kernel(std::uint16_t* param, const float* target, std::uint16_t* comp, bool kahan,
                 std::uint64_t seed, std::uint32_t tensor, std::uint32_t step, std::int64_t numel) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < numel; i += stride) {
    if (kahan) {
      std::uint16_t c = comp[i];
      param[i] = kahan_write<kBf16>(widen<kBf16>(param[i]), target[i], &c);
      comp[i] = c;
    } else {
      param[i] = round_stochastic<kBf16>(
          target[i], rounding_bits(seed, tensor, step, static_cast<std::uint64_t>(i)));
    }
  }
}

}  // namespace

void write_low_precision(const at::Tensor& param, const at::Tensor& target, bool kahan,
                         const at::Tensor& comp, const RoundingKey& key) {
  const auto numel = param.numel();
  if (numel == 0) return;
  const c10::cuda::CUDAGuard guard(param.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  const auto blocks =
      static_cast<unsigned>(std::min<std::int64_t>((numel + kThreads - 1) / kThreads, kMaxBlocks));
  auto* p = static_cast<std::uint16_t*>(param.data_ptr());
  const auto* t = target.data_ptr<float>();
  auto* c = kahan ? static_cast<std::uint16_t*>(comp.data_ptr()) : nullptr;
  if (param.scalar_type() == at::kBFloat16) {
    write_kernel<true><<<blocks, kThreads, 0, stream>>>(p, t, c, kahan, key.seed, key.tensor,
                                                        key.step, numel);
  } else {
    write_kernel<false><<<blocks, kThreads, 0, stream>>>(p, t, c, kahan, key.seed, key.tensor,
                                                         key.step, numel);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace mantissa::optim::detail::cuda
