// StepGraph: at::cuda::CUDAGraph around the Trainer's step; a stub without CUDA.
#include "trainer/step_graph.h"

#include "trainer/device_batch.h"

#include <fmt/format.h>

#include <ATen/ATen.h>

#ifdef MANTISSA_WITH_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace mantissa::detail {
namespace {

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
  c10::DeviceIndex device;
  c10::cuda::CUDAStream previous;
  c10::cuda::CUDAStream stream;
  c10::MempoolId_t pool;  // the graph's private memory, ours so a failed capture can end it
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  Batch inputs;
  bool captured = false;

  explicit State(const c10::Device& d)
      : device(d.index()),
        previous(c10::cuda::getCurrentCUDAStream(d.index())),
        stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, d.index())),
        pool(at::cuda::graph_pool_handle()) {}
};

namespace {

template <typename F>
void ignoring_errors(F&& f) {
  try {
    f();
  } catch (...) {
  }
}

// After a capture failed: end the stream's capture if CUDA has not, and take the caching
// allocators out of capture mode. LibTorch 2.11's CUDAGraph::capture_end throws before doing
// the latter when the capture was invalidated (pytorch#180395), which would leave every later
// allocation routed through a filter of the dead graph.
void abandon_capture(c10::DeviceIndex device, const c10::cuda::CUDAStream& stream,
                     c10::MempoolId_t pool) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream.stream(), &partial) == cudaSuccess && partial != nullptr) {
      cudaGraphDestroy(partial);
    }
  }
  (void)cudaGetLastError();  // the capture's error is not sticky; clear it
  ignoring_errors([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool); });
  ignoring_errors([&] { c10::cuda::CUDACachingAllocator::releasePool(device, pool); });
  ignoring_errors([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool); });
  ignoring_errors([&] { at::getHostAllocator(at::kCUDA)->release_pool(pool); });
}

}  // namespace

StepGraph::StepGraph(const c10::Device& device) {
  const auto unavailable = cuda_graph_unavailable(device);
  TORCH_CHECK(!unavailable, "StepGraph: ", *unavailable);
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
  state_->inputs = batch.map([](const torch::Tensor& t) { return t.clone(); });
  // As torch.cuda.graph does: hand the warm-up's cached blocks back first, so the graph's
  // private pool does not come on top of them.
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::emptyCache();
  state_->graph = std::make_unique<at::cuda::CUDAGraph>();
  auto& graph = *state_->graph;
  graph.capture_begin(state_->pool);
  std::string failure;
  try {
    step(state_->inputs);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  bool ended = false;
  try {
    graph.capture_end();
    ended = true;
  } catch (const std::exception& e) {
    if (failure.empty())
      failure = e.what();  // CUDA refused something inside: the capture was invalidated
  }
  if (!failure.empty()) {
    // An ended graph gives its pool back when it is destroyed; one that failed to end has not.
    if (!ended) abandon_capture(state_->device, state_->stream, state_->pool);
    state_->graph.reset();
    TORCH_CHECK(false, "cuda_graph: capturing the training step failed: ", failure,
                "\nSomething in the step waits for the GPU (a .item(), .cpu(), a tensor whose "
                "shape depends on data, an optimizer other than FusedAdamW, min_loss_scale > 0). "
                "Remove it, or train without --cuda_graph.");
  }
  state_->captured = true;
}

void StepGraph::replay(const Batch& batch) {
  TORCH_CHECK(state_->captured, "StepGraph: replay before capture");
  TORCH_CHECK(fits(batch), "StepGraph: the batch (", describe_shapes(batch),
              ") does not fit the captured one (", describe_captured(), ")");
  batch.for_each([&](const std::string& name, const torch::Tensor& t) {
    state_->inputs.at(name).copy_(t, /*non_blocking=*/true);
  });
  state_->graph->replay();
}

bool StepGraph::captured() const noexcept { return state_->captured; }

bool StepGraph::fits(const Batch& batch) const {
  if (!state_->captured || batch.names() != state_->inputs.names()) return false;
  bool same = true;
  batch.for_each([&](const std::string& name, const torch::Tensor& t) {
    same = same && same_layout(t, state_->inputs.at(name));
  });
  return same;
}

std::string StepGraph::describe_captured() const {
  if (!state_->captured) return "nothing captured";
  return describe_shapes(state_->inputs);
}

#else  // !MANTISSA_WITH_CUDA

std::optional<std::string> cuda_graph_unavailable(const c10::Device& device) {
  if (!device.is_cuda()) {
    return fmt::format("the device is {}; CUDA graphs need a CUDA device", device.str());
  }
  return std::string(
      "mantissa was built without CUDA (MANTISSA_CUDA=OFF, or nvcc and LibTorch disagree)");
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
