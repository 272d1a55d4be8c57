#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <mantissa/arg.h>

namespace mantissa::amp {

/// Settings of a `GradScaler`. The first five are `torch.amp.GradScaler`'s arguments with its
/// defaults; the rest are extensions from DeepSpeed's loss scaler whose defaults switch them
/// off, so that a default scaler follows PyTorch's trajectory bit for bit.
struct GradScalerOptions {
  /// Python: `init_scale=2.**16`. The scale before the first update.
  MANTISSA_ARG(double, init_scale) = 65536.0;
  /// Python: `growth_factor=2.0`. Multiplier after `growth_interval` clean steps; must be > 1.
  MANTISSA_ARG(double, growth_factor) = 2.0;
  /// Python: `backoff_factor=0.5`. Multiplier on overflow; must be in (0, 1).
  MANTISSA_ARG(double, backoff_factor) = 0.5;
  /// Python: `growth_interval=2000`. Clean steps between two growths; must be >= 1.
  MANTISSA_ARG(std::int64_t, growth_interval) = 2000;
  /// Python: `enabled=True`. A disabled scaler passes everything through unchanged.
  MANTISSA_ARG(bool, enabled) = true;
  /// DeepSpeed `hysteresis`: back off only after this many overflows in a row (the counter
  /// refills at the next growth). 1 (the default) backs off on every overflow, as PyTorch.
  MANTISSA_ARG(std::int64_t, hysteresis) = 1;
  /// DeepSpeed `consecutive_hysteresis`: refill the hysteresis counter after every clean step
  /// rather than only at a growth.
  MANTISSA_ARG(bool, consecutive_hysteresis) = false;
  /// DeepSpeed `min_loss_scale`: the scale never backs off below this; an overflow at the
  /// floor raises "Current loss scale already at minimum - cannot decrease scale anymore."
  /// instead of skipping steps forever. 0 (the default) means no floor, as PyTorch.
  MANTISSA_ARG(double, min_scale) = 0.0;
  /// Growth never takes the scale above this. Infinity (the default) means no ceiling.
  MANTISSA_ARG(double, max_scale) = std::numeric_limits<double>::infinity();
};

/// Dynamic loss scaling for mixed-precision training: the C++ twin of `torch.amp.GradScaler`,
/// with the same methods, the same per-optimizer stage checks and the same error texts.
///
///     GradScaler scaler;
///     {
///       Autocast autocast(torch::kCUDA, torch::kHalf);
///       loss = loss_fn(model->forward(x), y);
///     }
///     scaler.scale(loss).backward();
///     scaler.unscale_(optimizer);            // optional: only to clip or inspect grads
///     torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
///     scaler.step(optimizer);                // skipped when a grad held inf/nan
///     scaler.update();
///
/// The scale (fp32) and the growth tracker (int32) are 0-d tensors created on the device of
/// the first tensor passed to `scale()`, and stay there: `scale`, `unscale_` and `update` never
/// sync with the device. What syncs is said on each method. Move-only, like an optimizer.
class GradScaler {
 public:
  /// Python: `torch.amp.GradScaler(init_scale=..., growth_factor=..., ...)`.
  /// Throws `c10::ValueError` on a bad option, naming it and its value.
  explicit GradScaler(GradScalerOptions options = {});

  GradScaler(GradScaler&&) noexcept;
  GradScaler& operator=(GradScaler&&) noexcept;
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;
  ~GradScaler();

  /// Multiplies `outputs` (usually the loss) by the scale. Python: `scaler.scale(outputs)`.
  /// Creates the scale on `outputs`' device on first use. No sync.
  at::Tensor scale(const at::Tensor& outputs);

  /// Scales each tensor of a list. Python: `scaler.scale([loss_a, loss_b])`. No sync.
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  /// Divides the gradients of `optimizer`'s parameters by the scale, in place, and records
  /// whether any of them holds inf/nan. Python: `scaler.unscale_(optimizer)`. Call it at most
  /// once per optimizer between two `update()`s, before `step()`. No sync.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Steps `optimizer` unless a gradient held inf/nan. Python: `scaler.step(optimizer)`.
  /// Unscales first if `unscale_` was not called. Syncs once (reads found-inf on the host),
  /// except for optimizers that implement `SupportsAmpScaling`, which get the scale and the
  /// found-inf flag as device tensors and decide on the device: no sync.
  void step(torch::optim::Optimizer& optimizer);

  /// Python: `scaler.step(optimizer, closure)`: an enabled scaler refuses closures with
  /// PyTorch's error; a disabled one passes the closure on.
  void step(torch::optim::Optimizer& optimizer,
            const torch::optim::Optimizer::LossClosure& closure);

  /// Updates the scale from the inf/nan checks of this iteration: back off on overflow, grow
  /// after `growth_interval` clean steps. Python: `scaler.update()`. No sync (unless
  /// `min_scale` is set, which reads whether the floor was hit on the host).
  void update();

  /// Sets the scale to `new_scale`. Python: `scaler.update(new_scale=1024.)`. No sync.
  void update(double new_scale);

  /// Copies `new_scale` (1 element, on the scale's device type, no grad) into the scale.
  /// Python: `scaler.update(new_scale=tensor)`. No sync.
  void update(const at::Tensor& new_scale);

  /// The current scale. Python: `scaler.get_scale()`: `init_scale` before first use, 1.0
  /// when disabled. Syncs.
  double get_scale() const;

  /// The scale as the device tensor (undefined before first use). No sync.
  /// Python: `scaler._get_scale_async()`.
  const at::Tensor& scale_tensor() const noexcept { return scale_; }

  /// Clean steps since the last growth or overflow. Python: `scaler._get_growth_tracker()`.
  /// Syncs.
  std::int64_t get_growth_tracker() const;

  /// Python: `scaler.get_growth_factor()` / `set_growth_factor()` and the backoff and
  /// interval equivalents.
  double get_growth_factor() const noexcept { return options_.growth_factor(); }
  void set_growth_factor(double new_factor);
  double get_backoff_factor() const noexcept { return options_.backoff_factor(); }
  void set_backoff_factor(double new_factor);
  std::int64_t get_growth_interval() const noexcept { return options_.growth_interval(); }
  void set_growth_interval(std::int64_t new_interval);

  /// Python: `scaler.is_enabled()`.
  bool is_enabled() const noexcept { return options_.enabled(); }

  /// The options this scaler was built with (factors as last set).
  const GradScalerOptions& options() const noexcept { return options_; }

  /// Optimizer steps skipped for inf/nan since construction (counted on the device in
  /// `update()`). Syncs.
  std::int64_t skipped_steps() const;

  /// Whether the last `update()` saw inf/nan, i.e. the last step was skipped. Syncs.
  bool last_step_skipped() const;

  /// Passes every inf/nan flag this scaler records (in `unscale_`, and in `step` for an
  /// optimizer that unscales itself) through `reduce` as soon as it is computed; `reduce` may
  /// change the 0-d fp32 flag in place. Sharded data parallelism needs it: each rank sees only
  /// its shard of the gradients, so the flags must be combined across the ranks (an allreduce
  /// of the maximum) for every rank to skip the same steps and keep the same scale. An empty
  /// function (the default) turns it off. Python: FSDP's `ShardedGradScaler(process_group=...)`.
  /// No sync of its own; `reduce` may run a collective.
  void set_found_inf_reduction(std::function<void(at::Tensor& found_inf)> reduce) {
    found_inf_reduction_ = std::move(reduce);
  }

  /// Python: `scaler.state_dict()`: `{scale, growth_factor, backoff_factor, growth_interval,
  /// _growth_tracker}`, empty when disabled. With hysteresis on, also `_hysteresis_tracker`.
  /// Syncs. `torch::pickle_save` of it is read by Python's `torch.load`.
  c10::impl::GenericDict state_dict() const;

  /// Python: `scaler.load_state_dict(state)`. An empty dict raises PyTorch's error.
  void load_state_dict(const c10::impl::GenericDict& state);

  /// Writes `state_dict()` into an archive under PyTorch's keys (`torch::save` style).
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads what `save(archive)` wrote.
  void load(torch::serialize::InputArchive& archive);

  /// Writes `state_dict()` to `path` in `torch.save`'s format (HF's `scaler.pt`), atomically:
  /// a temporary file renamed over `path`, so a failed write leaves the old file intact.
  void save(const std::string& path) const;
  /// Reads a file written by `save(path)` or by Python's `torch.save(scaler.state_dict(), path)`.
  void load(const std::string& path);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct OptimizerState {
    Stage stage = Stage::kReady;
    std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;
  };

  void lazy_init_scale_growth_tracker(const c10::Device& device);
  std::pair<const at::Tensor&, const at::Tensor&> check_scale_growth_tracker(
      const char* funcname) const;
  std::vector<std::pair<c10::Device, at::Tensor>> unscale_grads(torch::optim::Optimizer& optimizer,
                                                                const at::Tensor& inv_scale,
                                                                const at::Tensor& found_inf,
                                                                bool allow_fp16) const;
  void check_inf_per_device(torch::optim::Optimizer& optimizer);
  void reduce_found_inf(std::vector<std::pair<c10::Device, at::Tensor>>& per_device) const;
  at::Tensor combined_found_inf() const;
  void update_with_extensions(const at::Tensor& found_inf);
  void finish_update(const at::Tensor& found_inf);
  bool extensions_enabled() const noexcept;

  GradScalerOptions options_;
  at::Tensor scale_;               // 0-d fp32, lazily on the device of the first scale() input
  at::Tensor growth_tracker_;      // 0-d int32
  at::Tensor hysteresis_tracker_;  // 0-d int32, only with extensions
  at::Tensor skipped_steps_;       // 0-d int64
  at::Tensor last_found_inf_;      // 0-d fp32, the combined flag of the last update()
  std::int64_t init_growth_tracker_ = 0;
  std::int64_t init_hysteresis_tracker_;
  std::unordered_map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_states_;
  std::function<void(at::Tensor&)> found_inf_reduction_;  // sharded runs: combines the ranks' flags
};

}  // namespace mantissa::amp
