// StateShardedDataParallel's checkpoints: the whole state put together on rank 0 and cut again
// by owner (`ProcessGroupStrategy::save_owned_state`, src/trainer/owned_state.cpp), or each
// process's own files (`save_owned_shards`, src/trainer/owned_shards.cpp).
#include <unordered_map>

#include "io/filesystem.h"
#include "trainer/sharded/shard_files.h"
#include "trainer/state_sharded_data_parallel.h"

namespace mantissa::detail {

ProcessGroupStrategy::OwnedState StateShardedDataParallel::owned_state() {
  OwnedState state;
  state.optimizer = optimizer_.get();
  state.plan = plan_;
  state.whole_params = [this] { return module_->parameters(); };
  // `whole_params` gives the module's own parameters, which `owned_by` filters: the
  // `params` it is handed are always those.
  state.owned_by = [this](std::int64_t owner, const std::vector<torch::Tensor>& /*params*/) {
    return owned_by(owner);
  };
  state.described_params = [this] { return module_->parameters(); };
  state.own_params = [this] { return module_->parameters(); };
  state.stand_in = [](const torch::Tensor& described) {
    return torch::zeros_like(described, described.options().requires_grad(false))
        .requires_grad_(described.requires_grad());
  };
  state.sharded_state_dict = sharded_state_dict_;
  state.write_model_shards = [this](const std::string& folder) { write_model_shards(folder); };
  state.load_model_shards = [this](const std::string& dir) { load_model_shards(dir); };
  return state;
}

void StateShardedDataParallel::write_model_shards(const std::string& folder) const {
  std::unordered_map<const c10::TensorImpl*, std::int64_t> owner_of;
  for (std::size_t i = 0; i < trainable_.size(); ++i) {
    owner_of.emplace(trainable_[i].unsafeGetTensorImpl(), owners_[i]);
  }
  std::vector<sharded::TensorPiece> pieces;
  for (const auto& [name, tensor] : io::module_state_dict(*module_)) {
    // A parameter by its owner; buffers and frozen parameters, whole everywhere, by rank 0.
    const auto found = owner_of.find(tensor.unsafeGetTensorImpl());
    const auto writer = found != owner_of.end() ? found->second : 0;
    if (writer != rank()) continue;
    pieces.push_back({name, tensor.detach().reshape({-1}), tensor.sizes().vec(), 0});
  }
  sharded::write_shard_file(io::join_path(folder, sharded::kModelShardsFolder), rank(),
                            world_size(), pieces);
}

void StateShardedDataParallel::load_model_shards(const std::string& dir) {
  const sharded::ShardFolderSource source(io::join_path(dir, sharded::kModelShardsFolder));
  io::NamedTensors state;
  for (const auto& name : source.names()) state.emplace_back(name, source.read_whole(name));
  load_model_state_dict(*module_, state, source.origin());
}

void StateShardedDataParallel::save_checkpoint(const std::string& output_dir,
                                               const CheckpointParts& parts) {
  save_owned_checkpoint(output_dir, parts, owned_state());
}

void StateShardedDataParallel::load_checkpoint(const std::string& dir,
                                               const CheckpointParts& parts) {
  load_owned_checkpoint(dir, parts, owned_state());
}

void StateShardedDataParallel::load_checkpoint_weights(torch::nn::Module& module,
                                                       const std::string& dir,
                                                       amp::MasterWeights* masters) {
  if (sharded::is_sharded_checkpoint(dir)) {
    load_owned_shard_weights(dir, owned_state(), masters);
    return;
  }
  const auto params = module.parameters();
  std::unordered_map<const c10::TensorImpl*, std::size_t> index;
  for (std::size_t i = 0; i < params.size(); ++i) index.emplace(params[i].unsafeGetTensorImpl(), i);
  // Each process checks its own masters: agreed, so that one that fails stops all.
  checkpoint_io().load(dir, [&] {
    Strategy::load_checkpoint_weights(module, dir, nullptr);
    if (masters == nullptr) return;
    load_owned_masters(
        dir, *masters, [&](const torch::Tensor& p) { return index.at(p.unsafeGetTensorImpl()); },
        params.size());
  });
}

}  // namespace mantissa::detail
