#pragma once
// The folder protocol of checkpoints: how `output_dir/checkpoint-<step>` comes to exist whole or
// not at all, how old ones are rotated out, and how a save killed half-way is cleaned up. What
// goes inside a folder is checkpoint_files.h's business.
//
// A save writes into a temporary folder beside the checkpoints (`tmp-checkpoint-<step>-*`) and
// renames it into place; a re-save of a step moves the old folder aside (`old-checkpoint-*`)
// first; a rotation renames a checkpoint to `deleting-checkpoint-*` before deleting it. A crash
// or a full disk at any point leaves the complete checkpoints as they were, and the next save
// removes or puts back what was left.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/checkpoint_faults.h"

namespace mantissa::detail {

/// `checkpoint-<step>` as a folder name. Python: HF's `f"{PREFIX_CHECKPOINT_DIR}-{step}"`.
std::string checkpoint_name(std::int64_t step);

/// Makes the empty folder a new `checkpoint-<step>` is written in, after cleaning interrupted
/// saves. `shared_name`: a fixed name (`tmp-checkpoint-<step>-shared`) that other processes can
/// find without being told, instead of a unique one; an old folder of that name is replaced.
/// No device sync.
std::string begin_checkpoint(const std::string& output_dir, std::int64_t step, bool shared_name);

/// The fixed folder name `begin_checkpoint(..., shared_name=true)` makes.
std::string shared_checkpoint_folder(const std::string& output_dir, std::int64_t step);

/// Renames a complete `folder` to `output_dir/checkpoint-<step>`, replacing an older one of
/// that step only then, and returns the final path. No device sync.
std::string publish_checkpoint(const std::string& output_dir, const std::string& folder,
                               std::int64_t step);

/// Removes a folder that will not be published; never throws. No device sync.
void abandon_checkpoint(const std::string& folder) noexcept;

/// Removes what a save or rotation killed half-way left in `output_dir` (`tmp-checkpoint-*`,
/// `deleting-checkpoint-*`), and puts back a checkpoint that was moved aside to be re-saved
/// (`old-checkpoint-<step>-*`) when no `checkpoint-<step>` replaced it. Called by every save.
void clean_interrupted_saves(const std::string& output_dir);

/// The `checkpoint-<n>` folders in `output_dir`, oldest (smallest n) first. Python: HF's
/// `Trainer._sorted_checkpoints`.
std::vector<std::string> sorted_checkpoints(const std::string& output_dir);

/// Resolves `resume_from_checkpoint`: "latest" is the newest checkpoint in `output_dir`
/// (a c10::ValueError when there is none); any other value is returned as it is.
std::string resolve_checkpoint(const std::string& requested, const std::string& output_dir);

/// Deletes the oldest checkpoints until `limit` remain, never the newest (`keep_latest`, to
/// resume from) nor the best one: with both protected and `limit` 1, two remain. Python: HF's
/// `rotate_checkpoints`; `keep_latest` false is what HF does at the end of a run with
/// `save_total_limit=1` (only the best stays). `faults.before_remove` sees each renamed folder
/// just before its deletion.
void rotate_checkpoints(const std::string& output_dir, std::int64_t limit,
                        const std::optional<std::string>& best_checkpoint, bool keep_latest = true,
                        const FileFaults& faults = {});

}  // namespace mantissa::detail
