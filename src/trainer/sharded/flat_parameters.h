#pragma once
// A model's trainable parameters moved into the flat buffers of a FlatLayout: each parameter
// becomes a view of its bucket's buffer (the same tensor object, so the module, the autograd
// graph and anything holding the parameter keep working), and this rank's shard of each buffer
// is one contiguous view that the shard optimizer updates in place.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "trainer/sharded/flat_layout.h"

namespace mantissa::detail::sharded {

/// The parameters of a sharded run and their flat buffers. Python: what FSDP2's
/// `FSDPParamGroup` (all-gather output) or DeepSpeed's `bit16_groups_flat` hold.
class FlatParameters {
 public:
  /// `groups[g]` are the tensors of optimizer param group `g` (HF's weight-decay groups, say),
  /// every one a distinct floating tensor on one device. Copies each into its bucket's buffer
  /// (`plan_flat_layout(..., world_size, bucket_cap_bytes)`; padding is zero) and re-points it
  /// to its view there (`Tensor::set_data`), so that its values, shape, `requires_grad` and
  /// identity stay. Throws `c10::ValueError` naming the group and index of an undefined,
  /// non-floating, empty or repeated tensor or of one on another device, and for a rank outside
  /// [0, world_size). Move or cast the model first: `module->to(...)` afterwards would give the
  /// parameters new storage outside the buffers. No collective, no sync.
  FlatParameters(const std::vector<std::vector<at::Tensor>>& groups, std::int64_t rank,
                 std::int64_t world_size, std::int64_t bucket_cap_bytes);

  FlatParameters(const FlatParameters&) = delete;
  FlatParameters& operator=(const FlatParameters&) = delete;

  /// Where each parameter sits.
  const FlatLayout& layout() const noexcept { return layout_; }
  /// Every parameter, groups concatenated in order: the index the layout's slots use.
  const std::vector<at::Tensor>& params() const noexcept { return params_; }
  /// The param group of `params()[i]`.
  std::size_t group_of(std::size_t i) const {
    return layout_.buckets[layout_.where[i].first].group;
  }
  /// The number of param groups.
  std::size_t num_groups() const noexcept { return num_groups_; }
  /// Bucket `b`'s whole buffer (`padded_numel` elements), which the parameters view.
  const at::Tensor& buffer(std::size_t b) const { return buffers_.at(b); }
  /// This rank's shard of bucket `b`: a view of `buffer(b)`.
  at::Tensor shard(std::size_t b) const;
  /// This process's rank and the world size the layout was planned for.
  std::int64_t rank() const noexcept { return rank_; }
  std::int64_t world_size() const noexcept { return layout_.world_size; }

 private:
  FlatLayout layout_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> buffers_;
  std::int64_t rank_;
  std::size_t num_groups_;
};

}  // namespace mantissa::detail::sharded
