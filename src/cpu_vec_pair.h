#pragma once
// Two Vectorized<float> loaded from, or stored to, float, bfloat16 or float16 memory: the inner
// step of the CPU kernels built once per instruction set (cmake/MantissaCpuKernels.cmake), which
// compute in float whatever the storage dtype. Like ATen's Vectorized<>, these live in an inline
// namespace named by CPU_CAPABILITY, so each build's copy is its own. Include only from those
// kernel files.

#include <type_traits>

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

namespace mantissa::cpu_vec {
inline namespace CPU_CAPABILITY {

using VecF = at::vec::Vectorized<float>;

/// src[0, 2 * VecF::size()) as two float vectors; bfloat16 and float16 are widened exactly.
template <typename T>
inline void load2(const T* src, VecF& a, VecF& b) {
  if constexpr (std::is_same_v<T, float>) {
    a = VecF::loadu(src);
    b = VecF::loadu(src + VecF::size());
  } else {
    at::vec::load_to_float<T>(src, a, b);
  }
}

/// a and b into dst[0, 2 * VecF::size()), rounded to T to nearest (even) for bfloat16/float16.
template <typename T>
inline void store2(T* dst, const VecF& a, const VecF& b) {
  if constexpr (std::is_same_v<T, float>) {
    a.store(dst);
    b.store(dst + VecF::size());
  } else {
    at::vec::convert_from_float<T>(a, b).store(dst);
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace mantissa::cpu_vec
