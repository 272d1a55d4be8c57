#pragma once
// What the machine offers for mixed precision, and the decision whether a TrainingArguments
// can run on it. Internal: the public header stays free of CUDA.

#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// Facts about this machine that decide whether bf16, fp16 and tf32 can be used.
struct DeviceInfo {
  /// LibTorch sees at least one CUDA device.
  bool cuda_available = false;
  /// Compute capability of cuda:0 (the device `TrainingArguments::device()` picks);
  /// -1 when there is no CUDA device or the library was built without the CUDA runtime.
  int cuda_capability_major = -1;
  int cuda_capability_minor = -1;
  /// This LibTorch has float16 matmul kernels on the CPU (probed with a 2x2 at::mm).
  bool cpu_fp16 = false;
};

/// Queries the machine once per process and caches the answer. Initialises CUDA when
/// present; no sync.
const DeviceInfo& query_device_info();

/// Compute capability major of cuda:0, -1 when no CUDA device is visible or the capability
/// cannot be read (library built without the CUDA runtime).
int cuda_compute_capability_major();

/// Raises c10::ValueError (HF's wording) when `args` asks for a precision that the machine
/// described by `info` cannot run: bf16 on a CUDA device below compute capability 8.0, fp16
/// on a CPU without fp16 kernels, tf32=true without an Ampere or newer GPU. A pure function of
/// its arguments, so each branch is unit-tested without the hardware.
void check_precision_support(const TrainingArguments& args, const DeviceInfo& info);

}  // namespace mantissa::detail
