// torch.ops.mantissa: FusedAdamW's step as a PyTorch custom operator, for the Python package
// (python/mantissa). Built into its own small library, libmantissa_ops.so, linked to
// libmantissa and LibTorch only (no Python): `torch.ops.load_library` runs the registrations
// below. The fake (meta) kernel is registered in Python (python/mantissa/_ops.py).
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#include <mantissa/optim/fused_adamw.h>
#include <mantissa/optim/low_precision_update.h>

#include "python_ops/fused_adamw_lists.h"

namespace mantissa::python_ops {
namespace {

// `state_steps` is incremented by the op itself (unlike torch._fused_adamw_, whose caller adds
// one before and subtracts found_inf after), so a skipped step touches nothing and needs no
// second pass. `grads` are read, never written: the kernel unscales in registers.
constexpr const char* kFusedAdamWSchema =
    "fused_adamw_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
    "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] state_steps, Tensor(e!)[] master_params, "
    "Tensor(f!)[] kahan_comps, int[] param_indices, *, float lr, float beta1, float beta2, "
    "float weight_decay, float eps, bool maximize=False, str low_precision_update=\"nearest\", "
    "int seed=0, Tensor? grad_scale=None, Tensor? found_inf=None) -> ()";

void fused_adamw_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                  at::TensorList exp_avg_sqs, at::TensorList state_steps,
                  at::TensorList master_params, at::TensorList kahan_comps,
                  at::IntArrayRef param_indices, double lr, double beta1, double beta2,
                  double weight_decay, double eps, bool maximize,
                  c10::string_view low_precision_update, std::int64_t seed,
                  const std::optional<at::Tensor>& grad_scale,
                  const std::optional<at::Tensor>& found_inf) {
  FusedAdamWLists lists;
  lists.params = params.vec();
  lists.grads = grads.vec();
  lists.exp_avgs = exp_avgs.vec();
  lists.exp_avg_sqs = exp_avg_sqs.vec();
  lists.steps = state_steps.vec();
  lists.masters = master_params.vec();
  lists.kahan_comps = kahan_comps.vec();
  lists.indices = param_indices.vec();
  optim::FusedAdamWOptions options(lr);
  options.betas(std::make_tuple(beta1, beta2))
      .weight_decay(weight_decay)
      .eps(eps)
      .maximize(maximize)
      .low_precision_update(optim::parse_low_precision_update(std::string(low_precision_update)))
      // The schema's int is signed; the seed's 64 bits are taken as they are.
      .stochastic_rounding_seed(static_cast<std::uint64_t>(seed));
  fused_adamw_lists_(lists, options, grad_scale.value_or(at::Tensor()),
                     found_inf.value_or(at::Tensor()));
}

}  // namespace
}  // namespace mantissa::python_ops

TORCH_LIBRARY(mantissa, m) { m.def(mantissa::python_ops::kFusedAdamWSchema); }

TORCH_LIBRARY_IMPL(mantissa, CPU, m) {
  m.impl("fused_adamw_", &mantissa::python_ops::fused_adamw_);
}

// Only where libmantissa has its CUDA kernels (the same guard as
// src/optim/fused_adamw_dispatch.cpp).
#ifdef MANTISSA_WITH_CUDA
TORCH_LIBRARY_IMPL(mantissa, CUDA, m) {
  m.impl("fused_adamw_", &mantissa::python_ops::fused_adamw_);
}
#endif
