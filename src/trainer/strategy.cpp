#include "trainer/strategy.h"

#include <mantissa/clip_grad.h>

#include "trainer/data_parallel.h"
#include "trainer/sharded_data_parallel.h"
#include "trainer/single_process.h"

namespace mantissa::detail {

std::vector<double> Strategy::mean(std::vector<double> values) const {
  auto sums = sum(std::move(values));
  for (auto& v : sums) v /= static_cast<double>(world_size());
  return sums;
}

OptimizerSetup Strategy::make_optimizer(const TrainingArguments& args, torch::nn::Module& module,
                                        const PrecisionPlan& plan, const OptimizerFactory& factory,
                                        amp::GradScaler& /*scaler*/) {
  OptimizerSetup setup;
  if (plan.weights == WeightsMode::kFp32Masters) {
    setup.masters = std::make_unique<amp::MasterWeights>(module.parameters());
  }
  setup.optimizer = make_trainer_optimizer(args, module.parameters(), setup.masters.get(),
                                           plan.low_precision_update, factory, &module);
  return setup;
}

torch::Tensor Strategy::clip_grad_norm_(const std::vector<torch::Tensor>& params,
                                        double max_norm) {
  return mantissa::clip_grad_norm_(params, max_norm);
}

std::unique_ptr<Strategy> make_strategy(const TrainingArguments& args, const c10::Device& device) {
  if (auto collectives = Collectives::join_if_launched(args, device)) {
    if (args.fsdp_shards_grad_op()) {
      return std::make_unique<ShardedDataParallel>(std::move(collectives), args);
    }
    return std::make_unique<DataParallel>(std::move(collectives), args);
  }
  return std::make_unique<SingleProcess>();
}

}  // namespace mantissa::detail
