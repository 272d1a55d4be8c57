#pragma once
// Which of our per-instruction-set CPU kernels to run (cmake/MantissaCpuKernels.cmake builds each
// kernel once per level: DEFAULT, AVX2, AVX512). One answer for all of them: ATen's.

#include <string>

#include <ATen/Context.h>

namespace mantissa::detail {

/// The instruction-set levels our CPU kernels are built for, plus `kOther` for a level ATen has
/// and we do not (its SVE kernels on ARM, say).
enum class CpuCapability { kDefault, kAvx2, kAvx512, kOther };

/// ATen's own choice of instruction set (`at::get_cpu_capability()`: cpuinfo, capped by the
/// ATEN_CPU_CAPABILITY environment variable), so that our vector code runs the level ATen's
/// kernels run. Reads the CPU's features on every call: callers choose once and keep the choice.
/// Host only.
inline CpuCapability aten_cpu_capability() {
  const std::string capability = at::get_cpu_capability();
  if (capability == "AVX512") return CpuCapability::kAvx512;
  if (capability == "AVX2") return CpuCapability::kAvx2;
  if (capability == "DEFAULT") return CpuCapability::kDefault;
  return CpuCapability::kOther;
}

}  // namespace mantissa::detail
