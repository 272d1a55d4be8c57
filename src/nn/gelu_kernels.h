#pragma once
// The CPU kernels behind mantissa::nn::gelu (its tanh form). Internal: included by src/nn/gelu*.cpp
// and the tests. Compiled once per instruction set (gelu_cpu_{default,avx2,avx512}.cpp, each in its
// own CPU_CAPABILITY namespace, as ATen's kernels are) and chosen at run time by gelu.cpp.
//
// The forward writes GELU(x) (tanh approximation) and dGELU/dx (float32) in one pass; the backward
// multiplies the incoming gradient by that derivative. Both follow ATen's own CPU kernels operation
// by operation (GeluKernelImpl and GeluBackwardKernelImpl in ATen/native/cpu/Activation.cpp, the
// forward's formulas in ATen/native/cpu/Gelu.h), including which elements ATen computes with
// its vector code and which with its scalar code (the elements past the last whole block of
// each thread's range), so output and gradient come out bit for bit as ATen's.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/TensorIterator.h>

namespace mantissa::nn::detail {

/// [begin, end) element ranges.
using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

/// Storage dtypes the kernels handle.
enum class GeluDtype : std::int8_t { kFloat, kBFloat16, kHalf };

/// One forward call: `numel` contiguous elements.
struct GeluForwardArgs {
  GeluDtype dtype;
  const void* input;
  void* output;       // same dtype as input
  float* derivative;  // dGELU/dx at each input element
  std::int64_t numel;
  /// The ranges ATen's forward splits the elements into (`parallel_for_ranges` with its grain
  /// and thread count). Each is computed as ATen computes a range, vector code and then a
  /// scalar tail, whether the ranges run on several threads or, in a build without OpenMP, on
  /// one.
  const Ranges& output_ranges;
  /// Where ATen's backward would compute with its scalar code: the tail of each of its thread
  /// ranges (see `scalar_tails`). The derivative there is written by the scalar formula.
  const Ranges& derivative_scalar_ranges;
};

/// One backward call: grad_input = grad_output * derivative, `numel` contiguous elements.
struct GeluBackwardArgs {
  GeluDtype dtype;
  const void* grad_output;
  const float* derivative;
  void* grad_input;
  std::int64_t numel;
};

/// The [begin, end) ranges at::parallel_for(0, numel, grain, f) hands to its threads when
/// `threads` threads are available outside a parallel region (ATen/Parallel-inl.h and
/// ATen/ParallelOpenMP.h): one range when numel <= grain or threads <= 1, else
/// min(threads, ceil(numel / grain)) ranges of ceil(numel / that) elements, the last shorter.
/// TensorIterator::for_each splits the same way.
inline Ranges parallel_for_ranges(std::int64_t numel, std::int64_t grain, std::int64_t threads) {
  Ranges ranges;
  if (numel <= 0) return ranges;
  if (numel <= grain || threads <= 1 || numel <= 1) {
    ranges.emplace_back(0, numel);
    return ranges;
  }
  const auto divup = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  const std::int64_t tasks = grain > 0 ? std::min(threads, divup(numel, grain)) : threads;
  const std::int64_t chunk = divup(numel, tasks);
  for (std::int64_t begin = 0; begin < numel; begin += chunk) {
    ranges.emplace_back(begin, std::min(numel, begin + chunk));
  }
  return ranges;
}

/// The elements ATen's vectorized element-wise loop (cpu_kernel_vec over contiguous data)
/// leaves to its scalar code: in each range, those past the last whole block of `block`
/// elements (two Vectorized<T> of the kernel's dtype).
inline Ranges scalar_tails(const Ranges& ranges, std::int64_t block) {
  Ranges tails;
  for (const auto& [begin, end] : ranges) {
    const std::int64_t vector_end = begin + (end - begin) / block * block;
    if (vector_end < end) tails.emplace_back(vector_end, end);
  }
  return tails;
}

/// The grain ATen's GELU forward picks: numel / threads above 16384 elements, else
/// at::internal::GRAIN_SIZE (the grain of its element-wise kernels, the backward's too).
inline std::int64_t aten_gelu_forward_grain(std::int64_t numel, std::int64_t threads) {
  return numel > 16384 ? numel / std::max<std::int64_t>(threads, 1) : at::internal::GRAIN_SIZE;
}

// One definition per instruction set. `gelu_block` is the block of the vectorized loop for a
// dtype in that build (2 * Vectorized<T>::size()).
namespace DEFAULT {
void gelu_forward_cpu(const GeluForwardArgs& args);
void gelu_backward_cpu(const GeluBackwardArgs& args);
std::int64_t gelu_block(GeluDtype dtype);
}  // namespace DEFAULT
namespace AVX2 {
void gelu_forward_cpu(const GeluForwardArgs& args);
void gelu_backward_cpu(const GeluBackwardArgs& args);
std::int64_t gelu_block(GeluDtype dtype);
}  // namespace AVX2
namespace AVX512 {
void gelu_forward_cpu(const GeluForwardArgs& args);
void gelu_backward_cpu(const GeluBackwardArgs& args);
std::int64_t gelu_block(GeluDtype dtype);
}  // namespace AVX512

}  // namespace mantissa::nn::detail
