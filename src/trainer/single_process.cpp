#include "trainer/single_process.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace mantissa::detail {

bool SingleProcess::passed_everywhere(const std::function<void()>& check) const {
  check();
  return true;
}

torch::Tensor SingleProcess::epoch_order(std::int64_t num_examples, std::uint64_t seed,
                                         std::int64_t epoch, bool /*drop_last*/) const {
  return torch::randperm(num_examples,
                         at::detail::createCPUGenerator(seed + static_cast<std::uint64_t>(epoch)),
                         torch::kLong);
}

}  // namespace mantissa::detail
