#include "trainer/sharded_data_parallel.h"

#include <fmt/format.h>

#include <mantissa/distributed.h>

namespace mantissa::detail {
namespace {

constexpr std::int64_t kMiB = 1024 * 1024;

// Optimizer-state bytes per element of a tensor of `dtype` that FusedAdamW with `options`
// updates: the two moments (three with amsgrad) and a Kahan buffer for a low-precision tensor.
std::int64_t state_bytes_per_element(const optim::FusedAdamWOptions& options,
                                     c10::ScalarType dtype) {
  const bool low = amp::is_low_precision(dtype);
  const std::int64_t element = static_cast<std::int64_t>(c10::elementSize(dtype));
  const std::int64_t moment = options.fp32_moments() && low ? 4 : element;
  std::int64_t bytes = moment * (options.amsgrad() ? 3 : 2);
  if (low && options.low_precision_update() == optim::LowPrecisionUpdate::kKahan) bytes += element;
  return bytes;
}

// "1.23 MiB", "12.0 KiB" or "640 bytes".
std::string bytes_text(std::int64_t bytes) {
  if (bytes >= kMiB) return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / kMiB);
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
  return fmt::format("{} bytes", bytes);
}

}  // namespace

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<Collectives> collectives,
                                         const TrainingArguments& args)
    : ProcessGroupStrategy(std::move(collectives), args) {}

ShardedDataParallel::~ShardedDataParallel() = default;

std::string ShardedDataParallel::describe() const {
  return fmt::format(" x {} processes ({}, rank {}, fsdp shard_grad_op: gradients and optimizer "
                     "state sharded)",
                     world_size(), distributed::backend_name(collectives().backend()), rank());
}

void ShardedDataParallel::prepare_model(torch::nn::Module& module) {
  agree_on_model(module, /*with_buffers=*/true);
  module_ = &module;
}

ForwardScope ShardedDataParallel::forward_context(const ForwardPass& pass) {
  if (pass.training) {
    TORCH_INTERNAL_ASSERT(grads_ != nullptr, "ShardedDataParallel: make_optimizer was not called");
  }
  return {};
}

void ShardedDataParallel::before_backward(const torch::Tensor& /*loss*/, bool sync) {
  grads_->prepare_for_backward(sync);
}

bool ShardedDataParallel::run_step(const std::function<bool()>& step) const {
  return collectives().guarded("reduce-scattering the gradients or gathering the weights", step);
}

std::optional<std::string> ShardedDataParallel::cuda_graph_blocker() const {
  return std::string(
      "this run shards the gradients and optimizer state (fsdp shard_grad_op): the gradients "
      "are reduce-scattered from autograd hooks with host-side bucket bookkeeping, which a "
      "captured graph would not replay");
}

OptimizerSetup ShardedDataParallel::make_optimizer(const TrainingArguments& args,
                                                   torch::nn::Module& module,
                                                   const PrecisionPlan& plan,
                                                   const OptimizerFactory& factory,
                                                   amp::GradScaler& scaler) {
  TORCH_CHECK_VALUE(!factory,
                    "fsdp shard_grad_op builds mantissa's FusedAdamW over each process's shard "
                    "of the parameters; a Trainer with set_optimizer_factory cannot use it");
  TORCH_CHECK_VALUE(module_ == &module, "ShardedDataParallel: prepare_model saw another module");
  plan_ = plan;
  bool first_group_decays = false;
  const auto param_groups = weight_decay_groups(module.parameters(), nullptr, &first_group_decays);
  TORCH_CHECK_VALUE(!param_groups.empty(), "the model has no parameter that requires grad");
  std::vector<std::vector<torch::Tensor>> groups;
  std::vector<optim::FusedAdamWOptions> options;
  const auto base = fused_adamw_options(args, plan.low_precision_update);
  for (std::size_t g = 0; g < param_groups.size(); ++g) {
    groups.push_back(param_groups[g].params());
    options.push_back(base);
    options.back().weight_decay(g == 0 && first_group_decays ? args.weight_decay() : 0.0);
  }
  const auto& group = collectives().group();
  flat_ = std::make_unique<sharded::FlatParameters>(groups, rank(), world_size(),
                                                    args.resolved_ddp_bucket_cap_mb() * kMiB);
  grads_ = std::make_unique<sharded::GradientReduceScatter>(*flat_, group);
  shards_ = std::make_unique<sharded::ShardedAdamW>(
      *flat_, *grads_, std::move(options), plan.weights == WeightsMode::kFp32Masters, group);
  scaler.set_found_inf_reduction(
      [shards = shards_.get()](at::Tensor& found_inf) { shards->agree_found_inf_(found_inf); });
  OptimizerSetup setup;
  setup.optimizer.optimizer = shards_->shared_optimizer();
  setup.optimizer.fused = &shards_->optimizer();
  setup.optimizer.params = shards_->shard_params();
  return setup;
}

void ShardedDataParallel::finish_gradients() {
  grads_->finish_backward();
  shards_->prepare_grads();
}

torch::Tensor ShardedDataParallel::clip_grad_norm_(const std::vector<torch::Tensor>& /*params*/,
                                                   double max_norm) {
  return shards_->clip_grad_norm_(max_norm);
}

void ShardedDataParallel::after_optimizer_step() { shards_->all_gather_params(); }

void ShardedDataParallel::after_weights_loaded() { shards_->copy_model_to_masters(); }

std::pair<std::int64_t, std::int64_t> ShardedDataParallel::optimizer_state_bytes() const {
  std::int64_t mine = 0;
  std::int64_t unsharded = 0;
  const auto& buckets = flat_->layout().buckets;
  const auto& param_groups = shards_->optimizer().param_groups();
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const auto& bucket = buckets[b];
    const auto& options =
        static_cast<const optim::FusedAdamWOptions&>(param_groups.at(bucket.group).options());
    const bool master = shards_->has_master(b);
    const auto updated = master ? c10::kFloat : bucket.dtype;
    // A master and its fp32 gradient, 4 bytes each, besides the optimizer's own state.
    const std::int64_t per_element = state_bytes_per_element(options, updated) + (master ? 8 : 0);
    mine += per_element * bucket.shard_numel + 4;  // + the 0-d fp32 step of each bucket
    unsharded += per_element * bucket.numel + 4 * static_cast<std::int64_t>(bucket.slots.size());
  }
  return {mine, unsharded};
}

std::string ShardedDataParallel::describe_optimizer_state() const {
  const auto [mine, unsharded] = optimizer_state_bytes();
  const auto& layout = flat_->layout();
  return fmt::format(
      "mantissa: optimizer state per process {} (its 1/{} shard of {} buckets, {} padding "
      "elements in all); data parallel would hold {} on every process",
      bytes_text(mine), world_size(), layout.buckets.size(), layout.padding_numel(),
      bytes_text(unsharded));
}

OptimizerSetup ShardedDataParallel::unsharded_optimizer() const {
  OptimizerSetup whole;
  if (plan_.weights == WeightsMode::kFp32Masters) {
    whole.masters = std::make_unique<amp::MasterWeights>(module_->parameters());
  }
  whole.optimizer = make_trainer_optimizer(args(), module_->parameters(), whole.masters.get(),
                                           plan_.low_precision_update, /*factory=*/{});
  // The learning rates the schedule has set (the other options are the arguments').
  auto& groups = whole.optimizer.optimizer->param_groups();
  const auto& sharded_groups = shards_->optimizer().param_groups();
  TORCH_INTERNAL_ASSERT(groups.size() == sharded_groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    groups[g].options().set_lr(sharded_groups[g].options().get_lr());
  }
  return whole;
}

std::vector<torch::Tensor> ShardedDataParallel::optimized_tensors(
    const OptimizerSetup& whole) const {
  std::vector<torch::Tensor> tensors;
  for (const auto& param : flat_->params()) {
    tensors.push_back(whole.masters != nullptr ? whole.masters->master_of(param) : param);
  }
  return tensors;
}

void ShardedDataParallel::save_checkpoint(const std::string& output_dir,
                                          const CheckpointParts& parts) {
  auto full = sharded::gather_full_state(*shards_);
  OptimizerSetup whole;
  const bool built = passed_everywhere([&] {
    if (rank() != 0) return;
    whole = unsharded_optimizer();
    const auto tensors = optimized_tensors(whole);
    if (whole.masters != nullptr) {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        if (full.masters.empty() || !full.masters[i].defined()) continue;
        tensors[i].copy_(full.masters[i]);
      }
    }
    if (!full.empty()) sharded::put_state(*whole.optimizer.fused, tensors, full);
  });
  TORCH_CHECK(built, "rank ", rank(), ": saving ", checkpoint_name(parts.state->global_step),
              " failed while rank 0 put the optimizer state together (see its error)");
  full = {};  // rank 0: the state now lives in `whole` alone
  CheckpointParts unsharded = parts;
  unsharded.optimizer = whole.optimizer.optimizer.get();
  unsharded.masters = whole.masters.get();
  Strategy::save_checkpoint(output_dir, unsharded);
}

void ShardedDataParallel::load_checkpoint(const std::string& dir, const CheckpointParts& parts) {
  OptimizerSetup whole;
  const auto through_strategy = loading_through_strategy(parts);
  checkpoint_io().load(
      dir,
      [&] {
        CheckpointParts here = through_strategy;
        here.optimizer = nullptr;
        here.masters = nullptr;
        if (rank() == 0) {
          whole = unsharded_optimizer();
          here.optimizer = whole.optimizer.optimizer.get();
          here.masters = whole.masters.get();
        }
        detail::load_checkpoint(dir, here);
      },
      /*whose_error=*/"rank 0's");
  sharded::FullOptimizerState full;
  if (rank() == 0) {
    const auto tensors = optimized_tensors(whole);
    full = sharded::state_of(*whole.optimizer.fused, tensors);
    if (whole.masters != nullptr) {
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        const bool own_master = tensors[i].is_same(flat_->params()[i]);
        full.masters.push_back(own_master ? torch::Tensor() : tensors[i]);
      }
    }
  }
  whole = {};
  sharded::scatter_full_state(*shards_, full);
  // The learning rates the checkpoint's schedule had set, as optimizer.pt restores them.
  const auto lrs = parts.scheduler->get_last_lr();
  auto& groups = shards_->optimizer().param_groups();
  for (std::size_t g = 0; g < groups.size() && g < lrs.size(); ++g) {
    groups[g].options().set_lr(lrs[g]);
  }
}

}  // namespace mantissa::detail
