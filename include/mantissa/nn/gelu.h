#pragma once
// GELU whose backward reuses the derivative the forward computed.

#include <string_view>

#include <ATen/core/Tensor.h>

namespace mantissa::nn {

/// GELU of each element: x Phi(x) with `approximate` = "none" (the exact form, with erf), or
/// GPT-2's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) with "tanh".
/// Python: `torch.nn.functional.gelu(input, approximate=approximate)`.
///
/// The tanh form on the CPU, for a contiguous float32, bfloat16 or float16 input that needs a
/// gradient: one pass computes the output and dGELU/dx together, and the backward only
/// multiplies the incoming gradient by that derivative, where ATen's backward computes tanh
/// once more from the saved input. Output and gradient equal at::gelu's and its backward's bit
/// for bit: the kernels run ATen's operations in ATen's order, vector and scalar code where
/// ATen runs each. That holds when the incoming gradient is contiguous (or a broadcast scalar,
/// as from `sum()`) and the backward runs with the thread count the forward saw; otherwise
/// ATen's backward splits its work differently (its scalar code calls the C library's tanhf
/// where the vector code calls SLEEF's), and elements may differ in their last bits (float32:
/// within about 1e-6 relative).
/// Memory: the derivative is kept in float32 in place of the input, so for a bfloat16/float16
/// input the saved tensor is twice the input's size (the same size for float32); it is freed
/// once the backward has used it.
///
/// Anything else is at::gelu itself: the exact form (for float32 and bfloat16 ATen runs
/// oneDNN's kernel, whose bits no kernel of ours could promise), CUDA, other dtypes, a strided
/// view, no gradient needed, and CPUs where ATen runs kernels other than its x86 DEFAULT, AVX2
/// or AVX512 builds (ARM's SVE). A double backward (create_graph) through the CPU path raises
/// c10::NotImplementedError; use at::gelu there. An `approximate` other than "none" or "tanh"
/// raises c10::ValueError naming it. Never syncs with a device.
at::Tensor gelu(const at::Tensor& input, std::string_view approximate = "none");

}  // namespace mantissa::nn
