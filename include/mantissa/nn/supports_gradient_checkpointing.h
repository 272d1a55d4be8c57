#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <mantissa/gradient_checkpointing_kwargs.h>
#include <mantissa/nn/checkpoint.h>

namespace mantissa::nn {

/// A block's computation: its input to its output.
using BlockFunction = std::function<at::Tensor(const at::Tensor&)>;

/// How the Trainer runs a model's blocks: what a fully sharded run does around each block
/// (gather its parameters, run it, free them, and the same again in the backward). The
/// Trainer installs it with `SupportsGradientCheckpointing::set_block_runner`; a model does not
/// implement it. Python: the pre- and post-forward hooks FSDP2's `fully_shard(block)` registers.
class BlockRunner {
 public:
  virtual ~BlockRunner() = default;
  /// Runs `fn(x)` for `block` and returns its output. `fn` is the model's block, already
  /// through `checkpoint` when checkpointing is on.
  virtual at::Tensor run(const torch::nn::Module& block, const BlockFunction& fn,
                         const at::Tensor& x) = 0;
};

/// Mixin for a model made of blocks: the blocks can run through `checkpoint`, and the Trainer
/// can shard them. Python: a `PreTrainedModel` with `supports_gradient_checkpointing = True`
/// and `_no_split_modules`.
///
/// Derive the model from it beside `torch::nn::Module`, name the blocks' classes in
/// `no_split_modules()`, and run each block through `run_block(*block, fn, x)`: checkpointing
/// (`--gradient_checkpointing`) and full sharding (`--fsdp`) both act there. `maybe_checkpoint`
/// runs an anonymous block: it can be checkpointed but not sharded.
///
/// The Trainer finds this interface with `dynamic_cast`: it calls `gradient_checkpointing_enable`
/// when `--gradient_checkpointing` is set (and refuses a model without it), and under `--fsdp`
/// installs a `BlockRunner`. Host state only; no device work.
class SupportsGradientCheckpointing {
 public:
  virtual ~SupportsGradientCheckpointing() = default;

  /// Turns checkpointing on for the blocks. Python:
  /// `model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)`.
  void gradient_checkpointing_enable(const GradientCheckpointingKwargs& kwargs = {}) {
    enabled_ = true;
    kwargs_ = kwargs;
  }
  /// Turns it off. Python: `model.gradient_checkpointing_disable()`.
  void gradient_checkpointing_disable() { enabled_ = false; }
  /// Python: `model.is_gradient_checkpointing`.
  bool is_gradient_checkpointing() const { return enabled_; }
  /// The kwargs of the last `gradient_checkpointing_enable`.
  const GradientCheckpointingKwargs& gradient_checkpointing_kwargs() const { return kwargs_; }

  /// The class names of the model's blocks, as `torch::nn::Module::name()` gives them (with or
  /// without the namespace: "DecoderLayerImpl" matches "my::DecoderLayerImpl"): the units full
  /// sharding gathers one at a time unless `fsdp_config`'s `transformer_layer_cls_to_wrap`
  /// names others. Every module of these classes must run through `run_block`. Empty by
  /// default (the whole model is then one unit). Python: `PreTrainedModel._no_split_modules`.
  virtual std::vector<std::string> no_split_modules() const { return {}; }

  /// Installs how the blocks run (the Trainer does, for full sharding); null: directly.
  void set_block_runner(std::shared_ptr<BlockRunner> runner) { runner_ = std::move(runner); }
  /// The installed runner, or null.
  const std::shared_ptr<BlockRunner>& block_runner() const { return runner_; }

 protected:
  /// `fn(x)` through `checkpoint` when checkpointing is on, `training` is true and grad mode
  /// is enabled; else `fn(x)` directly. `preserve_rng_state` follows the kwargs (default true).
  /// `fn` is kept and called again in the backward, after the model's `forward()` returned:
  /// capture per-forward tensors (RoPE tables, masks) by value, not by reference
  /// (docs/trainer.md, "Saving memory", shows a `ModuleList` of decoder layers).
  at::Tensor maybe_checkpoint(bool training, const std::function<at::Tensor(const at::Tensor&)>& fn,
                              const at::Tensor& x) const {
    if (!enabled_ || !training || !at::GradMode::is_enabled()) return fn(x);
    return checkpoint(fn, x, kwargs_.preserve_rng_state.value_or(true));
  }

  /// Runs the block `block` (a submodule of the model) as `fn(x)`: through `checkpoint` when
  /// checkpointing is on and `block` is training (as `maybe_checkpoint`), and through the
  /// installed `BlockRunner` (full sharding gathers `block`'s parameters around it). `fn` must
  /// use no parameter outside `block`, and capture per-forward tensors by value (it may run
  /// again in the backward). Do not modify the returned tensor in place.
  at::Tensor run_block(const torch::nn::Module& block, const BlockFunction& fn,
                       const at::Tensor& x) const {
    const bool training = block.is_training();
    if (!runner_) return maybe_checkpoint(training, fn, x);
    return runner_->run(
        block, [&](const at::Tensor& in) { return maybe_checkpoint(training, fn, in); }, x);
  }

 private:
  bool enabled_ = false;
  GradientCheckpointingKwargs kwargs_;
  std::shared_ptr<BlockRunner> runner_;
};

}  // namespace mantissa::nn
