#pragma once
// The launch side of fused_adamw_cuda.cu, which alone includes this file: the launch sizes, the
// metadata that travels as a kernel argument, the step-counter kernel and multi_tensor_apply,
// the packing of many tensors into few launches.

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

namespace mantissa::optim::detail::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kChunkSize = 64 * 1024;
// The launch metadata travels as a kernel argument (no host-to-device copy); these sizes keep
// it under the classic 4 KiB argument limit.
constexpr int kMaxTensors = 24;
constexpr int kMaxBlocks = 320;
constexpr int kMaxSteps = 256;

struct TensorListMeta {
  void* param[kMaxTensors];
  const void* grad[kMaxTensors];
  void* exp_avg[kMaxTensors];
  void* exp_avg_sq[kMaxTensors];
  void* max_exp_avg_sq[kMaxTensors];
  void* model[kMaxTensors];
  const float* step[kMaxTensors];
  std::int64_t numel[kMaxTensors];
  unsigned char block_to_tensor[kMaxBlocks];
  int block_to_chunk[kMaxBlocks];
};
static_assert(sizeof(TensorListMeta) <= 4000, "kernel argument too large");

struct StepList {
  float* step[kMaxSteps];
  int size;
};

__global__ void increment_steps_kernel(StepList steps, const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.f) return;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < steps.size) *steps.step[i] += 1.f;
}

// Adds 1 to the step of each tensor in `nonempty` (unless found_inf), kMaxSteps per launch.
void increment_steps(const std::vector<at::Tensor>& steps, const std::vector<std::size_t>& nonempty,
                     const float* found_inf, cudaStream_t stream) {
  StepList list{};
  for (std::size_t k = 0; k < nonempty.size(); ++k) {
    list.step[list.size++] = steps[nonempty[k]].data_ptr<float>();
    if (list.size == kMaxSteps || k == nonempty.size() - 1) {
      increment_steps_kernel<<<(list.size + 127) / 128, 128, 0, stream>>>(list, found_inf);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      list.size = 0;
    }
  }
}

// Packs the non-empty tensors among `params` into as few launches as the metadata allows, as
// apex's and TransformerEngine's multi_tensor_apply: each block of a launch takes one chunk of
// kChunkSize elements of one tensor, at most kMaxTensors tensors and kMaxBlocks blocks per
// launch, and a tensor whose chunks do not all fit continues in the next launch as its slot 0.
// `set_slot(meta, slot, i)` writes the pointers of tensor i into `meta`'s slot (numel and the
// block map are written here); `launch(meta, blocks)` starts one kernel. Returns the indices of
// the non-empty tensors, in order.
template <typename Meta, typename SetSlot, typename Launch>
std::vector<std::size_t> multi_tensor_apply(const std::vector<at::Tensor>& params,
                                            SetSlot&& set_slot, Launch&& launch) {
  std::vector<std::size_t> nonempty;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel() > 0) nonempty.push_back(i);
  }
  Meta meta{};
  int tensors = 0;
  int blocks = 0;
  for (std::size_t k = 0; k < nonempty.size(); ++k) {
    const auto i = nonempty[k];
    const int slot = tensors++;
    set_slot(meta, slot, i);
    meta.numel[slot] = params[i].numel();
    const std::int64_t chunks = (params[i].numel() + kChunkSize - 1) / kChunkSize;
    for (std::int64_t c = 0; c < chunks; ++c) {
      meta.block_to_tensor[blocks] = static_cast<unsigned char>(slot);
      meta.block_to_chunk[blocks] = static_cast<int>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      const bool tensors_full = tensors == kMaxTensors && last_chunk;
      const bool blocks_full = blocks == kMaxBlocks;
      const bool everything = k == nonempty.size() - 1 && last_chunk;
      if (tensors_full || blocks_full || everything) {
        launch(meta, blocks);
        blocks = 0;
        if (last_chunk) {
          tensors = 0;
        } else {
          // The tensor continues in the next launch: it becomes slot 0.
          set_slot(meta, 0, i);
          meta.numel[0] = params[i].numel();
          tensors = 1;
        }
      }
    }
  }
  return nonempty;
}

}  // namespace
}  // namespace mantissa::optim::detail::cuda
