// The fused AdamW CPU kernel built for AVX2 (CPU_CAPABILITY=AVX2 and -m flags set by
// cmake/MantissaSources.cmake); fused_adamw_dispatch.cpp calls it only when
// at::get_cpu_capability() says this CPU (and ATEN_CPU_CAPABILITY) allow AVX2. Elsewhere than
// x86-64 it forwards to the portable build.
#if defined(__x86_64__) || defined(_M_X64)
#include "optim/fused_adamw_cpu_kernel.inc"
#else
#include "optim/fused_adamw_kernels.h"
namespace mantissa::optim::detail::AVX2 {
void fused_adamw_cpu(const AdamWCpuArgs& args) { DEFAULT::fused_adamw_cpu(args); }
std::int64_t fused_adamw_cpu_calls() { return 0; }
}  // namespace mantissa::optim::detail::AVX2
#endif
