// StateShardedDataParallel's checkpoints: the whole state put together on rank 0 and cut again
// by owner (`ProcessGroupStrategy::save_owned_state`, src/trainer/owned_state.cpp).
#include <unordered_map>

#include "trainer/state_sharded_data_parallel.h"

namespace mantissa::detail {

ProcessGroupStrategy::OwnedState StateShardedDataParallel::owned_state() const {
  OwnedState state;
  state.optimizer = optimizer_.get();
  state.plan = plan_;
  state.whole_params = [this] { return module_->parameters(); };
  // `whole_params` gives the module's own parameters, which `owned_by` filters: the
  // `params` it is handed are always those.
  state.owned_by = [this](std::int64_t owner, const std::vector<torch::Tensor>& /*params*/) {
    return owned_by(owner);
  };
  return state;
}

void StateShardedDataParallel::save_checkpoint(const std::string& output_dir,
                                               const CheckpointParts& parts) {
  save_owned_state(output_dir, parts, owned_state());
}

void StateShardedDataParallel::load_checkpoint(const std::string& dir,
                                               const CheckpointParts& parts) {
  load_owned_state(dir, parts, owned_state());
}

void StateShardedDataParallel::load_checkpoint_weights(torch::nn::Module& module,
                                                       const std::string& dir,
                                                       amp::MasterWeights* masters) {
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
