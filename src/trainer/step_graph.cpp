// StepGraph: at::cuda::CUDAGraph around the Trainer's step; a stub without CUDA.
#include "trainer/step_graph.h"

#include <fmt/format.h>

#include <ATen/ATen.h>

#ifdef MANTISSA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace mantissa::detail {
namespace {

[[maybe_unused]] std::string describe(const at::Tensor& t) {
  return fmt::format("{} {}", c10::str(t.sizes()), c10::toString(t.scalar_type()));
}

[[maybe_unused]] bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && a.device() == b.device();
}

}  // namespace

#ifdef MANTISSA_WITH_CUDA

std::optional<std::string> cuda_graph_unavailable(const c10::Device& device) {
  if (!device.is_cuda()) {
    return fmt::format("the device is {}; CUDA graphs need a CUDA device", device.str());
  }
  if (c10::cuda::device_count() == 0) return std::string("no CUDA device is visible");
  return std::nullopt;
}

struct StepGraph::State {
  c10::cuda::CUDAStream previous;
  c10::cuda::CUDAStream stream;
  at::cuda::CUDAGraph graph;
  Batch inputs;
  bool captured = false;

  explicit State(const c10::Device& device)
      : previous(c10::cuda::getCurrentCUDAStream(device.index())),
        stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}
};

StepGraph::StepGraph(const c10::Device& device) {
  TORCH_CHECK(!cuda_graph_unavailable(device), "StepGraph: ", *cuda_graph_unavailable(device));
  const c10::cuda::CUDAGuard device_guard(device);
  state_ = std::make_unique<State>(device);
  at::cuda::CUDAEvent queued;  // the new stream starts after what is queued on the old one
  queued.record(state_->previous);
  queued.block(state_->stream);
  c10::cuda::setCurrentCUDAStream(state_->stream);
}

StepGraph::~StepGraph() {
  try {
    at::cuda::CUDAEvent done;
    done.record(state_->stream);
    done.block(state_->previous);
  } catch (const std::exception& e) {
    TORCH_WARN("StepGraph: could not order the streams on exit: ", e.what());
  }
  c10::cuda::setCurrentCUDAStream(state_->previous);
}

void StepGraph::capture(const Batch& batch, const std::function<void(const Batch&)>& step) {
  TORCH_CHECK(!state_->captured, "StepGraph: the step is already captured");
  state_->inputs = Batch(batch.data.clone(), batch.target.clone());
  auto& graph = state_->graph;
  graph.capture_begin();
  try {
    step(state_->inputs);
  } catch (const std::exception& e) {
    try {
      graph.capture_end();  // ends the stream's capture mode; the graph itself is invalid
    } catch (...) {
    }
    TORCH_CHECK(false, "cuda_graph: capturing the training step failed: ", e.what(),
                "\nSomething in the step waits for the GPU (a .item(), .cpu(), a tensor whose "
                "shape depends on data, an optimizer other than FusedAdamW, min_loss_scale > 0). "
                "Remove it, or train without --cuda_graph.");
  }
  graph.capture_end();
  state_->captured = true;
}

void StepGraph::replay(const Batch& batch) {
  TORCH_CHECK(state_->captured, "StepGraph: replay before capture");
  TORCH_CHECK(fits(batch), "StepGraph: the batch (data ", describe(batch.data), ") does not fit the captured one (",
              describe_captured(), ")");
  state_->inputs.data.copy_(batch.data, /*non_blocking=*/true);
  state_->inputs.target.copy_(batch.target, /*non_blocking=*/true);
  state_->graph.replay();
}

bool StepGraph::captured() const noexcept { return state_->captured; }

bool StepGraph::fits(const Batch& batch) const {
  return state_->captured && same_layout(batch.data, state_->inputs.data) &&
         same_layout(batch.target, state_->inputs.target);
}

std::string StepGraph::describe_captured() const {
  if (!state_->captured) return "nothing captured";
  return fmt::format("data {}, target {}", describe(state_->inputs.data), describe(state_->inputs.target));
}

#else  // !MANTISSA_WITH_CUDA

std::optional<std::string> cuda_graph_unavailable(const c10::Device& device) {
  if (!device.is_cuda()) {
    return fmt::format("the device is {}; CUDA graphs need a CUDA device", device.str());
  }
  return std::string("mantissa was built without CUDA (MANTISSA_CUDA=OFF, or nvcc and LibTorch disagree)");
}

struct StepGraph::State {};

StepGraph::StepGraph(const c10::Device& device) {
  TORCH_CHECK(false, "StepGraph: ", *cuda_graph_unavailable(device));
}
StepGraph::~StepGraph() = default;
void StepGraph::capture(const Batch&, const std::function<void(const Batch&)>&) {
  TORCH_CHECK(false, "StepGraph: built without CUDA");
}
void StepGraph::replay(const Batch&) { TORCH_CHECK(false, "StepGraph: built without CUDA"); }
bool StepGraph::captured() const noexcept { return false; }
bool StepGraph::fits(const Batch&) const { return false; }
std::string StepGraph::describe_captured() const { return "nothing captured"; }

#endif

}  // namespace mantissa::detail
