#include "trainer/checkpoint_folder.h"

#include <algorithm>
#include <string>
#include <utility>

#include <c10/util/Exception.h>

#include "io/filesystem.h"

namespace mantissa::detail {
namespace {

constexpr const char* kPrefix = "checkpoint-";

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

std::string checkpoint_name(std::int64_t step) { return kPrefix + std::to_string(step); }

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
                        const std::optional<std::string>& best_checkpoint, bool keep_latest,
                        const FileFaults& faults) {
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
    faults.removing(aside);
    io::remove_all(aside);
    --remaining;
  }
}

}  // namespace mantissa::detail
