#include "trainer/whole_tensor_sharded_data_parallel.h"

#include <algorithm>
#include <unordered_map>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <mantissa/distributed.h>

#include "trainer/optimizer_state_report.h"
#include "trainer/sharded/shard_files.h"

namespace mantissa::detail {

WholeTensorShardedDataParallel::WholeTensorShardedDataParallel(
    std::shared_ptr<Collectives> collectives, const TrainingArguments& args,
    const FsdpSettings& settings)
    : ShardedDataParallel(std::move(collectives), args, settings, /*whole_tensors=*/true) {}

WholeTensorShardedDataParallel::~WholeTensorShardedDataParallel() = default;

std::string WholeTensorShardedDataParallel::describe() const {
  return fmt::format(
      " x {} processes ({}, rank {}, fsdp full sharding by whole tensors: parameters, gradients "
      "and optimizer state sharded, each tensor whole in one process's shard, gathered per "
      "unit: {} block(s) and the root)",
      world_size(), distributed::backend_name(collectives().backend()), rank(), blocks_.size());
}

OptimizerParams WholeTensorShardedDataParallel::optimizer_params(torch::nn::Module& module) {
  flatten_parameters(module);
  const auto& layout = flat_->layout();
  const auto positions = module_positions();
  const auto names = flat_param_names();
  const auto count = module.parameters().size();
  std::vector<std::size_t> flat_at(count, flat_->params().size());
  for (std::size_t i = 0; i < positions.size(); ++i) flat_at[positions[i]] = i;
  // Stand-ins without memory, of the parameters' shapes and dtypes (the module's own are empty
  // now): HF's groups of them are a data-parallel run's, in its order.
  meta_params_.assign(count, torch::Tensor());
  std::unordered_map<const c10::TensorImpl*, std::size_t> position_of;
  for (std::size_t k = 0; k < count; ++k) {
    const auto i = flat_at[k];
    if (i == flat_->params().size()) continue;  // frozen: no group holds it
    meta_params_[k] =
        at::empty(flat_->shape(i),
                  at::TensorOptions().dtype(flat_->params()[i].scalar_type()).device(c10::kMeta))
            .requires_grad_(true);
    position_of.emplace(meta_params_[k].unsafeGetTensorImpl(), k);
  }
  std::vector<torch::Tensor> trainable;
  for (const auto& t : meta_params_) {
    if (t.defined()) trainable.push_back(t);
  }
  const auto grouped = weight_decay_params(trainable, nullptr);
  first_group_decays_ = grouped.first_group_decays;
  num_groups_ = grouped.groups.size();
  entries_.clear();
  for (std::size_t g = 0; g < grouped.groups.size(); ++g) {
    for (const auto& t : grouped.groups[g]) {
      const auto k = position_of.at(t.unsafeGetTensorImpl());
      const auto i = flat_at[k];
      const auto [b, s] = layout.where.at(i);
      const auto& bucket = layout.buckets[b];
      entries_.push_back(Entry{i, k, g, bucket.first_rank(bucket.slots[s]), names.at(i)});
    }
  }
  // This process's tensors: views of its shards, each parameter's whole elements.
  stand_in_device_ = flat_->params().empty() ? c10::Device(c10::kCPU) : flat_->params()[0].device();
  views_.assign(count, torch::Tensor());
  for (const auto& e : entries_) {
    if (e.owner != rank()) continue;
    const auto [b, s] = layout.where.at(e.flat);
    const auto& bucket = layout.buckets[b];
    const auto& slot = bucket.slots[s];
    TORCH_INTERNAL_ASSERT(!bucket.is_split(slot), "a whole-tensor shard split parameter ", e.name);
    views_[e.position] = flat_->shard(b)
                             .narrow(0, slot.offset - bucket.shard_begin(rank()), slot.numel)
                             .view(flat_->shape(e.flat))
                             .detach()
                             .requires_grad_(true);
  }
  return owned_by(rank(), views_);
}

OptimizerParams WholeTensorShardedDataParallel::owned_by(
    std::int64_t owner, const std::vector<torch::Tensor>& by_position) const {
  OptimizerParams out;
  out.first_group_decays = first_group_decays_;
  out.groups.resize(num_groups_);
  out.names.resize(num_groups_);
  for (const auto& e : entries_) {
    if (owner != OwnedState::kEveryOwner && e.owner != owner) continue;
    const auto& t = by_position.at(e.position);
    out.groups[e.group].push_back(t);
    out.names[e.group].push_back(e.name);
    out.in_order.push_back(t);
  }
  return out;
}

std::optional<std::string> WholeTensorShardedDataParallel::optimizer_factory_blocker() const {
  return owned_state_factory_blocker("fsdp full sharding");
}

void WholeTensorShardedDataParallel::setup_optimizer(OptimizerSetup& built,
                                                     const PrecisionPlan& plan,
                                                     amp::GradScaler& scaler) {
  TORCH_INTERNAL_ASSERT(flat_ != nullptr,
                        "WholeTensorShardedDataParallel: optimizer_params was not called");
  plan_ = plan;
  optimizer_ = built.optimizer.optimizer;
  // Two buckets' inputs in flight at most (a whole gradient otherwise).
  grads_ = std::make_unique<sharded::GradientReduceScatter>(*flat_, collectives().group(),
                                                            /*max_in_flight=*/2);
  // The order a data-parallel run's optimizer lists the tensors in (the order its gradient norm
  // sums the per-tensor norms in), built over the stand-ins without memory.
  const auto whole_order =
      make_trainer_optimizer(args(), owned_by(OwnedState::kEveryOwner, meta_params_),
                             /*masters=*/nullptr, plan.low_precision_update, /*factory=*/{})
          .params;
  // This process's views stand in that order for the parameters at their module positions.
  std::unordered_map<const c10::TensorImpl*, const c10::TensorImpl*> in_whole;
  for (std::size_t k = 0; k < views_.size(); ++k) {
    if (!views_[k].defined()) continue;
    in_whole.emplace(views_[k].unsafeGetTensorImpl(), meta_params_[k].unsafeGetTensorImpl());
  }
  norms_ = own_whole_tensors(
      built, plan, scaler, whole_order,
      [&](const torch::Tensor& view) { return in_whole.at(view.unsafeGetTensorImpl()); },
      collectives().device());
}

void WholeTensorShardedDataParallel::finish_gradients() {
  grads_->finish_backward();
  at::NoGradGuard no_grad;
  const auto& layout = flat_->layout();
  for (const auto& e : entries_) {
    if (e.owner != rank()) continue;
    const auto [b, s] = layout.where.at(e.flat);
    const auto averaged = grads_->averaged_shard(b);
    const auto& bucket = layout.buckets[b];
    const auto& slot = bucket.slots[s];
    views_[e.position].mutable_grad() =
        averaged.narrow(0, slot.offset - bucket.shard_begin(rank()), slot.numel)
            .view(flat_->shape(e.flat))
            .detach();  // no autograd view: zero_grad detaches gradients in place
  }
  if (units_ != nullptr) units_->finish();
}

torch::Tensor WholeTensorShardedDataParallel::clip_grad_norm_(
    const std::vector<torch::Tensor>& params, double max_norm) {
  // Every tensor has a gradient: the reduce-scatter gives an unused one zeros.
  return norms_.clip_(params, max_norm, /*has_grad=*/{},
                      [this](at::Tensor& packed) { sum_over_processes_(packed); });
}

std::string WholeTensorShardedDataParallel::describe_optimizer_state() const {
  const auto held = held_bytes();
  std::int64_t mine = 0;
  for (const auto& e : entries_) mine += e.owner == rank() ? 1 : 0;
  return fmt::format(
      "mantissa: rank {} holds parameters {} and gradients {} (its shards of {} units: {} of {} "
      "tensors, each whole; {} padding elements in all) and alone keeps those tensors' "
      "optimizer state{}; gathering adds the root's {} for a step and a block's {} at most; data "
      "parallel would hold {} + {} on every process",
      rank(), bytes_text(held.shards), bytes_text(held.shards), units_->size(), mine,
      entries_.size(), flat_->layout().padding_numel(),
      plan_.weights == WeightsMode::kFp32Masters ? " and fp32 masters" : "",
      bytes_text(units_->gathered_bytes(0)), bytes_text(held.largest_block_gather),
      bytes_text(held.whole), bytes_text(held.whole));
}

ProcessGroupStrategy::OwnedState WholeTensorShardedDataParallel::owned_state() {
  OwnedState state;
  state.optimizer = optimizer_.get();
  state.plan = plan_;
  // Zero stand-ins: the files keep no weights of the optimizer's tensors (model.safetensors is
  // gathered unit by unit), so rank 0 never gathers the model for them.
  state.whole_params = [this] { return whole_params(/*stand_ins=*/true); };
  state.owned_by = [this](std::int64_t owner, const std::vector<torch::Tensor>& params) {
    return owned_by(owner, params);
  };
  state.described_params = [this] { return meta_params_; };
  state.own_params = [this] { return views_; };
  state.stand_in = [this](const torch::Tensor& described) {
    return torch::zeros(described.sizes(),
                        described.options().device(stand_in_device_).requires_grad(false))
        .requires_grad_(described.requires_grad());
  };
  state.sharded_state_dict = settings_.sharded_state_dict;
  state.write_model_shards = [this](const std::string& folder) { write_model_shards(folder); };
  state.load_model_shards = [this](const std::string& dir) { load_model_shards(dir); };
  return state;
}

void WholeTensorShardedDataParallel::save_checkpoint(const std::string& output_dir,
                                                     const CheckpointParts& parts) {
  save_owned_checkpoint(output_dir, parts, owned_state());
}

void WholeTensorShardedDataParallel::load_checkpoint(const std::string& dir,
                                                     const CheckpointParts& parts) {
  load_owned_checkpoint(dir, parts, owned_state());
}

void WholeTensorShardedDataParallel::load_checkpoint_weights(torch::nn::Module& module,
                                                             const std::string& dir,
                                                             amp::MasterWeights* masters) {
  if (sharded::is_sharded_checkpoint(dir)) {
    load_owned_shard_weights(dir, owned_state(), masters);
    return;
  }
  std::unordered_map<const c10::TensorImpl*, std::size_t> position;
  for (std::size_t k = 0; k < views_.size(); ++k) {
    if (views_[k].defined()) position.emplace(views_[k].unsafeGetTensorImpl(), k);
  }
  // Each process reads its own elements and masters: agreed, so that one that fails stops all.
  checkpoint_io().load(dir, [&] {
    Strategy::load_checkpoint_weights(module, dir, nullptr);
    if (masters == nullptr) return;
    load_owned_masters(
        dir, *masters, [&](const torch::Tensor& p) { return position.at(p.unsafeGetTensorImpl()); },
        views_.size());
  });
}

}  // namespace mantissa::detail
