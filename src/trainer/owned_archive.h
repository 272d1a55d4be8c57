#pragma once
// One process's share of the optimizer state under the sharding by whole tensors, as a LibTorch
// archive: what travels to rank 0 for a FULL_STATE_DICT checkpoint (owned_state.cpp) and what
// each process writes for a SHARDED_STATE_DICT one (owned_shards.cpp).

#include <torch/optim/optimizer.h>
#include <torch/serialize/output-archive.h>

#include <mantissa/amp/master_weights.h>

namespace mantissa::detail {

/// An archive of `optimizer`'s state as its `save` writes it (under "optimizer") and, when
/// given, of `masters` (under "masters"). Host-side; copies device tensors to the host when the
/// archive is serialized.
torch::serialize::OutputArchive own_state_archive(const torch::optim::Optimizer& optimizer,
                                                  const amp::MasterWeights* masters);

}  // namespace mantissa::detail
