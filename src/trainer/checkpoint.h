#pragma once
// The checkpoints the Trainer writes and reads: checkpoint_folder.h makes a folder appear whole
// or not at all, checkpoint_files.h fills it and reads it back, checkpoint_io.h runs the folder
// protocol among the processes of a job. `save_checkpoint` is the three for a lone process and
// the model's own state (what tests of the files call).

#include <cstdint>
#include <string>

#include "trainer/checkpoint_faults.h"
#include "trainer/checkpoint_files.h"
#include "trainer/checkpoint_folder.h"

namespace mantissa::detail {

/// Writes `output_dir/checkpoint-<state.global_step>` atomically, with `parts.model`'s own
/// state as model.safetensors, and returns its path: a
/// failure (reported by `faults` or by the disk) leaves no new folder and the older checkpoints
/// as they were. Python: HF's `Trainer._save_checkpoint`. Syncs.
std::string save_checkpoint(const std::string& output_dir, const CheckpointParts& parts,
                            const FileFaults& faults = {});

}  // namespace mantissa::detail
