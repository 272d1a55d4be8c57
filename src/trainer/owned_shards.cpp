// Checkpoints of per-process files (fsdp_config state_dict_type SHARDED_STATE_DICT) for the
// strategies whose processes each own whole tensors:
//
//   checkpoint-<step>/
//     model_shards/shard-<rank>-of-<N>.safetensors   the weights each process holds
//     optimizer_shards/shard-<rank>-of-<N>.pt        each process's optimizer, as its `save`
//                                                    writes it, its masters and its tensors' names
//     optimizer_shards/index.json                    which file holds each tensor's state
//
// A loading process reads only the files that hold its tensors now. For each, it builds the
// saving process's optimizer over zero stand-ins of that process's tensors, loads the archive
// into it and moves the state of its own tensors across: so any optimizer whose state is per
// tensor reshards at any number of processes without code of its own (the FULL_STATE_DICT
// checkpoints of src/trainer/owned_state.cpp move state between optimizers the same way).
#include <map>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "io/archive_file.h"
#include "io/atomic_file.h"
#include "io/filesystem.h"
#include "io/json_reader.h"
#include "io/torch_load.h"
#include "trainer/checkpoint_files.h"
#include "trainer/owned_archive.h"
#include "trainer/param_group_options.h"
#include "trainer/process_group_strategy.h"
#include "trainer/sharded/shard_files.h"

namespace mantissa::detail {
namespace {

using OwnedState = ProcessGroupStrategy::OwnedState;

constexpr const char* kIndexFile = "index.json";

// "shard-00001-of-00002.pt" for rank 1 of 2.
std::string optimizer_shard_name(std::int64_t rank, std::int64_t world_size) {
  const auto name = sharded::shard_file_name(rank, world_size);
  return name.substr(0, name.rfind('.')) + ".pt";
}

// The names of the tensors of `params`, per group and in the order of `in_order` (the order
// masters are made and saved in).
nlohmann::json names_of(const OptimizerParams& params) {
  std::unordered_map<const c10::TensorImpl*, std::string> name_of;
  for (std::size_t g = 0; g < params.groups.size(); ++g) {
    for (std::size_t i = 0; i < params.groups[g].size(); ++i) {
      name_of.emplace(params.groups[g][i].unsafeGetTensorImpl(), params.names.at(g).at(i));
    }
  }
  auto in_order = nlohmann::json::array();
  for (const auto& t : params.in_order) in_order.push_back(name_of.at(t.unsafeGetTensorImpl()));
  return {{"groups", params.names}, {"in_order", std::move(in_order)}};
}

// Each trainable tensor of `every` (tensors standing for the parameters) by its name.
std::unordered_map<std::string, torch::Tensor> by_name(const OptimizerParams& every) {
  std::unordered_map<std::string, torch::Tensor> out;
  for (std::size_t g = 0; g < every.groups.size(); ++g) {
    for (std::size_t i = 0; i < every.groups[g].size(); ++i) {
      out.emplace(every.names.at(g).at(i), every.groups[g][i]);
    }
  }
  return out;
}

// A list of strings out of `value`, or an error naming `what` in `path`.
std::vector<std::string> string_list(const nlohmann::json& value, const std::string& path,
                                     const char* what) {
  TORCH_CHECK_VALUE(value.is_array(), "'", path, "': ", what, " is not a list: ",
                    io::describe_json(value));
  std::vector<std::string> out;
  for (const auto& item : value) {
    TORCH_CHECK_VALUE(item.is_string(), "'", path, "': ", what, " holds a non-string ",
                      io::describe_json(item));
    out.push_back(item.get<std::string>());
  }
  return out;
}

// The index of an optimizer_shards folder: which file holds each tensor's state.
struct ShardIndex {
  std::string optim;
  std::int64_t world_size = 0;
  std::map<std::string, std::string> file_of;
};

ShardIndex read_index(const std::string& folder) {
  const auto path = io::join_path(folder, kIndexFile);
  TORCH_CHECK_VALUE(io::path_exists(path), "'", path,
                    "' is missing: either these optimizer shards are adamw_torch_fused's flat "
                    ".safetensors shards (resume them with --optim adamw_torch_fused) or the "
                    "index of this checkpoint was lost");
  const auto bytes = io::read_file(path, 64 << 20);
  nlohmann::json index;
  try {
    index = io::parse_json_text<nlohmann::json>(std::string_view(bytes.data(), bytes.size()));
  } catch (const std::exception& e) {
    TORCH_CHECK_VALUE(false, "'", path, "' is not JSON: ", e.what());
  }
  TORCH_CHECK_VALUE(index.is_object() && index.contains("optim") && index["optim"].is_string() &&
                        index.contains("world_size") &&
                        index["world_size"].is_number_integer() && index["world_size"] > 0 &&
                        index.contains("weight_map") && index["weight_map"].is_object(),
                    "'", path,
                    "' is not an index of optimizer shards (an object with \"optim\", a positive "
                    "\"world_size\" and a \"weight_map\" of file names): ",
                    io::describe_json(index));
  ShardIndex out;
  out.optim = index["optim"].get<std::string>();
  out.world_size = index["world_size"].get<std::int64_t>();
  std::set<std::string> files;
  for (std::int64_t r = 0; r < out.world_size; ++r) {
    files.insert(optimizer_shard_name(r, out.world_size));
  }
  for (const auto& [name, file] : index["weight_map"].items()) {
    TORCH_CHECK_VALUE(file.is_string() && files.count(file.get<std::string>()) != 0, "'", path,
                      "' places the state of '", name, "' in ", io::describe_json(file),
                      ", which is not one of the files of ", out.world_size,
                      " process(es) (shard-<rank>-of-<N>.pt)");
    out.file_of.emplace(name, file.get<std::string>());
  }
  return out;
}

// Moves the optimizer state keyed by `from` in `source` to the key `to` in `target`.
void move_state_entry(torch::optim::Optimizer& source, const torch::Tensor& from,
                      torch::optim::Optimizer& target, const torch::Tensor& to) {
  auto& states = source.state();
  const auto found = states.find(from.unsafeGetTensorImpl());
  if (found == states.end()) return;  // never stepped: no state, as in a data-parallel run
  target.state()[to.unsafeGetTensorImpl()] = std::move(found->second);
  states.erase(found);
}

}  // namespace

void ProcessGroupStrategy::save_owned_checkpoint(const std::string& output_dir,
                                                 const CheckpointParts& parts,
                                                 const OwnedState& state) {
  if (state.sharded_state_dict) {
    save_owned_shards(output_dir, parts, state);
  } else {
    save_owned_state(output_dir, parts, state);
  }
}

void ProcessGroupStrategy::load_owned_checkpoint(const std::string& dir,
                                                 const CheckpointParts& parts,
                                                 const OwnedState& state) {
  if (sharded::is_sharded_checkpoint(dir)) {
    load_owned_shards(dir, parts, state);
  } else {
    load_owned_state(dir, parts, state);
  }
}

void ProcessGroupStrategy::save_owned_shards(const std::string& output_dir,
                                             const CheckpointParts& parts,
                                             const OwnedState& state) {
  const auto rest = sharded_run_files(parts);
  const auto described = state.described_params();
  checkpoint_io().save(
      output_dir, parts.state->global_step,
      [&](const std::string& folder) { write_checkpoint_files(folder, rest, {}); },
      [&](const std::string& folder) {
        state.write_model_shards(folder);
        const auto shards = io::join_path(folder, sharded::kOptimizerShardsFolder);
        io::create_directories(shards);
        auto archive = own_state_archive(*state.optimizer, parts.masters);
        const auto own = state.owned_by(rank(), state.own_params());
        archive.write("tensors", c10::IValue(names_of(own).dump()));
        io::save_torch_archive(io::join_path(shards, optimizer_shard_name(rank(), world_size())),
                               archive);
        if (rank() != 0) return;
        // Where each tensor's state lies, known to every process from the layout: written once.
        nlohmann::json file_of = nlohmann::json::object();
        for (std::int64_t owner = 0; owner < world_size(); ++owner) {
          const auto owned = state.owned_by(owner, described);
          for (const auto& names : owned.names) {
            for (const auto& name : names) file_of[name] = optimizer_shard_name(owner, world_size());
          }
        }
        const nlohmann::json index = {{"optim", args().optim().name()},
                                      {"world_size", world_size()},
                                      {"weight_map", std::move(file_of)}};
        io::write_file_atomically(io::join_path(shards, kIndexFile), index.dump(2) + "\n");
      });
}

void ProcessGroupStrategy::load_owned_shards(const std::string& dir, const CheckpointParts& parts,
                                             const OwnedState& state) {
  const auto through_strategy = loading_through_strategy(parts);
  checkpoint_io().load(dir, [&] {
    detail::load_checkpoint(dir, sharded_run_files(through_strategy));
    state.load_model_shards(dir);
    read_owned_optimizer_shards(dir, state, parts.masters, /*weights_only=*/false);
  });
  // The learning rates the checkpoint's schedule had set, as optimizer.pt restores them.
  set_learning_rates(*state.optimizer, parts.scheduler->get_last_lr());
}

void ProcessGroupStrategy::load_owned_shard_weights(const std::string& dir,
                                                    const OwnedState& state,
                                                    amp::MasterWeights* masters) {
  checkpoint_io().load(dir, [&] {
    state.load_model_shards(dir);
    if (masters != nullptr) read_owned_optimizer_shards(dir, state, masters, /*weights_only=*/true);
  });
}

void ProcessGroupStrategy::read_owned_optimizer_shards(const std::string& dir,
                                                       const OwnedState& state,
                                                       amp::MasterWeights* masters,
                                                       bool weights_only) const {
  const auto folder = io::join_path(dir, sharded::kOptimizerShardsFolder);
  const auto index = read_index(folder);
  const auto index_path = io::join_path(folder, kIndexFile);
  TORCH_CHECK_VALUE(index.optim == args().optim().name(), "'", index_path,
                    "' holds the state of optim ", index.optim, ", and this run's optim is ",
                    args().optim().name(), ": resume it with --optim ", index.optim);
  if (index.world_size != world_size()) {
    TORCH_WARN_ONCE("fsdp: resharding the optimizer state of '", dir, "', which ",
                    index.world_size, " process(es) saved, for ", world_size(),
                    ": each process reads its tensors' state from the files that hold them");
  }
  // Every process's file is there (each process checks them all, so that all name a lost one).
  for (std::int64_t r = 0; r < index.world_size; ++r) {
    const auto path = io::join_path(folder, optimizer_shard_name(r, index.world_size));
    TORCH_CHECK_VALUE(io::path_exists(path), "'", path, "' is missing: the checkpoint was saved by ",
                      index.world_size, " process(es), each writing its own optimizer file (",
                      index_path, ")");
  }
  // Every trainable parameter's state has a file, and every file's tensor a parameter.
  const auto every = by_name(state.owned_by(OwnedState::kEveryOwner, state.described_params()));
  for (const auto& [name, described] : every) {
    TORCH_CHECK_VALUE(index.file_of.count(name) != 0, "'", index_path,
                      "' names no file for the state of parameter '", name,
                      "': the checkpoint was saved from another model");
  }
  for (const auto& [name, file] : index.file_of) {
    TORCH_CHECK_VALUE(every.count(name) != 0, "'", index_path, "' holds the state of '", name,
                      "' (in ", file, "), which is not a trainable parameter of this model");
  }
  // This process's tensors, by the file that holds their state.
  const auto own = state.owned_by(rank(), state.own_params());
  std::map<std::string, std::vector<std::pair<std::string, torch::Tensor>>> by_file;
  for (std::size_t g = 0; g < own.groups.size(); ++g) {
    for (std::size_t i = 0; i < own.groups[g].size(); ++i) {
      const auto& name = own.names.at(g).at(i);
      by_file[index.file_of.at(name)].emplace_back(name, own.groups[g][i]);
    }
  }
  torch::NoGradGuard no_grad;
  if (masters != nullptr) masters->copy_model_to_masters();  // where a file keeps none
  for (const auto& [file, tensors] : by_file) {
    const auto path = io::join_path(folder, file);
    torch::serialize::InputArchive archive;
    // Read on the CPU (the saving process's device may be another GPU); `load` moves the state
    // to the stand-ins' device, this process's.
    io::load_torch_archive(path, archive, torch::kCPU);
    c10::IValue listed;
    TORCH_CHECK_VALUE(archive.try_read("tensors", listed) && listed.isString(), "'", path,
                      "' holds no list of its tensors (\"tensors\")");
    nlohmann::json names;
    try {
      names = io::parse_json_text<nlohmann::json>(listed.toStringRef());
    } catch (const std::exception& e) {
      TORCH_CHECK_VALUE(false, "'", path, "': its list of tensors is not JSON: ", e.what());
    }
    TORCH_CHECK_VALUE(names.is_object() && names.contains("groups") && names["groups"].is_array() &&
                          names.contains("in_order"),
                      "'", path, "': its list of tensors is not {\"groups\", \"in_order\"}: ",
                      io::describe_json(names));
    TORCH_CHECK_VALUE(names["groups"].size() == own.groups.size(), "'", path, "' holds ",
                      names["groups"].size(), " param groups, this run's optimizer ",
                      own.groups.size());
    // The saving process's optimizer (and masters), over stand-ins of its tensors.
    OptimizerParams saved;
    saved.first_group_decays = own.first_group_decays;
    std::unordered_map<std::string, torch::Tensor> stand_ins;
    for (const auto& group : names["groups"]) {
      saved.groups.emplace_back();
      saved.names.emplace_back();
      for (const auto& name : string_list(group, path, "a param group")) {
        const auto found = every.find(name);
        TORCH_CHECK_VALUE(found != every.end(), "'", path, "' holds the state of '", name,
                          "', which is not a trainable parameter of this model");
        auto t = state.stand_in(found->second);
        TORCH_CHECK_VALUE(stand_ins.emplace(name, t).second, "'", path, "' lists '", name,
                          "' twice");
        saved.groups.back().push_back(t);
        saved.names.back().push_back(name);
      }
    }
    for (const auto& name : string_list(names["in_order"], path, "\"in_order\"")) {
      const auto found = stand_ins.find(name);
      TORCH_CHECK_VALUE(found != stand_ins.end(), "'", path, "' orders its masters by '", name,
                        "', which none of its param groups holds");
      saved.in_order.push_back(found->second);
    }
    // The saving process's masters (when this run keeps masters: the optimizer's state is keyed
    // by them), their values where the file has them.
    std::unique_ptr<amp::MasterWeights> saved_masters;
    bool masters_saved = false;
    if (masters != nullptr) {
      saved_masters = std::make_unique<amp::MasterWeights>(saved.in_order);
      torch::serialize::InputArchive masters_archive;
      if (archive.try_read("masters", masters_archive)) {
        try {
          saved_masters->load(masters_archive);
        } catch (const std::exception& e) {
          TORCH_CHECK_VALUE(false, "'", path, "': its masters do not fit: ", e.what());
        }
        masters_saved = true;
      }
    }
    TrainerOptimizer saved_optimizer;
    if (!weights_only) {
      saved_optimizer = make_trainer_optimizer(args(), saved, saved_masters.get(),
                                               state.plan.low_precision_update, /*factory=*/{});
      torch::serialize::InputArchive saved_state;
      TORCH_CHECK_VALUE(archive.try_read("optimizer", saved_state), "'", path,
                        "' holds no optimizer state (\"optimizer\")");
      try {
        saved_optimizer.optimizer->load(saved_state);
      } catch (const std::exception& e) {
        TORCH_CHECK_VALUE(false, "'", path, "': its optimizer state does not fit: ", e.what());
      }
      // The checkpoint's options (betas, eps, weight decay, ...), not the arguments', as a
      // FULL_STATE_DICT resume restores them; every file holds the same.
      copy_param_group_options(*saved_optimizer.optimizer, *state.optimizer);
    }
    for (const auto& [name, mine] : tensors) {
      const auto found = stand_ins.find(name);
      TORCH_CHECK_VALUE(found != stand_ins.end(), "'", path, "' does not hold '", name,
                        "', which ", index_path, " places there");
      const auto& from = saved_masters != nullptr ? saved_masters->master_of(found->second)
                                                  : found->second;
      const auto& to = masters != nullptr ? masters->master_of(mine) : mine;
      if (!weights_only) move_state_entry(*saved_optimizer.optimizer, from, *state.optimizer, to);
      if (masters_saved) to.detach().copy_(from);
    }
  }
}

}  // namespace mantissa::detail
