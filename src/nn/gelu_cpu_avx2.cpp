// The GELU CPU kernels built for AVX2 (CPU_CAPABILITY=AVX2 and -m flags set by
// cmake/MantissaCpuKernels.cmake); gelu.cpp calls them only when at::get_cpu_capability() says
// this CPU (and ATEN_CPU_CAPABILITY) allow AVX2. Elsewhere than x86-64 they forward to the
// portable build.
#if defined(__x86_64__) || defined(_M_X64)
#include "nn/gelu_cpu_kernel.inc"
#else
#include "nn/gelu_kernels.h"
namespace mantissa::nn::detail::AVX2 {
void gelu_forward_cpu(const GeluForwardArgs& args) { DEFAULT::gelu_forward_cpu(args); }
void gelu_backward_cpu(const GeluBackwardArgs& args) { DEFAULT::gelu_backward_cpu(args); }
std::int64_t gelu_block(GeluDtype dtype) { return DEFAULT::gelu_block(dtype); }
}  // namespace mantissa::nn::detail::AVX2
#endif
