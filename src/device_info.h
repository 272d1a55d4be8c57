#pragma once
// What the machine offers for mixed precision, and the decision whether a TrainingArguments
// can run on it. Internal: the public header stays free of CUDA.

#include <string>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>

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
  /// The CPU has bf16 arithmetic in hardware (x86: AVX512-BF16 or AMX-BF16; Arm: the BF16
  /// extension), as cpuinfo reports it through `at::cpu::get_cpu_capabilities()`. Without it
  /// oneDNN emulates bf16 matmuls with fp32 instructions plus conversions.
  bool cpu_native_bf16 = false;
};

/// Queries the machine once per process and caches the answer. Initialises CUDA when
/// present; no sync.
const DeviceInfo& query_device_info();

/// Compute capability major of cuda:0, -1 when no CUDA device is visible or the capability
/// cannot be read (library built without the CUDA runtime).
int cuda_compute_capability_major();

/// True when one of cpuinfo's capability flags (`at::cpu::get_cpu_capabilities()` keys such as
/// `avx512_bf16`, `amx_bf16`, `bf16`) says the CPU computes in bf16 natively. Pure.
bool has_native_bf16_flag(const std::vector<std::pair<std::string, bool>>& capability_flags);

/// The clause the run's first line adds when the run computes in bf16 on a CPU without native
/// bf16 (empty otherwise): bf16 then runs emulated, several times slower than fp32 (BENCHMARKS.md,
/// "Pointers from the code"). Pure.
std::string emulated_bf16_note(bool on_cpu, c10::ScalarType compute_dtype, bool cpu_native_bf16);

/// Raises c10::ValueError (HF's wording) when `args` asks for a precision that the machine
/// described by `info` cannot run: bf16 on a CUDA device below compute capability 8.0, fp16
/// on a CPU without fp16 kernels, tf32=true without an Ampere or newer GPU. A pure function of
/// its arguments, so each branch is unit-tested without the hardware.
void check_precision_support(const TrainingArguments& args, const DeviceInfo& info);

}  // namespace mantissa::detail
