// mantissa::nn's CPU kernels beside the ATen calls they replace, forward + backward, measured
// side by side in one run: `gelu(x, "tanh")` against at::gelu, and
// `scaled_dot_product_attention` against at::scaled_dot_product_attention (causal, q/k/v cut
// from one packed [B, T, 3, H, D] tensor as in examples/char_gpt, the same tokens per batch at
// every length), in float32 and under bf16 autocast. Interleaved (the two sides alternate
// within each repeat), medians over repeats. With mantissa's CPU caching allocator installed,
// as the Trainer runs (--no_cache: LibTorch's allocator, whose fresh pages each call faults in).
//
//   OMP_NUM_THREADS=1 build/bench/cpu_kernels_bench
//   build/bench/cpu_kernels_bench --threads 2 --repeats 15
//
// Prints a table and, last, one JSON line with every figure (BENCHMARKS.md quotes both).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <mantissa/amp/autocast.h>
#include <mantissa/memory/cpu_caching_allocator.h>
#include <mantissa/nn/attention.h>
#include <mantissa/nn/gelu.h>

#include "median.h"

namespace {

using Clock = std::chrono::steady_clock;
using Step = std::function<void()>;

using mantissa_bench::median;

// Median milliseconds of `ours` and `theirs`, run alternately `repeats` times after one
// untimed call of each.
std::pair<double, double> time_pair(const Step& ours, const Step& theirs, int repeats) {
  ours();
  theirs();
  std::vector<double> a, b;
  for (int r = 0; r < repeats; ++r) {
    for (int side = 0; side < 2; ++side) {
      const bool first = (r + side) % 2 == 0;
      const auto start = Clock::now();
      (first ? ours : theirs)();
      (first ? a : b)
          .push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
  }
  return {median(a), median(b)};
}

struct Row {
  std::string kernel, shape, precision;
  double ours_ms, aten_ms;
};

Row gelu_row(torch::ScalarType dtype, int repeats) {
  torch::manual_seed(0);
  const auto x = torch::randn({8, 256, 1536}).to(dtype);  // char_gpt small's MLP hidden layer
  const auto grad = torch::randn({8, 256, 1536}).to(dtype);
  const auto step = [&](bool ours) {
    return [&, ours] {
      const auto input = x.detach().requires_grad_(true);
      const auto y = ours ? mantissa::nn::gelu(input, "tanh") : at::gelu(input, "tanh");
      y.backward(grad);
    };
  };
  const auto [ours, aten] = time_pair(step(true), step(false), repeats);
  return {"gelu tanh", "[8,256,1536]", c10::toString(dtype), ours, aten};
}

Row attention_row(int64_t time, int64_t heads, int64_t head_dim, bool bf16, int repeats) {
  const int64_t batch = std::max<int64_t>(1, 8 * 256 / time);
  torch::manual_seed(0);
  const auto packed = torch::randn({batch, time, 3, heads, head_dim});
  const auto step = [&](bool ours) {
    return [&, ours] {
      const auto input = packed.detach().requires_grad_(true);
      torch::Tensor out;
      {
        mantissa::amp::Autocast autocast(c10::DeviceType::CPU, torch::kBFloat16, bf16);
        const auto qkv =
            (bf16 ? input.to(torch::kBFloat16) : input).permute({2, 0, 3, 1, 4}).unbind(0);
        out = ours ? mantissa::nn::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2],
                                                                std::nullopt, 0.0, true)
                   : at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], std::nullopt, 0.0,
                                                      true);
      }
      out.to(torch::kFloat).sum().backward();
    };
  };
  const auto [ours, aten] = time_pair(step(true), step(false), repeats);
  const std::string shape = "B=" + std::to_string(batch) + " T=" + std::to_string(time) +
                            " H=" + std::to_string(heads) + " D=" + std::to_string(head_dim);
  return {"attention causal", shape, bf16 ? "bf16 autocast" : "float32", ours, aten};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mantissa::nn's CPU kernels beside the ATen calls they replace"};
  int threads = 0;
  int repeats = 11;
  app.add_option("--threads", threads, "at::set_num_threads (0: leave OMP_NUM_THREADS's)");
  app.add_option("--repeats", repeats, "timed calls of each side")->check(CLI::PositiveNumber);
  bool no_cache = false;
  app.add_flag("--no_cache", no_cache, "keep LibTorch's CPU allocator");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) at::set_num_threads(threads);
  if (!no_cache) mantissa::memory::enable_cpu_caching_allocator();

  std::vector<Row> rows;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16})
    rows.push_back(gelu_row(dtype, repeats));
  for (const auto& [heads, head_dim] : {std::pair<int64_t, int64_t>{4, 32}, {6, 64}}) {
    for (const int64_t time : {64, 128, 192, 256}) {
      for (const bool bf16 : {false, true}) {
        rows.push_back(attention_row(time, heads, head_dim, bf16, repeats));
      }
    }
  }

  nlohmann::json out = {{"bench", "cpu_kernels"},
                        {"threads", at::get_num_threads()},
                        {"cpu_capability", at::get_cpu_capability()},
                        {"repeats", repeats},
                        {"cpu_caching_allocator", !no_cache},
                        {"rows", nlohmann::json::array()}};
  std::printf("%-17s %-22s %-14s %10s %10s %11s\n", "kernel", "shape", "precision", "ours ms",
              "aten ms", "aten/ours");
  for (const auto& r : rows) {
    std::printf("%-17s %-22s %-14s %10.2f %10.2f %11.2f\n", r.kernel.c_str(), r.shape.c_str(),
                r.precision.c_str(), r.ours_ms, r.aten_ms, r.aten_ms / r.ours_ms);
    out["rows"].push_back({{"kernel", r.kernel},
                           {"shape", r.shape},
                           {"precision", r.precision},
                           {"ours_ms", r.ours_ms},
                           {"aten_ms", r.aten_ms}});
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
