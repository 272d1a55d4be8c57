// The fused AdamW CPU kernel for any CPU (CPU_CAPABILITY=DEFAULT: ATen's portable
// Vectorized<float>, which the compiler vectorizes for the baseline instruction set).
// Flags: cmake/MantissaSources.cmake.
#include "optim/fused_adamw_cpu_kernel.inc"
