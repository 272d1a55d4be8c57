#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <mantissa/amp/master_weights.h>
#include <mantissa/amp/supports_amp_scaling.h>
#include <mantissa/arg.h>
#include <mantissa/optim/low_precision_update.h>

namespace mantissa::optim {

/// Settings of `FusedAdamW`: those of `torch::optim::AdamWOptions`, with the same defaults,
/// plus `maximize` and how bf16/fp16 parameters without fp32 masters are updated
/// (`low_precision_update`, `stochastic_rounding_seed`, `fp32_moments`). Python:
/// `torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False,
/// maximize=False, fused=True)`.
struct FusedAdamWOptions : public torch::optim::OptimizerCloneableOptions<FusedAdamWOptions> {
  /// The type of `betas`, as `torch::optim::AdamWOptions::betas_t`.
  typedef std::tuple<double, double> betas_t;
  /// Python: `lr=1e-3`.
  FusedAdamWOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): as AdamWOptions
  /// Python: `lr`. Must be >= 0.
  MANTISSA_ARG(double, lr) = 1e-3;
  /// Python: `betas`. Each in [0, 1).
  MANTISSA_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Python: `eps`, added to the denominator. Must be >= 0.
  MANTISSA_ARG(double, eps) = 1e-8;
  /// Python: `weight_decay`, decoupled: `p *= 1 - lr * weight_decay` before the update.
  MANTISSA_ARG(double, weight_decay) = 1e-2;
  /// Python: `amsgrad`: normalise by the running maximum of `exp_avg_sq`.
  MANTISSA_ARG(bool, amsgrad) = false;
  /// Python: `maximize`: ascend the objective (the gradient's sign is flipped).
  MANTISSA_ARG(bool, maximize) = false;
  /// How the fp32 result is written into a bfloat16/float16 parameter that has no master
  /// (see `LowPrecisionUpdate`); fp32 parameters and masters ignore it. `kKahan` adds a buffer
  /// of the parameter's size and dtype to the state (`kahan_comp`). Python: optimi's
  /// `kahan_sum=True`, torchao's `bf16_stochastic_round=True`.
  MANTISSA_ARG(LowPrecisionUpdate, low_precision_update) = LowPrecisionUpdate::kNearest;
  /// The key of stochastic rounding's random bits. Each element's bits are a pure function of
  /// (seed, the step count, the parameter's index in the optimizer, the element's index), so a
  /// run is reproducible whatever the thread count, on the CPU (every instruction set) and on
  /// CUDA alike, and a resumed run continues bit for bit.
  MANTISSA_ARG(std::uint64_t, stochastic_rounding_seed) = 0;
  /// Keep `exp_avg`, `exp_avg_sq` (and `max_exp_avg_sq`) of bfloat16/float16 parameters without
  /// masters in fp32. Off: in the parameter's dtype, as PyTorch does (the memory-minimal
  /// layout: 2 bytes per moment instead of 4).
  MANTISSA_ARG(bool, fp32_moments) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
  friend bool operator==(const FusedAdamWOptions& lhs, const FusedAdamWOptions& rhs);
};

/// Per-parameter state of `FusedAdamW`, PyTorch's layout for fused AdamW: `step` is a 0-d fp32
/// tensor on the parameter's device (so a skipped step leaves it unchanged without a host
/// sync), `exp_avg` and `exp_avg_sq` have the parameter's shape and dtype.
struct FusedAdamWParamState
    : public torch::optim::OptimizerCloneableParamState<FusedAdamWParamState> {
  /// Python: `state["step"]` (a tensor, as with `fused=True` or `capturable=True`).
  MANTISSA_ARG(at::Tensor, step);
  /// Python: `state["exp_avg"]`.
  MANTISSA_ARG(at::Tensor, exp_avg);
  /// Python: `state["exp_avg_sq"]`.
  MANTISSA_ARG(at::Tensor, exp_avg_sq);
  /// Python: `state["max_exp_avg_sq"]`, only with amsgrad.
  MANTISSA_ARG(at::Tensor, max_exp_avg_sq);
  /// The Kahan compensation (parameter's shape and dtype): what rounding lost of the updates so
  /// far, added to the next one. Only under `LowPrecisionUpdate::kKahan` for bf16/fp16
  /// parameters. Python: optimi's `state["kahan_comp"]`.
  MANTISSA_ARG(at::Tensor, kahan_comp);

 public:
  /// Writes `step` as an integer (as `torch::optim::AdamW` does, so either optimizer reads the
  /// other's archive) and the tensors, `kahan_comp` among them when defined. Syncs (reads `step`).
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Reads `step` as an integer (`torch::optim::AdamW`'s archives) or a tensor; a missing
  /// `kahan_comp` stays undefined (a Kahan step then starts from zero compensation).
  void serialize(torch::serialize::InputArchive& archive) override;
};

/// AdamW with the whole update in one pass over memory per tensor, sync-free under loss scaling,
/// and aware of fp32 master weights.
///
/// For each parameter with a gradient, one pass reads the gradient, the parameter and the two
/// moments and writes the parameter, the moments and (when linked to a low-precision model
/// parameter) the bf16/fp16 model copy. In that pass it divides the gradient by the loss scale
/// and applies the decoupled weight decay and the AdamW update, in fp32 whatever the storage
/// dtype (bf16/fp16 parameters are rounded once). The arithmetic is that of
/// `torch::optim::AdamW`: fp32 results equal it to rounding.
///
/// Under a `GradScaler` it implements `SupportsAmpScaling`: the scale and the found-inf flag
/// are read as device tensors; when inf/nan was found nothing is written (parameters, moments,
/// step counts, model copies) and the host never waits for the device. Without a scaler
/// (`optimizer.step()`), there is no unscale and no skip, as with any optimizer.
///
/// bf16/fp16 parameters without masters (pure low-precision training) are written by the rule
/// `FusedAdamWOptions::low_precision_update` picks: nearest rounding, Kahan compensation or
/// stochastic rounding, in the same pass. The latter two give the same bits on every CPU
/// instruction set and on CUDA.
///
/// Kernels: on the CPU a vectorized (AVX2/AVX512, chosen at run time as ATen does) and
/// parallel one; on CUDA a multi-tensor kernel (many small tensors per launch). Parameters
/// elsewhere (or fp64, or laid out unlike their gradient) take an ATen fallback with the same
/// semantics.
///
/// Python: `torch.optim.AdamW(params, fused=True)` plus what it lacks: the master-weight cast
/// back, and bf16/fp16 parameters whose update is computed in fp32.
class FusedAdamW : public torch::optim::Optimizer, public mantissa::amp::SupportsAmpScaling {
 public:
  /// Parameter groups, each optionally with its own options (as `torch::optim::AdamW`).
  /// Throws `c10::ValueError` on a bad option value (naming it) or a parameter that is not
  /// float32/bfloat16/float16/float64 (naming its group and index).
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      FusedAdamWOptions defaults = {});

  /// One group of parameters. Python: `torch.optim.AdamW(params, ..., fused=True)`.
  explicit FusedAdamW(std::vector<at::Tensor> params, FusedAdamWOptions defaults = {});

  /// Optimizes `masters.master_params()` and writes each updated fp32 master back into its
  /// low-precision model parameter in the same pass (`link_model_params(masters)`), so that
  /// `masters.copy_masters_to_model()` is unnecessary.
  explicit FusedAdamW(const mantissa::amp::MasterWeights& masters, FusedAdamWOptions defaults = {});

  /// Links the optimizer's (fp32 master) params to the low-precision model params it writes back
  /// to after each update, in the same pass. Use after building the optimizer from
  /// `masters.masters_for(group)` parameter groups. After this,
  /// `MasterWeights::copy_masters_to_model()` is unnecessary. No sync.
  void link_model_params(const mantissa::amp::MasterWeights& masters);

  /// Links `params[i]` (an fp32 tensor this optimizer updates) to `model_params[i]` (bf16/fp16,
  /// same shape and device), which receives the updated value cast after each update. Pairs
  /// of the same tensor are ignored. Throws `c10::ValueError` naming the index of a bad pair.
  void link_model_params(const std::vector<at::Tensor>& params,
                         const std::vector<at::Tensor>& model_params);

  /// True once `link_model_params` was called: the step writes the model parameters itself.
  bool writes_back_to_model() const noexcept { return writes_back_; }

  /// One AdamW update of every parameter that has a gradient. Python: `optimizer.step()`.
  /// Never syncs with the device (on the CPU it reads the found-inf flag from memory). When
  /// capturable, it may be captured in a CUDA graph (see `set_capturable`).
  at::Tensor step(LossClosure closure = nullptr) override;

  /// Writes the state in `torch::optim::AdamW`'s archive layout (param groups with their
  /// options; per parameter `step`, `exp_avg`, `exp_avg_sq`, [`max_exp_avg_sq`]), plus
  /// `maximize`, `low_precision_update`, `stochastic_rounding_seed` and `fp32_moments` in the
  /// options and [`kahan_comp`] per parameter. Syncs.
  void save(torch::serialize::OutputArchive& archive) const override;

  /// Reads what `save` or `torch::optim::AdamW::save` wrote; the state moves to each
  /// parameter's device and dtype (moments to fp32 under `fp32_moments`). The options come from
  /// the archive, as in LibTorch: an archive without the low-precision options loads as
  /// `kNearest`. A saved moment or compensation that is not floating-point is refused (a
  /// c10::ValueError naming it and the parameter's index) before that cast would hide it.
  void load(torch::serialize::InputArchive& archive) override;

  /// Makes `step()` safe to capture in a CUDA graph: each group's learning rate is then read
  /// from a 0-d fp64 tensor on its parameters' device (`lr_tensor(group)`) instead of being
  /// passed to the kernel as a number, so a replayed graph uses the rate the scheduler set
  /// last, not the one it was captured with. The arithmetic is unchanged (the same double
  /// operations, on the device). Python: `torch.optim.AdamW(params, lr=torch.tensor(lr),
  /// fused=True, capturable=True)`. No sync.
  void set_capturable(bool capturable);

  /// Whether `set_capturable(true)` is in force.
  bool capturable() const noexcept { return capturable_; }

  /// Writes each group's `options().lr()` into its learning-rate tensor (one fill kernel per
  /// group, no sync). An eager `step()` does this itself; a captured one cannot (the fill
  /// would be captured with today's value), so call this before each replay. No-op unless
  /// capturable.
  void refresh_lr_tensors();

  /// The 0-d fp64 tensor group `group` reads its learning rate from (capturable only; made by
  /// `set_capturable` or the first `refresh_lr_tensors()` after a group was added).
  const at::Tensor& lr_tensor(std::size_t group) const;

  /// Called by `GradScaler::step` before `step()`: `grad_scale` (undefined when `unscale_`
  /// already ran) and `found_inf` (0-d fp32; non-zero skips the step). No sync.
  void set_amp_scaling(const at::Tensor& grad_scale, const at::Tensor& found_inf) override;

  /// Called by `GradScaler::step` after `step()`.
  void clear_amp_scaling() override;

 private:
  std::unordered_map<const c10::TensorImpl*, at::Tensor> model_of_;
  at::Tensor grad_scale_;
  at::Tensor found_inf_;
  bool writes_back_ = false;
  bool capturable_ = false;
  std::vector<at::Tensor> lr_tensors_;  // per group, capturable only
};

}  // namespace mantissa::optim
