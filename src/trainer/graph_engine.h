#pragma once
// The cuda_graph mode's step engine: the training step captured once in a CUDA graph and
// replayed after. Removing this file, graph_engine.cpp and the one `make_graph_engine` call in
// the loop leaves the eager path whole.

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "trainer/eager_engine.h"
#include "trainer/step_engine.h"
#include "trainer/step_graph.h"

namespace mantissa::detail {

/// Why `cuda_graph` cannot be honoured in this run, or nullopt: no CUDA graph on `device`,
/// an optimizer other than FusedAdamW (`fused` null; `from_factory` when it came from
/// `set_optimizer_factory`), gradient accumulation, or a loss-scale floor the host must check.
std::optional<std::string> cuda_graph_blocker(const TrainingArguments& args,
                                              const PrecisionPlan& plan, const c10::Device& device,
                                              const optim::FusedAdamW* fused, bool from_factory);

/// The step of the cuda_graph mode. The first `cuda_graph_warmup_steps` updates run on the
/// eager engine (cuBLAS and the allocator settle on the graph's stream); the next full batch
/// is captured (forward, backward and the device half of the update) and every later one
/// replays it, followed by the eager engine's host half. A batch of another shape (a smaller
/// last batch) runs eagerly, with one log line per shape. Python: `torch.cuda.graph` around
/// `training_step` + `optimizer.step()`, with `torch.cuda.make_graphed_callables`' warm-up.
///
/// Owns all CUDA-graph state (the StepGraph and its stream, the tensors the captured step
/// writes); while it lives the FusedAdamW is capturable, the loss window counts updates on
/// the device and autocast's weight-cast cache is off. Its destruction (at the end of
/// `train()`, also when an exception passes) undoes all of it and leaves the gradients None.
class GraphEngine final : public StepEngine {
 public:
  /// `parts.fused` must be non-null and `cuda_graph_blocker` empty. Prints one line saying
  /// after how many warm-up steps the capture happens.
  GraphEngine(EagerEngine& eager, StepParts parts);
  /// Clears the gradients, drops the captured tensors, makes FusedAdamW non-capturable and
  /// ends the graph and its stream. A failure to clear is a warning: it may run during unwinding.
  ~GraphEngine() override;
  GraphEngine(const GraphEngine&) = delete;
  GraphEngine& operator=(const GraphEngine&) = delete;

  /// The eager engine while warming up, the graph after (every batch an update: the blocker
  /// refuses gradient accumulation). Syncs only to learn whether an fp16 update was skipped.
  bool train_batch(const Batch& batch, std::int64_t in_group, bool boundary) override;
  /// The captured step's norm after a replay, the eager engine's after an eager update.
  torch::Tensor last_grad_norm() const override;

 private:
  void graphed_step(const Batch& batch);
  void capture(const Batch& batch);

  EagerEngine& eager_;
  StepParts parts_;
  optim::FusedAdamW& fused_;
  std::unique_ptr<StepGraph> graph_;
  std::int64_t updates_ = 0;          // updates run by this engine: the first ones warm up
  bool last_replayed_ = false;        // whether the last update was a replay (for last_grad_norm)
  torch::Tensor captured_grad_norm_;  // what the captured step writes, read after each replay
  torch::Tensor captured_scale_before_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> captured_grads_;  // (param, graph's grad)
  std::set<std::string> eager_shapes_logged_;
};

/// The graph engine when `args.cuda_graph` asks for one and nothing blocks it, else null; a
/// blocked request prints "cuda_graph: off, training eagerly: <why>".
std::unique_ptr<GraphEngine> make_graph_engine(EagerEngine& eager, const StepParts& parts,
                                               bool optimizer_from_factory);

}  // namespace mantissa::detail
