// ShardedDataParallel's saved state: the model's state dict gathered unit by unit, loads that
// write straight into this process's shards, and the checkpoints of both state dict types
// (FULL_STATE_DICT: rank 0 writes the files an unsharded run writes; SHARDED_STATE_DICT: each
// process writes its own pieces, sharded/shard_files.h).
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/filesystem.h"
#include "trainer/param_group_options.h"
#include "trainer/sharded/shard_files.h"
#include "trainer/sharded_data_parallel.h"

namespace mantissa::detail {

io::NamedTensors ShardedDataParallel::model_state_dict(const torch::nn::Module& module) const {
  if (units_ == nullptr) return Strategy::model_state_dict(module);
  // Unit by unit: no process ever holds more than one unit gathered (plus rank 0's copies).
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> copies;
  for (std::size_t u = 0; u < units_->size(); ++u) {
    units_->gather(u);
    if (should_save()) {
      for (const auto& p : units_->params(u)) {
        copies[p.unsafeGetTensorImpl()] = p.detach().to(torch::kCPU, /*non_blocking=*/false,
                                                        /*copy=*/true);
      }
    }
    units_->release(u);
  }
  if (!should_save()) return {};
  auto state = io::module_state_dict(module);
  for (auto& entry : state) {
    const auto copy = copies.find(entry.second.unsafeGetTensorImpl());
    if (copy != copies.end()) entry.second = copy->second;
  }
  return state;
}

void ShardedDataParallel::load_model_state_dict(torch::nn::Module& module,
                                                const io::NamedTensors& state,
                                                const std::string& origin) {
  if (units_ == nullptr) return Strategy::load_model_state_dict(module, state, origin);
  load_model_from(module, sharded::NamedTensorsSource(state, origin));
}

void ShardedDataParallel::load_model_file(torch::nn::Module& module, const std::string& path) {
  if (units_ == nullptr) return Strategy::load_model_file(module, path);
  load_model_from(module, sharded::SafetensorsSource(path));
}

std::vector<std::string> ShardedDataParallel::flat_param_names() const {
  std::unordered_map<const c10::TensorImpl*, std::string> name_of;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    name_of.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  std::vector<std::string> names;
  for (const auto& p : flat_->params()) names.push_back(name_of.at(p.unsafeGetTensorImpl()));
  return names;
}

void ShardedDataParallel::load_model_from(torch::nn::Module& module,
                                          const sharded::TensorSource& source) {
  TORCH_CHECK_VALUE(&module == module_, "ShardedDataParallel: a load into another module");
  const auto origin = source.origin();
  std::unordered_map<const c10::TensorImpl*, std::size_t> flat_index;
  for (std::size_t i = 0; i < flat_->params().size(); ++i) {
    flat_index.emplace(flat_->params()[i].unsafeGetTensorImpl(), i);
  }
  // Everything is checked before anything is copied, as load_state_dict(strict=True) does.
  const auto state = io::module_state_dict(module);
  std::set<std::string> expected;
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : state) {
    expected.insert(name);
    if (!source.contains(name)) missing.push_back(name);
  }
  for (const auto& name : source.names()) {
    if (expected.count(name) == 0) unexpected.push_back(name);
  }
  TORCH_CHECK_VALUE(
      missing.empty() && unexpected.empty(), "Error(s) in loading state_dict for ", module.name(),
      origin, ": Missing key(s) in state_dict: ", fmt::format("{}", fmt::join(missing, ", ")),
      "; Unexpected key(s) in state_dict: ", fmt::format("{}", fmt::join(unexpected, ", ")));
  for (const auto& [name, tensor] : state) {
    const auto flat = flat_index.find(tensor.unsafeGetTensorImpl());
    const auto shape = flat != flat_index.end() ? flat_->shape(flat->second) : tensor.sizes().vec();
    TORCH_CHECK_VALUE(source.shape(name) == shape, "size mismatch for ", name, ": the saved tensor",
                      origin, " has shape ", c10::IntArrayRef(source.shape(name)),
                      ", the model's has shape ", c10::IntArrayRef(shape));
    TORCH_CHECK_VALUE(source.dtype(name) == tensor.scalar_type(), "dtype mismatch for ", name,
                      ": the saved tensor", origin, " is ", source.dtype(name), ", the model's is ",
                      tensor.scalar_type());
  }
  torch::NoGradGuard no_grad;
  if (units_ != nullptr) units_->release_all();  // a gathered copy would hide the new values
  const auto names = flat_param_names();
  const auto& buckets = flat_->layout().buckets;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    auto shard = flat_->shard(b);
    for (const auto& slot : buckets[b].slots) {
      const auto piece = buckets[b].piece(slot, rank());
      if (!piece) continue;
      shard.narrow(0, piece->shard_offset, piece->numel)
          .copy_(source.read(names[slot.param], piece->param_offset, piece->numel));
    }
  }
  for (const auto& [name, tensor] : state) {
    if (flat_index.count(tensor.unsafeGetTensorImpl()) != 0) continue;
    auto target = tensor;  // a buffer or a frozen parameter: whole on every process
    target.copy_(source.read_whole(name));
  }
}

std::vector<torch::Tensor> ShardedDataParallel::whole_params(bool stand_ins) const {
  auto params = module_->parameters();
  if (!stand_ins) return params;
  std::unordered_map<const c10::TensorImpl*, std::size_t> index;
  for (std::size_t i = 0; i < flat_->params().size(); ++i) {
    index[flat_->params()[i].unsafeGetTensorImpl()] = i;
  }
  for (auto& p : params) {
    const auto found = index.find(p.unsafeGetTensorImpl());
    if (found == index.end()) continue;  // frozen: whole on every rank
    p = torch::zeros(flat_->shape(found->second), p.options().requires_grad(false))
            .requires_grad_(p.requires_grad());
  }
  return params;
}

OptimizerSetup ShardedDataParallel::unsharded_optimizer(
    const std::vector<torch::Tensor>& params) const {
  return data_parallel_optimizer(args(), plan_, params, weight_decay_params(params, nullptr),
                                 shards_->optimizer());
}

std::vector<std::size_t> ShardedDataParallel::module_positions() const {
  std::unordered_map<const c10::TensorImpl*, std::size_t> position;
  const auto module_params = module_->parameters();
  for (std::size_t k = 0; k < module_params.size(); ++k) {
    position[module_params[k].unsafeGetTensorImpl()] = k;
  }
  std::vector<std::size_t> positions;
  for (const auto& p : flat_->params()) positions.push_back(position.at(p.unsafeGetTensorImpl()));
  return positions;
}

std::vector<torch::Tensor> ShardedDataParallel::optimized_tensors(
    const OptimizerSetup& whole, const std::vector<torch::Tensor>& params) const {
  // params[k] stands for module_->parameters()[k].
  std::vector<torch::Tensor> tensors;
  for (const auto k : module_positions()) {
    const auto& param = params.at(k);
    tensors.push_back(whole.masters != nullptr ? whole.masters->master_of(param) : param);
  }
  return tensors;
}

void ShardedDataParallel::save_checkpoint(const std::string& output_dir,
                                          const CheckpointParts& parts) {
  if (settings_.sharded_state_dict) {
    // Rank 0 writes the files of the whole run; every process adds its own shards.
    const auto rest = sharded_run_files(parts);
    checkpoint_io().save(
        output_dir, parts.state->global_step,
        [&](const std::string& folder) { write_checkpoint_files(folder, rest, {}); },
        [&](const std::string& folder) { write_shards(folder); });
    return;
  }
  auto full = sharded::gather_full_state(*shards_);
  OptimizerSetup whole;
  const bool built = passed_everywhere([&] {
    if (rank() != 0) return;
    // Full sharding: the files keep no weights of the optimizer's tensors (model.safetensors
    // is gathered unit by unit, the masters come from their shards), so rank 0 builds the
    // unsharded optimizer over zero stand-ins instead of gathering the model.
    const auto params = whole_params(/*stand_ins=*/this->full());
    whole = unsharded_optimizer(params);
    const auto tensors = optimized_tensors(whole, params);
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
  const auto through_strategy = loading_through_strategy(parts);
  if (sharded::is_sharded_checkpoint(dir)) {
    checkpoint_io().load(dir, [&] {
      detail::load_checkpoint(dir, sharded_run_files(through_strategy));
      load_shards(dir, /*weights_only=*/false);
    });
    if (!full()) shards_->all_gather_params();
  } else {
    load_full_checkpoint(dir, through_strategy);
  }
  // The learning rates the checkpoint's schedule had set, as optimizer.pt restores them.
  set_learning_rates(shards_->optimizer(), parts.scheduler->get_last_lr());
}

void ShardedDataParallel::load_full_checkpoint(const std::string& dir,
                                               const CheckpointParts& through_strategy) {
  // Every process reads its elements of model.safetensors (load_model_file); rank 0 reads
  // optimizer.pt (and master_weights.pt) into an unsharded optimizer, over zero stand-ins
  // under full sharding, and cuts it into this run's shards.
  OptimizerSetup whole;
  std::vector<torch::Tensor> params;
  checkpoint_io().load(
      dir,
      [&] {
        CheckpointParts here = through_strategy;
        here.optimizer = nullptr;
        here.masters = nullptr;
        if (rank() == 0) {
          params = whole_params(/*stand_ins=*/full());
          whole = unsharded_optimizer(params);
          here.optimizer = whole.optimizer.optimizer.get();
          here.masters = whole.masters.get();
        }
        detail::load_checkpoint(dir, here);
      },
      /*whose_error=*/"rank 0's");
  // The options optimizer.pt restored on rank 0 (betas, eps, weight decay), on every process.
  const auto options = collectives().broadcast_bytes(
      rank() == 0 ? param_group_options_bytes(*whole.optimizer.optimizer) : std::string());
  load_param_group_options(shards_->optimizer(), options,
                           "'" + io::join_path(dir, "optimizer.pt") + "'");
  sharded::FullOptimizerState state;
  if (rank() == 0) {
    const auto tensors = optimized_tensors(whole, params);
    state = sharded::state_of(*whole.optimizer.fused, tensors);
    if (whole.masters != nullptr) {
      const auto positions = module_positions();
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        const bool own_master = tensors[i].is_same(params.at(positions[i]));
        state.masters.push_back(own_master ? torch::Tensor() : tensors[i]);
      }
    }
  }
  whole = {};
  params.clear();
  sharded::scatter_full_state(*shards_, state);
}

void ShardedDataParallel::load_checkpoint_weights(torch::nn::Module& module, const std::string& dir,
                                                  amp::MasterWeights* masters) {
  TORCH_INTERNAL_ASSERT(masters == nullptr, "ShardedDataParallel keeps the masters itself");
  checkpoint_io().load(dir, [&] {
    if (sharded::is_sharded_checkpoint(dir)) {
      load_shards(dir, /*weights_only=*/true);
    } else {
      Strategy::load_checkpoint_weights(module, dir, nullptr);
      // model.safetensors holds the rounded weights; FULL_STATE_DICT's master_weights.pt is
      // rank 0's whole file, so the masters follow the weights.
      shards_->copy_model_to_masters();
    }
  });
  if (!full()) shards_->all_gather_params();
}

}  // namespace mantissa::detail
