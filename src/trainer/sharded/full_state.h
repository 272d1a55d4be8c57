#pragma once
// The whole optimizer state of a sharded run, put back together on rank 0 for a checkpoint that
// a single process or a DDP run can resume (HF's FULL_STATE_DICT for FSDP), and cut into shards
// again on load, for any world size: each rank takes its own range of the flat layout, so a
// state saved by 2 ranks resumes on 1, 3 or 8.

#include <array>
#include <cstddef>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include <mantissa/optim/fused_adamw.h>

#include "trainer/sharded/sharded_adamw.h"

namespace mantissa::detail::sharded {

/// AdamW state per parameter of `FlatParameters::params()`, each tensor in its parameter's
/// shape: what an unsharded FusedAdamW over those parameters (or over their fp32 masters)
/// holds. Python: `FSDP.full_optim_state_dict`, `get_optimizer_state_dict(..., full_state_dict)`.
struct FullOptimizerState {
  at::Tensor step;                     ///< 0-d fp32; undefined before the first step
  std::vector<at::Tensor> exp_avg;     ///< per parameter; empty before the first step
  std::vector<at::Tensor> exp_avg_sq;  ///< per parameter; empty before the first step
  /// Per parameter, undefined where its group has no amsgrad; empty when none has.
  std::vector<at::Tensor> max_exp_avg_sq;
  /// Per parameter, undefined where no Kahan compensation is kept; empty when none is.
  std::vector<at::Tensor> kahan_comp;
  /// Per parameter, the fp32 master of a low-precision parameter (undefined for those that
  /// are their own master); empty in a run without masters.
  std::vector<at::Tensor> masters;

  /// True before the first step: no moments.
  bool empty() const noexcept { return !step.defined(); }
};

/// The per-element tensors a shard's optimizer state may hold.
enum class StateKind { kExpAvg, kExpAvgSq, kMaxExpAvgSq, kKahanComp, kMaster };
inline constexpr std::array<StateKind, 5> kStateKinds = {
    StateKind::kExpAvg, StateKind::kExpAvgSq, StateKind::kMaxExpAvgSq, StateKind::kKahanComp,
    StateKind::kMaster};
/// Its name in optimizer.pt and in shard files: "exp_avg", ..., "kahan_comp", "master".
const char* state_kind_name(StateKind kind);

/// This rank's shard of `kind` for bucket `b` (a tensor of the optimizer's or the fp32 master),
/// undefined where the run keeps none (no step taken yet, no amsgrad, no master).
at::Tensor local_state_shard(const ShardedAdamW& shards, std::size_t b, StateKind kind);
/// The 0-d step of bucket `b`'s state, undefined before the first step.
at::Tensor local_step(const ShardedAdamW& shards, std::size_t b);

/// Replaces bucket `b`'s state on this rank. The master (where the bucket has one) is filled by
/// `fill(kMaster, master)` or, when that returns false, copied from the model's shard. With
/// `step` undefined the optimizer state is cleared; else fresh moments are made and `fill`
/// fills each kind the options keep (exp_avg and exp_avg_sq must be filled; max_exp_avg_sq
/// stays zero and kahan_comp absent where `fill` returns false). No collective.
void restore_bucket_state(ShardedAdamW& shards, std::size_t b, const at::Tensor& step,
                          const std::function<bool(StateKind, at::Tensor&)>& fill);

/// Gathers every rank's shards of the optimizer state (and of the masters) into whole
/// per-parameter tensors on rank 0, on the parameters' device; the other ranks get an empty
/// state. A collective (one c10d `gather` per bucket and kind); syncs.
FullOptimizerState gather_full_state(const ShardedAdamW& shards);

/// The reverse: rank 0's `state` (the other ranks' argument is ignored) is cut along this run's
/// layout and each rank receives its shards, whatever world size `state` was gathered at. A
/// state without masters leaves the masters as copies of the model's current parameters
/// (which the caller loads first); an empty state clears the optimizer's state. Rank 0 checks
/// the state first (a parameter count or shape that does not match, steps that differ): its
/// error then names the parameter, and every other rank gets an error that points to rank 0's,
/// instead of waiting. A collective; syncs.
void scatter_full_state(ShardedAdamW& shards, const FullOptimizerState& state);

/// Reads the state `optimizer` (an unsharded FusedAdamW) holds for `tensors[i]` (the tensor it
/// updates in place of `FlatParameters::params()[i]`: the parameter, or its master) into a
/// `FullOptimizerState`; masters are the caller's to add. Throws `c10::ValueError` when some
/// tensors have state and others not, or when a tensor is not one of the optimizer's.
FullOptimizerState state_of(const optim::FusedAdamW& optimizer,
                            const std::vector<at::Tensor>& tensors);

/// Puts `state` into `optimizer` as the state of `tensors[i]` (as `state_of`), so that
/// `optimizer.save(archive)` writes exactly what an unsharded run's optimizer.pt holds. Tensors
/// are moved to each tensor's device. Throws `c10::ValueError` naming a parameter whose shape
/// does not match.
void put_state(optim::FusedAdamW& optimizer, const std::vector<at::Tensor>& tensors,
               const FullOptimizerState& state);

}  // namespace mantissa::detail::sharded
