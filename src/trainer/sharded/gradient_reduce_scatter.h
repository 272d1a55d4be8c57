#pragma once
// ZeRO-2's gradient path: as backward finishes each parameter's gradient, a hook notes it; when
// every gradient of a bucket is there, they are copied into one flat buffer (each divided by the
// world size on the way, as DDP's Reducer divides), the parameters' own gradients are released,
// and the buffer is reduce-scattered (c10d's `_reduce_scatter_base`), so that each rank receives
// the average over ranks of its shard only, while backward goes on computing the other buckets.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "trainer/sharded/flat_parameters.h"

namespace mantissa::detail::sharded {

/// Reduce-scatters the gradients of `FlatParameters` bucket by bucket, from autograd hooks.
/// Python: FSDP2's post-backward `reduce_scatter_tensor` per group, DeepSpeed stage 2's
/// `overlap_comm` with `reduce_scatter`.
///
/// Buckets are launched strictly in bucket order (as c10d's Reducer does), so that every rank
/// issues the same collectives in the same order whatever order its gradients came in. A
/// micro-batch that does not sync (inside an accumulation group) leaves the gradients on the
/// parameters, where autograd accumulates them; the synced one reduces the accumulated sum.
/// Gloo's `_reduce_scatter_base` is an allreduce inside and ignores the reduce op, so the sum
/// (never AVG) is asked for, of gradients already multiplied by 1/world_size as c10d's Reducer
/// multiplies them (`at::mul_out` by a wrapped scalar) before its allreduce: the average has
/// DDP's rounding at every world size, also where 1/N is inexact (3 ranks) and where the sum of
/// two fp16 gradients would overflow but their halves do not.
class GradientReduceScatter {
 public:
  /// Installs one post-accumulate-grad hook on each parameter of `flat` that requires a
  /// gradient. Throws `c10::ValueError` when a parameter already carries such a hook (naming
  /// its index): one tensor has one slot for it. `group` must span `flat.world_size()` ranks.
  /// `flat` must outlive this object (the hooks point to both).
  /// `max_in_flight` bounds the reduce-scatters (and their whole-bucket inputs) alive at once:
  /// launching one more first waits for the oldest. 0: no bound (every bucket's input lives
  /// until `finish_backward`, which overlaps most; full sharding bounds it, since there the
  /// inputs of all buckets together are a whole model's gradient).
  GradientReduceScatter(FlatParameters& flat, c10::intrusive_ptr<c10d::ProcessGroup> group,
                        std::size_t max_in_flight = 0);
  /// Removes the hooks.
  ~GradientReduceScatter();
  GradientReduceScatter(const GradientReduceScatter&) = delete;
  GradientReduceScatter& operator=(const GradientReduceScatter&) = delete;

  /// Before a micro-batch's backward. `sync`: this backward reduce-scatters (the last
  /// micro-batch of an accumulation group); otherwise the gradients accumulate on the
  /// parameters, as under DDP's `no_sync()`. No communication.
  void prepare_for_backward(bool sync);

  /// After a synced backward: launches the buckets the hooks did not (a parameter that got no
  /// gradient counts as zero), then waits for every reduce-scatter. Afterwards
  /// `averaged_shard(b)` holds this rank's shard of bucket `b` averaged over the ranks, and the
  /// parameters hold no gradient. A collective on every rank; does nothing after a backward
  /// that did not sync. Rethrows the collective's error (a peer that died or timed out).
  void finish_backward();

  /// This rank's shard of bucket `b`'s gradient, averaged over the ranks (DDP's gradient), in
  /// the bucket's dtype. Valid after `finish_backward()`. The handle shares the storage.
  at::Tensor averaged_shard(std::size_t b) const { return shards_.at(b); }

  /// How many buckets the last synced backward launched from its hooks (overlapped with the
  /// rest of backward) rather than in `finish_backward()`.
  std::size_t launched_in_backward() const noexcept { return launched_in_backward_; }

 private:
  friend struct GradReadyHook;
  void on_grad_ready(std::size_t param);
  void launch_ready_buckets();
  void launch(std::size_t bucket);

  FlatParameters& flat_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<at::Tensor> shards_;     // per bucket, persistent
  std::vector<std::size_t> ready_;     // per bucket: gradients arrived
  std::vector<std::size_t> expected_;  // per bucket: parameters that require grad
  std::vector<c10::intrusive_ptr<c10d::Work>> pending_;
  std::vector<at::Tensor> in_flight_;  // the flat inputs, alive until the wait
  std::size_t max_in_flight_ = 0;
  std::size_t next_bucket_ = 0;
  std::size_t launched_in_backward_ = 0;
  bool armed_ = false;  // this backward reduce-scatters
};

}  // namespace mantissa::detail::sharded
