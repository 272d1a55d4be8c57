#pragma once
// FusedAdamW's step over tensors that someone else owns: the entry point of the torch.ops
// bridge (fused_adamw_ops.cpp), which holds the optimizer state in Python. Part of
// libmantissa_ops; internal.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include <mantissa/optim/fused_adamw.h>

namespace mantissa::python_ops {

/// One step's tensors, one entry per parameter, in the layout Python's optimizers pass to
/// `torch._fused_adamw_`. `masters` and `kahan_comps` are empty or as long as `params`.
struct FusedAdamWLists {
  /// Updated in place; with masters, each receives its master's new value rounded to its dtype.
  std::vector<at::Tensor> params;
  /// Read only; of the params' dtype (cast to fp32 first when there are masters).
  std::vector<at::Tensor> grads;
  /// Of the updated tensor's shape: the master's when there are masters, else the param's.
  std::vector<at::Tensor> exp_avgs;
  std::vector<at::Tensor> exp_avg_sqs;
  /// 0-d fp32 on the parameter's device, incremented unless `found_inf` is non-zero.
  std::vector<at::Tensor> steps;
  /// fp32 copies the update runs on (empty: the params themselves are updated).
  std::vector<at::Tensor> masters;
  /// Kahan compensation of bf16/fp16 params without masters under
  /// `optim::LowPrecisionUpdate::kKahan`.
  std::vector<at::Tensor> kahan_comps;
  /// Each parameter's index in its optimizer (all groups): stochastic rounding's key, as
  /// FusedAdamW numbers its parameters.
  std::vector<std::int64_t> indices;
};

/// The arithmetic of `FusedAdamW::step` (same kernels, same buckets, same fallback) applied to
/// `lists` with `options` (amsgrad off). `grad_scale` and `found_inf` may be undefined; a
/// non-zero `found_inf` leaves every tensor unchanged. Never syncs on CUDA; on the CPU it reads
/// `found_inf` and `grad_scale` from memory. Throws `c10::ValueError` on mismatched lists.
void fused_adamw_lists_(const FusedAdamWLists& lists, const optim::FusedAdamWOptions& options,
                        const at::Tensor& grad_scale, const at::Tensor& found_inf);

}  // namespace mantissa::python_ops
