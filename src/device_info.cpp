// What this machine offers for mixed precision, and whether a TrainingArguments can run on it.
#include "device_info.h"

#include <string>

#include <ATen/ATen.h>
#include <ATen/cpu/Utils.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#if defined(MANTISSA_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace mantissa {

namespace detail {

int cuda_compute_capability_major() { return query_device_info().cuda_capability_major; }

const DeviceInfo& query_device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    d.cuda_available = torch::cuda::is_available();
#if defined(MANTISSA_WITH_CUDA)
    if (d.cuda_available) {
      int major = -1;
      int minor = -1;
      if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
          cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess) {
        d.cuda_capability_major = major;
        d.cuda_capability_minor = minor;
      } else {
        (void)cudaGetLastError();  // leave no sticky error behind for the next CUDA call
      }
    }
#endif
    // Older LibTorch builds have no Half matmul on the CPU ("addmm_impl_cpu_" not implemented
    // for 'Half'); 2.x has them. Ask the library itself rather than its version number.
    try {
      const auto a = at::ones({2, 2}, at::TensorOptions().dtype(at::kHalf));
      d.cpu_fp16 = at::mm(a, a).defined();
    } catch (const c10::Error&) {
      d.cpu_fp16 = false;
    }
    std::vector<std::pair<std::string, bool>> flags;
    for (const auto& [key, value] : at::cpu::get_cpu_capabilities()) {
      if (value.isBool()) flags.emplace_back(key, value.toBool());
    }
    d.cpu_native_bf16 = has_native_bf16_flag(flags);
    return d;
  }();
  return info;
}

bool has_native_bf16_flag(const std::vector<std::pair<std::string, bool>>& capability_flags) {
  for (const auto& [key, present] : capability_flags) {
    // cpuinfo names bf16 arithmetic avx512_bf16 and amx_bf16 on x86, bf16 / sve_bf16 on Arm;
    // avx_ne_convert only converts.
    if (present && key.find("bf16") != std::string::npos) return true;
  }
  return false;
}

std::string emulated_bf16_note(bool on_cpu, c10::ScalarType compute_dtype, bool cpu_native_bf16) {
  if (!on_cpu || compute_dtype != c10::kBFloat16 || cpu_native_bf16) return "";
  return " (this CPU has no native bf16, neither AVX512-BF16 nor AMX: bf16 math is emulated and "
         "runs several times slower than fp32)";
}

void check_precision_support(const TrainingArguments& args, const DeviceInfo& info) {
  const bool on_cuda = info.cuda_available && !args.use_cpu();
  const bool capability_known = info.cuda_capability_major >= 0;
  const std::string capability =
      std::to_string(info.cuda_capability_major) + "." + std::to_string(info.cuda_capability_minor);

  if (args.bf16() || args.bf16_full_eval()) {
    const char* field = args.bf16() ? "bf16" : "bf16_full_eval";
    // bf16 autocast runs on any CPU; on CUDA it needs Ampere (sm_80) tensor cores. An unknown
    // capability (library built without the CUDA runtime) is let through.
    TORCH_CHECK_VALUE(
        !on_cuda || !capability_known || info.cuda_capability_major >= 8,
        "Your setup doesn't support bf16/gpu. You need Ampere+ GPU with cuda>=11.0. (", field,
        "=True, but cuda:0 has compute capability ", capability,
        "; use --fp16 there, or --use_cpu to train on the CPU)");
  }
  if (args.fp16() || args.fp16_full_eval()) {
    const char* field = args.fp16() ? "fp16" : "fp16_full_eval";
    TORCH_CHECK_VALUE(on_cuda || info.cpu_fp16,
                      "FP16 Mixed precision training with AMP or APEX (`--fp16`) and FP16 half "
                      "precision evaluation (`--fp16_full_eval`) can only be used on CUDA "
                      "devices. (",
                      field,
                      "=True on the CPU, and this LibTorch has no float16 CPU kernels; "
                      "use --bf16 on the CPU)");
  }
  if (args.tf32().value_or(false)) {
    std::string why;
    if (!info.cuda_available) {
      why = "no CUDA device is visible";
    } else if (args.use_cpu()) {
      why = "use_cpu=True trains on the CPU";
    } else if (capability_known && info.cuda_capability_major < 8) {
      why = "cuda:0 has compute capability " + capability;
    }
    TORCH_CHECK_VALUE(why.empty(),
                      "--tf32 requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7 "
                      "(tf32=True, but ",
                      why, "; use --tf32 false or leave it unset)");
  }
}

}  // namespace detail

}  // namespace mantissa
