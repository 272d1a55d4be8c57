#pragma once
// Where each parameter of a sharded (ZeRO-2) run sits in the flat buffers, and which part of
// each buffer a rank owns. Pure arithmetic over sizes and dtypes, no tensors: the buffers are
// FlatParameters' (flat_parameters.h). DeepSpeed's stage 1/2 and FSDP2 lay memory out the same
// way: parameters back to back in one buffer, padded so that it splits into equal contiguous
// shards, shard r belonging to rank r.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>

namespace mantissa::detail::sharded {

/// What the layout needs to know of one parameter.
struct ParamSpec {
  std::int64_t numel = 0;               ///< elements
  c10::ScalarType dtype = c10::kFloat;  ///< a bucket holds one dtype
  std::size_t group = 0;                ///< optimizer param group: a bucket holds one group
  /// The sharding unit (a block of a fully sharded run, gathered and freed together): a bucket
  /// holds one unit. 0 for every parameter when the run has no units (ZeRO-2).
  std::size_t unit = 0;
};

/// One parameter's place in its bucket.
struct FlatSlot {
  std::size_t param = 0;    ///< index into the `ParamSpec` list
  std::int64_t offset = 0;  ///< its first element in the bucket
  std::int64_t numel = 0;   ///< its elements
};

/// The part of one parameter that lies in one rank's shard.
struct ShardPiece {
  std::int64_t param_offset = 0;  ///< first element, in the parameter's row-major order
  std::int64_t shard_offset = 0;  ///< where that element sits in the shard
  std::int64_t numel = 0;         ///< elements of the piece (> 0)
};

/// One flat buffer: parameters of one group and dtype, back to back, then zero padding so that
/// the buffer splits into `world_size` equal shards of `shard_numel` elements.
struct FlatBucket {
  std::size_t group = 0;                ///< the param group of every slot
  std::size_t unit = 0;                 ///< the sharding unit of every slot
  c10::ScalarType dtype = c10::kFloat;  ///< the dtype of every slot
  std::vector<FlatSlot> slots;          ///< in increasing offset
  std::int64_t numel = 0;               ///< elements of the parameters
  std::int64_t padded_numel = 0;        ///< world_size * shard_numel >= numel
  std::int64_t shard_numel = 0;         ///< elements of each rank's shard

  /// Rank `rank`'s shard: elements [shard_begin(rank), shard_begin(rank) + shard_numel).
  std::int64_t shard_begin(std::int64_t rank) const noexcept { return rank * shard_numel; }

  /// The part of `slot` inside rank `rank`'s shard, or nothing when they do not overlap.
  std::optional<ShardPiece> piece(const FlatSlot& slot, std::int64_t rank) const;

  /// The rank whose shard holds `slot`'s first element.
  std::int64_t first_rank(const FlatSlot& slot) const noexcept { return slot.offset / shard_numel; }
  /// Whether `slot` lies in more than one rank's shard.
  bool is_split(const FlatSlot& slot) const noexcept {
    return (slot.offset + slot.numel - 1) / shard_numel != first_rank(slot);
  }
};

/// One rank's piece of a split parameter, and where that rank puts it when it packs its
/// pieces of split parameters back to back (in slot order).
struct PackedPiece {
  std::int64_t rank = 0;           ///< the rank whose shard holds the piece
  std::int64_t packed_offset = 0;  ///< the piece's first element in that rank's packed buffer
  ShardPiece piece;                ///< the piece, as `FlatBucket::piece` gives it
};

/// A parameter that no single shard holds whole.
struct SplitSlot {
  std::size_t slot = 0;             ///< index into the bucket's `slots`
  std::vector<PackedPiece> pieces;  ///< in rank order, which is the parameter's element order
};

/// The split parameters of one bucket, and the elements each rank contributes when every rank
/// packs its pieces of them for one all-gather: what puts each split parameter's whole
/// gradient together (for its norm) without gathering the whole bucket.
struct SplitSlots {
  std::vector<SplitSlot> slots;   ///< in slot order; empty when every parameter lies whole
  std::int64_t packed_numel = 0;  ///< the most elements any rank packs; every rank sends this
};

/// The parameters of `bucket` that straddle a shard boundary, with their pieces; `world_size`
/// is the layout's. At most two per rank (one across each end of its shard, or one covering
/// it), so `packed_numel` is at most `shard_numel`. Pure arithmetic.
SplitSlots split_slots(const FlatBucket& bucket, std::int64_t world_size);

/// Every bucket of a run, and where each parameter went.
struct FlatLayout {
  std::int64_t world_size = 1;      ///< the number of shards of each bucket
  std::vector<FlatBucket> buckets;  ///< in the order gradients arrive (last parameters first)
  /// Per parameter (in `ParamSpec` order): its bucket and its slot in that bucket.
  std::vector<std::pair<std::size_t, std::size_t>> where;

  /// Elements of one rank's shards over all buckets (the same on every rank).
  std::int64_t shard_numel() const;
  /// Padding elements over all buckets.
  std::int64_t padding_numel() const;
};

/// Elements each shard is a multiple of, for `dtype`: 16 bytes' worth, so that every shard
/// starts 16-byte aligned for vectorized kernels and NCCL (DeepSpeed pads to 2 * world_size
/// 16-bit elements for the same reason).
std::int64_t shard_alignment(c10::ScalarType dtype);

/// Groups `params` into buckets. Parameters are taken in reverse order (backward produces the
/// last layer's gradients first, as DDP assumes), and a new bucket starts when the unit, the
/// group or the dtype changes or when the next parameter would take the bucket past `bucket_cap_bytes` (a
/// parameter larger than the cap gets a bucket of its own). Each bucket is padded to a multiple
/// of `world_size * shard_alignment(dtype)`. Python: DeepSpeed's `flatten_dense_tensors_aligned`
/// per group, FSDP2's per-`fully_shard` flat group. Throws `c10::ValueError` for a world size
/// below 1, a cap below 1, no parameters or a parameter without elements (naming its index).
FlatLayout plan_flat_layout(const std::vector<ParamSpec>& params, std::int64_t world_size,
                            std::int64_t bucket_cap_bytes);

/// `layout` with each bucket's parameters moved so that every one lies whole in a single
/// rank's shard: the parameters of a bucket get owners by `assign_tensor_owners` (largest first
/// to the least-loaded rank, ties going to the rank that owns the least in the buckets before), each owner's
/// parameters sit back to back in its shard in slot
/// order, each starting on a `shard_alignment` boundary, and the shards grow to the largest
/// owner's share (the other shards end in padding). For the optimizers whose update needs a
/// whole tensor (`OptimizerSpec::shards_whole_tensors`) under full sharding: a reduce-scatter
/// then hands each owner its tensors' whole gradients. `first_rank(slot)` is a slot's owner,
/// and no slot `is_split`. Pure arithmetic.
FlatLayout place_whole_tensors(FlatLayout layout);

}  // namespace mantissa::detail::sharded
