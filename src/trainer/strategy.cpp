#include "trainer/strategy.h"

#include "trainer/data_parallel.h"
#include "trainer/single_process.h"

namespace mantissa::detail {

std::vector<double> Strategy::mean(std::vector<double> values) const {
  auto sums = sum(std::move(values));
  for (auto& v : sums) v /= static_cast<double>(world_size());
  return sums;
}

std::unique_ptr<Strategy> make_strategy(const TrainingArguments& args, const c10::Device& device) {
  if (auto collectives = Collectives::join_if_launched(args, device)) {
    return std::make_unique<DataParallel>(std::move(collectives), args);
  }
  return std::make_unique<SingleProcess>();
}

}  // namespace mantissa::detail
