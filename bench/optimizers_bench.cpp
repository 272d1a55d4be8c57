// The optimizers of docs/optimizers.md against AdamW on the CPU: the median time of one step
// over a transformer block's worth of tensors (plus an embedding), interleaved so that every
// optimizer sees the same machine state, and the bytes of optimizer state per parameter.
//
//   OMP_NUM_THREADS=1 build/bench/optimizers_bench                 # width 512, 7 repeats
//   OMP_NUM_THREADS=1 build/bench/optimizers_bench --width 256 --repeats 5
//
// Prints a table and, last, one JSON line with every figure (BENCHMARKS.md quotes both).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <mantissa/memory/cpu_caching_allocator.h>
#include <mantissa/optim/optimizer_registry.h>
#include <mantissa/training_arguments.h>

#include "median.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Model {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
};

// One block of width w (attention's four w x w matrices, a 4w MLP, two norms, biases) and a
// 4096-row embedding, fp32.
Model make_model(int64_t w) {
  Model m;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    m.names.push_back(std::move(name));
    m.params.push_back(torch::randn(shape).mul_(0.02).requires_grad_());
  };
  add("embed.weight", {4096, w});
  for (const char* n : {"q", "k", "v", "o"})
    add(std::string("blocks.0.attn.") + n + ".weight", {w, w});
  add("blocks.0.mlp.fc.weight", {4 * w, w});
  add("blocks.0.mlp.fc.bias", {4 * w});
  add("blocks.0.mlp.proj.weight", {w, 4 * w});
  add("blocks.0.mlp.proj.bias", {w});
  add("blocks.0.ln1.weight", {w});
  add("blocks.0.ln2.weight", {w});
  return m;
}

std::unique_ptr<torch::optim::Optimizer> build(const std::string& name, const Model& m) {
  const auto args =
      mantissa::TrainingArguments().optim(name).learning_rate(1e-3).weight_decay(0.01);
  mantissa::optim::OptimizerBuildInputs inputs{args, {}, /*first_group_decays=*/true};
  std::vector<torch::Tensor> decay, no_decay;
  std::vector<std::string> decay_names, no_decay_names;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const bool d = m.params[i].dim() >= 2;
    (d ? decay : no_decay).push_back(m.params[i]);
    (d ? decay_names : no_decay_names).push_back(m.names[i]);
  }
  inputs.groups.emplace_back(decay);
  inputs.groups.emplace_back(no_decay);
  inputs.group_names = {decay_names, no_decay_names};
  return mantissa::optim::find_optimizer(name)->build(std::move(inputs));
}

double state_bytes(const std::string& name, torch::optim::Optimizer& optimizer) {
  const auto* spec = mantissa::optim::find_optimizer(name);
  double bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    for (const auto& t : spec->state_tensors(*state)) {
      if (t.value.defined()) bytes += static_cast<double>(t.value.nbytes());
    }
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t width = 512;
  int repeats = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--width") == 0) width = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::atoi(argv[i + 1]);
  }
  // As the Trainer runs (cpu_caching_allocator defaults to true): the unfused steps' temporaries
  // come from the cache instead of fresh pages.
  const bool cached = mantissa::memory::enable_cpu_caching_allocator();
  torch::manual_seed(0);
  const std::vector<std::string> names = {"adamw_torch", "adamw_torch_fused", "adafactor",
                                          "adamw_torch_8bit", "muon"};
  std::vector<Model> models;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers;
  for (const auto& name : names) {
    torch::manual_seed(0);
    models.push_back(make_model(width));
    for (auto& p : models.back().params) p.mutable_grad() = torch::randn_like(p).mul_(1e-3);
    optimizers.push_back(build(name, models.back()));
    optimizers.back()->step();  // the state exists from here on
  }
  int64_t numel = 0;
  for (const auto& p : models[0].params) numel += p.numel();
  std::map<std::string, std::vector<double>> times;
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      const auto start = Clock::now();
      optimizers[k]->step();
      times[names[k]].push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  const double adamw = mantissa_bench::median(times["adamw_torch"]);
  std::printf(
      "%lld parameters (width %lld), %d threads, %d interleaved repeats, CPU caching "
      "allocator %s\n",
      static_cast<long long>(numel), static_cast<long long>(width), at::get_num_threads(), repeats,
      cached ? "on" : "off");
  std::printf("%-20s %12s %12s %16s\n", "optim", "step ms", "vs adamw", "state bytes/param");
  std::string json = "{";
  for (std::size_t k = 0; k < names.size(); ++k) {
    const double t = mantissa_bench::median(times[names[k]]);
    const double per_param = state_bytes(names[k], *optimizers[k]) / static_cast<double>(numel);
    std::printf("%-20s %12.2f %12.2f %16.3f\n", names[k].c_str(), t * 1e3, t / adamw, per_param);
    json += (k ? ", \"" : "\"") + names[k] + "\": {\"step_ms\": " + std::to_string(t * 1e3) +
            ", \"vs_adamw\": " + std::to_string(t / adamw) +
            ", \"state_bytes_per_param\": " + std::to_string(per_param) + "}";
  }
  std::printf("%s, \"numel\": %lld, \"threads\": %d}\n", json.c_str(),
              static_cast<long long>(numel), at::get_num_threads());
  return 0;
}
