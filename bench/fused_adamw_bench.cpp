// The fused AdamW step against the unfused ATen sequence it replaces, on the CPU, measured side
// by side in one run (medians of several repeats); the step's achieved bandwidth against this
// machine's copy bandwidth; the step time of each low-precision update rule on a pure bf16
// model; and the memory per parameter of each precision mode.
//
//   build/bench/fused_adamw_bench                       # 10M and 100M parameters
//   build/bench/fused_adamw_bench --sizes 10 --repeats 9
//
// Prints a table and, last, one JSON line with every figure (BENCHMARKS.md quotes both).
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/torch.h>

#include <mantissa/amp/autocast.h>
#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/optim/fused_adamw.h>

#include "median.h"
#include "optim/fused_adamw_kernels.h"

namespace {

using mantissa::amp::GradScaler;
using mantissa::amp::MasterWeights;
using mantissa::optim::FusedAdamW;
using mantissa::optim::FusedAdamWOptions;
using Clock = std::chrono::steady_clock;

constexpr double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWd = 0.01;
constexpr int64_t kTensorNumel = 4 << 20;  // a model's matrices: 4M elements each

double seconds_of(const std::function<void()>& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

using mantissa_bench::median;

std::vector<int64_t> split(int64_t n) {
  std::vector<int64_t> sizes;
  for (int64_t left = n; left > 0; left -= kTensorNumel)
    sizes.push_back(std::min(left, kTensorNumel));
  return sizes;
}

// A bf16 model trained with fp32 masters, after backward, driven the mantissa way
// (MasterWeights + GradScaler + FusedAdamW, as the Trainer calls them).
struct FusedPath {
  std::vector<torch::Tensor> model;
  std::unique_ptr<MasterWeights> masters;
  std::unique_ptr<FusedAdamW> optimizer;
  explicit FusedPath(int64_t n) {
    for (auto numel : split(n)) {
      auto p = torch::randn({numel}).to(torch::kBFloat16).requires_grad_(true);
      p.mutable_grad() = (torch::randn({numel}) * 1024).to(torch::kBFloat16);
      model.push_back(p);
    }
    masters = std::make_unique<MasterWeights>(model);
    optimizer = std::make_unique<FusedAdamW>(
        *masters, FusedAdamWOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(kWd));
  }
  // GradScaler's READY path: its inf check, then the fused unscale + update + cast back.
  void boundary(GradScaler& scaler, bool with_grad_cast) {
    if (with_grad_cast) masters->copy_grads_to_masters();
    scaler.step(*optimizer);
    scaler.update();
  }
};

// The same tensors seen by the unfused sequence (so that both sides touch the same memory).
struct UnfusedView {
  std::vector<torch::Tensor> model, model_grads, masters, master_grads, exp_avgs, exp_avg_sqs;
  std::vector<int64_t> steps;
  explicit UnfusedView(const FusedPath& fused) {
    for (size_t i = 0; i < fused.model.size(); ++i) {
      const auto& master = fused.masters->master_params()[i];
      const auto& state = static_cast<const mantissa::optim::FusedAdamWParamState&>(
          *fused.optimizer->state().at(master.unsafeGetTensorImpl()));
      model.push_back(fused.model[i].detach());
      model_grads.push_back(fused.model[i].grad());
      masters.push_back(master.detach());
      master_grads.push_back(master.grad());
      exp_avgs.push_back(state.exp_avg());
      exp_avg_sqs.push_back(state.exp_avg_sq());
      steps.push_back(1);
    }
  }
};

// What PyTorch runs without fusion (torch.optim.AdamW's default foreach path, plus the
// master-weight plumbing around it): grad cast, unscale + inf check, foreach AdamW, cast back.
void unfused_boundary(UnfusedView& s, const torch::Tensor& scale, bool with_grad_cast) {
  torch::NoGradGuard no_grad;
  if (with_grad_cast) {
    for (size_t i = 0; i < s.model.size(); ++i) s.master_grads[i].copy_(s.model_grads[i]);
  }
  auto found_inf = torch::zeros({1});
  const auto inv_scale = scale.to(torch::kDouble).reciprocal().to(torch::kFloat);
  at::_amp_foreach_non_finite_check_and_unscale_(s.master_grads, found_inf, inv_scale);
  if (found_inf.item<float>() != 0) return;  // GradScaler's one sync
  std::vector<c10::Scalar> step_sizes, bias_correction2_sqrts;
  for (auto& step : s.steps) {
    ++step;
    const double bc1 = 1 - std::pow(kBeta1, step);
    const double bc2 = 1 - std::pow(kBeta2, step);
    step_sizes.emplace_back(-(kLr / bc1));
    bias_correction2_sqrts.emplace_back(std::sqrt(bc2));
  }
  at::_foreach_mul_(s.masters, 1 - kLr * kWd);
  at::_foreach_lerp_(s.exp_avgs, s.master_grads, 1 - kBeta1);
  at::_foreach_mul_(s.exp_avg_sqs, kBeta2);
  at::_foreach_addcmul_(s.exp_avg_sqs, s.master_grads, s.master_grads, 1 - kBeta2);
  auto denom = at::_foreach_sqrt(s.exp_avg_sqs);
  at::_foreach_div_(denom, bias_correction2_sqrts);
  at::_foreach_add_(denom, kEps);
  at::_foreach_addcdiv_(s.masters, s.exp_avgs, denom, step_sizes);
  for (size_t i = 0; i < s.model.size(); ++i) s.model[i].copy_(s.masters[i]);
}

double gbps(double bytes, double seconds) { return bytes / seconds / 1e9; }

// A pure bf16 model (no masters) stepped by FusedAdamW under one LowPrecisionUpdate rule.
struct RuleFigure {
  std::string name;
  double step_ms;
  double moved_bytes_per_param;  // read + written by the kernel
  double state_bytes_per_param;  // param, grad, moments, compensation
  double gbps;
};

RuleFigure measure_rule(int64_t n, mantissa::optim::LowPrecisionUpdate rule, bool fp32_moments,
                        int repeats) {
  using mantissa::optim::LowPrecisionUpdate;
  std::vector<torch::Tensor> params;
  for (auto numel : split(n)) {
    auto p = torch::randn({numel}).to(torch::kBFloat16).requires_grad_(true);
    p.mutable_grad() = (torch::randn({numel}) * 1e-2).to(torch::kBFloat16);
    params.push_back(p);
  }
  FusedAdamW optimizer(params, FusedAdamWOptions(kLr)
                                   .betas({kBeta1, kBeta2})
                                   .eps(kEps)
                                   .weight_decay(kWd)
                                   .low_precision_update(rule)
                                   .fp32_moments(fp32_moments));
  optimizer.step();  // makes the state
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) times.push_back(seconds_of([&] { optimizer.step(); }));
  const double moment = fp32_moments ? 4 : 2;
  const double comp = rule == LowPrecisionUpdate::kKahan ? 2 : 0;
  // Reads g, p, m, v (and c); writes p, m, v (and c).
  const double moved = 2 + 2 + 2 * moment + comp + 2 + 2 * moment + comp;
  const double held = 2 + 2 + 2 * moment + comp;
  std::string name =
      std::string(mantissa::optim::to_string(rule)) + (fp32_moments ? "+fp32 moments" : "");
  const double t = median(times);
  return {name, 1e3 * t, moved, held, gbps(moved * static_cast<double>(n), t)};
}

// The 1-minute load average: other work on the machine skews absolute figures (ratios less so).
double load_average() {
  FILE* f = std::fopen("/proc/loadavg", "r");
  double load = -1;
  if (f != nullptr) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

// ---- memory per parameter -------------------------------------------------------------

int64_t rss_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long pages_total = 0, pages_resident = 0;
  const int read = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  return read == 2 ? static_cast<int64_t>(pages_resident) * sysconf(_SC_PAGESIZE) : -1;
}

struct MemoryFigure {
  std::string mode;
  double tensor_bytes_per_param;  // distinct storages of params, grads, masters, optimizer state
  double rss_bytes_per_param;     // growth of the resident set over the same
};

MemoryFigure measure_mode(const std::string& mode, int64_t width, int layers) {
  const int64_t before = rss_bytes();
  MemoryFigure figure{mode, 0, 0};
  {
    torch::nn::Sequential model;
    for (int i = 0; i < layers; ++i)
      model->push_back(torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(false)));
    const std::string m(mode);
    const bool pure = m.rfind("pure bf16", 0) == 0;
    const bool low = mode == "bf16+masters" || pure;
    auto options = FusedAdamWOptions(kLr);
    if (m.find("kahan") != std::string::npos)
      options.low_precision_update(mantissa::optim::LowPrecisionUpdate::kKahan);
    if (m.find("SR") != std::string::npos) {
      options.low_precision_update(mantissa::optim::LowPrecisionUpdate::kStochasticRounding);
    }
    options.fp32_moments(m.find("fp32 moments") != std::string::npos);
    if (low) model->to(torch::kBFloat16);
    std::unique_ptr<MasterWeights> masters;
    std::unique_ptr<FusedAdamW> optimizer;
    if (mode == "bf16+masters") {
      masters = std::make_unique<MasterWeights>(*model);
      optimizer = std::make_unique<FusedAdamW>(*masters, FusedAdamWOptions(kLr));
    } else {
      optimizer = std::make_unique<FusedAdamW>(model->parameters(), options);
    }
    const auto x = torch::randn({1, width}, low ? torch::kBFloat16 : torch::kFloat);
    for (int step = 0; step < 2; ++step) {
      torch::Tensor loss;
      {
        mantissa::amp::Autocast autocast(torch::kCPU, torch::kBFloat16,
                                         mode == "AMP (bf16 autocast)");
        loss = model->forward(x).to(torch::kFloat).pow(2).mean();
      }
      loss.backward();
      if (masters) masters->copy_grads_to_masters();
      optimizer->step();
    }
    // Every tensor the training state holds, each storage counted once.
    std::unordered_set<const void*> seen;
    int64_t bytes = 0, numel = 0;
    auto add = [&](const torch::Tensor& t) {
      if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second)
        bytes += t.storage().nbytes();
    };
    for (const auto& p : model->parameters()) {
      numel += p.numel();
      add(p);
      add(p.grad());
    }
    if (masters) {
      for (const auto& m : masters->master_params()) {
        add(m);
        add(m.grad());
      }
    }
    for (const auto& [key, state] : optimizer->state()) {
      const auto& s = static_cast<const mantissa::optim::FusedAdamWParamState&>(*state);
      add(s.exp_avg());
      add(s.exp_avg_sq());
      add(s.kahan_comp());
    }
    const int64_t after = rss_bytes();
    figure.tensor_bytes_per_param = static_cast<double>(bytes) / numel;
    figure.rss_bytes_per_param = static_cast<double>(after - before) / numel;
  }
  return figure;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes_m{10, 100};
  int repeats = 5;
  bool memory = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sizes" && i + 1 < argc) {
      sizes_m.clear();
      std::string list = argv[++i];
      for (size_t start = 0; start < list.size();) {
        const auto comma = list.find(',', start);
        sizes_m.push_back(std::stoll(list.substr(start, comma - start)));
        start = comma == std::string::npos ? list.size() : comma + 1;
      }
    } else if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--no-memory") {
      memory = false;
    } else {
      std::fprintf(stderr, "usage: %s [--sizes 10,100] [--repeats 5] [--no-memory]\n", argv[0]);
      return 2;
    }
  }
  // Tensors above 1 MiB come from mmap and go back to the OS when freed, so the resident set
  // measures what is alive (glibc would otherwise raise this threshold as tensors are freed).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  torch::manual_seed(0);
  namespace d = mantissa::optim::detail;
  const double load = load_average();
  std::printf(
      "fused AdamW, CPU: %d threads, kernel %s (ATen capability %s), %d repeats (median), load "
      "average %.2f\n",
      at::get_num_threads(), d::fused_adamw_cpu_capability(), at::get_cpu_capability().c_str(),
      repeats, load);

  std::string json =
      "{\"bench\":\"fused_adamw_cpu\",\"threads\":" + std::to_string(at::get_num_threads()) +
      ",\"kernel\":\"" + d::fused_adamw_cpu_capability() +
      "\",\"load_average\":" + std::to_string(load) + ",\"sizes\":[";
  for (size_t si = 0; si < sizes_m.size(); ++si) {
    const int64_t n = sizes_m[si] * 1000 * 1000;
    FusedPath fused(n);
    GradScaler scaler(
        mantissa::amp::GradScalerOptions().init_scale(1024.).growth_interval(1 << 30));
    scaler.scale(torch::ones({}));  // creates the scale on the CPU
    fused.boundary(scaler, true);   // creates the optimizer state the unfused view shares
    UnfusedView state(fused);
    const auto scale = torch::full({}, 1024.f);

    // Bytes each variant moves per parameter (read + write), bf16 model and fp32 master.
    //   grad cast: 2 + 4; inf check/unscale: 4 + 4;
    //   fused kernel: g, p, m, v read (16) + p, m, v, model written (14);
    //   copy bandwidth: at::copy_ of the fused kernel's byte count (half read, half written),
    //   and an in-place at::mul_ of the same count (as the optimizer, it writes what it read).
    const double fused_kernel_bytes = 30.0 * n;
    auto copy_src = torch::empty({static_cast<int64_t>(fused_kernel_bytes / 2 / 4)});
    auto copy_dst = torch::empty_like(copy_src);
    copy_src.fill_(1);
    copy_dst.fill_(0);

    std::map<std::string, std::vector<double>> t;
    for (int r = -1; r < repeats; ++r) {  // r == -1: warm-up, not recorded
      std::map<std::string, double> once;
      once["unfused_boundary"] = seconds_of([&] { unfused_boundary(state, scale, true); });
      once["fused_boundary"] = seconds_of([&] { fused.boundary(scaler, true); });
      once["unfused_update"] = seconds_of([&] { unfused_boundary(state, scale, false); });
      once["fused_update"] = seconds_of([&] {
        // The update alone: the kernel unscales, updates and casts back in its one pass.
        fused.optimizer->set_amp_scaling(scale, torch::zeros({}));
        fused.optimizer->step();
        fused.optimizer->clear_amp_scaling();
      });
      once["copy"] = seconds_of([&] { copy_dst.copy_(copy_src); });
      // In place, as the optimizer writes: no read-for-ownership of a cold destination.
      once["inplace"] = seconds_of([&] { copy_src.mul_(1.0f); });
      once["grad_cast"] = seconds_of([&] {
        for (size_t i = 0; i < state.model.size(); ++i)
          state.master_grads[i].copy_(state.model_grads[i]);
      });
      once["inf_check"] = seconds_of([&] {
        auto found_inf = torch::zeros({1});
        at::_amp_foreach_non_finite_check_and_unscale_(state.master_grads, found_inf,
                                                       torch::ones({1}));
      });
      once["memcpy"] = seconds_of(
          [&] { std::memcpy(copy_dst.data_ptr(), copy_src.data_ptr(), copy_src.nbytes()); });
      if (r >= 0) {
        for (const auto& [k, v] : once) t[k].push_back(v);
      }
    }
    std::map<std::string, double> med;
    for (const auto& [k, v] : t) med[k] = median(v);
    const double boundary_ratio = med["unfused_boundary"] / med["fused_boundary"];
    const double update_ratio = med["unfused_update"] / med["fused_update"];
    const double fused_gbps = gbps(fused_kernel_bytes, med["fused_update"]);
    const double copy_gbps = gbps(fused_kernel_bytes, med["copy"]);
    const double memcpy_gbps = gbps(fused_kernel_bytes, med["memcpy"]);
    const double inplace_gbps = gbps(fused_kernel_bytes, med["inplace"]);
    std::printf("\n%lldM parameters (bf16 model, fp32 masters, %zu tensors)\n",
                static_cast<long long>(sizes_m[si]), state.model.size());
    std::printf(
        "  boundary (grad cast + inf check/unscale + AdamW + cast back): unfused %8.1f ms  fused "
        "%8.1f ms  ratio %.2fx\n",
        1e3 * med["unfused_boundary"], 1e3 * med["fused_boundary"], boundary_ratio);
    std::printf(
        "  update   (unscale + AdamW + cast back):                      unfused %8.1f ms  fused "
        "%8.1f ms  ratio %.2fx\n",
        1e3 * med["unfused_update"], 1e3 * med["fused_update"], update_ratio);
    std::printf(
        "  of which grad cast %.1f ms, GradScaler's inf check %.1f ms (ATen ops, same on both "
        "sides)\n",
        1e3 * med["grad_cast"], 1e3 * med["inf_check"]);
    std::printf(
        "  fused update moves 30 B/param: %.1f GB/s = %.0f%% of at::copy_ (%.1f GB/s), %.0f%% of "
        "in-place at::mul_ (%.1f GB/s); memcpy, 1 thread: %.1f GB/s\n",
        fused_gbps, 100 * fused_gbps / copy_gbps, copy_gbps, 100 * fused_gbps / inplace_gbps,
        inplace_gbps, memcpy_gbps);

    // Each CPU kernel build this machine can run, on the same data (no unscale, fp32 + bf16 copy).
    std::vector<std::pair<std::string, void (*)(const d::AdamWCpuArgs&)>> kernels{
        {"DEFAULT", &d::DEFAULT::fused_adamw_cpu}};
    const std::string capability = at::get_cpu_capability();
    if (capability == "AVX2" || capability == "AVX512")
      kernels.emplace_back("AVX2", &d::AVX2::fused_adamw_cpu);
    if (capability == "AVX512") kernels.emplace_back("AVX512", &d::AVX512::fused_adamw_cpu);
    std::vector<d::AdamWCpuTensor> tensors;
    for (size_t i = 0; i < state.masters.size(); ++i) {
      tensors.push_back({state.masters[i].data_ptr(), state.master_grads[i].data_ptr(),
                         state.exp_avgs[i].data_ptr(), state.exp_avg_sqs[i].data_ptr(), nullptr,
                         state.model[i].data_ptr(), state.masters[i].numel(), -1e-3f, 1.f});
    }
    d::AdamWCpuArgs args{};
    args.param_dtype = d::KernelDtype::kFloat;
    args.model_dtype = d::KernelDtype::kBFloat16;
    args.scalars = {0.99999f, 0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, true, 1.f / 1024, false};
    args.tensors = tensors.data();
    args.num_tensors = static_cast<int64_t>(tensors.size());
    std::string kernel_json;
    for (const auto& [name, kernel] : kernels) {
      std::vector<double> times;
      for (int r = -1; r < repeats; ++r) {
        const double s = seconds_of([&] { kernel(args); });
        if (r >= 0) times.push_back(s);
      }
      const double gb = gbps(fused_kernel_bytes, median(times));
      std::printf("  kernel %-7s %8.1f ms  %5.1f GB/s\n", name.c_str(), 1e3 * median(times), gb);
      kernel_json +=
          std::string(kernel_json.empty() ? "" : ",") + "\"" + name + "\":" + std::to_string(gb);
    }
    char buffer[2048];
    std::snprintf(buffer, sizeof(buffer),
                  "%s{\"params\":%lld,\"unfused_boundary_ms\":%.2f,\"fused_boundary_ms\":%.2f,"
                  "\"boundary_ratio\":%.3f,"
                  "\"unfused_update_ms\":%.2f,\"fused_update_ms\":%.2f,\"update_ratio\":%.3f,"
                  "\"grad_cast_ms\":%.2f,\"inf_check_ms\":%.2f,"
                  "\"fused_update_gbps\":%.2f,\"copy_gbps\":%.2f,\"inplace_gbps\":%.2f,\"memcpy_"
                  "1thread_gbps\":%.2f,"
                  "\"fraction_of_copy\":%.3f,\"fraction_of_inplace\":%.3f,\"kernel_gbps\":{%s}",
                  si ? "," : "", static_cast<long long>(n), 1e3 * med["unfused_boundary"],
                  1e3 * med["fused_boundary"], boundary_ratio, 1e3 * med["unfused_update"],
                  1e3 * med["fused_update"], update_ratio, 1e3 * med["grad_cast"],
                  1e3 * med["inf_check"], fused_gbps, copy_gbps, inplace_gbps, memcpy_gbps,
                  fused_gbps / copy_gbps, fused_gbps / inplace_gbps, kernel_json.c_str());
    json += buffer;

    // Pure bf16 (no masters): the same step under each low-precision update rule.
    std::printf("  pure bf16, FusedAdamW step by low_precision_update (%zu tensors):\n",
                state.model.size());
    json += ",\"rules\":{";
    bool first_rule = true;
    using mantissa::optim::LowPrecisionUpdate;
    for (auto rule : {LowPrecisionUpdate::kNearest, LowPrecisionUpdate::kKahan,
                      LowPrecisionUpdate::kStochasticRounding}) {
      for (bool fp32_moments : {false, true}) {
        const auto f = measure_rule(n, rule, fp32_moments, repeats);
        std::printf("    %-34s %8.1f ms  %5.1f GB/s  moves %4.1f B/param  holds %4.1f B/param\n",
                    f.name.c_str(), f.step_ms, f.gbps, f.moved_bytes_per_param,
                    f.state_bytes_per_param);
        char rule_buffer[256];
        std::snprintf(rule_buffer, sizeof(rule_buffer),
                      "%s\"%s\":{\"step_ms\":%.2f,\"gbps\":%.2f,\"moved_bytes_per_param\":%.1f,"
                      "\"bytes_per_param\":%.1f}",
                      first_rule ? "" : ",", f.name.c_str(), f.step_ms, f.gbps,
                      f.moved_bytes_per_param, f.state_bytes_per_param);
        json += rule_buffer;
        first_rule = false;
      }
    }
    json += "}}";
  }
  json += "]";

  if (memory) {
    // 4 Linear(4096, 4096) layers without bias: 67M parameters, batch 1 (activations negligible).
    std::printf("\nmemory per parameter after two training steps (67M parameters, FusedAdamW):\n");
    json += ",\"memory_bytes_per_param\":{";
    bool first = true;
    for (const char* mode : {"fp32", "AMP (bf16 autocast)", "bf16+masters", "pure bf16",
                             "pure bf16 kahan", "pure bf16 SR", "pure bf16 kahan fp32 moments"}) {
      const auto f = measure_mode(mode, 4096, 4);
      std::printf("  %-20s tensors %5.2f B  resident set %5.2f B\n", mode, f.tensor_bytes_per_param,
                  f.rss_bytes_per_param);
      char buffer[256];
      std::snprintf(buffer, sizeof(buffer), "%s\"%s\":{\"tensors\":%.2f,\"rss\":%.2f}",
                    first ? "" : ",", mode, f.tensor_bytes_per_param, f.rss_bytes_per_param);
      json += buffer;
      first = false;
    }
    json += "}";
  }
  json += "}";
  std::printf("\n%s\n", json.c_str());
  return 0;
}
