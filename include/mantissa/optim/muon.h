#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <mantissa/arg.h>
#include <mantissa/optim/low_precision_update.h>

namespace mantissa::optim {

/// How Muon scales the learning rate of an A x B matrix, `torch.optim.Muon`'s `adjust_lr_fn`.
enum class MuonAdjustLr : std::int8_t {
  /// `lr * sqrt(max(1, A / B))` (Keller Jordan's; Python's default, `None` or "original").
  kOriginal,
  /// `lr * 0.2 * sqrt(max(A, B))`, which gives the update AdamW's RMS so that AdamW's learning
  /// rate and weight decay carry over (Moonshot's; "match_rms_adamw").
  kMatchRmsAdamW,
};

/// "original" or "match_rms_adamw".
const char* to_string(MuonAdjustLr fn);
/// The inverse of `to_string`; throws `c10::ValueError` naming `text` for anything else.
MuonAdjustLr parse_muon_adjust_lr(const std::string& text);

/// Settings of one parameter group of `Muon`. A group with `use_muon` runs `torch.optim.Muon`
/// with its defaults (`lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
/// ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None`) and holds
/// 2-d tensors only; a group without runs `torch.optim.AdamW` with `lr`, `weight_decay`, `betas`
/// and `adam_eps`, as the reference recipe's auxiliary AdamW.
struct MuonOptions : public torch::optim::OptimizerCloneableOptions<MuonOptions> {
  typedef std::tuple<double, double, double> coefficients_t;
  typedef std::tuple<double, double> betas_t;
  /// Python: `lr`.
  MuonOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): as AdamWOptions
  /// Python: `lr`. Must be >= 0.
  MANTISSA_ARG(double, lr) = 1e-3;
  /// Python: `weight_decay`, decoupled: `p *= 1 - lr * weight_decay` before the update.
  MANTISSA_ARG(double, weight_decay) = 0.1;
  /// Whether the group's tensors are orthogonalised (Muon) or updated by AdamW.
  MANTISSA_ARG(bool, use_muon) = true;
  /// Python: `momentum`, the momentum buffer's decay (`buf = lerp(buf, grad, 1 - momentum)`).
  MANTISSA_ARG(double, momentum) = 0.95;
  /// Python: `nesterov`: orthogonalise `lerp(grad, buf, momentum)` rather than `buf`.
  MANTISSA_ARG(bool, nesterov) = true;
  /// Python: `ns_coefficients` (a, b, c) of the quintic Newton-Schulz step
  /// `X = a X + (b A + c A^2) X` with `A = X X^T`.
  MANTISSA_ARG(coefficients_t, ns_coefficients) = std::make_tuple(3.4445, -4.7750, 2.0315);
  /// Python: `eps`, the floor of the Frobenius norm the iteration starts by dividing by.
  MANTISSA_ARG(double, eps) = 1e-7;
  /// Python: `ns_steps`, Newton-Schulz iterations. In [1, 100).
  MANTISSA_ARG(std::int64_t, ns_steps) = 5;
  /// Python: `adjust_lr_fn`.
  MANTISSA_ARG(MuonAdjustLr, adjust_lr_fn) = MuonAdjustLr::kOriginal;
  /// Python: `torch.optim.AdamW`'s `betas` (groups without `use_muon`).
  MANTISSA_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Python: `torch.optim.AdamW`'s `eps` (groups without `use_muon`).
  MANTISSA_ARG(double, adam_eps) = 1e-8;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// Per-parameter state of `Muon`, under the keys of the Python optimizer that updates it:
/// `momentum_buffer` (`torch.optim.Muon`) or `step`, `exp_avg`, `exp_avg_sq`
/// (`torch.optim.AdamW`). In the parameter's dtype, as PyTorch keeps them. A Muon tensor counts
/// its steps too (the key of stochastic rounding; torch.optim.Muon keeps none), and a pure
/// bf16/fp16 tensor under `LowPrecisionUpdate::kKahan` has `kahan_comp`.
struct MuonParamState : public torch::optim::OptimizerCloneableParamState<MuonParamState> {
  /// Python: Muon's `state["momentum_buffer"]`.
  MANTISSA_ARG(at::Tensor, momentum_buffer);
  /// Python: AdamW's `state["step"]`.
  MANTISSA_ARG(std::int64_t, step) = 0;
  /// Python: AdamW's `state["exp_avg"]`.
  MANTISSA_ARG(at::Tensor, exp_avg);
  /// Python: AdamW's `state["exp_avg_sq"]`.
  MANTISSA_ARG(at::Tensor, exp_avg_sq);
  /// The part of the updates a bf16/fp16 parameter lost to rounding, in its dtype: only under
  /// `LowPrecisionUpdate::kKahan` (FusedAdamW's `kahan_comp`). PyTorch has no such key.
  MANTISSA_ARG(at::Tensor, kahan_comp);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// The Newton-Schulz orthogonalisation of a 2-d `update` in bf16, as `torch.optim.Muon` computes
/// it: a matrix close to U V^T for the SVD U S V^T of `update` (its singular values end near 1,
/// not exactly 1). Returns bf16. No device sync.
at::Tensor muon_orthogonalise(const at::Tensor& update, const MuonOptions& options);

/// Muon (Jordan et al., 2024) for the 2-d hidden weights with AdamW for the rest, one optimizer
/// over both kinds of groups (`MuonOptions::use_muon`). Python: `torch.optim.Muon` over the
/// `use_muon` groups plus `torch.optim.AdamW` over the others, stepped together. bf16/fp16
/// parameters are updated in their own dtype, as PyTorch does, under
/// `LowPrecisionUpdate::kNearest` (the default); under `kKahan` or `kStochasticRounding` the
/// momentum and the moments stay in the parameter's dtype, the new weight is computed in fp32
/// and written by the rule, as FusedAdamW writes it. `step()` does not sync.
class Muon : public torch::optim::Optimizer, public LowPrecisionRules {
 public:
  /// Throws `c10::ValueError` naming the value for a negative lr, momentum or weight_decay, an
  /// ns_steps outside [1, 100), an AdamW beta outside [0, 1), and for a `use_muon` group
  /// holding a tensor that is not 2-d.
  Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults = {});

  /// One update of every parameter that has a gradient; the closure, if any, runs first.
  at::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads `save`'s archive; the state moves to its parameter's device and dtype.
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace mantissa::optim
