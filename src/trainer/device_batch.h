#pragma once
// Moving a batch onto the training device.

#include <c10/core/Device.h>

#include <mantissa/batch.h>

namespace mantissa::detail {

/// `batch` on `device`. HF's dataloader_pin_memory: a CPU batch bound for a GPU is first
/// copied into page-locked memory (LibTorch's caching host allocator), so that the copy to the
/// device is asynchronous. A batch already there is returned as it is. No sync.
inline Batch to_device(Batch batch, const c10::Device& device, bool pin_memory) {
  // Two dispatched no-op `to()` calls per step otherwise (a batch gathered on the CPU for the CPU).
  if (batch.data.device() == device && batch.target.device() == device) return batch;
  auto move = [&](const torch::Tensor& t) {
    const bool pin = pin_memory && device.is_cuda() && t.is_cpu() && !t.is_pinned();
    return (pin ? t.pin_memory() : t).to(device, /*non_blocking=*/true);
  };
  return {move(batch.data), move(batch.target)};
}

}  // namespace mantissa::detail
