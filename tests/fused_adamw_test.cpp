// FusedAdamW against LibTorch's torch::optim::AdamW, under GradScaler, with MasterWeights, and
// through checkpoints. The CUDA kernel is compared with the CPU kernel on a GPU (Cuda suites).
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Version.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/amp/unscale.h>
#include <mantissa/optim/fused_adamw.h>

#include "optim/fused_adamw_kernels.h"
#include "test_util.h"

#ifdef MANTISSA_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

using mantissa::amp::GradScaler;
using mantissa::amp::GradScalerOptions;
using mantissa::amp::MasterWeights;
using mantissa::optim::FusedAdamW;
using mantissa::optim::FusedAdamWOptions;
using mantissa::optim::FusedAdamWParamState;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); }

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(leaf(t));
  return out;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// Shapes that exercise the kernel: ragged tails, a 0-d tensor, many blocks, and one big enough
// (> 4 chunks of 32K) to go parallel.
std::vector<std::vector<int64_t>> kShapes = {{7}, {}, {64, 33}, {1000}, {3, 5, 7}, {150001}};

std::vector<torch::Tensor> random_params(torch::Dtype dtype = torch::kFloat) {
  std::vector<torch::Tensor> params;
  for (const auto& shape : kShapes) params.push_back(leaf(torch::randn(shape).to(dtype)));
  return params;
}

void set_grads(std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].clone();
}

std::vector<torch::Tensor> random_grads(const std::vector<torch::Tensor>& params,
                                        double scale = 1.0) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    grads.push_back((torch::randn(p.sizes()) * scale).to(p.scalar_type()));
  return grads;
}

const FusedAdamWParamState& fused_state(const FusedAdamW& opt, const torch::Tensor& p) {
  return static_cast<const FusedAdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
}
const torch::optim::AdamWParamState& adamw_state(const torch::optim::AdamW& opt,
                                                 const torch::Tensor& p) {
  return static_cast<const torch::optim::AdamWParamState&>(
      *opt.state().at(p.unsafeGetTensorImpl()));
}

TEST(FusedAdamWTest, DefaultsAreAdamWs) {
  FusedAdamWOptions options;
  torch::optim::AdamWOptions reference;
  EXPECT_EQ(options.lr(), reference.lr());
  EXPECT_EQ(options.betas(), reference.betas());
  EXPECT_EQ(options.eps(), reference.eps());
  EXPECT_EQ(options.weight_decay(), reference.weight_decay());
  EXPECT_EQ(options.amsgrad(), reference.amsgrad());
  EXPECT_FALSE(options.maximize());
  EXPECT_EQ(FusedAdamWOptions(3e-4).lr(), 3e-4);
  options.set_lr(0.5);
  EXPECT_EQ(options.get_lr(), 0.5);
}

TEST(FusedAdamWTest, RejectsBadOptionsNamingTheValue) {
  auto p = leaf(torch::randn({2}));
  EXPECT_THAT([&] { FusedAdamW({p}, FusedAdamWOptions(-1.0)); },
              ThrowsMessage<c10::ValueError>(HasSubstr("Invalid learning rate: -1")));
  EXPECT_THAT([&] { FusedAdamW({p}, FusedAdamWOptions().eps(-1e-3)); },
              ThrowsMessage<c10::ValueError>(HasSubstr("Invalid epsilon value: -0.001")));
  EXPECT_THAT(
      [&] {
        FusedAdamW({p}, FusedAdamWOptions().betas({1.0, 0.9}));
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("Invalid beta parameter at index 0: 1")));
  EXPECT_THAT(
      [&] {
        FusedAdamW({p}, FusedAdamWOptions().betas({0.9, -0.1}));
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("Invalid beta parameter at index 1: -0.1")));
  EXPECT_THAT([&] { FusedAdamW({p}, FusedAdamWOptions().weight_decay(-2)); },
              ThrowsMessage<c10::ValueError>(HasSubstr("Invalid weight_decay value: -2")));
  EXPECT_THAT(
      [&] {
        FusedAdamW({p, torch::ones({2}, torch::kInt)});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("parameter 1 of group 0 is Int")));
}

// The first test: fp32 params equal torch::optim::AdamW to 1e-6 over 100 steps with
// weight decay, in two parameter groups with different options.
TEST(FusedAdamWTest, Fp32MatchesLibTorchAdamWOver100Steps) {
  for (bool amsgrad : {false, true}) {
    SCOPED_TRACE(amsgrad ? "amsgrad" : "adamw");
    torch::manual_seed(0);
    auto fused_params = random_params();
    auto ref_params = clones(fused_params);
    auto make_groups = [&](const std::vector<torch::Tensor>& ps, auto options_a, auto options_b) {
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(std::vector<torch::Tensor>(ps.begin(), ps.begin() + 3),
                          std::make_unique<decltype(options_a)>(options_a));
      groups.emplace_back(std::vector<torch::Tensor>(ps.begin() + 3, ps.end()),
                          std::make_unique<decltype(options_b)>(options_b));
      return groups;
    };
    FusedAdamW fused(make_groups(
        fused_params, FusedAdamWOptions(1e-2).weight_decay(0.1).amsgrad(amsgrad),
        FusedAdamWOptions(3e-3).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.02).amsgrad(amsgrad)));
    torch::optim::AdamW reference(
        make_groups(ref_params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(amsgrad),
                    torch::optim::AdamWOptions(3e-3)
                        .betas({0.8, 0.99})
                        .eps(1e-6)
                        .weight_decay(0.02)
                        .amsgrad(amsgrad)));
    double worst = 0;
    for (int step = 0; step < 100; ++step) {
      const auto grads = random_grads(fused_params, step % 7 == 0 ? 1e-3 : 1.0);
      set_grads(fused_params, grads);
      set_grads(ref_params, grads);
      fused.step();
      reference.step();
      for (size_t i = 0; i < fused_params.size(); ++i)
        worst = std::max(worst, max_abs_diff(fused_params[i], ref_params[i]));
    }
    EXPECT_LE(worst, 1e-6) << "max |fused - AdamW| over 100 steps";
    for (size_t i = 0; i < fused_params.size(); ++i) {
      const auto& fs = fused_state(fused, fused_params[i]);
      const auto& rs = adamw_state(reference, ref_params[i]);
      EXPECT_EQ(fs.step().item<double>(), static_cast<double>(rs.step()));
      EXPECT_LE(max_abs_diff(fs.exp_avg(), rs.exp_avg()), 1e-6);
      EXPECT_LE(max_abs_diff(fs.exp_avg_sq(), rs.exp_avg_sq()), 1e-6);
      if (amsgrad) EXPECT_LE(max_abs_diff(fs.max_exp_avg_sq(), rs.max_exp_avg_sq()), 1e-6);
    }
  }
}

TEST(FusedAdamWTest, StateLayoutIsPytorchs) {
  auto p = leaf(torch::randn({4, 3}));
  FusedAdamW opt({p});
  p.mutable_grad() = torch::ones({4, 3});
  opt.step();
  opt.step();
  const auto& s = fused_state(opt, p);
  EXPECT_EQ(s.step().dim(), 0);
  EXPECT_EQ(s.step().scalar_type(), torch::kFloat);
  EXPECT_EQ(s.step().item<float>(), 2.f);
  EXPECT_EQ(s.exp_avg().sizes(), p.sizes());
  EXPECT_EQ(s.exp_avg_sq().sizes(), p.sizes());
  EXPECT_FALSE(s.max_exp_avg_sq().defined());
}

TEST(FusedAdamWTest, MaximizeAscends) {
  torch::manual_seed(1);
  auto params = random_params();
  auto ref = clones(params);
  FusedAdamW fused(params, FusedAdamWOptions(1e-2).maximize(true));
  torch::optim::AdamW reference(ref, torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 5; ++step) {
    const auto grads = random_grads(params);
    set_grads(params, grads);
    for (size_t i = 0; i < ref.size(); ++i) ref[i].mutable_grad() = -grads[i];
    fused.step();
    reference.step();
  }
  for (size_t i = 0; i < params.size(); ++i) EXPECT_LE(max_abs_diff(params[i], ref[i]), 1e-6);
}

TEST(FusedAdamWTest, ManySmallTensorsAndParamsWithoutGrads) {
  torch::manual_seed(2);
  std::vector<torch::Tensor> params;
  for (int i = 0; i < 300; ++i) params.push_back(leaf(torch::randn({1 + i % 37})));
  auto ref = clones(params);
  FusedAdamW fused(params, FusedAdamWOptions(1e-2));
  torch::optim::AdamW reference(ref, torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (i % 5 == 0) continue;  // never gets a gradient: never moves, no state
      const auto g = torch::randn(params[i].sizes());
      params[i].mutable_grad() = g.clone();
      ref[i].mutable_grad() = g.clone();
    }
    fused.step();
    reference.step();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LE(max_abs_diff(params[i], ref[i]), 1e-6) << i;
    EXPECT_EQ(fused.state().count(params[i].unsafeGetTensorImpl()), i % 5 == 0 ? 0u : 1u);
  }
}

// Parameters the kernels cannot walk as flat memory (non-dense views, a gradient laid out
// differently) and fp64 take the ATen fallback, with the same results.
TEST(FusedAdamWTest, FallbackForOddLayoutsAndFp64) {
  torch::manual_seed(3);
  auto base = torch::randn({8, 12});
  auto strided = base.slice(/*dim=*/1, 0, 6).detach().requires_grad_(true);  // not dense
  auto transposed =
      leaf(torch::randn({5, 9})).t().detach().requires_grad_(true);  // dense, grad contiguous
  auto fp64 = leaf(torch::randn({13}, torch::kDouble));
  std::vector<torch::Tensor> params{strided, transposed, fp64};
  std::vector<torch::Tensor> ref{leaf(strided), leaf(transposed), leaf(fp64)};
  FusedAdamW fused(params, FusedAdamWOptions(1e-2).weight_decay(0.05));
  torch::optim::AdamW reference(ref, torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
  for (int step = 0; step < 10; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      const auto g = torch::randn(params[i].sizes(), params[i].options().requires_grad(false));
      params[i].mutable_grad() = g.contiguous();
      ref[i].mutable_grad() = g.contiguous();
    }
    fused.step();
    reference.step();
  }
  for (size_t i = 0; i < params.size(); ++i) EXPECT_LE(max_abs_diff(params[i], ref[i]), 1e-6) << i;

  // The fallback skips on found_inf too.
  const auto before = strided.detach().clone();
  fused.set_amp_scaling({}, torch::ones({}));
  fused.step();
  fused.clear_amp_scaling();
  EXPECT_TRUE(torch::equal(strided, before));
  EXPECT_EQ(fused_state(fused, strided).step().item<float>(), 10.f);
}

// With injected inf the step is a no-op: params, moments, step counts and model copies.
TEST(FusedAdamWTest, InjectedInfMakesTheStepANoOp) {
  torch::manual_seed(4);
  auto model_params = random_params(torch::kBFloat16);
  model_params.push_back(leaf(torch::randn({9})));  // an fp32 param: its own master
  MasterWeights masters(model_params);
  FusedAdamW fused(masters, FusedAdamWOptions(1e-2).weight_decay(0.1));
  GradScaler scaler(GradScalerOptions().init_scale(256.));
  scaler.scale(torch::ones({}));  // the scale lives on the CPU from here on
  auto train_step = [&](bool inject) {
    masters.zero_grad();
    for (auto& p : model_params)
      p.mutable_grad() = (torch::randn(p.sizes()) * 256).to(p.scalar_type());
    if (inject) model_params[2].mutable_grad()[1][2] = kNan;
    masters.copy_grads_to_masters();
    scaler.step(fused);
    scaler.update();
  };
  train_step(false);
  std::vector<torch::Tensor> model_before, master_before, m_before, v_before, step_before;
  for (size_t i = 0; i < model_params.size(); ++i) {
    model_before.push_back(model_params[i].detach().clone());
    master_before.push_back(masters.master_params()[i].detach().clone());
    const auto& s = fused_state(fused, masters.master_params()[i]);
    m_before.push_back(s.exp_avg().clone());
    v_before.push_back(s.exp_avg_sq().clone());
    step_before.push_back(s.step().clone());
  }
  train_step(true);
  EXPECT_TRUE(scaler.last_step_skipped());
  for (size_t i = 0; i < model_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(model_params[i], model_before[i])) << i;
    EXPECT_TRUE(torch::equal(masters.master_params()[i], master_before[i])) << i;
    const auto& s = fused_state(fused, masters.master_params()[i]);
    EXPECT_TRUE(torch::equal(s.exp_avg(), m_before[i])) << i;
    EXPECT_TRUE(torch::equal(s.exp_avg_sq(), v_before[i])) << i;
    EXPECT_TRUE(torch::equal(s.step(), step_before[i])) << i;
  }
  // Unscaled by the GradScaler first (the Trainer's order): grad_scale undefined, still skips.
  masters.zero_grad();
  for (auto& p : model_params) p.mutable_grad() = torch::ones(p.sizes(), p.scalar_type());
  model_params[0].mutable_grad()[3] = kInf;
  masters.copy_grads_to_masters();
  scaler.unscale_(fused);
  scaler.step(fused);
  scaler.update();
  EXPECT_TRUE(torch::equal(masters.master_params()[0], master_before[0]));
  EXPECT_TRUE(torch::equal(fused_state(fused, masters.master_params()[0]).step(), step_before[0]));
  EXPECT_EQ(scaler.skipped_steps(), 2);
}

TEST(FusedAdamWTest, WithoutAScalerThereIsNoSkip) {
  // optimizer.step() on its own: no unscale, no inf check, as torch::optim::AdamW.
  auto p = leaf(torch::zeros({4}));
  FusedAdamW opt({p});
  p.mutable_grad() = torch::tensor({1.f, kInf, 1.f, 1.f});
  opt.step();
  EXPECT_TRUE(std::isnan(p[1].item<float>()));
  EXPECT_FALSE(std::isnan(p[0].item<float>()));
  EXPECT_EQ(fused_state(opt, p).step().item<float>(), 1.f);
}

// With a loss scale of 1024 (a power of two: unscaling is exact) the trajectory equals the
// unscaled run bit for bit, whether the optimizer unscales (grad_scale handed over) or
// GradScaler::unscale_ did.
TEST(FusedAdamWTest, ScaledRunEqualsUnscaledRun) {
  for (bool call_unscale : {false, true}) {
    SCOPED_TRACE(call_unscale ? "unscale_ first" : "fused unscale");
    torch::manual_seed(5);
    auto plain_params = random_params();
    auto scaled_params = clones(plain_params);
    FusedAdamW plain(plain_params, FusedAdamWOptions(1e-2).weight_decay(0.1));
    FusedAdamW scaled(scaled_params, FusedAdamWOptions(1e-2).weight_decay(0.1));
    GradScaler scaler(GradScalerOptions().init_scale(1024.).growth_interval(1000));
    scaler.scale(torch::ones({}));
    for (int step = 0; step < 20; ++step) {
      const auto grads = random_grads(plain_params);
      set_grads(plain_params, grads);
      for (size_t i = 0; i < grads.size(); ++i) scaled_params[i].mutable_grad() = grads[i] * 1024;
      plain.step();
      if (call_unscale) scaler.unscale_(scaled);
      scaler.step(scaled);
      scaler.update();
    }
    EXPECT_EQ(scaler.get_scale(), 1024.);
    for (size_t i = 0; i < plain_params.size(); ++i) {
      EXPECT_TRUE(torch::equal(plain_params[i], scaled_params[i])) << i;
    }
  }
}

// bf16 model + fp32 masters: FusedAdamW writing back in the same pass matches MasterWeights +
// torch::optim::AdamW + copy_masters_to_model.
TEST(FusedAdamWTest, Bf16ModelWithMastersMatchesMasterWeightsAndAdamW) {
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::manual_seed(6);
    auto fused_model = random_params(dtype);
    auto ref_model = clones(fused_model);
    MasterWeights fused_masters(fused_model);
    MasterWeights ref_masters(ref_model);
    FusedAdamW fused(fused_masters, FusedAdamWOptions(1e-3).weight_decay(0.01));
    EXPECT_TRUE(fused.writes_back_to_model());
    torch::optim::AdamW reference(ref_masters.master_params(),
                                  torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
    for (int step = 0; step < 50; ++step) {
      const auto grads = random_grads(fused_model);
      set_grads(fused_model, grads);
      set_grads(ref_model, grads);
      fused_masters.copy_grads_to_masters();
      ref_masters.copy_grads_to_masters();
      fused.step();  // no copy_masters_to_model: the optimizer wrote the model
      reference.step();
      ref_masters.copy_masters_to_model();
    }
    for (size_t i = 0; i < fused_model.size(); ++i) {
      EXPECT_LE(max_abs_diff(fused_masters.master_params()[i], ref_masters.master_params()[i]),
                1e-6)
          << i;
      EXPECT_TRUE(torch::equal(fused_model[i], fused_masters.master_params()[i].to(dtype)))
          << "the model holds its master, rounded once: " << i;
      // Masters that differ by an ulp of fp32 round to the same bf16 except at a tie edge.
      const auto mismatched = fused_model[i].ne(ref_model[i]).sum().item<int64_t>();
      EXPECT_LE(mismatched, std::max<int64_t>(1, fused_model[i].numel() / 10000)) << i;
    }
  }
}

// Pure bf16 (no masters): the update is computed in fp32 and rounded once. One step from a
// bf16 state equals the fp32 step of the same values, rounded to bf16.
TEST(FusedAdamWTest, PureLowPrecisionParamsAreUpdatedInFp32AndRoundedOnce) {
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::manual_seed(7);
    auto low = random_params(dtype);
    std::vector<torch::Tensor> wide;
    for (const auto& p : low) wide.push_back(leaf(p.to(torch::kFloat)));
    FusedAdamW fused_low(low, FusedAdamWOptions(1e-2).weight_decay(0.1));
    FusedAdamW fused_wide(wide, FusedAdamWOptions(1e-2).weight_decay(0.1));
    for (int step = 0; step < 3; ++step) {
      const auto grads = random_grads(low);
      set_grads(low, grads);
      for (size_t i = 0; i < wide.size(); ++i) wide[i].mutable_grad() = grads[i].to(torch::kFloat);
      fused_low.step();
      fused_wide.step();
      for (size_t i = 0; i < low.size(); ++i) {
        EXPECT_TRUE(torch::equal(low[i], wide[i].to(dtype))) << "step " << step << " tensor " << i;
        const auto& ls = fused_state(fused_low, low[i]);
        const auto& ws = fused_state(fused_wide, wide[i]);
        EXPECT_EQ(ls.exp_avg().scalar_type(), dtype)
            << "pure mode keeps moments in the param dtype";
        EXPECT_TRUE(torch::equal(ls.exp_avg(), ws.exp_avg().to(dtype)));
        EXPECT_TRUE(torch::equal(ls.exp_avg_sq(), ws.exp_avg_sq().to(dtype)));
        // Re-sync the wide run to the rounded values, so that each step starts equal.
        torch::NoGradGuard no_grad;
        wide[i].copy_(low[i]);
        ws.exp_avg().copy_(ls.exp_avg());
        ws.exp_avg_sq().copy_(ls.exp_avg_sq());
      }
    }
  }
}

TEST(FusedAdamWTest, PureFp16ParamsStepThroughGradScaler) {
  // fp16 params and grads: the fused path unscales in fp32 inside the kernel, so GradScaler
  // never needs to unscale fp16 gradients itself.
  auto p = leaf(torch::zeros({8}, torch::kHalf));
  FusedAdamW opt({p}, FusedAdamWOptions(0.5).weight_decay(0));
  GradScaler scaler(GradScalerOptions().init_scale(1024.));  // 65536 overflows fp16
  scaler.scale(p.to(torch::kFloat).sum()).backward();
  EXPECT_EQ(p.grad().scalar_type(), torch::kHalf);
  scaler.step(opt);
  scaler.update();
  EXPECT_TRUE(torch::allclose(p.to(torch::kFloat), torch::full({8}, -0.5f), 0, 1e-3));
}

TEST(FusedAdamWTest, LinkingChecksThePairs) {
  auto master = leaf(torch::randn({3}));
  auto model = leaf(torch::randn({3}).to(torch::kBFloat16));
  FusedAdamW opt({master});
  EXPECT_FALSE(opt.writes_back_to_model());
  EXPECT_THAT(
      [&] {
        opt.link_model_params({master}, {model, model});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("1 params but 2 model params")));
  EXPECT_THAT(
      [&] { opt.link_model_params({master}, {leaf(torch::randn({4}).to(torch::kBFloat16))}); },
      ThrowsMessage<c10::ValueError>(HasSubstr("pair 0 differs in shape or device")));
  EXPECT_THAT(
      [&] { opt.link_model_params({master}, {leaf(torch::randn({3}, torch::kDouble))}); },
      ThrowsMessage<c10::ValueError>(HasSubstr("model param 0 must be bfloat16 or float16")));
  opt.link_model_params({master}, {model});
  EXPECT_TRUE(opt.writes_back_to_model());
  master.mutable_grad() = torch::ones({3});
  opt.step();
  EXPECT_TRUE(torch::equal(model, master.to(torch::kBFloat16)));
}

// HF's parameter groups built from masters_for, linked afterwards.
TEST(FusedAdamWTest, ParameterGroupsFromMastersFor) {
  torch::manual_seed(8);
  torch::nn::Linear model(16, 8);
  model->to(torch::kBFloat16);
  MasterWeights masters(*model);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      masters.masters_for({model->weight}),
      std::make_unique<FusedAdamWOptions>(FusedAdamWOptions(1e-2).weight_decay(0.1)));
  groups.emplace_back(
      masters.masters_for({model->bias}),
      std::make_unique<FusedAdamWOptions>(FusedAdamWOptions(1e-2).weight_decay(0.0)));
  FusedAdamW opt(std::move(groups));
  opt.link_model_params(masters);
  model->forward(torch::randn({4, 16}, torch::kBFloat16)).to(torch::kFloat).sum().backward();
  masters.copy_grads_to_masters();
  opt.step();
  EXPECT_TRUE(torch::equal(model->weight, masters.master_params()[0].to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(model->bias, masters.master_params()[1].to(torch::kBFloat16)));
}

// All CPU kernels this machine can run (DEFAULT always; AVX2/AVX512 when ATen allows them)
// agree with each other, and the library uses the one ATen uses.
TEST(FusedAdamWTest, EveryBuiltCpuKernelAgrees) {
  namespace d = mantissa::optim::detail;
  const std::string capability = at::get_cpu_capability();
  EXPECT_STREQ(d::fused_adamw_cpu_capability(),
               capability == "AVX512" || capability == "AVX2" ? capability.c_str() : "DEFAULT");
  std::vector<void (*)(const d::AdamWCpuArgs&)> kernels{&d::DEFAULT::fused_adamw_cpu};
  if (capability == "AVX2" || capability == "AVX512") kernels.push_back(&d::AVX2::fused_adamw_cpu);
  if (capability == "AVX512") kernels.push_back(&d::AVX512::fused_adamw_cpu);
  torch::manual_seed(9);
  const int64_t n = 1000 + 13;
  const auto p0 = torch::randn({n});
  const auto g0 = torch::randn({n});
  const auto m0 = torch::randn({n}) * 0.1;
  const auto v0 = torch::rand({n}) * 0.1;
  std::vector<torch::Tensor> results;
  for (auto kernel : kernels) {
    auto p = p0.clone(), m = m0.clone(), v = v0.clone();
    auto model = torch::empty({n}, torch::kBFloat16);
    d::AdamWCpuTensor t{
        p.data_ptr(), g0.data_ptr(), m.data_ptr(), v.data_ptr(), nullptr, model.data_ptr(), n,
        -0.01f,       0.5f};
    d::AdamWCpuArgs args{};
    args.param_dtype = d::KernelDtype::kFloat;
    args.model_dtype = d::KernelDtype::kBFloat16;
    args.scalars = {0.999f, 0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, true, 0.5f, false};
    args.tensors = &t;
    args.num_tensors = 1;
    kernel(args);
    EXPECT_TRUE(torch::equal(model, p.to(torch::kBFloat16)));
    results.push_back(torch::cat({p, m, v}));
  }
  for (size_t k = 1; k < results.size(); ++k) {
    // DEFAULT rounds m's multiply-add in two steps where AVX2/AVX512 fuse it: an ulp apart.
    EXPECT_TRUE(torch::allclose(results[k], results[0], 1e-6, 1e-7)) << "kernel " << k;
  }
}

// CTest runs this suite natively and under ATEN_CPU_CAPABILITY=default and =avx2: each time a
// FusedAdamW step must run the kernel built for the level ATen reports, and no other.
TEST(FusedAdamWTest, StepRunsTheKernelOfAtensCpuCapability) {
  namespace d = mantissa::optim::detail;
  const std::string aten = at::get_cpu_capability();
  const std::string expected = aten == "AVX512" || aten == "AVX2" ? aten : "DEFAULT";
#if defined(__x86_64__)
  // The variable caps the level (the suite skips itself where the CPU cannot run the level).
  const char* requested = std::getenv("ATEN_CPU_CAPABILITY");
  if (requested != nullptr && std::string(requested) == "default") EXPECT_EQ(aten, "DEFAULT");
  if (requested != nullptr && std::string(requested) == "avx2") EXPECT_EQ(aten, "AVX2");
#endif
  EXPECT_EQ(d::fused_adamw_cpu_capability(), expected);

  const std::vector<std::pair<std::string, std::int64_t (*)()>> counters{
      {"DEFAULT", &d::DEFAULT::fused_adamw_cpu_calls},
      {"AVX2", &d::AVX2::fused_adamw_cpu_calls},
      {"AVX512", &d::AVX512::fused_adamw_cpu_calls}};
  std::vector<std::int64_t> before;
  for (const auto& counter : counters) before.push_back(counter.second());
  auto p = leaf(torch::randn({100}));
  p.mutable_grad() = torch::randn({100});
  FusedAdamW opt({p});
  opt.step();
  for (size_t k = 0; k < counters.size(); ++k) {
    EXPECT_EQ(counters[k].second() - before[k], counters[k].first == expected ? 1 : 0)
        << counters[k].first << " kernel, ATen says " << aten;
  }
}

// Checkpoint mid-training: the restored run continues the identical trajectory.
// Capturable: each group's rate is read from a tensor (what a CUDA graph replays). While a
// schedule changes the rate every step, the trajectory is bit for bit the plain one, through
// the kernel (fp32) and the ATen fallback (fp64) alike.
TEST(FusedAdamWTest, CapturableReadsTheRateFromItsTensorBitForBit) {
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    torch::manual_seed(21);
    auto plain_params = random_params(dtype);
    auto capturable_params = clones(plain_params);
    const auto options = FusedAdamWOptions(1e-2).weight_decay(0.1);
    FusedAdamW plain(plain_params, options);
    FusedAdamW capturable(capturable_params, options);
    EXPECT_FALSE(capturable.capturable());
    capturable.set_capturable(true);
    ASSERT_TRUE(capturable.capturable());
    EXPECT_EQ(capturable.lr_tensor(0).scalar_type(), torch::kDouble);
    EXPECT_EQ(capturable.lr_tensor(0).dim(), 0);
    EXPECT_EQ(capturable.lr_tensor(0).item<double>(), 1e-2);
    for (int step = 0; step < 8; ++step) {
      const double lr = 1e-2 * (1.0 - step / 10.0);
      plain.param_groups()[0].options().set_lr(lr);
      capturable.param_groups()[0].options().set_lr(lr);
      const auto grads = random_grads(plain_params);
      set_grads(plain_params, grads);
      set_grads(capturable_params, grads);
      plain.step();
      capturable.step();  // eager: refreshes the tensor first
      EXPECT_EQ(capturable.lr_tensor(0).item<double>(), lr);
    }
    for (size_t i = 0; i < plain_params.size(); ++i) {
      EXPECT_TRUE(torch::equal(plain_params[i], capturable_params[i])) << dtype << " tensor " << i;
    }
  }
}

TEST(FusedAdamWTest, LrTensorsFollowTheOptionsOnlyWhenRefreshed) {
  auto params = random_params();
  FusedAdamW opt(params, FusedAdamWOptions(1e-3));
  EXPECT_THAT([&] { opt.lr_tensor(0); }, ThrowsMessage<c10::Error>(HasSubstr("not capturable")));
  opt.set_capturable(true);
  const auto tensor = opt.lr_tensor(0);
  opt.param_groups()[0].options().set_lr(0.5);
  EXPECT_EQ(tensor.item<double>(), 1e-3);  // a replayed graph would still see 1e-3 ...
  opt.refresh_lr_tensors();
  EXPECT_EQ(tensor.item<double>(), 0.5);  // ... until this, which writes the same memory
  EXPECT_TRUE(opt.lr_tensor(0).is_same(tensor));
  opt.add_param_group(torch::optim::OptimizerParamGroup({leaf(torch::randn({3}))}));
  opt.refresh_lr_tensors();
  EXPECT_EQ(opt.lr_tensor(1).item<double>(), 1e-3);  // the new group took the defaults
  EXPECT_THAT([&] { opt.lr_tensor(2); }, ThrowsMessage<c10::IndexError>(HasSubstr("group 2 of 2")));
  opt.set_capturable(false);
  EXPECT_THAT([&] { opt.lr_tensor(0); }, ThrowsMessage<c10::Error>(HasSubstr("not capturable")));
}

TEST(FusedAdamWTest, CheckpointRoundTripContinuesIdentically) {
  struct Run {
    torch::nn::Sequential model{nullptr};
    std::unique_ptr<MasterWeights> masters;
    std::unique_ptr<FusedAdamW> optimizer;
    GradScaler scaler{GradScalerOptions().init_scale(4096.).growth_interval(3)};
    explicit Run(int seed) {
      torch::manual_seed(seed);
      model = torch::nn::Sequential(
          torch::nn::Linear(12, 16),
          torch::nn::Functional([](const torch::Tensor& x) { return torch::tanh(x); }),
          torch::nn::Linear(16, 3));
      model->to(torch::kBFloat16);
      masters = std::make_unique<MasterWeights>(*model);
      optimizer =
          std::make_unique<FusedAdamW>(*masters, FusedAdamWOptions(1e-2).weight_decay(0.05));
    }
    void step(const torch::Tensor& x, const torch::Tensor& y, bool inject_inf) {
      masters->zero_grad();
      auto loss = torch::mse_loss(model->forward(x).to(torch::kFloat), y);
      scaler.scale(loss).backward();
      if (inject_inf) model->parameters()[0].mutable_grad()[0][0] = kInf;
      masters->copy_grads_to_masters();
      scaler.unscale_(*optimizer);
      torch::nn::utils::clip_grad_norm_(masters->master_params(), 1.0, 2.0, false);
      scaler.step(*optimizer);
      scaler.update();
    }
    std::string save() const {
      torch::serialize::OutputArchive archive;
      torch::serialize::OutputArchive m(archive.compilation_unit()), o(archive.compilation_unit()),
          s(archive.compilation_unit());
      masters->save(m);
      optimizer->save(o);
      scaler.save(s);
      archive.write("masters", m);
      archive.write("optimizer", o);
      archive.write("scaler", s);
      std::ostringstream out;
      archive.save_to(out);
      return out.str();
    }
    void load(const std::string& bytes) {
      std::istringstream in(bytes);
      torch::serialize::InputArchive archive;
      archive.load_from(in);
      torch::serialize::InputArchive m, o, s;
      archive.read("masters", m);
      archive.read("optimizer", o);
      archive.read("scaler", s);
      masters->load(m);
      optimizer->load(o);
      scaler.load(s);
    }
  };
  torch::manual_seed(10);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < 12; ++i) {
    data.emplace_back(torch::randn({8, 12}, torch::kBFloat16), torch::randn({8, 3}));
  }
  Run straight(11);
  Run first_half(11);
  for (int i = 0; i < 6; ++i) {
    straight.step(data[i].first, data[i].second, i == 2);
    first_half.step(data[i].first, data[i].second, i == 2);
  }
  const auto checkpoint = first_half.save();
  Run resumed(99);  // different initial weights: everything must come from the checkpoint
  resumed.load(checkpoint);
  EXPECT_EQ(resumed.scaler.get_scale(), straight.scaler.get_scale());
  for (int i = 6; i < 12; ++i) {
    straight.step(data[i].first, data[i].second, i == 8);
    resumed.step(data[i].first, data[i].second, i == 8);
  }
  for (size_t i = 0; i < straight.masters->master_params().size(); ++i) {
    EXPECT_TRUE(
        torch::equal(straight.masters->master_params()[i], resumed.masters->master_params()[i]))
        << i;
    EXPECT_TRUE(torch::equal(straight.model->parameters()[i], resumed.model->parameters()[i])) << i;
  }
  EXPECT_EQ(straight.scaler.get_scale(), resumed.scaler.get_scale());
  EXPECT_EQ(straight.scaler.skipped_steps(), 2);
}

// The archive layout is torch::optim::AdamW's: each optimizer resumes from the other's.
TEST(FusedAdamWTest, ArchivesInterchangeWithLibTorchAdamW) {
  torch::manual_seed(12);
  const auto init = random_params();
  std::vector<std::vector<torch::Tensor>> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(random_grads(init));
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1).betas({0.85, 0.995});
  const auto fused_options = FusedAdamWOptions(1e-2).weight_decay(0.1).betas({0.85, 0.995});

  auto straight = clones(init);
  torch::optim::AdamW straight_opt(straight, options);
  for (const auto& g : grads) {
    set_grads(straight, g);
    straight_opt.step();
  }
  auto save = [](const torch::optim::Optimizer& opt) {
    torch::serialize::OutputArchive archive;
    opt.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    return out.str();
  };
  auto load = [](torch::optim::Optimizer& opt, const std::string& bytes) {
    std::istringstream in(bytes);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    opt.load(archive);
  };
  // AdamW for 3 steps, FusedAdamW for 3; and the other way round.
  for (bool fused_first : {false, true}) {
    SCOPED_TRACE(fused_first ? "FusedAdamW -> AdamW" : "AdamW -> FusedAdamW");
    auto params = clones(init);
    std::unique_ptr<torch::optim::Optimizer> a, b;
    if (fused_first) {
      a = std::make_unique<FusedAdamW>(params, fused_options);
      b = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.5));
    } else {
      a = std::make_unique<torch::optim::AdamW>(params, options);
      b = std::make_unique<FusedAdamW>(params, FusedAdamWOptions(0.5));
    }
    for (int i = 0; i < 3; ++i) {
      set_grads(params, grads[i]);
      a->step();
    }
    load(*b, save(*a));
    EXPECT_EQ(b->param_groups()[0].options().get_lr(), 1e-2);
    for (int i = 3; i < 6; ++i) {
      set_grads(params, grads[i]);
      b->step();
    }
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_LE(max_abs_diff(params[i], straight[i]), 1e-6) << i;
  }
}

// ---- CUDA (skipped without a GPU) -------------------------------------------------------

// Runs the same steps on the CPU kernel and on the CUDA kernel and compares.
void compare_cuda_with_cpu(torch::Dtype param_dtype, bool with_masters, bool amsgrad,
                           const std::vector<std::vector<int64_t>>& shapes, bool scaled) {
  torch::manual_seed(13);
  std::vector<torch::Tensor> cpu_model, gpu_model;
  for (const auto& shape : shapes) {
    const auto init = torch::randn(shape).to(param_dtype);
    cpu_model.push_back(leaf(init));
    gpu_model.push_back(leaf(init.cuda()));
  }
  std::unique_ptr<MasterWeights> cpu_masters, gpu_masters;
  std::unique_ptr<FusedAdamW> cpu_opt, gpu_opt;
  const auto options = FusedAdamWOptions(1e-2).weight_decay(0.1).amsgrad(amsgrad);
  if (with_masters) {
    cpu_masters = std::make_unique<MasterWeights>(cpu_model);
    gpu_masters = std::make_unique<MasterWeights>(gpu_model);
    cpu_opt = std::make_unique<FusedAdamW>(*cpu_masters, options);
    gpu_opt = std::make_unique<FusedAdamW>(*gpu_masters, options);
  } else {
    cpu_opt = std::make_unique<FusedAdamW>(cpu_model, options);
    gpu_opt = std::make_unique<FusedAdamW>(gpu_model, options);
  }
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto g = (torch::randn(shapes[i]) * (scaled ? 1024 : 1)).to(param_dtype);
      cpu_model[i].mutable_grad() = g.clone();
      gpu_model[i].mutable_grad() = g.cuda();
    }
    if (with_masters) {
      cpu_masters->copy_grads_to_masters();
      gpu_masters->copy_grads_to_masters();
    }
    if (scaled) {
      const auto inf = torch::zeros({});
      cpu_opt->set_amp_scaling(torch::full({}, 1024.f), inf);
      gpu_opt->set_amp_scaling(torch::full({}, 1024.f, torch::kCUDA), inf.cuda());
    }
    cpu_opt->step();
    gpu_opt->step();
    cpu_opt->clear_amp_scaling();
    gpu_opt->clear_amp_scaling();
  }
  const auto& cpu_params = with_masters ? cpu_masters->master_params() : cpu_model;
  const auto& gpu_params = with_masters ? gpu_masters->master_params() : gpu_model;
  // Same operations, same rounding (IEEE sqrt and divide on both); only the bias corrections'
  // double pow may differ in its last bit between glibc and CUDA. A stored bf16/fp16 value then
  // lands one ulp of its dtype away, rarely.
  auto close = [](const torch::Tensor& a, const torch::Tensor& b) {
    const double rtol =
        a.scalar_type() == torch::kFloat ? 1e-5 : (a.scalar_type() == torch::kHalf ? 2e-3 : 1e-2);
    return torch::allclose(a.to(torch::kFloat), b.cpu().to(torch::kFloat), rtol, 1e-6);
  };
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_TRUE(close(cpu_params[i], gpu_params[i]))
        << "tensor " << i << ": max diff " << max_abs_diff(cpu_params[i], gpu_params[i].cpu());
    EXPECT_LE(cpu_model[i].ne(gpu_model[i].cpu()).sum().item<int64_t>(),
              std::max<int64_t>(1, cpu_model[i].numel() / 1000))
        << "model copy " << i;
    const auto& cs = fused_state(*cpu_opt, cpu_params[i]);
    const auto& gs = fused_state(*gpu_opt, gpu_params[i]);
    EXPECT_EQ(gs.step().device().type(), torch::kCUDA);
    EXPECT_EQ(gs.step().item<float>(), cs.step().item<float>());
    EXPECT_TRUE(close(cs.exp_avg(), gs.exp_avg())) << "exp_avg " << i;
    EXPECT_TRUE(close(cs.exp_avg_sq(), gs.exp_avg_sq())) << "exp_avg_sq " << i;
  }
}

// Many tensors (more than one launch's 24), and one of > 320 chunks of 64K (several launches).
const std::vector<std::vector<int64_t>> kCudaShapes = [] {
  std::vector<std::vector<int64_t>> shapes{{}, {7}, {65536}, {65537}, {321 * 65536 + 5}};
  for (int i = 0; i < 40; ++i) shapes.push_back({1 + 97 * i});
  return shapes;
}();

TEST(FusedAdamWCudaTest, Fp32MatchesCpuKernel) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(mantissa::amp::cuda_kernels_built()) << "built without MANTISSA_CUDA";
  compare_cuda_with_cpu(torch::kFloat, false, false, kCudaShapes, false);
  compare_cuda_with_cpu(torch::kFloat, false, true, kCudaShapes, true);
}

TEST(FusedAdamWCudaTest, Bf16MastersWriteBackLikeCpuKernel) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  compare_cuda_with_cpu(torch::kBFloat16, true, false, kCudaShapes, true);
  compare_cuda_with_cpu(torch::kHalf, true, false, kCudaShapes, false);
}

TEST(FusedAdamWCudaTest, PureBf16MatchesCpuKernel) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  compare_cuda_with_cpu(torch::kBFloat16, false, false, kCudaShapes, false);
  compare_cuda_with_cpu(torch::kHalf, false, true, kCudaShapes, true);
}

TEST(FusedAdamWCudaTest, SkipsOnDeviceFoundInfAndMatchesAdamW) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  torch::manual_seed(14);
  auto params = random_params();
  std::vector<torch::Tensor> gpu;
  for (const auto& p : params) gpu.push_back(leaf(p.cuda()));
  torch::optim::AdamW reference(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  FusedAdamW fused(gpu, FusedAdamWOptions(1e-2).weight_decay(0.1));
  GradScaler scaler(GradScalerOptions().init_scale(512.));
  scaler.scale(torch::ones({}, torch::kCUDA));
  for (int step = 0; step < 10; ++step) {
    const auto grads = random_grads(params);
    set_grads(params, grads);
    for (size_t i = 0; i < gpu.size(); ++i)
      gpu[i].mutable_grad() = (grads[i] * scaler.get_scale()).cuda();
    if (step == 4) gpu[3].mutable_grad()[17] = kNan;
    if (step != 4) reference.step();
    scaler.step(fused);
    scaler.update();
  }
  EXPECT_EQ(scaler.skipped_steps(), 1);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LE(max_abs_diff(params[i], gpu[i].cpu()), 1e-6) << i;
    EXPECT_EQ(fused_state(fused, gpu[i]).step().item<float>(), 9.f);
  }
}

// The proof that the step never syncs: it can be captured in a CUDA graph. Replays with new
// gradients and a new rate each time follow the eager optimizer bit for bit (same kernel).
TEST(FusedAdamWCudaTest, CapturedStepReplaysWithTheCurrentRateBitForBit) {
  MANTISSA_SKIP_WITHOUT_CUDA();
#ifdef MANTISSA_WITH_CUDA
  torch::manual_seed(22);
  std::vector<torch::Tensor> eager_params;
  std::vector<torch::Tensor> graph_params;
  for (const auto& p : random_params()) {
    eager_params.push_back(leaf(p.cuda()));
    graph_params.push_back(leaf(p.cuda()));
  }
  const auto options = FusedAdamWOptions(1e-2).weight_decay(0.1);
  FusedAdamW eager(eager_params, options);
  FusedAdamW graphed(graph_params, options);
  graphed.set_capturable(true);
  GradScaler scaler(GradScalerOptions().init_scale(1024.));
  scaler.scale(torch::ones({}, torch::kCUDA));
  auto set_all = [&](const std::vector<torch::Tensor>& grads, bool overflow) {
    for (size_t i = 0; i < grads.size(); ++i) {
      auto g = (grads[i] * 1024).cuda();
      if (overflow && i == 2) g[0][0] = kInf;
      eager_params[i].mutable_grad() = g.clone();
      if (graph_params[i].grad().defined()) {
        graph_params[i].mutable_grad().copy_(g);  // the captured step reads these addresses
      } else {
        graph_params[i].mutable_grad() = g.clone();
      }
    }
  };
  // One eager step each makes the optimizer state, which the graph then reads and writes.
  set_all(random_grads(eager_params), false);
  eager.step();
  graphed.step();

  GradScaler graph_scaler(GradScalerOptions().init_scale(1024.));
  graph_scaler.scale(torch::ones({}, torch::kCUDA));
  at::cuda::CUDAGraph graph;
  auto side = c10::cuda::getStreamFromPool();
  side.synchronize();
  torch::cuda::synchronize();
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    graph.capture_begin();
    graph_scaler.step(graphed);
    graph_scaler.update();
    graph.capture_end();
  }
  torch::cuda::synchronize();
  for (int step = 0; step < 6; ++step) {
    const double lr = 1e-2 / (step + 2);
    eager.param_groups()[0].options().set_lr(lr);
    graphed.param_groups()[0].options().set_lr(lr);
    set_all(random_grads(eager_params), /*overflow=*/step == 3);
    scaler.step(eager);
    scaler.update();
    graphed.refresh_lr_tensors();
    graph.replay();
  }
  torch::cuda::synchronize();
  EXPECT_EQ(graph_scaler.get_scale(), scaler.get_scale());
  EXPECT_EQ(graph_scaler.skipped_steps(), 1);
  for (size_t i = 0; i < eager_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(eager_params[i], graph_params[i])) << "tensor " << i;
    EXPECT_EQ(fused_state(graphed, graph_params[i]).step().item<float>(),
              6.f);  // 1 + 6 - 1 skipped
  }
#endif
}

}  // namespace
