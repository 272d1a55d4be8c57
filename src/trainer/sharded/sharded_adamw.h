#pragma once
// ZeRO-2's optimizer side: AdamW state (moments, and fp32 masters of a low-precision model) for
// this rank's shard of each flat bucket only, the update run by mantissa's FusedAdamW over those
// shards (so every precision mode FusedAdamW has works unchanged), and the updated shards
// all-gathered back into every rank's full buffers. Also the two quantities that need every
// rank's shards: the global gradient norm and the agreed inf/nan flag.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <mantissa/amp/master_weights.h>
#include <mantissa/optim/fused_adamw.h>

#include "trainer/sharded/flat_parameters.h"
#include "trainer/sharded/gradient_reduce_scatter.h"

namespace mantissa::detail::sharded {

/// The shard optimizer of a sharded data-parallel run. Python: DeepSpeed stage 1/2's
/// `single_partition_of_fp32_groups` with the wrapped optimizer over them, or FSDP2's optimizer
/// over sharded DTensor parameters.
///
/// One step, on every rank:
///
///     grads.finish_backward();              // reduce-scattered sums of this rank's shards
///     shards.prepare_grads();               // averaged, into the optimizer's (fp32) grads
///     scaler.unscale_(shards.optimizer());  // fp16: flags agreed through agree_found_inf_
///     shards.clip_grad_norm_(max_norm);     // per-parameter norms, as data parallel's
///     scaler.step(shards.optimizer());      // FusedAdamW on the shards (skipped on inf)
///     shards.all_gather_params();           // every rank's full parameters updated
///
/// The optimizer's param groups mirror those of `FlatParameters` (same count, order and
/// options), so a learning-rate scheduler drives it as it would the unsharded one.
class ShardedAdamW {
 public:
  /// Wraps `optimizer`, built over this rank's shard of each bucket of `flat` (or its fp32
  /// master from `masters`, made from the shards in bucket order; null without masters),
  /// grouped as the buckets are: group by group, in bucket order. A bf16/fp16 shard with a
  /// master gets an fp32 gradient too, and the optimizer writes the master back, rounded, into
  /// the shard of the model's buffer; fp32 shards are their own master. Without masters the
  /// optimizer updates the shard of the model's buffer directly (pure bf16 with FusedAdamW's
  /// nearest / Kahan / stochastic rounding). Throws `c10::ValueError` when the optimizer's
  /// groups are not the shards, or the group does not span the layout's world size. No
  /// collective.
  ShardedAdamW(FlatParameters& flat, GradientReduceScatter& grads,
               std::shared_ptr<optim::FusedAdamW> optimizer, const amp::MasterWeights* masters,
               c10::intrusive_ptr<c10d::ProcessGroup> group);

  ShardedAdamW(const ShardedAdamW&) = delete;
  ShardedAdamW& operator=(const ShardedAdamW&) = delete;

  /// The FusedAdamW over this rank's shards: what `GradScaler::unscale_`/`step` and a
  /// scheduler are given. Its tensors are `shard_params()`.
  optim::FusedAdamW& optimizer() noexcept { return *optimizer_; }
  const optim::FusedAdamW& optimizer() const noexcept { return *optimizer_; }
  /// The same optimizer, shared: for a holder that may outlive this object's other uses.
  const std::shared_ptr<optim::FusedAdamW>& shared_optimizer() const noexcept { return optimizer_; }

  /// Per bucket, the tensor the optimizer updates: the fp32 master of the shard, or the shard
  /// of the model's buffer itself.
  const std::vector<at::Tensor>& shard_params() const noexcept { return shard_params_; }
  /// Whether bucket `b`'s shard has an fp32 master of its own.
  bool has_master(std::size_t b) const { return has_master_.at(b); }
  /// The flat parameters this optimizer updates.
  const FlatParameters& flat() const noexcept { return flat_; }

  /// Puts each bucket's reduced gradient shard, divided by the world size, into its optimizer
  /// tensor's gradient (cast to fp32 for a master). Call after `grads.finish_backward()`.
  /// Python: DeepSpeed's `averaged_gradients` into the fp32 partition. No collective, no sync.
  void prepare_grads();

  /// The 2-norm of the whole gradient (all buckets, all ranks), bit for bit what
  /// `mantissa::get_total_norm` gives over the whole gradient of each parameter (as data
  /// parallel computes it): each parameter's norm is taken over its whole gradient by the rank
  /// holding its first element (the pieces of a parameter that straddles a shard boundary are
  /// all-gathered first, one all-gather per bucket that has such parameters, at most a shard's
  /// worth each), the per-parameter norms reach every rank through one allreduce of one fp64
  /// value per parameter, and every rank stacks and norms them as `get_total_norm` does. A 0-d
  /// tensor of the dtype `get_total_norm` gives, on the parameters' device, the same on every
  /// rank. Python: `torch.nn.utils.get_total_norm` over the unsharded gradients. A collective;
  /// no host sync.
  at::Tensor global_grad_norm();

  /// Scales every rank's gradient shards by `min(max_norm / (norm + 1e-6), 1)` with the global
  /// norm, and returns that norm. Python: `torch.nn.utils.clip_grad_norm_(model.parameters(),
  /// max_norm)` under FSDP2. A collective; no host sync.
  at::Tensor clip_grad_norm_(double max_norm);

  /// Replaces `found_inf` (0-d, this rank's inf/nan flag) by its maximum over the ranks, in
  /// place, so that every rank skips the same steps and backs its loss scale off alike. Hand it
  /// to `GradScaler::set_found_inf_reduction`. Python: `ShardedGradScaler`'s all-reduce of
  /// `found_inf`. A collective; no host sync.
  void agree_found_inf_(at::Tensor& found_inf);

  /// All-gathers every bucket's updated shard into every rank's full buffer, so that each
  /// parameter holds the new values everywhere. Python: FSDP2's all-gather before the next
  /// forward, DeepSpeed's `all_gather_dp_groups`. A collective; waits for it.
  void all_gather_params();

  /// Bytes of optimizer state this rank holds: moments (and `max_exp_avg_sq`, `kahan_comp`),
  /// the fp32 masters and their gradients. Measured from the tensors. No sync.
  std::int64_t state_bytes() const;

  /// Copies each bucket's shard of the model's buffer into its fp32 master: after the model's
  /// weights were replaced (the best model loaded back). Python: FSDP's masters follow
  /// `load_state_dict`. No collective, no sync.
  void copy_model_to_masters();

  /// Clears the optimizer tensors' gradients (the shard buffers stay for the next step).
  void zero_grad();

  /// The process group.
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const noexcept { return group_; }

 private:
  FlatParameters& flat_;
  GradientReduceScatter& grads_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<at::Tensor> shard_params_;
  std::vector<at::Tensor> master_grads_;  // per bucket; undefined without a master
  std::vector<bool> has_master_;
  std::vector<SplitSlots> splits_;  // per bucket: the parameters that straddle a shard boundary
  std::shared_ptr<optim::FusedAdamW> optimizer_;
};

/// Bytes of the optimizer state tensors of `optimizer` (each `FusedAdamWParamState` tensor of
/// each parameter; the 0-d step counts too). What an unsharded run holds, to compare with
/// `ShardedAdamW::state_bytes()`. No sync.
std::int64_t fused_adamw_state_bytes(const optim::FusedAdamW& optimizer);

}  // namespace mantissa::detail::sharded
