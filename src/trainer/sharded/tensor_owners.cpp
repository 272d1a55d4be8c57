#include "trainer/sharded/tensor_owners.h"

#include <algorithm>
#include <numeric>

#include <c10/util/Exception.h>

namespace mantissa::detail::sharded {

std::vector<std::int64_t> assign_tensor_owners(const std::vector<std::int64_t>& numels,
                                               std::int64_t world_size,
                                               std::vector<std::int64_t> owned_elsewhere) {
  TORCH_CHECK_VALUE(world_size >= 1, "assign_tensor_owners: world_size must be at least 1, got ",
                    world_size);
  for (std::size_t i = 0; i < numels.size(); ++i) {
    TORCH_CHECK_VALUE(numels[i] >= 0, "assign_tensor_owners: tensor ", i, " has ", numels[i],
                      " elements");
  }
  if (owned_elsewhere.empty()) owned_elsewhere.assign(static_cast<std::size_t>(world_size), 0);
  TORCH_CHECK_VALUE(static_cast<std::int64_t>(owned_elsewhere.size()) == world_size,
                    "assign_tensor_owners: owned_elsewhere has ", owned_elsewhere.size(),
                    " entries for ", world_size, " ranks");
  std::vector<std::size_t> by_size(numels.size());
  std::iota(by_size.begin(), by_size.end(), std::size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](std::size_t a, std::size_t b) { return numels[a] > numels[b]; });
  std::vector<std::int64_t> load(static_cast<std::size_t>(world_size), 0);
  std::vector<std::int64_t> owners(numels.size(), 0);
  for (const auto i : by_size) {
    // The least load here, then the least elsewhere, then the lowest rank.
    std::size_t rank = 0;
    for (std::size_t r = 1; r < load.size(); ++r) {
      if (load[r] < load[rank] ||
          (load[r] == load[rank] && owned_elsewhere[r] < owned_elsewhere[rank])) {
        rank = r;
      }
    }
    owners[i] = static_cast<std::int64_t>(rank);
    load[rank] += numels[i];
  }
  return owners;
}

std::vector<std::int64_t> owned_elements(const std::vector<std::int64_t>& numels,
                                         const std::vector<std::int64_t>& owners,
                                         std::int64_t world_size) {
  TORCH_CHECK_VALUE(numels.size() == owners.size(), "owned_elements: ", numels.size(),
                    " tensors but ", owners.size(), " owners");
  std::vector<std::int64_t> load(static_cast<std::size_t>(world_size), 0);
  for (std::size_t i = 0; i < numels.size(); ++i) {
    TORCH_CHECK_VALUE(owners[i] >= 0 && owners[i] < world_size, "owned_elements: tensor ", i,
                      "'s owner ", owners[i], " is not a rank of ", world_size);
    load[static_cast<std::size_t>(owners[i])] += numels[i];
  }
  return load;
}

}  // namespace mantissa::detail::sharded
