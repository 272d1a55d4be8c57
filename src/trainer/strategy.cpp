#include "trainer/strategy.h"

#include <mantissa/clip_grad.h>
#include <mantissa/optim/optimizer_registry.h>

#include "trainer/data_parallel.h"
#include "trainer/param_group_options.h"
#include "trainer/sharded/shard_files.h"
#include "trainer/sharded_data_parallel.h"
#include "trainer/single_process.h"
#include "trainer/state_sharded_data_parallel.h"
#include "trainer/whole_tensor_sharded_data_parallel.h"

namespace mantissa::detail {

std::vector<double> Strategy::mean(std::vector<double> values) const {
  auto sums = sum(std::move(values));
  for (auto& v : sums) v /= static_cast<double>(world_size());
  return sums;
}

OptimizerParams Strategy::optimizer_params(torch::nn::Module& module) {
  return weight_decay_params(module.parameters(), &module);
}

void Strategy::setup_optimizer(OptimizerSetup& /*built*/, const PrecisionPlan& /*plan*/,
                               amp::GradScaler& /*scaler*/) {}

io::NamedTensors Strategy::model_state_dict(const torch::nn::Module& module) const {
  return io::module_state_dict(module);
}

void Strategy::load_model_state_dict(torch::nn::Module& module, const io::NamedTensors& state,
                                     const std::string& origin) {
  io::load_module_state_dict(module, state, /*strict=*/true, /*allow_dtype_cast=*/false, origin);
}

void Strategy::load_model_file(torch::nn::Module& module, const std::string& path) {
  load_model_state_dict(module, io::load_safetensors(path), " from '" + path + "'");
}

void Strategy::save_checkpoint(const std::string& output_dir, const CheckpointParts& parts) {
  const auto model_state = model_state_dict(*parts.model);
  checkpoint_io().save(output_dir, parts.state->global_step, [&](const std::string& folder) {
    write_checkpoint_files(folder, parts, model_state);
  });
}

void Strategy::load_checkpoint(const std::string& dir, const CheckpointParts& parts) {
  const auto here = loading_through_strategy(parts);
  checkpoint_io().load(dir, [&] {
    check_not_sharded(dir);
    detail::load_checkpoint(dir, here);
  });
}

void Strategy::load_checkpoint_weights(torch::nn::Module& module, const std::string& dir,
                                       amp::MasterWeights* masters) {
  check_not_sharded(dir);
  detail::load_checkpoint_weights(
      dir, [&](const std::string& path) { load_model_file(module, path); }, masters);
}

CheckpointParts Strategy::loading_through_strategy(const CheckpointParts& parts) {
  CheckpointParts here = parts;
  torch::nn::Module* model = parts.model;
  here.load_model_file = [this, model](const std::string& path) { load_model_file(*model, path); };
  return here;
}

void Strategy::check_not_sharded(const std::string& dir) {
  TORCH_CHECK_VALUE(!sharded::is_sharded_checkpoint(dir), "the checkpoint '", dir,
                    "' holds each process's shards (fsdp_config state_dict_type "
                    "SHARDED_STATE_DICT: model_shards/, optimizer_shards/) instead of "
                    "model.safetensors: resume it with --fsdp (at any number of processes), or "
                    "turn it into whole files by resuming it with --fsdp and saving with "
                    "FULL_STATE_DICT");
}

torch::Tensor Strategy::clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm) {
  return mantissa::clip_grad_norm_(params, max_norm);
}

OptimizerSetup data_parallel_optimizer(const TrainingArguments& args, const PrecisionPlan& plan,
                                       const std::vector<torch::Tensor>& params,
                                       const OptimizerParams& groups,
                                       const torch::optim::Optimizer& options_of) {
  OptimizerSetup whole;
  if (plan.weights == WeightsMode::kFp32Masters) {
    whole.masters = std::make_unique<amp::MasterWeights>(params);
  }
  whole.optimizer = make_trainer_optimizer(args, groups, whole.masters.get(),
                                           plan.low_precision_update, /*factory=*/{});
  // The options the run trains with: the learning rates the schedule has set, the others the
  // arguments' or, after a resume, the checkpoint's.
  copy_param_group_options(options_of, *whole.optimizer.optimizer);
  return whole;
}

std::unique_ptr<Strategy> make_strategy(const TrainingArguments& args, const c10::Device& device) {
  // The launcher's variables are read here and nowhere else in the Trainer.
  auto env = distributed::DistributedEnvironment::from_env();
  if (auto collectives = Collectives::join_if_launched(std::move(env), args, device)) {
    const auto fsdp = read_fsdp_settings(args.fsdp(), args.fsdp_config());
    if (fsdp.enabled) {
      // validate() let only these two kinds of optimizer through.
      if (!optim::find_optimizer(args.optim().name())->shardable) {
        if (fsdp.shards_parameters()) {
          return std::make_unique<WholeTensorShardedDataParallel>(std::move(collectives), args,
                                                                  fsdp);
        }
        return std::make_unique<StateShardedDataParallel>(std::move(collectives), args, fsdp);
      }
      return std::make_unique<ShardedDataParallel>(std::move(collectives), args, fsdp);
    }
    return std::make_unique<DataParallel>(std::move(collectives), args);
  }
  if (read_fsdp_settings(args.fsdp(), args.fsdp_config()).enabled) {
    // HF refuses fsdp without several processes; the same command line runs here, unsharded.
    TORCH_WARN_ONCE(
        "fsdp: this process runs alone (no launcher set WORLD_SIZE above 1), so "
        "there is nothing to shard and it trains as one process; start it with "
        "torchrun --nproc_per_node N to shard");
  }
  return std::make_unique<SingleProcess>();
}

}  // namespace mantissa::detail
