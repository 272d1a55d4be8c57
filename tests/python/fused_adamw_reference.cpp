// The C++ side of the Python package's tests (tests/python/test_fused_adamw.py): runs
// mantissa::optim::FusedAdamW itself, so that Python's mantissa.optim.FusedAdamW is compared with
// the C++ optimizer's results and files, not with a copy of its arithmetic.
//
//   fused_adamw_reference golden OUT.pt   20 steps of bf16 params (plus an fp32 one) under
//                                         kahan and stochastic_rounding, with a loss scale and
//                                         one skipped step; writes inputs and results
//   fused_adamw_reference save DIR        a few steps, then DIR/optimizer.pt (what the Trainer
//                                         writes) and DIR/expected.pt (the same state as tensors)
//   fused_adamw_reference check DIR       loads DIR/py_optimizer.pt (written by Python) into a
//                                         C++ FusedAdamW over DIR/py_expected.pt's params and
//                                         compares its state with py_expected.pt's
// Exits 0 on success, 1 with a message otherwise.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <mantissa/optim/fused_adamw.h>

#include "io/atomic_file.h"
#include "io/torch_load.h"
#include "io/torch_save.h"

namespace {

using mantissa::optim::FusedAdamW;
using mantissa::optim::FusedAdamWOptions;
using mantissa::optim::FusedAdamWParamState;
using mantissa::optim::LowPrecisionUpdate;

constexpr int kSteps = 20;
constexpr int kSkippedStep = 7;  // found_inf = 1 on this step (1-based)
constexpr double kGradScale = 1024.0;
constexpr std::uint64_t kSeed = 1234;

void write_dict(const std::string& path, const c10::Dict<std::string, at::Tensor>& dict) {
  const auto bytes = mantissa::io::torch_save_bytes(c10::IValue(dict));
  mantissa::io::write_file_atomically(path, std::string_view(bytes.data(), bytes.size()));
}

// The parameters: an fp32 one first (so the bf16 ones do not have index 0), then bf16 ones of
// a few shapes, in two groups (the second with its own learning rate).
std::vector<at::Tensor> initial_params() {
  torch::manual_seed(0);
  return {torch::randn({5, 3}), torch::randn({37}).to(torch::kBFloat16),
          torch::randn({4, 33}).to(torch::kBFloat16), torch::randn({129}).to(torch::kBFloat16)};
}

std::vector<torch::optim::OptimizerParamGroup> groups_of(const std::vector<at::Tensor>& params,
                                                         const FusedAdamWOptions& defaults) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{params[0], params[1]});
  groups.emplace_back(std::vector<at::Tensor>{params[2], params[3]},
                      std::make_unique<FusedAdamWOptions>(FusedAdamWOptions(defaults).lr(3e-3)));
  return groups;
}

FusedAdamWOptions test_options(LowPrecisionUpdate rule) {
  return FusedAdamWOptions(1e-2)
      .betas(std::make_tuple(0.9, 0.99))
      .eps(1e-6)
      .weight_decay(0.1)
      .low_precision_update(rule)
      .stochastic_rounding_seed(kSeed);
}

int golden(const std::string& out) {
  c10::Dict<std::string, at::Tensor> dict;
  const auto init = initial_params();
  for (std::size_t i = 0; i < init.size(); ++i) dict.insert("init/" + std::to_string(i), init[i]);
  // Gradients of each step, already multiplied by the loss scale (exact: a power of two).
  std::vector<std::vector<at::Tensor>> grads(kSteps);
  torch::manual_seed(1);
  for (int s = 0; s < kSteps; ++s) {
    for (std::size_t i = 0; i < init.size(); ++i) {
      auto g = (torch::randn(init[i].sizes()) * kGradScale).to(init[i].scalar_type());
      grads[s].push_back(g);
      dict.insert("grad/" + std::to_string(s) + "/" + std::to_string(i), g);
    }
  }
  for (const auto rule : {LowPrecisionUpdate::kKahan, LowPrecisionUpdate::kStochasticRounding}) {
    std::vector<at::Tensor> params;
    for (const auto& p : init) params.push_back(p.clone());
    FusedAdamW opt(groups_of(params, test_options(rule)), test_options(rule));
    for (int s = 0; s < kSteps; ++s) {
      for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[s][i];
      opt.set_amp_scaling(torch::full({}, static_cast<float>(kGradScale)),
                          torch::full({}, s + 1 == kSkippedStep ? 1.f : 0.f));
      opt.step();
      opt.clear_amp_scaling();
    }
    const std::string name = mantissa::optim::to_string(rule);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto key = name + "/" + std::to_string(i);
      const auto& state = static_cast<const FusedAdamWParamState&>(
          *opt.state().at(params[i].unsafeGetTensorImpl()));
      dict.insert("param/" + key, params[i]);
      dict.insert("exp_avg/" + key, state.exp_avg());
      dict.insert("exp_avg_sq/" + key, state.exp_avg_sq());
      dict.insert("step/" + key, state.step());
      if (state.kahan_comp().defined()) dict.insert("kahan_comp/" + key, state.kahan_comp());
    }
  }
  write_dict(out, dict);
  return 0;
}

int save(const std::string& dir) {
  auto params = initial_params();
  const auto options = test_options(LowPrecisionUpdate::kKahan);
  FusedAdamW opt(groups_of(params, options), options);
  torch::manual_seed(2);
  for (int s = 0; s < 3; ++s) {
    for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes()).to(p.scalar_type());
    opt.step();
  }
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  archive.save_to(dir + "/optimizer.pt");
  c10::Dict<std::string, at::Tensor> dict;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& state =
        static_cast<const FusedAdamWParamState&>(*opt.state().at(params[i].unsafeGetTensorImpl()));
    const auto key = std::to_string(i);
    dict.insert("param/" + key, params[i]);
    dict.insert("state/" + key + "/step", state.step());
    dict.insert("state/" + key + "/exp_avg", state.exp_avg());
    dict.insert("state/" + key + "/exp_avg_sq", state.exp_avg_sq());
    if (state.kahan_comp().defined())
      dict.insert("state/" + key + "/kahan_comp", state.kahan_comp());
  }
  write_dict(dir + "/expected.pt", dict);
  return 0;
}

// Python wrote py_expected.pt: "param/<i>" (4 params, grouped as initial_params),
// "state/<i>/<key>", "lr/<group>" (0-d fp64) and "seed" (0-d int64).
int check(const std::string& dir) {
  const auto expected = mantissa::io::load_torch_file(dir + "/py_expected.pt").toGenericDict();
  auto get = [&](const std::string& key) {
    TORCH_CHECK(expected.contains(key), "py_expected.pt has no '", key, "'");
    return expected.at(key).toTensor();
  };
  std::vector<at::Tensor> params;
  for (int i = 0; i < 4; ++i) params.push_back(get("param/" + std::to_string(i)).clone());
  const auto options = test_options(LowPrecisionUpdate::kNearest).lr(1.0);
  FusedAdamW opt(groups_of(params, options), options);
  torch::serialize::InputArchive archive;
  mantissa::io::load_torch_archive(dir + "/py_optimizer.pt", archive);
  opt.load(archive);
  int failures = 0;
  auto fail = [&](const std::string& what) {
    std::cerr << "mismatch: " << what << "\n";
    ++failures;
  };
  for (int g = 0; g < 2; ++g) {
    const auto& o = static_cast<const FusedAdamWOptions&>(opt.param_groups()[g].options());
    if (o.lr() != get("lr/" + std::to_string(g)).item<double>())
      fail("lr of group " + std::to_string(g));
    if (o.low_precision_update() != LowPrecisionUpdate::kKahan) fail("low_precision_update");
    if (o.stochastic_rounding_seed() !=
        static_cast<std::uint64_t>(get("seed").item<std::int64_t>()))
      fail("stochastic_rounding_seed");
  }
  for (int i = 0; i < 4; ++i) {
    const auto key = std::to_string(i);
    const auto it = opt.state().find(params[i].unsafeGetTensorImpl());
    if (it == opt.state().end()) {
      fail("no state for param " + key);
      continue;
    }
    const auto& state = static_cast<const FusedAdamWParamState&>(*it->second);
    auto same = [&](const char* name, const at::Tensor& got) {
      const auto want = get("state/" + key + "/" + name);
      if (!got.defined() || got.scalar_type() != want.scalar_type() ||
          !torch::equal(got.reshape(want.sizes()), want)) {
        fail(std::string(name) + " of param " + key);
      }
    };
    same("step", state.step());
    same("exp_avg", state.exp_avg());
    same("exp_avg_sq", state.exp_avg_sq());
    if (expected.contains("state/" + key + "/kahan_comp")) same("kahan_comp", state.kahan_comp());
  }
  if (failures == 0) std::cout << "check: PASSED\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fused_adamw_reference golden OUT.pt | save DIR | check DIR\n";
    return 2;
  }
  const std::string mode = argv[1];
  try {
    if (mode == "golden") return golden(argv[2]);
    if (mode == "save") return save(argv[2]);
    if (mode == "check") return check(argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "fused_adamw_reference " << mode << ": " << e.what() << "\n";
    return 1;
  }
  std::cerr << "unknown mode '" << mode << "'\n";
  return 2;
}
