// The GELU CPU kernels for any CPU (CPU_CAPABILITY=DEFAULT: ATen's portable Vectorized<float>,
// which the compiler vectorizes for the baseline instruction set). Flags: cmake/MantissaCpuKernels.cmake.
#include "nn/gelu_cpu_kernel.inc"
