#pragma once
// A model's trainable parameters moved into the flat buffers of a FlatLayout: each parameter
// becomes a view of its bucket's buffer (the same tensor object, so the module, the autograd
// graph and anything holding the parameter keep working), and this rank's shard of each buffer
// is one contiguous tensor that the shard optimizer updates in place. Between uses a fully
// sharded run keeps the shards alone: a whole buffer's memory exists only while it is gathered.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "trainer/sharded/flat_layout.h"

namespace mantissa::detail::sharded {

/// One parameter to flatten, with its optimizer param group and its sharding unit.
struct FlatInput {
  at::Tensor tensor;      ///< the parameter
  std::size_t group = 0;  ///< its optimizer param group
  std::size_t unit = 0;   ///< its sharding unit (a block); 0 when the run has none
};

/// Where the parameters' values live between uses.
enum class FlatStorage {
  /// Every rank keeps every whole buffer; a shard is a view of its buffer (ZeRO-2).
  kWholeBuffers,
  /// Every rank keeps its shards; a whole buffer has memory only between `allocate_buffer` and
  /// `free_buffer`, while the parameters that view it are in use (ZeRO-3, FSDP2's
  /// `reshard_after_forward=True`).
  kShardsOnly,
};

/// The parameters of a sharded run and their flat buffers. Python: what FSDP2's
/// `FSDPParamGroup` (all-gather output) or DeepSpeed's `bit16_groups_flat` hold.
class FlatParameters {
 public:
  /// `groups[g]` are the tensors of optimizer param group `g` (HF's weight-decay groups, say),
  /// every one a distinct floating tensor on one device, all in unit 0, whole buffers kept.
  FlatParameters(const std::vector<std::vector<at::Tensor>>& groups, std::int64_t rank,
                 std::int64_t world_size, std::int64_t bucket_cap_bytes);
  /// `params`, in the order a forward uses them (the layout takes them backwards), each with
  /// its group (groups numbered from 0 without gaps) and unit. Copies each into its bucket's
  /// buffer (`plan_flat_layout(..., world_size, bucket_cap_bytes)`; padding is zero) and
  /// re-points it to its view there (`Tensor::set_data`), so that its values, shape,
  /// `requires_grad` and identity stay; with `FlatStorage::kShardsOnly` this rank's shard of each
  /// buffer is then copied out and the buffers freed (`free_buffer`). Throws `c10::ValueError` naming
  /// the group and index of an undefined, non-floating, empty or repeated tensor or of one on
  /// another device, and for a rank outside [0, world_size). Move or cast the model first:
  /// `module->to(...)` afterwards would give the parameters new storage outside the buffers.
  /// No collective, no sync.
  /// With `whole_tensors`, the layout is `place_whole_tensors`'s: each parameter lies whole in
  /// its owner's shard.
  FlatParameters(const std::vector<FlatInput>& params, std::int64_t rank, std::int64_t world_size,
                 std::int64_t bucket_cap_bytes, FlatStorage storage, bool whole_tensors = false);

  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;

  /// Where each parameter sits.
  const FlatLayout& layout() const noexcept { return layout_; }
  /// Every parameter, in the order given: the index the layout's slots use.
  const std::vector<at::Tensor>& params() const noexcept { return params_; }
  /// The param group of `params()[i]`.
  std::size_t group_of(std::size_t i) const {
    return layout_.buckets[layout_.where[i].first].group;
  }
  /// The number of param groups.
  std::size_t num_groups() const noexcept { return num_groups_; }
  /// Bucket `b`'s whole buffer (`padded_numel` elements), which the parameters view. With
  /// `FlatStorage::kShardsOnly` its values are there only while `is_allocated(b)`.
  const at::Tensor& buffer(std::size_t b) const { return buffers_.at(b); }
  /// This rank's shard of bucket `b`: a view of `buffer(b)`, or with `FlatStorage::kShardsOnly`
  /// a tensor of its own that holds the values between uses.
  at::Tensor shard(std::size_t b) const;
  /// This process's rank and the world size the layout was planned for.
  std::int64_t rank() const noexcept { return rank_; }
  std::int64_t world_size() const noexcept { return layout_.world_size; }
  /// Where the values live.
  FlatStorage storage() const noexcept { return storage_; }

  /// Whether `buffer(b)` has memory (always with `FlatStorage::kWholeBuffers`).
  bool is_allocated(std::size_t b) const;
  /// Gives `buffer(b)` its memory back, uninitialised (a gather fills it). The parameters that
  /// view it, and any view autograd saved of them, see the same memory. `kShardsOnly` only.
  /// No sync.
  void allocate_buffer(std::size_t b);
  /// Frees `buffer(b)`'s memory; until it is allocated again the parameters that view it have
  /// no elements (shape [0]), and the views of them autograd saved keep their shapes but no
  /// memory. Python: FSDP2's `untyped_storage().resize_(0)` with the sharded parameters swapped
  /// in. `kShardsOnly` only. No sync.
  void free_buffer(std::size_t b);
  /// The order in which an unsharded optimizer lists the parameters (indices into `params()`):
  /// the order the global gradient norm sums their norms in, so that it matches data parallel's
  /// bit for bit. `params()`'s own order unless `set_norm_order` gave another.
  const std::vector<std::size_t>& norm_order() const noexcept { return norm_order_; }
  /// Sets `norm_order()`; throws `c10::ValueError` unless `order` is a permutation of the
  /// parameter indices.
  void set_norm_order(std::vector<std::size_t> order);
  /// Parameter `i`'s shape (what it has whenever its buffer is allocated).
  const std::vector<std::int64_t>& shape(std::size_t i) const { return shapes_.at(i); }

 private:
  FlatLayout layout_;
  std::vector<at::Tensor> params_;
  std::vector<std::vector<std::int64_t>> shapes_;
  std::vector<std::size_t> norm_order_;
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> shards_;  // kShardsOnly: the values between uses
  std::int64_t rank_;
  std::size_t num_groups_ = 0;
  FlatStorage storage_;
};

}  // namespace mantissa::detail::sharded
