#include "trainer/sharded_data_parallel.h"

#include <limits>
#include <unordered_map>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fmt/format.h>

#include <mantissa/distributed.h>
#include <mantissa/nn/supports_gradient_checkpointing.h>

#include "trainer/optimizer_state_report.h"

namespace mantissa::detail {

/// Runs the model's blocks through the units that hold their parameters; a block that is no
/// unit (its parameters are the root's, gathered for the whole forward) runs directly.
class UnitRunner final : public nn::BlockRunner {
 public:
  explicit UnitRunner(const std::vector<sharded::BlockUnit>& blocks) {
    for (std::size_t b = 0; b < blocks.size(); ++b) unit_of_[blocks[b].module] = b + 1;
  }
  /// The units, once made (before that, blocks run directly: nothing is sharded yet).
  void attach(sharded::ParameterUnits* units) { units_ = units; }
  at::Tensor run(const torch::nn::Module& block, const nn::BlockFunction& fn,
                 const at::Tensor& x) override {
    const auto found = unit_of_.find(&block);
    if (units_ == nullptr || found == unit_of_.end()) return fn(x);
    return units_->run_block(found->second, fn, x);
  }

 private:
  std::unordered_map<const torch::nn::Module*, std::size_t> unit_of_;
  sharded::ParameterUnits* units_ = nullptr;
};

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

}  // namespace

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<Collectives> collectives,
                                         const TrainingArguments& args,
                                         const FsdpSettings& settings, bool whole_tensors)
    : ProcessGroupStrategy(std::move(collectives), args),
      settings_(settings),
      whole_tensors_(whole_tensors) {
  TORCH_INTERNAL_ASSERT(settings_.enabled, "ShardedDataParallel: fsdp is off");
  TORCH_INTERNAL_ASSERT(!whole_tensors_ || full(),
                        "ShardedDataParallel: whole tensors per shard under full sharding only");
}

ShardedDataParallel::~ShardedDataParallel() {
  if (runner_ == nullptr) return;
  runner_->attach(nullptr);
  // The Trainer holds the model, so it is still there: its blocks run directly again.
  if (auto* model = dynamic_cast<nn::SupportsGradientCheckpointing*>(module_)) {
    model->set_block_runner(nullptr);
  }
}

std::string ShardedDataParallel::describe() const {
  const auto where = fmt::format(" x {} processes ({}, rank {}, ", world_size(),
                                 distributed::backend_name(collectives().backend()), rank());
  if (!full()) return where + "fsdp shard_grad_op: gradients and optimizer state sharded)";
  return where + fmt::format(
                     "fsdp full sharding: parameters, gradients and optimizer state "
                     "sharded, gathered per unit: {} block(s) and the root)",
                     blocks_.size());
}

void ShardedDataParallel::prepare_model(torch::nn::Module& module) {
  // Full sharding: small broadcast buckets, since each is a transient copy of that much model.
  agree_on_model(module, /*with_buffers=*/true,
                 full() ? std::size_t{16} << 20 : std::size_t{250} << 20);
  module_ = &module;
  if (!full()) return;
  auto* model = dynamic_cast<nn::SupportsGradientCheckpointing*>(&module);
  const auto declared = model != nullptr ? model->no_split_modules() : std::vector<std::string>{};
  // Found everywhere before anyone stops: a bad class name fails on every rank alike.
  blocks_ = sharded::find_block_units(module, settings_, declared);
  std::string listed;
  for (const auto& block : blocks_) listed += block.name + " (" + block.class_name + ") ";
  check_same_text(listed, "the blocks fsdp shards one at a time");
  if (blocks_.empty()) {
    TORCH_WARN_ONCE("fsdp: ", module.name(),
                    " has no block to shard one at a time (its no_split_modules() names none, "
                    "or fsdp_config's policy takes none), so the whole model is one unit, "
                    "gathered for each forward and backward; declare the blocks "
                    "(docs/distributed.md, \"Declaring blocks\") to hold less");
    return;
  }
  TORCH_CHECK_VALUE(model != nullptr, "fsdp: ", module.name(),
                    " has blocks to shard but does not derive from "
                    "mantissa::nn::SupportsGradientCheckpointing, through whose run_block the "
                    "Trainer gathers each block (docs/distributed.md, \"Declaring blocks\")");
  runner_ = std::make_shared<UnitRunner>(blocks_);
  model->set_block_runner(runner_);
}

ForwardScope ShardedDataParallel::forward_context(const ForwardPass& pass) {
  if (pass.training) {
    TORCH_INTERNAL_ASSERT(grads_ != nullptr, "ShardedDataParallel: setup_optimizer was not called");
  }
  if (units_ == nullptr) return {};
  units_->check_blocks_ran();
  units_->begin_forward();
  return ForwardScope(
      [units = units_.get(), training = pass.training] { units->end_forward(training); });
}

void ShardedDataParallel::before_backward(const torch::Tensor& /*loss*/, bool sync) {
  if (units_ != nullptr) units_->check_blocks_ran();
  grads_->prepare_for_backward(sync);
}

bool ShardedDataParallel::run_step(const std::function<bool()>& step) const {
  if (units_ == nullptr || units_->forward_ended()) {
    return collectives().guarded("reduce-scattering the gradients or gathering the weights", step);
  }
  // The first step: an error there is most often a block's parameter read outside run_block,
  // where it is empty; say so beside the op's own words.
  return collectives().guarded("reduce-scattering the gradients or gathering the weights", [&] {
    try {
      return step();
    } catch (const c10::Error& error) {
      TORCH_CHECK(false, error.what_without_backtrace(),
                  "\n(fsdp full sharding: outside run_block a block's parameters have no "
                  "elements; if the model reads one of ",
                  blocks_.size(),
                  " blocks' parameters elsewhere, run that code inside the block's run_block "
                  "call; docs/distributed.md, \"Declaring blocks\")");
    }
  });
}

std::optional<std::string> ShardedDataParallel::cuda_graph_blocker() const {
  return std::string(
      "this run shards the gradients and optimizer state (fsdp shard_grad_op): the gradients "
      "are reduce-scattered from autograd hooks with host-side bucket bookkeeping, which a "
      "captured graph would not replay");
}

OptimizerParams ShardedDataParallel::flatten_parameters(torch::nn::Module& module) {
  TORCH_CHECK_VALUE(module_ == &module, "ShardedDataParallel: prepare_model saw another module");
  const auto whole = weight_decay_params(module.parameters(), nullptr);
  TORCH_CHECK_VALUE(!whole.groups.empty(), "the model has no parameter that requires grad");
  const auto& group = collectives().group();
  if (full()) {
    auto inputs = unit_inputs(whole.groups);
    // Whole tensors: one bucket per unit (and dtype), whatever the groups, so that the owners
    // of a block's matrices and of its norms share one shard size. The optimizer's groups come
    // from the parameters themselves (WholeTensorShardedDataParallel), not from the buckets.
    if (whole_tensors_) {
      for (auto& input : inputs) input.group = 0;
    }
    flat_ = std::make_unique<sharded::FlatParameters>(
        inputs, rank(), world_size(), std::numeric_limits<std::int64_t>::max(),
        sharded::FlatStorage::kShardsOnly, whole_tensors_);
    // The global norm sums the per-parameter norms in data parallel's order: group by group.
    std::unordered_map<const c10::TensorImpl*, std::size_t> index;
    for (std::size_t i = 0; i < inputs.size(); ++i)
      index[inputs[i].tensor.unsafeGetTensorImpl()] = i;
    std::vector<std::size_t> order;
    for (const auto& params : whole.groups) {
      for (const auto& p : params) order.push_back(index.at(p.unsafeGetTensorImpl()));
    }
    flat_->set_norm_order(std::move(order));
    std::vector<std::string> names{"the root"};
    for (const auto& block : blocks_) names.push_back(block.name);
    units_ = std::make_unique<sharded::ParameterUnits>(*flat_, group, std::move(names));
    if (runner_ != nullptr) runner_->attach(units_.get());
#if defined(__GLIBC__)
    // The parameters' original storage is freed now; glibc keeps large freed chunks in its
    // heap (its mmap threshold grows with each one), so hand them back to the system.
    malloc_trim(0);
#endif
  } else {
    flat_ = std::make_unique<sharded::FlatParameters>(whole.groups, rank(), world_size(),
                                                      args().resolved_ddp_bucket_cap_mb() * kMiB);
  }
  return whole;
}

OptimizerParams ShardedDataParallel::optimizer_params(torch::nn::Module& module) {
  const auto whole = flatten_parameters(module);
  // This process's shard of each bucket, in bucket order, and grouped as the buckets are.
  OptimizerParams shards;
  shards.first_group_decays = whole.first_group_decays;
  shards.groups.resize(flat_->num_groups());
  const auto& buckets = flat_->layout().buckets;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    auto shard = flat_->shard(b);
    shards.groups.at(buckets[b].group).push_back(shard);
    shards.in_order.push_back(std::move(shard));
  }
  return shards;
}

std::optional<std::string> ShardedDataParallel::optimizer_factory_blocker() const {
  return std::string(
      "fsdp builds mantissa's FusedAdamW from the arguments over each process's shard of the "
      "parameters, and gathers its state into the same optimizer for a checkpoint; train "
      "without set_optimizer_factory (choose the optimizer with --optim)");
}

void ShardedDataParallel::setup_optimizer(OptimizerSetup& built, const PrecisionPlan& plan,
                                          amp::GradScaler& scaler) {
  TORCH_INTERNAL_ASSERT(flat_ != nullptr, "ShardedDataParallel: optimizer_params was not called");
  auto fused = std::dynamic_pointer_cast<optim::FusedAdamW>(built.optimizer.optimizer);
  const auto& built_optimizer = *built.optimizer.optimizer;
  TORCH_CHECK_VALUE(fused != nullptr,
                    "fsdp shards the state of mantissa's FusedAdamW (optim adamw_torch_fused), "
                    "over each process's flat shards of the parameters; the optimizer built "
                    "for this run is ",
                    c10::demangle(typeid(built_optimizer).name()),
                    ", whose state fsdp cannot shard");
  plan_ = plan;
  // Full sharding: two buckets' inputs in flight at most (a whole gradient otherwise).
  grads_ = std::make_unique<sharded::GradientReduceScatter>(*flat_, collectives().group(),
                                                            /*max_in_flight=*/full() ? 2 : 0);
  shards_ = std::make_unique<sharded::ShardedAdamW>(*flat_, *grads_, std::move(fused),
                                                    built.masters.get(), collectives().group());
  // The wrapper keeps the masters' tensors; the engine must not treat them as its own.
  built.masters.reset();
  scaler.set_found_inf_reduction(
      [shards = shards_.get()](at::Tensor& found_inf) { shards->agree_found_inf_(found_inf); });
  built.optimizer.params = shards_->shard_params();
}

std::vector<sharded::FlatInput> ShardedDataParallel::unit_inputs(
    const std::vector<std::vector<torch::Tensor>>& groups) const {
  std::unordered_map<const c10::TensorImpl*, std::size_t> group_of;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g]) group_of[p.unsafeGetTensorImpl()] = g;
  }
  std::unordered_map<const c10::TensorImpl*, std::size_t> unit_of;
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    for (const auto& p : blocks_[b].module->parameters()) unit_of[p.unsafeGetTensorImpl()] = b + 1;
  }
  // Per unit, per group, in the module's parameter order.
  std::vector<std::vector<std::vector<torch::Tensor>>> sorted(
      blocks_.size() + 1, std::vector<std::vector<torch::Tensor>>(groups.size()));
  for (const auto& p : module_->parameters()) {
    const auto g = group_of.find(p.unsafeGetTensorImpl());
    if (g == group_of.end()) continue;  // frozen: kept whole, as it is
    const auto u = unit_of.find(p.unsafeGetTensorImpl());
    sorted[u == unit_of.end() ? 0 : u->second][g->second].push_back(p);
  }
  std::vector<sharded::FlatInput> inputs;
  for (std::size_t u = 0; u < sorted.size(); ++u) {
    for (std::size_t g = 0; g < sorted[u].size(); ++g) {
      for (const auto& p : sorted[u][g]) inputs.push_back(sharded::FlatInput{p, g, u});
    }
  }
  return inputs;
}

void ShardedDataParallel::finish_gradients() {
  grads_->finish_backward();
  shards_->prepare_grads();
  if (units_ != nullptr) units_->finish();
}

torch::Tensor ShardedDataParallel::clip_grad_norm_(const std::vector<torch::Tensor>& /*params*/,
                                                   double max_norm) {
  return shards_->clip_grad_norm_(max_norm);
}

void ShardedDataParallel::after_optimizer_step() {
  if (!full()) shards_->all_gather_params();
}

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

ShardedDataParallel::HeldBytes ShardedDataParallel::held_bytes() const {
  HeldBytes held;
  for (const auto& bucket : flat_->layout().buckets) {
    const auto element = static_cast<std::int64_t>(c10::elementSize(bucket.dtype));
    held.shards += bucket.shard_numel * element;
    held.whole += bucket.numel * element;
  }
  for (std::size_t u = 1; units_ != nullptr && u < units_->size(); ++u) {
    held.largest_block_gather = std::max(held.largest_block_gather, units_->gathered_bytes(u));
  }
  return held;
}

std::string ShardedDataParallel::describe_optimizer_state() const {
  const auto [mine, unsharded] = optimizer_state_bytes();
  const auto& layout = flat_->layout();
  if (full()) {
    // Parameters and their gradients: shards here, whole tensors under data parallel.
    const auto held = held_bytes();
    return fmt::format(
        "mantissa: rank {} holds parameters {}, gradients {} and optimizer state {} (1/{} "
        "shards of {} units, {} padding elements); gathering adds the root's {} for a step "
        "and a block's {} at most (two blocks at once while the next one's gather overlaps); "
        "data parallel would hold {} + {} + {} on every process",
        rank(), bytes_text(held.shards), bytes_text(held.shards), bytes_text(mine), world_size(),
        units_->size(), layout.padding_numel(), bytes_text(units_->gathered_bytes(0)),
        bytes_text(held.largest_block_gather), bytes_text(held.whole), bytes_text(held.whole),
        bytes_text(unsharded));
  }
  return fmt::format(
      "mantissa: optimizer state per process {} (its 1/{} shard of {} buckets, {} padding "
      "elements in all); data parallel would hold {} on every process",
      bytes_text(mine), world_size(), layout.buckets.size(), layout.padding_numel(),
      bytes_text(unsharded));
}

}  // namespace mantissa::detail
