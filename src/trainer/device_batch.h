#pragma once
// Moving a batch onto the training device.

#include <string>

#include <c10/core/Device.h>
#include <c10/util/StringUtil.h>

#include <mantissa/batch.h>

namespace mantissa::detail {

/// `batch` on `device`, every entry. HF's dataloader_pin_memory: a CPU tensor bound for a GPU
/// is first copied into page-locked memory (LibTorch's caching host allocator), so that the
/// copy to the device is asynchronous. A batch already there is returned as it is. No sync.
inline Batch to_device(Batch batch, const c10::Device& device, bool pin_memory) {
  // Dispatched no-op `to()` calls per step otherwise (a batch gathered on the CPU for the CPU).
  bool there = true;
  batch.for_each(
      [&](const std::string&, const torch::Tensor& t) { there = there && t.device() == device; });
  if (there) return batch;
  return batch.map([&](const torch::Tensor& t) {
    const bool pin = pin_memory && device.is_cuda() && t.is_cpu() && !t.is_pinned();
    return (pin ? t.pin_memory() : t).to(device, /*non_blocking=*/true);
  });
}

/// "input_ids [8, 64] Long, labels [8, 64] Long": each entry's shape and dtype, for messages.
inline std::string describe_shapes(const Batch& batch) {
  std::string text;
  batch.for_each([&](const std::string& name, const torch::Tensor& t) {
    text += c10::str(text.empty() ? "" : ", ", name, " ", t.sizes(), " ", t.scalar_type());
  });
  return text.empty() ? std::string("an empty batch") : text;
}

}  // namespace mantissa::detail
