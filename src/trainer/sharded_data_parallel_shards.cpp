// ShardedDataParallel's SHARDED_STATE_DICT files: each process writes the elements of the
// parameters and of the optimizer state that its shards hold (model_shards/,
// optimizer_shards/, trainer/sharded/shard_files.h) and reads back the elements its shards
// hold now, from whichever files have them, at any number of processes.
#include <set>

#include "io/atomic_file.h"
#include "io/filesystem.h"
#include "io/torch_load.h"
#include "trainer/param_group_options.h"
#include "trainer/sharded/shard_files.h"
#include "trainer/sharded_data_parallel.h"

namespace mantissa::detail {

void ShardedDataParallel::write_model_shards(const std::string& folder) const {
  const auto names = flat_param_names();
  const auto& buckets = flat_->layout().buckets;
  std::vector<sharded::TensorPiece> model;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const auto shard = flat_->shard(b);
    for (const auto& slot : buckets[b].slots) {
      const auto piece = buckets[b].piece(slot, rank());
      if (!piece) continue;
      model.push_back({names[slot.param], shard.narrow(0, piece->shard_offset, piece->numel),
                       flat_->shape(slot.param), piece->param_offset});
    }
  }
  if (rank() == 0) {
    // What is whole on every process (buffers, frozen parameters), once.
    std::set<const c10::TensorImpl*> flat;
    for (const auto& p : flat_->params()) flat.insert(p.unsafeGetTensorImpl());
    for (const auto& [name, tensor] : io::module_state_dict(*module_)) {
      if (flat.count(tensor.unsafeGetTensorImpl()) != 0) continue;
      model.push_back({name, tensor.detach().reshape({-1}), tensor.sizes().vec(), 0});
    }
  }
  sharded::write_shard_file(io::join_path(folder, sharded::kModelShardsFolder), rank(),
                            world_size(), model);
}

void ShardedDataParallel::write_shards(const std::string& folder) const {
  write_model_shards(folder);
  const auto names = flat_param_names();
  const auto& buckets = flat_->layout().buckets;
  std::vector<sharded::TensorPiece> optimizer;
  at::Tensor step;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    if (!step.defined()) step = sharded::local_step(*shards_, b);
    std::vector<std::pair<std::string, at::Tensor>> kinds;
    for (const auto kind : sharded::kStateKinds) {
      auto local = sharded::local_state_shard(*shards_, b, kind);
      if (local.defined()) kinds.emplace_back(sharded::state_kind_name(kind), std::move(local));
    }
    for (const auto& slot : buckets[b].slots) {
      const auto piece = buckets[b].piece(slot, rank());
      if (!piece) continue;
      for (const auto& [kind, local] : kinds) {
        optimizer.push_back({names[slot.param] + "." + kind,
                             local.narrow(0, piece->shard_offset, piece->numel),
                             flat_->shape(slot.param), piece->param_offset});
      }
    }
  }
  // The step count and the param groups' options are the same on every process: rank 0
  // writes them.
  if (rank() == 0 && step.defined()) optimizer.push_back({"step", step.reshape({}), {}, 0});
  const auto shards = io::join_path(folder, sharded::kOptimizerShardsFolder);
  sharded::write_shard_file(shards, rank(), world_size(), optimizer);
  if (rank() == 0) {
    io::write_file_atomically(io::join_path(shards, sharded::kParamGroupsFile),
                              param_group_options_bytes(shards_->optimizer()));
  }
}

namespace {

// Fills `into` (this rank's shard of bucket `b` of one state kind) with the pieces named
// `<parameter>.<kind>` of `source`; false when the checkpoint holds no such state for the
// bucket. A kind that some of the bucket's parameters have and others not is an error.
bool fill_from_pieces(const sharded::TensorSource& source, const sharded::FlatParameters& flat,
                      const std::vector<std::string>& names, std::size_t b, std::int64_t rank,
                      const char* kind, at::Tensor& into) {
  const auto& bucket = flat.layout().buckets[b];
  const auto key = [&](std::size_t param) { return names[param] + "." + kind; };
  const bool present = source.contains(key(bucket.slots.front().param));
  for (const auto& slot : bucket.slots) {
    TORCH_CHECK(source.contains(key(slot.param)) == present, "the optimizer shards",
                source.origin(), " hold '", key(present ? bucket.slots.front().param : slot.param),
                "' but not '", key(present ? slot.param : bucket.slots.front().param),
                "': parameters updated together must all have it or none");
    if (!present) continue;
    TORCH_CHECK(source.shape(key(slot.param)) == flat.shape(slot.param), "the optimizer shards",
                source.origin(), " hold '", key(slot.param), "' of shape ",
                c10::IntArrayRef(source.shape(key(slot.param))), ", the parameter has shape ",
                c10::IntArrayRef(flat.shape(slot.param)));
    const auto piece = bucket.piece(slot, rank);
    if (!piece) continue;
    into.narrow(0, piece->shard_offset, piece->numel)
        .copy_(source.read(key(slot.param), piece->param_offset, piece->numel));
  }
  return present;
}

}  // namespace

void ShardedDataParallel::load_model_shards(const std::string& dir) {
  const sharded::ShardFolderSource model(io::join_path(dir, sharded::kModelShardsFolder));
  if (model.world_size() != world_size()) {
    TORCH_WARN_ONCE("fsdp: resharding the checkpoint '", dir, "', which ", model.world_size(),
                    " process(es) saved, for ", world_size(),
                    ": each process reads its elements from their shard files");
  }
  load_model_from(*module_, model);
}

void ShardedDataParallel::load_shards(const std::string& dir, bool weights_only) {
  load_model_shards(dir);
  const auto folder = io::join_path(dir, sharded::kOptimizerShardsFolder);
  TORCH_CHECK_VALUE(!io::path_exists(io::join_path(folder, "index.json")), "'", folder,
                    "' holds the archives of an optimizer sharded by whole tensors (its "
                    "index.json names which), not the flat pieces of adamw_torch_fused's state: "
                    "resume it with the --optim its index.json names");
  const sharded::ShardFolderSource optimizer(folder);
  const auto names = flat_param_names();
  const auto& buckets = flat_->layout().buckets;
  torch::NoGradGuard no_grad;
  if (weights_only) {
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      if (!shards_->has_master(b)) continue;
      auto master = shards_->shard_params()[b];
      if (!fill_from_pieces(optimizer, *flat_, names, b, rank(), "master", master)) {
        master.copy_(flat_->shard(b));
      }
    }
    return;
  }
  const auto options_path = io::join_path(folder, sharded::kParamGroupsFile);
  if (io::path_exists(options_path)) {
    // Through the bounds-checked reader: the file is as hostile as any in the checkpoint.
    torch::serialize::InputArchive saved;
    io::load_torch_archive(options_path, saved, torch::kCPU);
    load_param_group_options(shards_->optimizer(), saved, "'" + options_path + "'");
  } else {
    TORCH_WARN_ONCE("fsdp: '", folder, "' holds no ", sharded::kParamGroupsFile,
                    " (a checkpoint saved before mantissa kept the optimizer's options in its "
                    "shards): this run's betas, eps and weight decay are used");
  }
  const auto step = optimizer.contains("step") ? optimizer.read_whole("step") : at::Tensor();
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    sharded::restore_bucket_state(*shards_, b, step,
                                  [&](sharded::StateKind kind, at::Tensor& into) {
                                    return fill_from_pieces(optimizer, *flat_, names, b, rank(),
                                                            sharded::state_kind_name(kind), into);
                                  });
  }
}

}  // namespace mantissa::detail
