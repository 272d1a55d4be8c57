#pragma once
// The checkpoints the Trainer writes and reads: checkpoint_folder.h makes a folder appear whole
// or not at all, checkpoint_files.h fills it and reads it back. `save_checkpoint` is the two in
// order for a lone process.
//
// A data-parallel save runs the steps with the other processes in between: the writing process
// begins the folder (`begin_checkpoint`) and writes the files (`write_checkpoint_files`), every
// process adds its random state (`write_rng_state`), the writer publishes
// (`publish_checkpoint`); a failure anywhere abandons the folder on every writer
// (`abandon_checkpoint`).

#include <cstdint>
#include <string>

#include "trainer/checkpoint_faults.h"
#include "trainer/checkpoint_files.h"
#include "trainer/checkpoint_folder.h"

namespace mantissa::detail {

/// Writes `output_dir/checkpoint-<state.global_step>` atomically and returns its path: a
/// failure (reported by `faults` or by the disk) leaves no new folder and the older checkpoints
/// as they were. Python: HF's `Trainer._save_checkpoint`. Syncs.
std::string save_checkpoint(const std::string& output_dir, const CheckpointParts& parts,
                            const FileFaults& faults = {});

}  // namespace mantissa::detail
