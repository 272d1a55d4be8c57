#include <mantissa/nn/gelu.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include "cpu_capability.h"
#include "nn/gelu_kernels.h"

namespace mantissa::nn {
namespace {

using detail::GeluDtype;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GeluCpuKernels {
  void (*forward)(const detail::GeluForwardArgs&);
  void (*backward)(const detail::GeluBackwardArgs&);
  std::int64_t (*block)(GeluDtype);
};

// The kernels of ATen's instruction set, so that the vector code here is the vector code at::gelu
// would run. Null kernels where ATen runs code we have no copy of: there mantissa::nn::gelu is
// at::gelu.
GeluCpuKernels cpu_kernels() {
  switch (mantissa::detail::aten_cpu_capability()) {
    case mantissa::detail::CpuCapability::kAvx512:
      return {&detail::AVX512::gelu_forward_cpu, &detail::AVX512::gelu_backward_cpu,
              &detail::AVX512::gelu_block};
    case mantissa::detail::CpuCapability::kAvx2:
      return {&detail::AVX2::gelu_forward_cpu, &detail::AVX2::gelu_backward_cpu,
              &detail::AVX2::gelu_block};
    case mantissa::detail::CpuCapability::kDefault:
      return {&detail::DEFAULT::gelu_forward_cpu, &detail::DEFAULT::gelu_backward_cpu,
              &detail::DEFAULT::gelu_block};
    case mantissa::detail::CpuCapability::kOther:
      break;
  }
  return {nullptr, nullptr, nullptr};
}

const GeluCpuKernels& chosen_kernels() {
  static const GeluCpuKernels kernels = cpu_kernels();
  return kernels;
}

std::optional<GeluDtype> kernel_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return GeluDtype::kFloat;
    case at::kBFloat16:
      return GeluDtype::kBFloat16;
    case at::kHalf:
      return GeluDtype::kHalf;
    default:
      return std::nullopt;
  }
}

// true for "tanh", false for "none"; anything else is the caller's mistake.
bool is_tanh_approximation(std::string_view approximate) {
  TORCH_CHECK_VALUE(approximate == "none" || approximate == "tanh",
                    "mantissa::nn::gelu: approximate must be \"none\" or \"tanh\", got \"",
                    std::string(approximate), "\"");
  return approximate == "tanh";
}

std::int64_t threads_for_parallel_for() {
  return at::in_parallel_region() ? 1 : at::get_num_threads();
}

class GeluFunction : public torch::autograd::Function<GeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input) {
    const GeluDtype dtype = *kernel_dtype(input.scalar_type());
    const auto& kernels = chosen_kernels();
    at::Tensor output = at::empty_like(input, at::MemoryFormat::Contiguous);
    at::Tensor derivative =
        at::empty(input.sizes(), input.options().dtype(at::kFloat), at::MemoryFormat::Contiguous);
    const std::int64_t numel = input.numel();
    const std::int64_t threads = threads_for_parallel_for();
    const auto output_ranges = detail::parallel_for_ranges(
        numel, detail::aten_gelu_forward_grain(numel, at::get_num_threads()), threads);
    // The elements ATen's backward would compute with its scalar code, from the ranges its
    // at::parallel_for will hand out (default grain, the threads of now).
    const auto derivative_scalar_ranges =
        detail::scalar_tails(detail::parallel_for_ranges(numel, at::internal::GRAIN_SIZE, threads),
                             kernels.block(dtype));
    const detail::GeluForwardArgs args{dtype,
                                       input.const_data_ptr(),
                                       output.mutable_data_ptr(),
                                       derivative.mutable_data_ptr<float>(),
                                       numel,
                                       output_ranges,
                                       derivative_scalar_ranges};
    kernels.forward(args);
    // Saved as a variable, not in saved_data: the engine frees it once this node's backward has
    // run, as it frees ATen's saved input, and saved-tensor hooks see it.
    ctx->save_for_backward({derivative});
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        !at::GradMode::is_enabled(),
        "mantissa::nn::gelu keeps dGELU/dx, not its input, so it has no double backward "
        "(create_graph=true); use at::gelu for that");
    const at::Tensor& grad_output = grad_outputs[0];
    if (!grad_output.defined()) return {at::Tensor()};
    const at::Tensor derivative = ctx->get_saved_variables()[0];
    // The engine hands the gradient in the output's dtype, which is the input's.
    const at::Tensor grad = grad_output.contiguous();
    const auto dtype = kernel_dtype(grad.scalar_type());
    TORCH_INTERNAL_ASSERT(dtype.has_value(), "mantissa::nn::gelu: a ", grad.scalar_type(),
                          " gradient for a float32/bfloat16/float16 output");
    at::Tensor grad_input = at::empty_like(grad, at::MemoryFormat::Contiguous);
    const detail::GeluBackwardArgs args{*dtype, grad.const_data_ptr(),
                                        derivative.const_data_ptr<float>(),
                                        grad_input.mutable_data_ptr(), grad.numel()};
    chosen_kernels().backward(args);
    return {grad_input};
  }
};

}  // namespace

at::Tensor gelu(const at::Tensor& input, std::string_view approximate) {
  // The exact (erf) form stays ATen's: for float32 and bfloat16 ATen runs oneDNN's kernel there,
  // whose bits a kernel of ours could not promise to reproduce.
  const bool fused = is_tanh_approximation(approximate) && input.defined() &&
                     at::GradMode::is_enabled() && input.requires_grad() &&
                     input.device().is_cpu() && input.layout() == at::kStrided &&
                     kernel_dtype(input.scalar_type()).has_value() && input.is_contiguous() &&
                     input.numel() > 0 && chosen_kernels().forward != nullptr;
  if (!fused) return at::gelu(input, std::string(approximate));
  return GeluFunction::apply(input);
}

}  // namespace mantissa::nn
