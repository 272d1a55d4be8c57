#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <mantissa/arg.h>
#include <mantissa/optim/low_precision_update.h>

namespace mantissa::optim {

/// Settings of `AdamW8bit`, with the defaults of torchao's `torchao.optim.AdamW8bit`.
struct AdamW8bitOptions : public torch::optim::OptimizerCloneableOptions<AdamW8bitOptions> {
  /// The type of `betas`, as `torch::optim::AdamWOptions::betas_t`.
  typedef std::tuple<double, double> betas_t;
  /// Python: `lr=1e-3`.
  AdamW8bitOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): as AdamWOptions
  /// Python: `lr`. Must be >= 0. The step uses it rounded to fp32, as torchao keeps it in a
  /// float32 tensor.
  MANTISSA_ARG(double, lr) = 1e-3;
  /// Python: `betas`. Each in [0, 1).
  MANTISSA_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Python: `eps`, added to the denominator. Must be >= 0.
  MANTISSA_ARG(double, eps) = 1e-8;
  /// Python: `weight_decay`, decoupled: `p -= lr * weight_decay * p` before the update.
  MANTISSA_ARG(double, weight_decay) = 1e-2;
  /// Python: the keyword `block_size`: elements that share one scale. A tensor is quantised only
  /// when it has at least 4096 elements and a multiple of `block_size` of them. Must be >= 1.
  MANTISSA_ARG(std::int64_t, block_size) = 256;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// Per-parameter state of `AdamW8bit`. A quantised moment is kept as uint8 codes of the
/// parameter's shape plus one fp32 scale (the block's largest magnitude) per `block_size`
/// elements; the value of an element is `qmap[code] * scale`, with torchao's dynamic maps
/// (`adamw8bit_qmap`). A tensor too small or not divisible into blocks keeps plain moments in
/// its own dtype, as torchao does. Python: torchao's `state["exp_avg"]` is an `OptimState8bit`
/// whose `codes` and `scale` are `exp_avg_codes` and `exp_avg_scale` here.
struct AdamW8bitParamState
    : public torch::optim::OptimizerCloneableParamState<AdamW8bitParamState> {
  /// Python: `state["step"]`, a 0-d fp32 tensor on the parameter's device.
  MANTISSA_ARG(at::Tensor, step);
  /// Python: `state["exp_avg"].codes` (uint8, signed map).
  MANTISSA_ARG(at::Tensor, exp_avg_codes);
  /// Python: `state["exp_avg"].scale` (fp32, one per block).
  MANTISSA_ARG(at::Tensor, exp_avg_scale);
  /// Python: `state["exp_avg_sq"].codes` (uint8, unsigned map).
  MANTISSA_ARG(at::Tensor, exp_avg_sq_codes);
  /// Python: `state["exp_avg_sq"].scale`.
  MANTISSA_ARG(at::Tensor, exp_avg_sq_scale);
  /// Python: `state["exp_avg"]` of a tensor that is not quantised.
  MANTISSA_ARG(at::Tensor, exp_avg);
  /// Python: `state["exp_avg_sq"]` of a tensor that is not quantised.
  MANTISSA_ARG(at::Tensor, exp_avg_sq);
  /// The part of the updates a bf16/fp16 parameter lost to rounding, in its dtype: only under
  /// `LowPrecisionUpdate::kKahan` (FusedAdamW's `kahan_comp`). torchao has no such key.
  MANTISSA_ARG(at::Tensor, kahan_comp);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// torchao's 256-entry dynamic quantisation map (`create_dynamic_map(signed)`), sorted, fp32 on
/// the CPU: values from 0 up to 1 (and down to -1 when signed) spaced more finely near zero.
/// Python: `torch.tensor(torchao.optim.subclass_8bit.get_qmap_signed())`. Host only.
at::Tensor adamw8bit_qmap(bool is_signed);

/// AdamW with both moments quantised to 8 bits block by block (Dettmers et al., 2021), as
/// torchao computes it: the moments are dequantised, updated in fp32, requantised to the nearest
/// code, and the fp32 values (not the requantised ones) form this step's update. bf16/fp16
/// parameters are updated in fp32 and written back by `low_precision_update` (nearest by
/// default; Kahan compensation or stochastic rounding as FusedAdamW writes them). Python:
/// `torchao.optim.AdamW8bit(params, lr, betas, eps, weight_decay, block_size=256)` (HF's
/// `--optim adamw_torch_8bit`). `step()` does not sync with the device.
class AdamW8bit : public torch::optim::Optimizer, public LowPrecisionRules {
 public:
  /// Throws `c10::ValueError` naming the value for a negative lr, eps or weight_decay, a beta
  /// outside [0, 1) or a block_size below 1.
  AdamW8bit(std::vector<torch::optim::OptimizerParamGroup> param_groups,
            AdamW8bitOptions defaults = {});
  AdamW8bit(std::vector<at::Tensor> params, AdamW8bitOptions defaults = {});

  /// One update of every parameter that has a gradient; the closure, if any, runs first.
  at::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads `save`'s archive; the state moves to its parameter's device.
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace mantissa::optim
