// The GPU's limits, measured in the same run as the figures compared with them
// (scripts/gpu-check runs this; results in BENCHMARKS.md):
//   gemm   the bf16 GEMM peak through cuBLAS (cublasGemmEx, fp32 accumulate): the ceiling for
//          MFU; and on SM 8.9+ the FP8 e4m3 GEMM through at::_scaled_mm (Float8Linear's forward);
//          model FLOPs utilisation; and an fp32 GEMM with tf32 off and on (mantissa's
//          Tf32Guard), to check that the flag really changes cuBLAS's math mode.
//   adamw  FusedAdamW's step in bytes/s against a device-to-device copy of the same size (the
//          memory-bound limit), for fp32 params and for fp32 masters writing a bf16 model.
//
//   build/bench/gpu_bench [--gemm_size 8192] [--adamw_millions 100] [--repeats 20]
//
// Medians over --repeats timed runs (CUDA events) after warm-up. Prints a table and one JSON line.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <cublas_v2.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <mantissa/amp/master_weights.h>
#include <mantissa/amp/tf32_guard.h>
#include <mantissa/optim/fused_adamw.h>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Median milliseconds of `run` on the current stream, timed with CUDA events.
double median_ms(const std::function<void()>& run, int repeats, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) run();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault);
    at::cuda::CUDAEvent stop(cudaEventDefault);
    const auto stream = at::cuda::getCurrentCUDAStream();
    start.record(stream);
    run();
    stop.record(stream);
    stop.synchronize();
    ms.push_back(start.elapsed_time(stop));
  }
  return median(ms);
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(
        fmt::format("{} failed: cuBLAS status {}", what, static_cast<int>(status)));
  }
}

nlohmann::json bench_gemm(int64_t n, int repeats) {
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto a = torch::randn({n, n}, bf16);
  const auto b = torch::randn({n, n}, bf16);
  auto c = torch::empty({n, n}, bf16);
  const float alpha = 1.f;
  const float beta = 0.f;
  const auto flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  const double bf16_ms = median_ms(
      [&] {
        check_cublas(
            cublasGemmEx(at::cuda::getCurrentCUDABlasHandle(), CUBLAS_OP_N, CUBLAS_OP_N,
                         static_cast<int>(n), static_cast<int>(n), static_cast<int>(n), &alpha,
                         a.data_ptr(), CUDA_R_16BF, static_cast<int>(n), b.data_ptr(), CUDA_R_16BF,
                         static_cast<int>(n), &beta, c.data_ptr(), CUDA_R_16BF, static_cast<int>(n),
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx (bf16)");
      },
      repeats);

  const auto a32 = a.to(torch::kFloat);
  const auto b32 = b.to(torch::kFloat);
  auto fp32_ms = [&](bool tf32) {
    mantissa::amp::Tf32Guard guard(tf32);
    return median_ms([&] { at::mm(a32, b32); }, repeats);
  };
  const double fp32_off_ms = fp32_ms(false);
  const double fp32_on_ms = fp32_ms(true);
  const double peak = flops / (bf16_ms * 1e-3) / 1e12;
  fmt::print("GEMM {0}x{0}x{0}\n", n);
  fmt::print("  bf16 cublasGemmEx        {:8.3f} ms  {:7.1f} TFLOP/s   (the MFU ceiling)\n",
             bf16_ms, peak);
  fmt::print("  fp32 at::mm, tf32 off    {:8.3f} ms  {:7.1f} TFLOP/s\n", fp32_off_ms,
             flops / (fp32_off_ms * 1e-3) / 1e12);
  fmt::print(
      "  fp32 at::mm, tf32 on     {:8.3f} ms  {:7.1f} TFLOP/s   ({:.2f}x: tf32 {} cuBLAS's math "
      "mode)\n",
      fp32_on_ms, flops / (fp32_on_ms * 1e-3) / 1e12, fp32_off_ms / fp32_on_ms,
      fp32_off_ms / fp32_on_ms > 1.5 ? "changes" : "does NOT change");
  nlohmann::json result = {{"size", n},
                            {"bf16_ms", bf16_ms},
                            {"bf16_tflops", peak},
                            {"fp32_tf32_off_ms", fp32_off_ms},
                            {"fp32_tf32_on_ms", fp32_on_ms},
                            {"tf32_speedup", fp32_off_ms / fp32_on_ms}};

  // FP8 (SM 8.9+): e4m3 x e4m3 through at::_scaled_mm with per-tensor scales, bf16 out and
  // fast accumulation, the forward GEMM of mantissa::fp8::Float8Linear; the second operand
  // column-major, as cuBLASLt requires.
  const auto* props = at::cuda::getCurrentDeviceProperties();
  if (props->major * 10 + props->minor >= 89) {
    const auto a8 = a.to(torch::kFloat8_e4m3fn);
    const auto b8 = b.to(torch::kFloat8_e4m3fn).t().contiguous().t();  // column-major
    const auto one = torch::ones({}, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA));
    const double fp8_ms = median_ms(
        [&] {
          at::_scaled_mm(a8, b8, one, one, std::nullopt, std::nullopt, torch::kBFloat16,
                         /*use_fast_accum=*/true);
        },
        repeats);
    const double fp8_tflops = flops / (fp8_ms * 1e-3) / 1e12;
    fmt::print("  fp8 e4m3 at::_scaled_mm  {:8.3f} ms  {:7.1f} TFLOP/s   ({:.2f}x bf16)\n", fp8_ms,
               fp8_tflops, bf16_ms / fp8_ms);
    result["fp8_ms"] = fp8_ms;
    result["fp8_tflops"] = fp8_tflops;
    result["fp8_speedup_over_bf16"] = bf16_ms / fp8_ms;
  } else {
    fmt::print("  fp8: not measured (compute capability {}.{} < 8.9)\n", props->major, props->minor);
  }
  return result;
}

/// Parameters of `numel` elements in all, in 4M-element tensors, as a model's matrices.
std::vector<torch::Tensor> make_params(int64_t numel, torch::Dtype dtype) {
  std::vector<torch::Tensor> params;
  constexpr int64_t kTensor = 4 << 20;
  for (int64_t left = numel; left > 0; left -= kTensor) {
    auto p = torch::randn({std::min(left, kTensor)},
                          torch::TensorOptions().dtype(dtype).device(torch::kCUDA));
    p.mutable_grad() = torch::randn_like(p) * 1e-3;
    params.push_back(p.requires_grad_(true));
  }
  return params;
}

nlohmann::json bench_adamw(int64_t numel, int repeats) {
  const auto bytes = static_cast<double>(numel) * 4;
  // The limit: a copy reads and writes each byte once.
  const auto src =
      torch::empty({numel}, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA));
  auto dst = torch::empty_like(src);
  const double copy_ms = median_ms([&] { dst.copy_(src); }, repeats);
  const double copy_gbs = 2 * bytes / (copy_ms * 1e-3) / 1e9;

  // fp32 params: read p, g, m, v; write p, m, v.
  auto fp32 = make_params(numel, torch::kFloat);
  mantissa::optim::FusedAdamW fp32_opt(fp32,
                                       mantissa::optim::FusedAdamWOptions(1e-4).weight_decay(0.01));
  const double fp32_ms = median_ms([&] { fp32_opt.step(); }, repeats);
  const double fp32_gbs = 7 * bytes / (fp32_ms * 1e-3) / 1e9;

  // fp32 masters of a bf16 model: the same, plus the bf16 copy written (2 bytes per element).
  auto model = make_params(numel, torch::kBFloat16);
  mantissa::amp::MasterWeights masters(model);
  masters.copy_grads_to_masters();
  mantissa::optim::FusedAdamW master_opt(
      masters, mantissa::optim::FusedAdamWOptions(1e-4).weight_decay(0.01));
  const double master_ms = median_ms([&] { master_opt.step(); }, repeats);
  const double master_gbs = 7.5 * bytes / (master_ms * 1e-3) / 1e9;

  fmt::print("FusedAdamW step, {}M parameters\n", numel / 1000000);
  fmt::print("  device-to-device copy    {:8.3f} ms  {:7.0f} GB/s   (the limit)\n", copy_ms,
             copy_gbs);
  fmt::print("  fp32 params              {:8.3f} ms  {:7.0f} GB/s   {:5.1f}% of copy\n", fp32_ms,
             fp32_gbs, 100 * fp32_gbs / copy_gbs);
  fmt::print("  fp32 masters -> bf16     {:8.3f} ms  {:7.0f} GB/s   {:5.1f}% of copy\n", master_ms,
             master_gbs, 100 * master_gbs / copy_gbs);
  return {{"params", numel},
          {"copy_ms", copy_ms},
          {"copy_gbs", copy_gbs},
          {"fp32_ms", fp32_ms},
          {"fp32_gbs", fp32_gbs},
          {"fp32_fraction_of_copy", fp32_gbs / copy_gbs},
          {"masters_bf16_ms", master_ms},
          {"masters_bf16_gbs", master_gbs},
          {"masters_bf16_fraction_of_copy", master_gbs / copy_gbs}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "The GPU's GEMM peak and copy bandwidth, against cuBLAS with tf32 and FusedAdamW's step"};
  int64_t gemm_size = 8192;
  int64_t adamw_millions = 100;
  int repeats = 20;
  app.add_option("--gemm_size", gemm_size, "M = N = K of the timed GEMMs")
      ->check(CLI::PositiveNumber);
  app.add_option("--adamw_millions", adamw_millions,
                 "parameters of the optimizer step, in millions")
      ->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "timed runs per figure (the median is reported)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "gpu_bench: no CUDA device on this machine; nothing measured\n");
    return 2;
  }
  try {
    nlohmann::json report = {{"device", at::cuda::getCurrentDeviceProperties()->name},
                             {"gemm", bench_gemm(gemm_size, repeats)},
                             {"adamw", bench_adamw(adamw_millions * 1000000, repeats)}};
    std::printf("%s\n", report.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
