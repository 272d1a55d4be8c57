#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <mantissa/arg.h>
#include <mantissa/optim/low_precision_update.h>

namespace mantissa::optim {

/// Settings of `Adafactor`, with the defaults of HF's `transformers.optimization.Adafactor` as
/// HF's Trainer builds it for `--optim adafactor` (`scale_parameter=False, relative_step=False,
/// warmup_init=False`, the learning rate given): the step size is `lr` itself, not one derived
/// from the step count or the parameter's scale.
struct AdafactorOptions : public torch::optim::OptimizerCloneableOptions<AdafactorOptions> {
  /// Python: `lr`. Must be >= 0.
  AdafactorOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): as AdamWOptions
  /// Python: `lr`.
  MANTISSA_ARG(double, lr) = 1e-3;
  /// Python: `eps[0]`, added to each squared gradient before it enters the second moment.
  MANTISSA_ARG(double, eps) = 1e-30;
  /// Python: `clip_threshold`: an update whose RMS exceeds it is scaled down to it.
  MANTISSA_ARG(double, clip_threshold) = 1.0;
  /// Python: `decay_rate`: step t's second-moment decay is `1 - t^decay_rate`. Must be < 0.
  MANTISSA_ARG(double, decay_rate) = -0.8;
  /// Python: `beta1`: unset (None) keeps no first moment; set, `exp_avg` averages the updates.
  MANTISSA_ARG(std::optional<double>, beta1) = std::nullopt;
  /// Python: `weight_decay`: `p -= lr * weight_decay * p` each step.
  MANTISSA_ARG(double, weight_decay) = 0.0;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// Per-parameter state of `Adafactor`, under the keys of HF's Adafactor. A parameter of two or
/// more dimensions keeps the factored second moment (`exp_avg_sq_row`: its shape without the
/// last dimension; `exp_avg_sq_col`: without the second-to-last), others the full
/// `exp_avg_sq`. All fp32 whatever the parameter's dtype.
struct AdafactorParamState
    : public torch::optim::OptimizerCloneableParamState<AdafactorParamState> {
  /// Python: `state["step"]`, the steps taken.
  MANTISSA_ARG(std::int64_t, step) = 0;
  /// Python: `state["exp_avg_sq_row"]` (factored parameters).
  MANTISSA_ARG(at::Tensor, exp_avg_sq_row);
  /// Python: `state["exp_avg_sq_col"]` (factored parameters).
  MANTISSA_ARG(at::Tensor, exp_avg_sq_col);
  /// Python: `state["exp_avg_sq"]` (0-d and 1-d parameters).
  MANTISSA_ARG(at::Tensor, exp_avg_sq);
  /// Python: `state["exp_avg"]`, only with `beta1` set.
  MANTISSA_ARG(at::Tensor, exp_avg);
  /// The part of the updates a bf16/fp16 parameter lost to rounding, in its dtype: only under
  /// `LowPrecisionUpdate::kKahan` (FusedAdamW's `kahan_comp`). Python has no such key.
  MANTISSA_ARG(at::Tensor, kahan_comp);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Adafactor (Shazeer & Stern, 2018) with HF's update: the second moment of a matrix is kept as
/// its row and column means (O(n+m) memory for an n x m matrix), the update is the gradient
/// over the moment's square root, scaled down to an RMS of at most `clip_threshold`, times `lr`.
/// bf16/fp16 parameters are updated in fp32 and written back by `low_precision_update` (pure
/// low-precision training: nearest rounding by default; Kahan compensation or stochastic
/// rounding as FusedAdamW writes them); the state is fp32. Python:
/// `transformers.optimization.Adafactor(params, lr=lr, scale_parameter=False,
/// relative_step=False)`. `step()` does not sync with the device.
class Adafactor : public torch::optim::Optimizer, public LowPrecisionRules {
 public:
  /// Throws `c10::ValueError` naming the value for a negative lr, eps, weight_decay or
  /// clip_threshold, a decay_rate >= 0 or a beta1 outside [0, 1].
  Adafactor(std::vector<torch::optim::OptimizerParamGroup> param_groups,
            AdafactorOptions defaults = {});
  Adafactor(std::vector<at::Tensor> params, AdafactorOptions defaults = {});

  /// One update of every parameter that has a gradient. The closure, if any, is called first
  /// with grad enabled and its loss returned.
  at::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads `save`'s archive; the state moves to its parameter's device, in fp32.
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace mantissa::optim
