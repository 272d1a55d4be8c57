#include "trainer/state_sharded_data_parallel.h"

#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <mantissa/amp/autocast.h>
#include <mantissa/clip_grad.h>
#include <mantissa/distributed.h>

#include "trainer/optimizer_state_report.h"
#include "trainer/sharded/tensor_owners.h"

namespace mantissa::detail {

StateShardedDataParallel::StateShardedDataParallel(std::shared_ptr<Collectives> collectives,
                                                   const TrainingArguments& args,
                                                   const FsdpSettings& settings)
    : DataParallel(std::move(collectives), args),
      sharded_state_dict_(settings.sharded_state_dict) {}

StateShardedDataParallel::~StateShardedDataParallel() = default;

std::string StateShardedDataParallel::describe() const {
  return fmt::format(
      " x {} processes ({}, rank {}, fsdp shard_grad_op: optimizer state sharded by whole "
      "tensors, gradients averaged whole)",
      world_size(), distributed::backend_name(collectives().backend()), rank());
}

void StateShardedDataParallel::prepare_model(torch::nn::Module& module) {
  DataParallel::prepare_model(module);
  module_ = &module;
  trainable_.clear();
  std::vector<std::int64_t> numels;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : module.parameters()) {
    // A tensor registered under two names (tied weights) has one owner.
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    trainable_.push_back(p);
    numels.push_back(p.numel());
  }
  owners_ = sharded::assign_tensor_owners(numels, world_size());
  // Each owner's tensors, detached (broadcast into in place), in the module's order.
  owned_tensors_.assign(static_cast<std::size_t>(world_size()), {});
  for (std::size_t i = 0; i < trainable_.size(); ++i) {
    owned_tensors_[static_cast<std::size_t>(owners_[i])].push_back(trainable_[i].detach());
  }
}

OptimizerParams StateShardedDataParallel::owned_by(std::int64_t owner) const {
  std::unordered_map<const c10::TensorImpl*, std::int64_t> owner_of;
  for (std::size_t i = 0; i < trainable_.size(); ++i) {
    owner_of.emplace(trainable_[i].unsafeGetTensorImpl(), owners_[i]);
  }
  const auto mine = [&](const torch::Tensor& p) {
    const auto found = owner_of.find(p.unsafeGetTensorImpl());
    return found != owner_of.end() && (owner == OwnedState::kEveryOwner || found->second == owner);
  };
  const auto whole = weight_decay_params(module_->parameters(), module_);
  OptimizerParams out;
  out.first_group_decays = whole.first_group_decays;
  out.groups.resize(whole.groups.size());
  out.names.resize(whole.names.size());
  for (std::size_t g = 0; g < whole.groups.size(); ++g) {
    for (std::size_t i = 0; i < whole.groups[g].size(); ++i) {
      if (!mine(whole.groups[g][i])) continue;
      out.groups[g].push_back(whole.groups[g][i]);
      if (g < whole.names.size()) out.names[g].push_back(whole.names[g][i]);
    }
  }
  for (const auto& p : whole.in_order) {
    if (mine(p)) out.in_order.push_back(p);
  }
  return out;
}

OptimizerParams StateShardedDataParallel::optimizer_params(torch::nn::Module& module) {
  TORCH_CHECK_VALUE(module_ == &module,
                    "StateShardedDataParallel: prepare_model saw another module");
  TORCH_CHECK_VALUE(!trainable_.empty(), "the model has no parameter that requires grad");
  return owned_by(rank());
}

std::optional<std::string> StateShardedDataParallel::optimizer_factory_blocker() const {
  return owned_state_factory_blocker("fsdp shard_grad_op");
}

void StateShardedDataParallel::setup_optimizer(OptimizerSetup& built, const PrecisionPlan& plan,
                                               amp::GradScaler& scaler) {
  TORCH_INTERNAL_ASSERT(module_ != nullptr,
                        "StateShardedDataParallel: prepare_model was not called");
  plan_ = plan;
  optimizer_ = built.optimizer.optimizer;
  // The order a DDP run's optimizer lists the tensors in: the order its gradient norm sums
  // the per-tensor norms in. Building it allocates no state.
  slot_params_ =
      make_trainer_optimizer(args(), owned_by(OwnedState::kEveryOwner), /*masters=*/nullptr,
                             plan.low_precision_update, /*factory=*/{})
          .params;
  slot_has_grad_.assign(slot_params_.size(), false);
  const auto device = slot_params_.empty() ? collectives().device() : slot_params_.front().device();
  // This process's tensors are the module's own, listed there as they are.
  norms_ = own_whole_tensors(
      built, plan, scaler, slot_params_,
      [](const torch::Tensor& p) { return p.unsafeGetTensorImpl(); }, device);
}

void StateShardedDataParallel::finish_gradients() {
  // Every process has every averaged gradient now: which tensors have one is known here,
  // without asking the others; then the owners alone keep theirs.
  for (std::size_t k = 0; k < slot_params_.size(); ++k) {
    slot_has_grad_[k] = slot_params_[k].grad().defined();
  }
  for (std::size_t i = 0; i < trainable_.size(); ++i) {
    if (owners_[i] != rank()) trainable_[i].mutable_grad().reset();
  }
}

torch::Tensor StateShardedDataParallel::clip_grad_norm_(const std::vector<torch::Tensor>& params,
                                                        double max_norm) {
  return norms_.clip_(params, max_norm, slot_has_grad_,
                      [this](at::Tensor& packed) { sum_over_processes_(packed); });
}

void StateShardedDataParallel::after_optimizer_step() {
  for (std::size_t owner = 0; owner < owned_tensors_.size(); ++owner) {
    collectives().broadcast_tensors(owned_tensors_[owner], static_cast<std::int64_t>(owner));
  }
}

std::string StateShardedDataParallel::describe_optimizer_state() const {
  std::vector<std::int64_t> numels;
  std::int64_t total = 0;
  std::int64_t tensors = 0;
  for (std::size_t i = 0; i < trainable_.size(); ++i) {
    numels.push_back(trainable_[i].numel());
    total += numels.back();
    if (owners_[i] == rank()) ++tensors;
  }
  const auto mine = sharded::owned_elements(numels, owners_, world_size());
  return fmt::format(
      "mantissa: optimizer state per process: rank {} owns {} of {} tensors ({} of {} "
      "elements) and alone keeps their optimizer state{}; every process holds the whole model "
      "and its averaged gradients, as data parallel does",
      rank(), tensors, trainable_.size(), mine.at(static_cast<std::size_t>(rank())), total,
      plan_.weights == WeightsMode::kFp32Masters ? " and fp32 masters" : "");
}

}  // namespace mantissa::detail
