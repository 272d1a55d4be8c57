#pragma once
// Gradient averaging across the processes of a data-parallel run, by c10d::Reducer: the C++
// engine Python's DistributedDataParallel drives. Gradients are copied into buckets as backward
// produces them, and each full bucket is averaged (allreduce, divided by the world size) while
// backward goes on computing the rest.

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/nn/module.h>

#include "trainer/collectives.h"

namespace c10d {
class Reducer;
}  // namespace c10d

namespace mantissa::detail {

/// What DDP adds around a micro-batch's forward and backward. Python: the parts of
/// `DistributedDataParallel.forward` (`_pre_forward`, `_post_forward`) and `no_sync()` that
/// concern gradients and buffers.
class GradientSync {
 public:
  /// Builds the buckets over `module`'s parameters that require a gradient, in reverse order
  /// (gradients arrive roughly last layer first), capped at `ddp_bucket_cap_mb`, the first at
  /// 1 MiB, as DDP does; with `ddp_comm_hook` the buckets travel as fp16 (c10d's
  /// FP16CompressCommHook) or bf16. `module`'s parameters must already be rank 0's
  /// (`Collectives::broadcast_module_states`).
  GradientSync(const Collectives& group, torch::nn::Module& module, const TrainingArguments& args);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  /// Before the forward of a micro-batch. `sync`: its backward averages the gradients (the
  /// last micro-batch of an accumulation group; the others run as under `no_sync()`). Rebuilds
  /// the buckets once in the order the first backward produced the gradients, and copies rank
  /// 0's buffers to every rank when `ddp_broadcast_buffers` and the previous micro-batch
  /// synced. A collective on every rank.
  void before_forward(bool sync);

  /// Between the forward and the backward of a micro-batch: arms the averaging when `sync`.
  /// With `ddp_find_unused_parameters` it walks the autograd graph from `loss` to mark the
  /// parameters that will get no gradient. No communication.
  void before_backward(const torch::Tensor& loss, bool sync);

 private:
  const Collectives& group_;
  torch::nn::Module& module_;
  bool find_unused_parameters_;
  bool broadcast_buffers_;
  std::shared_ptr<c10d::Reducer> reducer_;
  /// Whether the last forward was followed by a synced backward (DDP's
  /// `require_forward_param_sync`): buffers are broadcast only then.
  bool last_forward_synced_ = true;
};

}  // namespace mantissa::detail
