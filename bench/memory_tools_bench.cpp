// One configuration of the memory tools per process (peak RSS is the process's), driven by
// bench/memory_tools:
//
//   memory_tools_bench --case checkpointing --on 1 --model_size small --batch 8
//       char_gpt training steps (forward, backward, AdamW) with or without gradient
//       checkpointing of its blocks, on random tokens
//   memory_tools_bench --case loss --on 1 --vocab 50257 --tokens 2048 --hidden 768
//       the LM head and its loss, forward and backward: linear_cross_entropy (--on 1) or
//       F::cross_entropy(F::linear(...)) (--on 0)
//
// Prints one JSON line: the median step time over the timed steps, the RSS after setup and the
// peak (VmHWM), and on CUDA the caching allocator's peak of allocated bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <mantissa/amp/autocast.h>
#include <mantissa/nn/linear_cross_entropy.h>

#ifdef MANTISSA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "model.h"  // examples/char_gpt

namespace {

struct Config {
  std::string bench_case = "checkpointing";
  bool on = false;
  std::string model_size = "small";
  std::int64_t batch = 8;
  std::int64_t vocab = 155;
  std::int64_t tokens = 2048;
  std::int64_t hidden = 384;
  std::int64_t chunk_size = 0;
  std::int64_t steps = 10;
  std::int64_t warmup = 3;
  bool bf16 = false;
  std::string device = "cpu";
};

// A line of /proc/self/status in MiB ("VmRSS", "VmHWM").
double proc_status_mib(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;
  }
  return -1.0;
}

double cuda_peak_allocated_mib(const torch::Device& device) {
#ifdef MANTISSA_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1024.0 * 1024.0);
  }
#endif
  (void)device;
  return -1.0;
}

void reset_cuda_peak(const torch::Device& device) {
#ifdef MANTISSA_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  (void)device;
}

// Runs `step` warmup + steps times; returns the median seconds of the timed ones and the last loss.
template <class Step>
std::pair<double, double> time_steps(const Config& c, const torch::Device& device, Step step) {
  std::vector<double> seconds;
  double loss = 0.0;
  for (std::int64_t i = 0; i < c.warmup + c.steps; ++i) {
    if (device.is_cuda()) torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    loss = step();  // .item(): the step is done when it returns
    const auto stop = std::chrono::steady_clock::now();
    if (i >= c.warmup) seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return {seconds[seconds.size() / 2], loss};
}

std::pair<double, double> run_checkpointing(const Config& c, const torch::Device& device) {
  auto config = mantissa::examples::GptConfig::preset(c.model_size);
  config.vocab_size = c.vocab;
  torch::manual_seed(0);
  mantissa::examples::CharGpt model(config);
  model->to(device);
  model->train();
  if (c.on) model->gradient_checkpointing_enable();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  auto gen = at::detail::createCPUGenerator(1);
  return time_steps(c, device, [&] {
    const auto ids =
        torch::randint(c.vocab, {c.batch, config.block_size + 1}, gen, torch::kLong).to(device);
    mantissa::Batch batch{{"input_ids", ids.narrow(1, 0, config.block_size)},
                          {"labels", ids.narrow(1, 1, config.block_size)}};
    torch::Tensor loss;
    {
      std::optional<mantissa::amp::Autocast> autocast;
      if (c.bf16) autocast.emplace(device.type(), torch::kBFloat16);
      loss = model->forward(batch).loss;
    }
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    return loss.item<double>();
  });
}

std::pair<double, double> run_loss(const Config& c, const torch::Device& device) {
  torch::manual_seed(0);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  auto hidden = torch::randn({c.tokens, c.hidden}, f32).requires_grad_(true);
  auto weight = (torch::randn({c.vocab, c.hidden}, f32) * 0.02).requires_grad_(true);
  const auto targets = torch::randint(c.vocab, {c.tokens}, f32.dtype(torch::kLong));
  return time_steps(c, device, [&] {
    torch::Tensor loss;
    {
      std::optional<mantissa::amp::Autocast> autocast;
      if (c.bf16) autocast.emplace(device.type(), torch::kBFloat16);
      loss =
          c.on ? mantissa::nn::linear_cross_entropy(hidden, weight, {}, targets, -100, c.chunk_size)
               : torch::nn::functional::cross_entropy(torch::nn::functional::linear(hidden, weight),
                                                      targets);
    }
    loss.backward();
    hidden.mutable_grad().reset();
    weight.mutable_grad().reset();
    return loss.item<double>();
  });
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"One configuration of the memory tools benchmark (bench/memory_tools runs them)."};
  app.add_option("--case", c.bench_case, "checkpointing or loss")
      ->check(CLI::IsMember({"checkpointing", "loss"}));
  app.add_option("--on", c.on, "1: with the tool (checkpointing, linear_cross_entropy)");
  app.add_option("--model_size", c.model_size, "char_gpt preset (checkpointing)");
  app.add_option("--batch", c.batch, "sequences per step (checkpointing)");
  app.add_option("--vocab", c.vocab, "vocabulary size");
  app.add_option("--tokens", c.tokens, "rows of the loss (loss)");
  app.add_option("--hidden", c.hidden, "width of the hidden states (loss)");
  app.add_option("--chunk_size", c.chunk_size, "rows per chunk of linear_cross_entropy (0: auto)");
  app.add_option("--steps", c.steps, "timed steps");
  app.add_option("--warmup", c.warmup, "untimed steps first");
  app.add_flag("--bf16", c.bf16, "under bf16 autocast");
  app.add_option("--device", c.device, "cpu or cuda");
  CLI11_PARSE(app, argc, argv);
  const torch::Device device(c.device);
  const double setup_rss_mib = proc_status_mib("VmRSS");
  reset_cuda_peak(device);
  const auto [step_seconds, loss] =
      c.bench_case == "checkpointing" ? run_checkpointing(c, device) : run_loss(c, device);
  std::printf(
      "{\"case\":\"%s\",\"on\":%d,\"model_size\":\"%s\",\"batch\":%lld,\"vocab\":%lld,"
      "\"tokens\":%lld,\"hidden\":%lld,\"bf16\":%d,\"device\":\"%s\",\"threads\":%d,"
      "\"median_step_ms\":%.3f,\"loss\":%.6f,\"setup_rss_mib\":%.1f,\"peak_rss_mib\":%.1f,"
      "\"cuda_peak_allocated_mib\":%.1f}\n",
      c.bench_case.c_str(), c.on ? 1 : 0, c.model_size.c_str(), static_cast<long long>(c.batch),
      static_cast<long long>(c.vocab), static_cast<long long>(c.tokens),
      static_cast<long long>(c.hidden), c.bf16 ? 1 : 0, c.device.c_str(), at::get_num_threads(),
      step_seconds * 1e3, loss, setup_rss_mib, proc_status_mib("VmHWM"),
      cuda_peak_allocated_mib(device));
  return 0;
}
