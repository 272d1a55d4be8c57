#include "trainer/checkpoint.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <mantissa/io/safetensors.h>
#include <mantissa/optim/fused_adamw.h>
#include "io/filesystem.h"

#include "io/atomic_file.h"
#include "io/torch_save.h"

namespace mantissa::detail {

std::function<void(const std::string& path)> checkpoint_write_hook;
std::function<void(const std::string& path)> checkpoint_remove_hook;

namespace {

constexpr const char* kPrefix = "checkpoint-";

void before_write(const std::string& path) {
  if (checkpoint_write_hook) checkpoint_write_hook(path);
}

void write_text(const std::string& path, const std::string& text) {
  before_write(path);
  io::write_file_atomically(path, text);
}

void write_archive(const std::string& path, torch::serialize::OutputArchive& archive) {
  before_write(path);
  std::ostringstream bytes;
  archive.save_to(bytes);
  io::write_file_atomically(path, bytes.str());
}

// Runs `load`, re-raising any error with the file's name in front and without the inner
// error's C++ backtrace (the outer error carries its own). A value error stays a value error.
template <typename Fn>
void loading(const std::string& path, Fn&& load) {
  TORCH_CHECK(io::path_exists(path), "checkpoint file '", path, "' is missing");
  try {
    io::check_regular_file(path);
    load();
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, "cannot load checkpoint file '", path,
                      "': ", e.what_without_backtrace());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot load checkpoint file '", path, "': ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cannot load checkpoint file '", path, "': ", e.what());
  }
}

// Each optimizer state tensor must have its parameter's shape and a floating dtype; a loaded
// optimizer.pt from another model would otherwise fail at the first step, far from the file.
void check_state_tensor(const at::Tensor& param, const at::Tensor& value, std::size_t index,
                        const char* name) {
  if (!value.defined()) return;
  TORCH_CHECK_VALUE(value.sizes() == param.sizes(), "the state '", name, "' of parameter ", index,
                    " has shape ", value.sizes(), " but the parameter has shape ", param.sizes());
  TORCH_CHECK_VALUE(c10::isFloatingType(value.scalar_type()), "the state '", name,
                    "' of parameter ", index, " is ", value.scalar_type(),
                    ", not a floating-point tensor");
}

void check_optimizer_state(torch::optim::Optimizer& optimizer) {
  std::size_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      const auto it = optimizer.state().find(param.unsafeGetTensorImpl());
      if (it != optimizer.state().end()) {
        auto* state = it->second.get();
        if (auto* fused = dynamic_cast<optim::FusedAdamWParamState*>(state)) {
          check_state_tensor(param, fused->exp_avg(), index, "exp_avg");
          check_state_tensor(param, fused->exp_avg_sq(), index, "exp_avg_sq");
          check_state_tensor(param, fused->max_exp_avg_sq(), index, "max_exp_avg_sq");
        } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state)) {
          check_state_tensor(param, adamw->exp_avg(), index, "exp_avg");
          check_state_tensor(param, adamw->exp_avg_sq(), index, "exp_avg_sq");
          check_state_tensor(param, adamw->max_exp_avg_sq(), index, "max_exp_avg_sq");
        } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state)) {
          check_state_tensor(param, adam->exp_avg(), index, "exp_avg");
          check_state_tensor(param, adam->exp_avg_sq(), index, "exp_avg_sq");
          check_state_tensor(param, adam->max_exp_avg_sq(), index, "max_exp_avg_sq");
        } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state)) {
          check_state_tensor(param, sgd->momentum_buffer(), index, "momentum_buffer");
        }
      }
      ++index;
    }
  }
}

c10::IValue rng_states() {
  c10::impl::GenericDict states(c10::StringType::get(), c10::AnyType::get());
  states.insert("cpu", at::detail::getDefaultCPUGenerator().get_state());
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

// Prefixes of the folders a save or a rotation makes beside the checkpoints. Each lives only
// while one save runs; any found at the start of a save was left by a process that died.
constexpr const char* kWritingPrefix = "tmp-checkpoint-";        // a new checkpoint being written
constexpr const char* kReplacedPrefix = "old-checkpoint-";       // a checkpoint being re-saved
constexpr const char* kDeletingPrefix = "deleting-checkpoint-";  // one being rotated out

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// "tmp-checkpoint-" and "checkpoint-12" give "tmp-checkpoint-12-".
std::string aside_prefix(const char* prefix, const std::string& checkpoint_folder) {
  return prefix + checkpoint_folder.substr(std::char_traits<char>::length(kPrefix)) + "-";
}

// Renames `path` to a new unique name `<prefix><name>-XXXXXX` beside it (rename(2) replaces the
// empty folder mkdtemp made) and returns the new path. Atomic: `path` is whole or gone.
std::string move_aside(const std::string& output_dir, const std::string& path,
                       const std::string& prefix) {
  const std::string aside = io::make_temp_directory(output_dir, prefix);
  io::rename_path(path, aside);
  return aside;
}

// The step in "checkpoint-<step>", or nullopt for any other name (or a step beyond int64).
std::optional<std::int64_t> step_of(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  const auto digits = name.substr(std::char_traits<char>::length(kPrefix));
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

// The step of "<prefix>checkpoint-<step>-XXXXXX", a folder `move_aside` made: the checkpoint
// name inside it, read by `step_of`.
std::optional<std::int64_t> step_of_aside(const std::string& name, const char* prefix) {
  const auto inner =
      name.substr(std::char_traits<char>::length(prefix) - std::char_traits<char>::length(kPrefix));
  const auto dash = inner.rfind('-');
  if (dash == std::string::npos) return std::nullopt;
  return step_of(inner.substr(0, dash));
}

}  // namespace

void clean_interrupted_saves(const std::string& output_dir) {
  if (!io::is_directory(output_dir)) return;
  for (const auto& name : io::list_directory(output_dir)) {
    const auto path = io::join_path(output_dir, name);
    if (starts_with(name, kWritingPrefix) || starts_with(name, kDeletingPrefix)) {
      io::remove_all(path);
    } else if (starts_with(name, kReplacedPrefix)) {
      // Killed between moving the old copy aside and renaming the new one in: the old copy is
      // the only complete one, so it goes back in place.
      const auto step = step_of_aside(name, kReplacedPrefix);
      const auto original =
          step ? io::join_path(output_dir, checkpoint_name(*step)) : std::string();
      if (step && !io::path_exists(original)) {
        io::rename_path(path, original);
      } else {
        io::remove_all(path);
      }
    }
  }
}

std::string checkpoint_name(std::int64_t step) { return kPrefix + std::to_string(step); }

std::string shared_checkpoint_folder(const std::string& output_dir, std::int64_t step) {
  return io::join_path(output_dir, aside_prefix(kWritingPrefix, checkpoint_name(step)) + "shared");
}

std::string begin_checkpoint(const std::string& output_dir, std::int64_t step, bool shared_name) {
  io::create_directories(output_dir);
  clean_interrupted_saves(output_dir);
  if (!shared_name) {
    return io::make_temp_directory(output_dir, aside_prefix(kWritingPrefix, checkpoint_name(step)));
  }
  const auto folder = shared_checkpoint_folder(output_dir, step);
  if (io::path_exists(folder)) io::remove_all(folder);
  io::create_directories(folder);
  return folder;
}

void write_checkpoint_files(const std::string& folder, const CheckpointParts& parts) {
  const auto file = [&](const char* name) { return io::join_path(folder, name); };
  before_write(file("model.safetensors"));
  io::save_module_safetensors(file("model.safetensors"), *parts.model);
  {
    torch::serialize::OutputArchive archive;
    parts.optimizer->save(archive);
    write_archive(file("optimizer.pt"), archive);
  }
  before_write(file("scheduler.pt"));
  parts.scheduler->save(file("scheduler.pt"));
  before_write(file("scaler.pt"));
  parts.scaler->save(file("scaler.pt"));
  if (parts.masters != nullptr) {
    torch::serialize::OutputArchive archive;
    parts.masters->save(archive);
    write_archive(file("master_weights.pt"), archive);
  }
  write_text(file("trainer_state.json"), parts.state->to_json());
  write_text(file("training_args.json"), parts.args->to_json());
}

namespace {

std::string rng_state_name(std::int64_t process_index, std::int64_t num_processes) {
  return num_processes > 1 ? "rng_state_" + std::to_string(process_index) + ".pth"
                           : std::string("rng_state.pth");
}

}  // namespace

void write_rng_state(const std::string& folder, std::int64_t process_index,
                     std::int64_t num_processes) {
  const auto path = io::join_path(folder, rng_state_name(process_index, num_processes));
  const auto bytes = io::torch_save_bytes(rng_states());
  before_write(path);
  io::write_file_atomically(path, std::string_view(bytes.data(), bytes.size()));
}

std::string publish_checkpoint(const std::string& output_dir, const std::string& folder,
                               std::int64_t step) {
  const std::string name = checkpoint_name(step);
  const std::string final_dir = io::join_path(output_dir, name);
  // Replace an older folder of the same step (a re-save) only once the new one is complete.
  if (io::path_exists(final_dir)) {
    const std::string old = move_aside(output_dir, final_dir, aside_prefix(kReplacedPrefix, name));
    io::rename_path(folder, final_dir);
    io::remove_all(old);
  } else {
    io::rename_path(folder, final_dir);
  }
  return final_dir;
}

void abandon_checkpoint(const std::string& folder) noexcept {
  try {
    if (!folder.empty()) io::remove_all(folder);
  } catch (...) {
  }
}

std::int64_t saved_process_count(const std::string& dir) {
  std::int64_t ranked = 0;
  bool single = false;
  for (const auto& name : io::list_directory(dir)) {
    if (name == "rng_state.pth") single = true;
    if (name.rfind("rng_state_", 0) == 0 && name.size() > 14 &&
        name.compare(name.size() - 4, 4, ".pth") == 0) {
      ++ranked;
    }
  }
  return ranked > 0 ? ranked : (single ? 1 : 0);
}

std::string save_checkpoint(const std::string& output_dir, const CheckpointParts& parts) {
  const auto step = parts.state->global_step;
  const std::string folder = begin_checkpoint(output_dir, step, /*shared_name=*/false);
  try {
    write_checkpoint_files(folder, parts);
    write_rng_state(folder, parts.process_index, parts.num_processes);
    return publish_checkpoint(output_dir, folder, step);
  } catch (...) {
    abandon_checkpoint(folder);
    throw;
  }
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
  loading(file("model.safetensors"),
          [&] { io::load_module_safetensors(file("model.safetensors"), *parts.model); });
  if (parts.masters != nullptr) {
    loading(file("master_weights.pt"), [&] {
      torch::serialize::InputArchive archive;
      archive.load_from(file("master_weights.pt"));
      parts.masters->load(archive);
    });
  }
  loading(file("optimizer.pt"), [&] {
    torch::serialize::InputArchive archive;
    archive.load_from(file("optimizer.pt"));
    parts.optimizer->load(archive);
    check_optimizer_state(*parts.optimizer);
  });
  loading(file("scheduler.pt"), [&] { parts.scheduler->load(file("scheduler.pt")); });
  loading(file("scaler.pt"), [&] {
    if (parts.scaler->is_enabled()) parts.scaler->load(file("scaler.pt"));
  });
  const auto rng_name = rng_state_name(parts.process_index, parts.num_processes);
  const auto rng_file = io::join_path(dir, rng_name);
  const auto saved_processes = saved_process_count(dir);
  if (!io::path_exists(rng_file) && saved_processes > 0 && saved_processes != parts.num_processes) {
    // A run of another size saved it. HF goes on without the file too: the run continues,
    // but not bit for bit. (Missing from a checkpoint of this run's size, it is an error.)
    TORCH_WARN("the checkpoint '", dir, "' has no ", rng_name, ": ", saved_processes,
               " process(es) saved it, and this run has ", parts.num_processes,
               ", so the random state of process ", parts.process_index,
               " (dropout, ...) starts afresh instead of where it stood");
    return;
  }
  loading(rng_file, [&] { restore_rng_states(torch::pickle_load(io::read_file(rng_file))); });
}

void load_checkpoint_weights(const std::string& dir, torch::nn::Module& model,
                             amp::MasterWeights* masters) {
  TORCH_CHECK_VALUE(io::is_directory(dir), "the checkpoint folder '", dir, "' does not exist");
  const auto file = [&](const char* name) { return io::join_path(dir, name); };
  loading(file("model.safetensors"),
          [&] { io::load_module_safetensors(file("model.safetensors"), model); });
  if (masters == nullptr) return;
  if (!io::path_exists(file("master_weights.pt"))) {
    masters->copy_model_to_masters();
    return;
  }
  loading(file("master_weights.pt"), [&] {
    torch::serialize::InputArchive archive;
    archive.load_from(file("master_weights.pt"));
    masters->load(archive);
  });
}

std::optional<TrainingArguments> load_checkpoint_arguments(const std::string& dir) {
  const auto path = io::join_path(dir, "training_args.json");
  if (!io::path_exists(path)) return std::nullopt;
  std::optional<TrainingArguments> args;
  loading(path, [&] { args = TrainingArguments::load_json(path, /*validate=*/false); });
  return args;
}

std::vector<std::string> sorted_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  if (!io::is_directory(output_dir)) return {};
  for (const auto& name : io::list_directory(output_dir)) {
    const auto step = step_of(name);
    const auto path = io::join_path(output_dir, name);
    if (step && io::is_directory(path)) found.emplace_back(*step, path);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::string resolve_checkpoint(const std::string& requested, const std::string& output_dir) {
  if (requested != "latest") return requested;
  const auto all = sorted_checkpoints(output_dir);
  TORCH_CHECK_VALUE(!all.empty(),
                    "resume_from_checkpoint=latest but there is no checkpoint-<step> folder in '",
                    output_dir, "'");
  return all.back();
}

void rotate_checkpoints(const std::string& output_dir, std::int64_t limit,
                        const std::optional<std::string>& best_checkpoint, bool keep_latest) {
  const auto all = sorted_checkpoints(output_dir);
  if (limit <= 0 || static_cast<std::int64_t>(all.size()) <= limit) return;
  std::vector<std::string> kept;
  if (keep_latest) kept.push_back(all.back());
  if (best_checkpoint && std::find(all.begin(), all.end(), *best_checkpoint) != all.end() &&
      std::find(kept.begin(), kept.end(), *best_checkpoint) == kept.end()) {
    kept.push_back(*best_checkpoint);
  }
  const auto keep = std::max<std::int64_t>(limit, static_cast<std::int64_t>(kept.size()));
  auto remaining = static_cast<std::int64_t>(all.size());
  // Oldest first. Renamed out of the checkpoint-<step> namespace first: a process killed while
  // deleting leaves a deleting-... folder (removed by the next save), never a half-deleted
  // checkpoint.
  for (const auto& path : all) {
    if (remaining <= keep) break;
    if (std::find(kept.begin(), kept.end(), path) != kept.end()) continue;
    const auto name = path.substr(path.rfind('/') + 1);
    const auto aside = move_aside(output_dir, path, aside_prefix(kDeletingPrefix, name));
    if (checkpoint_remove_hook) checkpoint_remove_hook(aside);
    io::remove_all(aside);
    --remaining;
  }
}

}  // namespace mantissa::detail
