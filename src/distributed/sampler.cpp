// distributed_sampler_indices: torch.utils.data.DistributedSampler's index list, step by step.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include "mantissa/distributed.h"

#include "checked_math.h"

namespace mantissa::distributed {

std::vector<int64_t> distributed_sampler_indices(int64_t num_examples, int64_t world_size,
                                                 int64_t rank, uint64_t seed, uint64_t epoch,
                                                 bool shuffle, bool drop_last) {
  TORCH_CHECK_VALUE(num_examples >= 0,
                    "distributed_sampler_indices: num_examples must not be negative, but it is ",
                    num_examples);
  TORCH_CHECK_VALUE(world_size >= 1,
                    "distributed_sampler_indices: world_size must be at least 1, but it is ",
                    world_size);
  TORCH_CHECK_VALUE(rank >= 0 && rank < world_size, "Invalid rank ", rank,
                    ", rank should be in the interval [0, ", world_size - 1, "]");

  // Python: ceil((n - R) / R) with drop_last and a ragged tail, else ceil(n / R). For a ragged n
  // the first equals floor(n / R), also when n < R (ceil of a value in (-1, 0) is 0).
  const bool ragged = num_examples % world_size != 0;
  const int64_t num_samples = (drop_last && ragged)
                                  ? num_examples / world_size
                                  : mantissa::detail::ceil_div(num_examples, world_size);
  const int64_t total_size = num_samples * world_size;

  std::vector<int64_t> order(static_cast<size_t>(num_examples));
  if (shuffle) {
    // A fresh CPU generator, as Python's `torch.Generator(); g.manual_seed(seed + epoch)`; the
    // same randperm kernel then draws the same permutation.
    at::Generator generator = at::detail::createCPUGenerator(seed + epoch);
    const at::Tensor perm = at::randperm(num_examples, generator, at::kLong);
    const int64_t* data = perm.const_data_ptr<int64_t>();
    order.assign(data, data + num_examples);
  } else {
    for (int64_t i = 0; i < num_examples; ++i) order[static_cast<size_t>(i)] = i;
  }

  // Padding repeats the order from its start, as often as needed; dropping keeps the head. Either
  // way position p of the padded list holds order[p % n]; then rank r takes r, r + R, ...
  std::vector<int64_t> indices;
  indices.reserve(static_cast<size_t>(num_samples));
  for (int64_t p = rank; p < total_size; p += world_size) {
    indices.push_back(order[static_cast<size_t>(p % num_examples)]);
  }
  return indices;
}

}  // namespace mantissa::distributed
