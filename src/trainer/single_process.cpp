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

void SingleProcess::save_checkpoint(const std::string& output_dir, const CheckpointParts& parts) {
  detail::save_checkpoint(output_dir, parts);
}

void SingleProcess::load_checkpoint(const std::string& dir, const CheckpointParts& parts) {
  detail::load_checkpoint(dir, parts);
}

}  // namespace mantissa::detail
