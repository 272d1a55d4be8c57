#pragma once
// Whether work queued now on a device is being captured into a CUDA graph. Internal.

#include <c10/core/Device.h>

#ifdef MANTISSA_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace mantissa::detail {

/// True while the current stream of CUDA device `device` is capturing. Asks CUDA only for a
/// CUDA device (a CUDA build of LibTorch on a machine without a GPU must not); false on a
/// build without CUDA. Python: `torch.cuda.is_current_stream_capturing()`.
inline bool is_capturing_on(const c10::Device& device) {
#ifdef MANTISSA_WITH_CUDA
  if (!device.is_cuda()) return false;
  const c10::cuda::CUDAGuard device_guard(device);
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  (void)device;
  return false;
#endif
}

}  // namespace mantissa::detail
