#pragma once
// Which process owns each whole tensor when the optimizer state is sharded by tensors rather
// than by flat element ranges: the optimizers whose update needs a whole matrix (Adafactor's
// factored moments, Muon's orthogonalisation) or keeps per-block state (8-bit AdamW's scales)
// are sharded this way. Pure arithmetic over element counts.

#include <cstdint>
#include <vector>

namespace mantissa::detail::sharded {

/// The owner rank of each tensor of `numels` (elements per tensor) among `world_size` ranks:
/// the largest tensors first, each to the rank that owns the fewest elements so far (the
/// lowest rank on a tie; equal tensors in their given order). A rank may own nothing when there
/// are fewer tensors than ranks. The same on every rank for the same input. Python: the
/// round-robin `params[rank::world_size]` of distributed Muon implementations, balanced by
/// size. `owned_elsewhere`: the elements each rank owns of other tensors (an earlier bucket's),
/// which breaks ties between ranks that own equally many of these (before the lowest rank
/// does); empty for none. Throws `c10::ValueError` for a world size below 1, a negative element
/// count or `owned_elsewhere` of another size.
std::vector<std::int64_t> assign_tensor_owners(const std::vector<std::int64_t>& numels,
                                               std::int64_t world_size,
                                               std::vector<std::int64_t> owned_elsewhere = {});

/// Elements each rank owns under `owners` (as `assign_tensor_owners` gives them).
std::vector<std::int64_t> owned_elements(const std::vector<std::int64_t>& numels,
                                         const std::vector<std::int64_t>& owners,
                                         std::int64_t world_size);

}  // namespace mantissa::detail::sharded
