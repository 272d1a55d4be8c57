// Checkpoints of the strategies whose processes each own whole tensors (the sharding by whole
// tensors: `StateShardedDataParallel` under shard_grad_op, `WholeTensorShardedDataParallel`
// under full sharding): the owners' optimizer state and masters put together on rank 0 into the
// optimizer a data-parallel run holds (FULL_STATE_DICT), and cut again by owner on load, at
// whatever number of processes. Each process's share travels as the bytes of a LibTorch archive
// of its own optimizer (as its `save` writes it) and of its masters; rank 0 builds the same
// optimizer over that process's tensors to read or write it, so any optimizer whose state is
// per tensor travels without code of its own.
#include <unordered_map>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <mantissa/amp/autocast.h>
#include <mantissa/optim/low_precision_update.h>

#include "io/archive_file.h"
#include "io/filesystem.h"
#include "io/torch_load.h"
#include "trainer/owned_archive.h"
#include "trainer/param_group_options.h"
#include "trainer/process_group_strategy.h"

namespace mantissa::detail {
namespace {

using OwnedState = ProcessGroupStrategy::OwnedState;

// Moves the state of each of `tensors` from `from` to `to` (the state is keyed by the tensor).
void move_state(torch::optim::Optimizer& from, torch::optim::Optimizer& to,
                const std::vector<torch::Tensor>& tensors) {
  for (const auto& t : tensors) {
    auto* key = t.unsafeGetTensorImpl();
    const auto found = from.state().find(key);
    if (found == from.state().end()) continue;
    to.state()[key] = std::move(found->second);
    from.state().erase(key);
  }
}

// The optimizer (and masters) a data-parallel run of `args` holds, over `params`.
OptimizerSetup whole_optimizer(const TrainingArguments& args, const OwnedState& state,
                               const std::vector<torch::Tensor>& params) {
  return data_parallel_optimizer(args, state.plan, params,
                                 state.owned_by(OwnedState::kEveryOwner, params), *state.optimizer);
}


// The packed state of the owner of `owned` moved into `whole` (rank 0).
void unpack_into_whole(const TrainingArguments& args, const OwnedState& state,
                       const OptimizerParams& owned, const std::string& bytes,
                       OptimizerSetup& whole) {
  torch::serialize::InputArchive archive;
  // Read on the CPU: the tensors were saved from the owner's device, which may be another GPU;
  // `load` moves them to the parameters' device.
  archive.load_from(bytes.data(), bytes.size(), torch::kCPU);
  // The owner's optimizer, rebuilt over the whole optimizer's tensors for the owner's share,
  // reads the owner's archive; its state then moves to the whole optimizer.
  auto part =
      make_trainer_optimizer(args, owned, whole.masters.get(), state.plan.low_precision_update, {});
  torch::serialize::InputArchive saved_state;
  archive.read("optimizer", saved_state);
  part.optimizer->load(saved_state);
  move_state(*part.optimizer, *whole.optimizer.optimizer, part.params);
  torch::serialize::InputArchive saved_masters;
  if (whole.masters == nullptr || !archive.try_read("masters", saved_masters)) return;
  // The owner saved the masters of exactly these tensors, in this order.
  std::vector<std::size_t> positions(owned.in_order.size());
  for (std::size_t k = 0; k < positions.size(); ++k) positions[k] = k;
  whole.masters->load(saved_masters, owned.in_order, positions, positions.size());
}

// The share of `whole`'s state (taken out of it) of the owner of `owned`, as bytes for it.
std::string pack_for(const TrainingArguments& args, const OwnedState& state,
                     const OptimizerParams& owned, OptimizerSetup& whole) {
  auto part =
      make_trainer_optimizer(args, owned, whole.masters.get(), state.plan.low_precision_update, {});
  move_state(*whole.optimizer.optimizer, *part.optimizer, part.params);
  // The checkpoint's options (which optimizer.pt restored), not the arguments'.
  copy_param_group_options(*whole.optimizer.optimizer, *part.optimizer);
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive saved_state;
  part.optimizer->save(saved_state);
  archive.write("optimizer", saved_state);
  if (whole.masters != nullptr) {
    // What the owner's MasterWeights, built over these tensors, saves and loads.
    torch::serialize::OutputArchive saved_masters;
    whole.masters->save(saved_masters, owned.in_order);
    archive.write("masters", saved_masters);
  }
  return io::archive_bytes(archive);
}

// Loads bytes `pack_for` made into this process's optimizer and masters.
void unpack_own_state(const std::string& bytes, torch::optim::Optimizer& optimizer,
                      amp::MasterWeights* masters) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size(), torch::kCPU);  // rank 0's device: see above
  torch::serialize::InputArchive saved_state;
  archive.read("optimizer", saved_state);
  optimizer.load(saved_state);
  torch::serialize::InputArchive saved_masters;
  if (masters != nullptr && archive.try_read("masters", saved_masters)) {
    masters->load(saved_masters);
  }
}

}  // namespace

void ProcessGroupStrategy::save_owned_state(const std::string& output_dir,
                                            const CheckpointParts& parts, const OwnedState& state) {
  // Every process's share reaches rank 0, one owner after another; packed first everywhere, so
  // that a process that cannot pack stops them all rather than leaving them waiting.
  std::string mine;
  const bool packed =
      passed_everywhere([&] {
        auto archive = own_state_archive(*state.optimizer, parts.masters);
        mine = io::archive_bytes(archive);
      });
  TORCH_CHECK(packed, "rank ", rank(), ": saving ", checkpoint_name(parts.state->global_step),
              " failed while a process packed its share of the optimizer state (see its error)");
  auto shares = collectives().gather_bytes(mine);  // rank 0: one per owner
  std::string().swap(mine);  // its memory too, not only its length
  OptimizerSetup whole;
  const bool built = passed_everywhere([&] {
    if (rank() != 0) return;
    const auto params = state.whole_params();
    whole = whole_optimizer(args(), state, params);
    for (std::int64_t owner = 0; owner < world_size(); ++owner) {
      auto& share = shares[static_cast<std::size_t>(owner)];
      unpack_into_whole(args(), state, state.owned_by(owner, params), share, whole);
      std::string().swap(share);
    }
  });
  shares = {};  // the packed shares live on in `whole` alone while it is written
  TORCH_CHECK(built, "rank ", rank(), ": saving ", checkpoint_name(parts.state->global_step),
              " failed while rank 0 put the optimizer state together (see its error)");
  CheckpointParts unsharded = parts;
  unsharded.optimizer = whole.optimizer.optimizer.get();
  unsharded.masters = whole.masters.get();
  Strategy::save_checkpoint(output_dir, unsharded);
}

void ProcessGroupStrategy::load_owned_state(const std::string& dir, const CheckpointParts& parts,
                                            const OwnedState& state) {
  // Every process loads the model and the run's files; rank 0 alone reads optimizer.pt (and
  // master_weights.pt) into the whole optimizer, checked as a data-parallel run checks it.
  const auto through_strategy = loading_through_strategy(parts);
  OptimizerSetup whole;
  std::vector<torch::Tensor> params;
  checkpoint_io().load(
      dir,
      [&] {
        check_not_sharded(dir);
        CheckpointParts here = through_strategy;
        here.optimizer = nullptr;
        here.masters = nullptr;
        if (rank() == 0) {
          params = state.whole_params();
          whole = whole_optimizer(args(), state, params);
          here.optimizer = whole.optimizer.optimizer.get();
          here.masters = whole.masters.get();
        }
        detail::load_checkpoint(dir, here);
      },
      /*whose_error=*/"rank 0's");
  std::vector<std::string> shares;
  const bool packed = passed_everywhere([&] {
    if (rank() != 0) return;
    for (std::int64_t owner = 0; owner < world_size(); ++owner) {
      shares.push_back(pack_for(args(), state, state.owned_by(owner, params), whole));
    }
  });
  TORCH_CHECK(packed, "rank ", rank(), ": resuming from '", dir,
              "' failed while rank 0 cut the optimizer state by owner (see its error)");
  whole = {};
  params.clear();
  const auto mine = collectives().scatter_bytes(shares);
  shares.clear();
  const bool loaded =
      passed_everywhere([&] { unpack_own_state(mine, *state.optimizer, parts.masters); });
  TORCH_CHECK(loaded, "rank ", rank(), ": resuming from '", dir,
              "' failed while a process loaded its share of the optimizer state (see its error)");
  // The learning rates the checkpoint's schedule had set, as optimizer.pt restores them.
  set_learning_rates(*state.optimizer, parts.scheduler->get_last_lr());
}

void ProcessGroupStrategy::load_owned_masters(
    const std::string& dir, amp::MasterWeights& masters,
    const std::function<std::size_t(const torch::Tensor&)>& position, std::size_t count) {
  const auto path = io::join_path(dir, "master_weights.pt");
  if (!io::path_exists(path)) {
    masters.copy_model_to_masters();
    return;
  }
  torch::serialize::InputArchive archive;
  io::load_torch_archive(path, archive, torch::kCPU);
  const auto& own = masters.model_params();
  std::vector<std::size_t> positions;
  for (const auto& p : own) positions.push_back(position(p));
  try {
    masters.load(archive, own, positions, count);
  } catch (const c10::ValueError& error) {
    TORCH_CHECK_VALUE(false, "'", path, "': ", error.what_without_backtrace());
  }
}

sharded::OwnedTensorNorms ProcessGroupStrategy::own_whole_tensors(
    const OptimizerSetup& built, const PrecisionPlan& plan, amp::GradScaler& scaler,
    const std::vector<torch::Tensor>& whole_order,
    const std::function<const c10::TensorImpl*(const torch::Tensor&)>& in_whole,
    c10::Device device) {
  std::unordered_map<const c10::TensorImpl*, std::size_t> place;
  std::vector<c10::ScalarType> dtypes;  // each gradient's, as data parallel norms it
  for (std::size_t j = 0; j < whole_order.size(); ++j) {
    const auto& p = whole_order[j];
    place.emplace(p.unsafeGetTensorImpl(), j);
    const bool master =
        plan.weights == WeightsMode::kFp32Masters && amp::is_low_precision(p.scalar_type());
    dtypes.push_back(master ? c10::kFloat : p.scalar_type());
  }
  // Each of this process's optimizer tensors (a model tensor, or its master) to its model tensor.
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> model_of;
  if (built.masters != nullptr) {
    const auto& models = built.masters->model_params();
    const auto& masters = built.masters->master_params();
    for (std::size_t i = 0; i < models.size(); ++i) {
      model_of.emplace(masters[i].unsafeGetTensorImpl(), models[i]);
    }
  }
  std::vector<std::size_t> slots;
  for (const auto& t : built.optimizer.params) {
    const auto found = model_of.find(t.unsafeGetTensorImpl());
    slots.push_back(place.at(in_whole(found != model_of.end() ? found->second : t)));
  }
  if (auto* rules = dynamic_cast<optim::LowPrecisionRules*>(built.optimizer.optimizer.get())) {
    rules->set_rounding_indices(std::vector<std::uint32_t>(slots.begin(), slots.end()));
  }
  scaler.set_found_inf_reduction([this](at::Tensor& found_inf) {
    auto flat = found_inf.view({1});
    max_all_reduce_(flat);
  });
  return sharded::OwnedTensorNorms(std::move(slots), std::move(dtypes), device);
}

std::string ProcessGroupStrategy::owned_state_factory_blocker(const char* mode) {
  return std::string(mode) +
         " shards this optimizer's state by whole tensors and builds it from the arguments for "
         "every process's share of them to put a checkpoint together; train without "
         "set_optimizer_factory (choose the optimizer with --optim)";
}

void ProcessGroupStrategy::sum_over_processes_(at::Tensor& tensor) const {
  std::vector<at::Tensor> tensors{tensor.to(collectives().device())};
  collectives().group()->allreduce(tensors)->wait();  // ReduceOp::SUM
  tensor = tensors.front().to(tensor.device());
}

torch::serialize::OutputArchive own_state_archive(const torch::optim::Optimizer& optimizer,
                                                  const amp::MasterWeights* masters) {
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive state;
  optimizer.save(state);
  archive.write("optimizer", state);
  if (masters != nullptr) {
    torch::serialize::OutputArchive saved_masters;
    masters->save(saved_masters);
    archive.write("masters", saved_masters);
  }
  return archive;
}

}  // namespace mantissa::detail
