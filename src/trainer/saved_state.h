#pragma once
// The registry of training state that a checkpoint holds, one file per piece: each stateful
// piece of a run describes itself once, with its file, how it saves and loads, and what it
// does after each optimizer update. The checkpoint files and the step engine walk the list and
// name no piece. The optimizer, the LR scheduler, the loss scaler and the fp32 masters are
// described in checkpoint_files.cpp (from the objects the strategy hands over at each save,
// which may be gathered copies); a run adds its own pieces, such as the delayed FP8 recipe's
// scales (src/fp8/trainer_fp8.cpp), as torchtitan's model converters carry their own state.
// What stays outside: the model (through the strategy), the trainer's state and arguments
// (read first, to decide whether the rest can be), and the random states (one per process).

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace mantissa::detail {

/// What a piece may use after an optimizer update.
struct StepServices {
  /// Replaces each element of a dense contiguous tensor, in place, by its maximum over the
  /// processes (the strategy's `max_all_reduce_`; nothing alone). A collective.
  std::function<void(at::Tensor&)> max_all_reduce;
};

/// One piece of training state with a file of its own in each checkpoint. Plain data; the
/// piece builds it.
struct SavedState {
  /// Its file in the checkpoint folder ("fp8_state.pt").
  std::string file;
  /// Writes the file at `path`, atomically (a failure leaves no file there). Syncs (copies to
  /// the host).
  std::function<void(const std::string& path)> save;
  /// Restores the state from the file at `path` (errors are prefixed with the file's name by
  /// the caller). Syncs.
  std::function<void(const std::string& path)> load;
  /// Called instead of `load` when the checkpoint folder `checkpoint_dir` has no such file:
  /// throws to refuse the checkpoint, or returns (having warned) to go on from fresh state.
  /// Empty: a missing file is an error that names it.
  std::function<void(const std::string& checkpoint_dir)> load_missing;
  /// After each optimizer update, taken or skipped, on every process, in registration order;
  /// may be empty. A collective where it communicates.
  std::function<void(const StepServices& services)> after_optimizer_step;
};

/// The pieces a run registered, in registration order.
using SavedStates = std::vector<SavedState>;

}  // namespace mantissa::detail
