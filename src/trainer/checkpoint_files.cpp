#include "trainer/checkpoint_files.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <vector>

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/serialize.h>

#include <mantissa/io/safetensors.h>
#include <mantissa/nn/pretrained_config.h>
#include "io/filesystem.h"

#include "io/archive_file.h"
#include "io/atomic_file.h"
#include "io/torch_load.h"
#include "io/torch_save.h"
#include "shorten.h"
#include "trainer/optimizer_family.h"
#include "trainer/optimizer_state_table.h"

namespace mantissa::detail {
namespace {

void write_text(const std::string& path, const std::string& text, const FileFaults& faults) {
  faults.writing(path);
  io::write_file_atomically(path, text);
}

// Runs `load`, re-raising any error with the file's name in front and without the inner
// error's C++ backtrace (the outer error carries its own). A value error stays a value error.
template <typename Fn>
void loading(const std::string& path, Fn&& load) {
  const auto shown = shorten_path(path);
  TORCH_CHECK(io::path_exists(path) || !io::entry_exists(path), "checkpoint file '", shown,
              "' is a symbolic link that leads to no file (dangling, or a loop of links)");
  TORCH_CHECK(io::path_exists(path), "checkpoint file '", shown, "' is missing");
  try {
    io::check_regular_file(path);
    load();
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, "cannot load checkpoint file '", shown,
                      "': ", e.what_without_backtrace());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot load checkpoint file '", shown, "': ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cannot load checkpoint file '", shown, "': ", e.what());
  }
}

// The key of rng_state*.pth that records how many processes saved the checkpoint (HF's
// files have no such key; it reads the keys it knows and ignores the others).
constexpr const char* kWorldSizeKey = "world_size";

c10::IValue rng_states(std::int64_t num_processes) {
  c10::impl::GenericDict states(c10::StringType::get(), c10::AnyType::get());
  states.insert("cpu", at::detail::getDefaultCPUGenerator().get_state());
  states.insert(kWorldSizeKey, num_processes);
  c10::impl::GenericList cuda(c10::AnyType::get());
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(torch::cuda::device_count()); ++i) {
    cuda.push_back(at::globalContext()
                       .defaultGenerator(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)))
                       .get_state());
  }
  states.insert("cuda", cuda);
  return states;
}

// Generators are shared handles: a copy sets the state of the process-wide generator.
void set_generator_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

void restore_rng_states(const c10::IValue& value) {
  TORCH_CHECK(value.isGenericDict(), "rng_state.pth does not hold a dict");
  const auto states = value.toGenericDict();
  TORCH_CHECK(states.contains("cpu"), "rng_state.pth has no 'cpu' state");
  set_generator_state(at::detail::getDefaultCPUGenerator(), states.at("cpu").toTensor());
  if (states.contains("cuda")) {
    const auto cuda = states.at("cuda").toList();
    const auto devices = static_cast<std::size_t>(torch::cuda::device_count());
    for (std::size_t i = 0; i < std::min<std::size_t>(cuda.size(), devices); ++i) {
      set_generator_state(at::globalContext().defaultGenerator(
                              c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i))),
                          cuda.get(i).toTensor());
    }
  }
}

std::string rng_state_name(std::int64_t process_index, std::int64_t num_processes) {
  return num_processes > 1 ? "rng_state_" + std::to_string(process_index) + ".pth"
                           : std::string("rng_state.pth");
}

void read_masters(const std::string& path, amp::MasterWeights& masters) {
  torch::serialize::InputArchive archive;
  io::load_torch_archive(path, archive);
  masters.load(archive);
}

// Writes what `object.save(archive)` puts into a LibTorch archive at `path`, atomically.
template <typename Saves>
void save_archive(const std::string& path, const Saves& object) {
  torch::serialize::OutputArchive archive;
  object.save(archive);
  io::save_torch_archive(path, archive);
}

SavedState optimizer_piece(torch::optim::Optimizer& optimizer) {
  SavedState piece;
  piece.file = "optimizer.pt";
  piece.save = [&optimizer](const std::string& path) { save_archive(path, optimizer); };
  piece.load = [&optimizer](const std::string& path) {
    torch::serialize::InputArchive archive;
    io::load_torch_archive(path, archive);
    check_optimizer_family(optimizer, archive);
    optimizer.load(archive);
    check_optimizer_state(optimizer);
  };
  return piece;
}

SavedState scheduler_piece(LrScheduler& scheduler) {
  SavedState piece;
  piece.file = "scheduler.pt";
  piece.save = [&scheduler](const std::string& path) { scheduler.save(path); };
  piece.load = [&scheduler](const std::string& path) { scheduler.load(path); };
  return piece;
}

// Written always (HF does too); read only when this run scales its loss.
SavedState scaler_piece(amp::GradScaler& scaler) {
  SavedState piece;
  piece.file = "scaler.pt";
  piece.save = [&scaler](const std::string& path) { scaler.save(path); };
  piece.load = [&scaler](const std::string& path) {
    if (scaler.is_enabled()) scaler.load(path);
  };
  return piece;
}

SavedState masters_piece(amp::MasterWeights& masters) {
  SavedState piece;
  piece.file = "master_weights.pt";
  piece.save = [&masters](const std::string& path) { save_archive(path, masters); };
  piece.load = [&masters](const std::string& path) { read_masters(path, masters); };
  return piece;
}

// Every piece of training state a checkpoint of `parts` holds in a file of its own, in the
// order they are written and read: the optimizer, the LR scheduler, the loss scaler, the fp32
// masters, then the run's registered pieces. The optimizer and the masters are left out where
// the strategy keeps them in shard files, and the optimizer where `parts` has none (loading on
// a process that does not read it).
SavedStates checkpoint_pieces(const CheckpointParts& parts) {
  SavedStates pieces;
  if (parts.optimizer != nullptr && !parts.in_shards) {
    pieces.push_back(optimizer_piece(*parts.optimizer));
  }
  pieces.push_back(scheduler_piece(*parts.scheduler));
  pieces.push_back(scaler_piece(*parts.scaler));
  if (parts.masters != nullptr && !parts.in_shards) {
    pieces.push_back(masters_piece(*parts.masters));
  }
  if (parts.saved_states != nullptr) {
    pieces.insert(pieces.end(), parts.saved_states->begin(), parts.saved_states->end());
  }
  return pieces;
}

// Reads model.safetensors at `path` into the model: through `load_model_file` when given, else
// straight into `model`'s tensors.
void read_model_file(const std::string& path, const ModelFileLoader& load_model_file,
                     torch::nn::Module& model) {
  if (load_model_file) {
    load_model_file(path);
  } else {
    io::load_module_safetensors(path, model);
  }
}

}  // namespace

void write_pretrained_config(const std::string& dir, const torch::nn::Module& model,
                             const io::NamedTensors& model_state) {
  const auto* pretrained = dynamic_cast<const nn::HasPretrainedConfig*>(&model);
  if (pretrained == nullptr) return;
  // The dtype the weights are saved in: the first tensor's, as HF takes the model's.
  auto dtype = c10::kFloat;
  if (!model_state.empty()) {
    dtype = model_state.front().second.scalar_type();
  } else {
    for (const auto& p : model.parameters()) {
      dtype = p.scalar_type();
      break;
    }
  }
  io::write_file_atomically(io::join_path(dir, "config.json"),
                            pretrained->pretrained_config_json(dtype));
}

void write_checkpoint_files(const std::string& folder, const CheckpointParts& parts,
                            const io::NamedTensors& model_state, const FileFaults& faults) {
  const auto file = [&](const char* name) { return io::join_path(folder, name); };
  if (!parts.in_shards) {
    // Refused before anything is written: its optimizer.pt could not be checked when loaded.
    optimizer_state_kind(*parts.optimizer);
    faults.writing(file("model.safetensors"));
    io::save_safetensors(file("model.safetensors"), model_state, {{"format", "pt"}});
  }
  if (dynamic_cast<const nn::HasPretrainedConfig*>(parts.model) != nullptr) {
    faults.writing(file("config.json"));
    write_pretrained_config(folder, *parts.model, model_state);
  }
  for (const auto& piece : checkpoint_pieces(parts)) {
    const auto path = io::join_path(folder, piece.file);
    faults.writing(path);
    piece.save(path);
  }
  write_text(file("trainer_state.json"), parts.state->to_json(), faults);
  write_text(file("training_args.json"), parts.args->to_json(), faults);
}

void write_rng_state(const std::string& folder, std::int64_t process_index,
                     std::int64_t num_processes, const FileFaults& faults) {
  const auto path = io::join_path(folder, rng_state_name(process_index, num_processes));
  const auto bytes = io::torch_save_bytes(rng_states(num_processes));
  faults.writing(path);
  io::write_file_atomically(path, std::string_view(bytes.data(), bytes.size()));
}

namespace {

bool is_rng_state_name(const std::string& name) {
  return name == "rng_state.pth" || (name.rfind("rng_state_", 0) == 0 && name.size() > 14 &&
                                     name.compare(name.size() - 4, 4, ".pth") == 0);
}

// The world size an rng_state file records, or nullopt for a file without it (HF's, or one
// saved before mantissa recorded it).
std::optional<std::int64_t> recorded_world_size(const std::string& path) {
  std::optional<std::int64_t> recorded;
  loading(path, [&] {
    const auto value = io::load_torch_file(path);
    if (!value.isGenericDict()) return;  // restore_rng_states names this error
    const auto states = value.toGenericDict();
    if (!states.contains(kWorldSizeKey)) return;
    const auto size = states.at(kWorldSizeKey);
    TORCH_CHECK_VALUE(size.isInt() && size.toInt() >= 1 && size.toInt() <= (1 << 24), "its '",
                      kWorldSizeKey, "' is ", size, ", not a number of processes");
    recorded = size.toInt();
  });
  return recorded;
}

}  // namespace

std::optional<std::string> rng_state_to_restore(std::int64_t process_index,
                                                std::int64_t num_processes,
                                                std::int64_t saved_processes) {
  if (saved_processes == 0) return rng_state_name(process_index, num_processes);
  if (process_index >= saved_processes) return std::nullopt;
  return rng_state_name(process_index, saved_processes);
}

std::int64_t saved_process_count(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& name : io::list_directory(dir)) {
    if (is_rng_state_name(name)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    if (const auto recorded = recorded_world_size(io::join_path(dir, name))) return *recorded;
  }
  // Files that do not say: count them, as HF's layout implies.
  const bool single = std::find(names.begin(), names.end(), "rng_state.pth") != names.end();
  const auto ranked = static_cast<std::int64_t>(names.size()) - (single ? 1 : 0);
  return ranked > 0 ? ranked : (single ? 1 : 0);
}

void load_checkpoint(const std::string& dir, const CheckpointParts& parts) {
  TORCH_CHECK_VALUE(io::path_exists(dir), "checkpoint folder '", dir, "' does not exist");
  TORCH_CHECK_VALUE(
      io::is_directory(dir), "the checkpoint '", dir,
      "' is not a folder; resume_from_checkpoint takes a checkpoint-<step> folder or 'latest'");
  const auto file = [&](const char* name) { return io::join_path(dir, name); };
  loading(file("trainer_state.json"), [&] {
    const auto bytes = io::read_file(file("trainer_state.json"));
    auto state = TrainerState::from_json(std::string(bytes.begin(), bytes.end()));
    if (parts.check_state) parts.check_state(state);
    *parts.state = std::move(state);
  });
  if (!parts.in_shards) {
    loading(file("model.safetensors"), [&] {
      read_model_file(file("model.safetensors"), parts.load_model_file, *parts.model);
    });
  }
  for (const auto& piece : checkpoint_pieces(parts)) {
    const auto path = io::join_path(dir, piece.file);
    if (io::path_exists(path) || !piece.load_missing) {
      loading(path, [&] { piece.load(path); });
    } else {
      piece.load_missing(dir);
    }
  }
  const auto saved_processes = saved_process_count(dir);
  const auto rng_name =
      rng_state_to_restore(parts.process_index, parts.num_processes, saved_processes);
  if (!rng_name) {
    // A process the saving run did not have. HF goes on without its file too: the run
    // continues, but not bit for bit.
    TORCH_WARN("the checkpoint '", shorten_path(dir), "' holds the random states of ",
               saved_processes, " process(es), and this run has ", parts.num_processes,
               ": process ", parts.process_index,
               " was not among them, so its random state (dropout, ...) starts afresh");
    return;
  }
  const auto rng_file = io::join_path(dir, *rng_name);
  // A process of the saving run must find the file it wrote.
  TORCH_CHECK(io::entry_exists(rng_file) || saved_processes == 0, "checkpoint file '",
              shorten_path(rng_file), "' is missing: ", saved_processes, " process(es) saved '",
              shorten_path(dir), "', process ", parts.process_index, " among them");
  loading(rng_file, [&] { restore_rng_states(io::load_torch_file(rng_file)); });
}

void load_checkpoint_weights(const std::string& dir, const ModelFileLoader& load_model_file,
                             amp::MasterWeights* masters) {
  TORCH_CHECK_VALUE(io::is_directory(dir), "the checkpoint folder '", dir, "' does not exist");
  const auto file = [&](const char* name) { return io::join_path(dir, name); };
  loading(file("model.safetensors"), [&] { load_model_file(file("model.safetensors")); });
  if (masters == nullptr) return;
  if (!io::path_exists(file("master_weights.pt"))) {
    masters->copy_model_to_masters();
    return;
  }
  loading(file("master_weights.pt"), [&] { read_masters(file("master_weights.pt"), *masters); });
}

std::optional<TrainingArguments> load_checkpoint_arguments(const std::string& dir) {
  const auto path = io::join_path(dir, "training_args.json");
  if (!io::entry_exists(path)) return std::nullopt;  // a checkpoint of HF's without it
  std::optional<TrainingArguments> args;
  loading(path, [&] { args = TrainingArguments::load_json(path, /*validate=*/false); });
  return args;
}

CheckpointParts sharded_run_files(const CheckpointParts& parts) {
  CheckpointParts rest = parts;
  rest.in_shards = true;
  rest.optimizer = nullptr;
  rest.masters = nullptr;
  return rest;
}

}  // namespace mantissa::detail
