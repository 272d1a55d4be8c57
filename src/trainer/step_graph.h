#pragma once
// The Trainer's training step captured in a CUDA graph (TrainingArguments::cuda_graph).
// Internal: included by src/trainer/*.cpp only. Compiles without CUDA; there every graph is
// unavailable and `cuda_graph_unavailable` says why.

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include <mantissa/batch.h>

namespace mantissa::detail {

/// Why this build cannot capture a training step on `device`, or nullopt when it can.
std::optional<std::string> cuda_graph_unavailable(const c10::Device& device);

/// One training step, captured once and replayed with each new batch.
///
/// The object owns a stream from LibTorch's pool and makes it current for its lifetime
/// (ordered after the work already queued on the previous stream, and the previous stream
/// after its own work when it ends): capturing needs a stream other than the default one, and
/// running the eager warm-up steps on the same stream lets cuBLAS set up its workspace there
/// before the capture. Python: `s = torch.cuda.Stream(); with torch.cuda.stream(s): ...`
/// around `g = torch.cuda.CUDAGraph(); with torch.cuda.graph(g): step(static_batch)`.
class StepGraph {
 public:
  /// `device` must be a CUDA device and `cuda_graph_unavailable(device)` empty.
  explicit StepGraph(const c10::Device& device);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  /// Whether `capture` succeeded.
  bool captured() const noexcept;

  /// Whether `batch` has the shapes, dtypes and device of the captured batch.
  bool fits(const Batch& batch) const;

  /// The captured batch's shapes, for log lines: "data [64, 1, 28, 28] Float, target [64] Long".
  std::string describe_captured() const;

  /// Copies `batch` into static input tensors and captures `step(static_inputs)`: nothing is
  /// executed, so call `replay` next to run it. `step` must not sync with the host (a
  /// `.item()`, a `.cpu()`, a data-dependent shape): CUDA refuses, and the error is rethrown
  /// with what to do. Host-side effects of `step` happen once, here, not on replay.
  void capture(const Batch& batch, const std::function<void(const Batch&)>& step);

  /// Copies `batch` into the static inputs and replays the captured step. No sync.
  void replay(const Batch& batch);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mantissa::detail
