#include "trainer/sharded/flat_layout.h"

#include <algorithm>

#include <c10/core/ScalarTypeToTypeMeta.h>
#include <c10/util/Exception.h>

#include "checked_math.h"
#include "trainer/sharded/tensor_owners.h"

namespace mantissa::detail::sharded {

std::optional<ShardPiece> FlatBucket::piece(const FlatSlot& slot, std::int64_t rank) const {
  const std::int64_t begin = std::max(slot.offset, shard_begin(rank));
  const std::int64_t end = std::min(slot.offset + slot.numel, shard_begin(rank) + shard_numel);
  if (begin >= end) return std::nullopt;
  return ShardPiece{begin - slot.offset, begin - shard_begin(rank), end - begin};
}

SplitSlots split_slots(const FlatBucket& bucket, std::int64_t world_size) {
  SplitSlots split;
  std::vector<std::int64_t> packed(static_cast<std::size_t>(world_size), 0);
  for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
    const auto& slot = bucket.slots[s];
    if (!bucket.is_split(slot)) continue;
    SplitSlot entry;
    entry.slot = s;
    for (std::int64_t r = bucket.first_rank(slot); r < world_size; ++r) {
      const auto piece = bucket.piece(slot, r);
      if (!piece) break;
      auto& used = packed[static_cast<std::size_t>(r)];
      entry.pieces.push_back(PackedPiece{r, used, *piece});
      used += piece->numel;
    }
    split.slots.push_back(std::move(entry));
  }
  for (const auto used : packed) split.packed_numel = std::max(split.packed_numel, used);
  return split;
}

std::int64_t FlatLayout::shard_numel() const {
  std::int64_t total = 0;
  for (const auto& bucket : buckets) total += bucket.shard_numel;
  return total;
}

std::int64_t FlatLayout::padding_numel() const {
  std::int64_t total = 0;
  for (const auto& bucket : buckets) total += bucket.padded_numel - bucket.numel;
  return total;
}

std::int64_t shard_alignment(c10::ScalarType dtype) {
  const auto size = static_cast<std::int64_t>(c10::elementSize(dtype));
  return std::max<std::int64_t>(1, 16 / size);
}

FlatLayout plan_flat_layout(const std::vector<ParamSpec>& params, std::int64_t world_size,
                            std::int64_t bucket_cap_bytes) {
  TORCH_CHECK_VALUE(world_size >= 1, "plan_flat_layout: world_size must be >= 1, but it is ",
                    world_size);
  TORCH_CHECK_VALUE(bucket_cap_bytes >= 1,
                    "plan_flat_layout: bucket_cap_bytes must be >= 1, but it is ",
                    bucket_cap_bytes);
  TORCH_CHECK_VALUE(!params.empty(), "plan_flat_layout: there are no parameters to shard");
  FlatLayout layout;
  layout.world_size = world_size;
  layout.where.resize(params.size());

  const auto close = [&](FlatBucket& bucket) {
    const std::int64_t multiple = world_size * shard_alignment(bucket.dtype);
    bucket.padded_numel = ceil_div(bucket.numel, multiple) * multiple;
    bucket.shard_numel = bucket.padded_numel / world_size;
  };
  for (std::size_t k = params.size(); k-- > 0;) {
    const auto& spec = params[k];
    TORCH_CHECK_VALUE(spec.numel > 0, "plan_flat_layout: parameter ", k, " has no elements (numel ",
                      spec.numel, "); leave it out of the shards");
    const auto bytes = spec.numel * static_cast<std::int64_t>(c10::elementSize(spec.dtype));
    bool fresh = layout.buckets.empty();
    if (!fresh) {
      const auto& last = layout.buckets.back();
      const auto last_bytes = last.numel * static_cast<std::int64_t>(c10::elementSize(last.dtype));
      fresh = last.unit != spec.unit || last.group != spec.group || last.dtype != spec.dtype ||
              last_bytes + bytes > bucket_cap_bytes;
    }
    if (fresh) {
      if (!layout.buckets.empty()) close(layout.buckets.back());
      FlatBucket bucket;
      bucket.group = spec.group;
      bucket.unit = spec.unit;
      bucket.dtype = spec.dtype;
      layout.buckets.push_back(std::move(bucket));
    }
    auto& bucket = layout.buckets.back();
    layout.where[k] = {layout.buckets.size() - 1, bucket.slots.size()};
    bucket.slots.push_back(FlatSlot{k, bucket.numel, spec.numel});
    bucket.numel += spec.numel;
  }
  close(layout.buckets.back());
  return layout;
}

FlatLayout place_whole_tensors(FlatLayout layout) {
  const auto world = layout.world_size;
  // The elements each rank owns so far: between ranks that own equally many of a bucket, its
  // next tensor goes to the one that owns the least in the buckets before, so that a bucket of
  // one tensor does not always fall to rank 0. The bucket's own balance comes first: it sets
  // every rank's shard length.
  std::vector<std::int64_t> owned(static_cast<std::size_t>(world), 0);
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    auto& bucket = layout.buckets[b];
    std::vector<std::int64_t> numels;
    for (const auto& slot : bucket.slots) numels.push_back(slot.numel);
    const auto owners = assign_tensor_owners(numels, world, owned);
    const auto loads = owned_elements(numels, owners, world);
    for (std::size_t r = 0; r < owned.size(); ++r) owned[r] += loads[r];
    // Each owner's parameters back to back, each from an aligned element on.
    const auto alignment = shard_alignment(bucket.dtype);
    std::vector<std::int64_t> used(static_cast<std::size_t>(world), 0);
    std::vector<std::int64_t> at_owner(bucket.slots.size(), 0);
    for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
      auto& next = used[static_cast<std::size_t>(owners[s])];
      at_owner[s] = next;
      next = ceil_div(next + bucket.slots[s].numel, alignment) * alignment;
    }
    bucket.shard_numel = *std::max_element(used.begin(), used.end());
    bucket.padded_numel = bucket.shard_numel * world;
    for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
      bucket.slots[s].offset = owners[s] * bucket.shard_numel + at_owner[s];
    }
    std::stable_sort(bucket.slots.begin(), bucket.slots.end(),
                     [](const FlatSlot& x, const FlatSlot& y) { return x.offset < y.offset; });
    for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
      layout.where[bucket.slots[s].param] = {b, s};
    }
  }
  return layout;
}

}  // namespace mantissa::detail::sharded
