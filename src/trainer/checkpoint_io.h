#pragma once
// How a checkpoint folder comes to exist among the processes of a job: begun, filled by the
// processes that write, completed with every process's random state, then published, or
// abandoned everywhere. A strategy holds one and decides what goes into the folder; this piece
// decides only how the folder appears whole or not at all. Lightning's `CheckpointIO` plugins
// split the work the same way.
//
//   LocalCheckpointIO       a lone process: checkpoint.h's save_checkpoint steps in order
//   CollectiveCheckpointIO  several processes: the same steps, with an agreement after each

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "trainer/checkpoint_faults.h"

namespace mantissa::detail {

class Collectives;

/// Writes what a checkpoint folder holds besides the random states into `folder`.
using CheckpointWriter = std::function<void(const std::string& folder)>;

/// The folder protocol of a checkpoint, for the processes of a job. Every process calls each
/// method, in the same order.
class CheckpointIO {
 public:
  virtual ~CheckpointIO() = default;

  /// Makes `output_dir/checkpoint-<step>` appear whole: the writing processes run
  /// `write_files` into a temporary folder, every process runs `write_own` there (its shard
  /// files, when given) and adds its random state, and the folder is published. A failure anywhere leaves no new folder and the older checkpoints as
  /// they were, and raises on every process. Python: the folder handling of HF's
  /// `Trainer._save_checkpoint`. Syncs.
  virtual void save(const std::string& output_dir, std::int64_t step,
                    const CheckpointWriter& write_files,
                    const CheckpointWriter& write_own = {}) = 0;
  /// Runs `load` (this process reading `dir`) and returns only when it succeeded on every
  /// process; otherwise raises on every process, naming `dir`, so that none trains on while
  /// another stopped. An error of this process passes unchanged; the others point to
  /// `whose_error` ("its": the failed process's; "rank 0's" where rank 0 reads more).
  virtual void load(const std::string& dir, const std::function<void()>& load,
                    const char* whose_error = "its") = 0;
};

/// A lone process's checkpoints, with `faults` seeing each file first (tests).
class LocalCheckpointIO final : public CheckpointIO {
 public:
  explicit LocalCheckpointIO(FileFaults faults = {}) : faults_(std::move(faults)) {}
  void save(const std::string& output_dir, std::int64_t step, const CheckpointWriter& write_files,
            const CheckpointWriter& write_own = {}) override;
  void load(const std::string& dir, const std::function<void()>& load,
            const char* whose_error = "its") override;

 private:
  FileFaults faults_;
};

/// The checkpoints of several processes over `collectives`: the processes where `writer`
/// (HF's `should_save`) write the files into a folder shared by name, every process adds
/// `rng_state_<rank>.pth` and what `write_own` writes (into rank 0's folder when it has none of
/// its own; shard files need one every process sees), the writers
/// publish it; they agree after each stage, and a failure anywhere abandons the folder.
class CollectiveCheckpointIO final : public CheckpointIO {
 public:
  CollectiveCheckpointIO(const Collectives& collectives, bool writer)
      : collectives_(collectives), writer_(writer) {}
  void save(const std::string& output_dir, std::int64_t step, const CheckpointWriter& write_files,
            const CheckpointWriter& write_own = {}) override;
  void load(const std::string& dir, const std::function<void()>& load,
            const char* whose_error = "its") override;

 private:
  const Collectives& collectives_;
  bool writer_;
};

}  // namespace mantissa::detail
