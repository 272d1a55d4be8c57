// GradScaler behaviour, ported from PyTorch's own tests (test/test_torch.py,
// test_grad_scaling_*), plus mantissa's extensions and serialization.
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/supports_amp_scaling.h>

namespace {

using mantissa::amp::GradScaler;
using mantissa::amp::GradScalerOptions;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr float kInf = std::numeric_limits<float>::infinity();

torch::Tensor param(const torch::nn::Sequential& model, const std::string& name) {
  return model->named_parameters()[name];
}

// _create_scaling_models_optimizers + _create_scaling_case: two Linear(8, 8) in a Sequential,
// identical weights, SGD lr 1.0, four 8x8 batches, MSELoss, inf injected at iteration 2.
struct ScalingCase {
  torch::nn::Sequential mod_control{torch::nn::Linear(8, 8), torch::nn::Linear(8, 8)};
  torch::nn::Sequential mod_scaling{torch::nn::Linear(8, 8), torch::nn::Linear(8, 8)};
  std::unique_ptr<torch::optim::SGD> opt_control;
  std::unique_ptr<torch::optim::SGD> opt_scaling;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  int skip_iter = 2;

  ScalingCase() {
    torch::manual_seed(0);
    mod_control = torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8));
    mod_scaling = torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8));
    {
      torch::NoGradGuard no_grad;
      auto c = mod_control->parameters();
      auto s = mod_scaling->parameters();
      for (size_t i = 0; i < c.size(); ++i) s[i].copy_(c[i]);
    }
    opt_control = std::make_unique<torch::optim::SGD>(mod_control->parameters(), 1.0);
    opt_scaling = std::make_unique<torch::optim::SGD>(mod_scaling->parameters(), 1.0);
    for (int i = 0; i < 4; ++i) data.emplace_back(torch::randn({8, 8}), torch::randn({8, 8}));
  }
};

using RunFn = std::function<void(ScalingCase&, torch::nn::Sequential&, torch::optim::Optimizer&,
                                 GradScaler&, bool try_scaling_api)>;

// _run_scaling_case: run the control (no scaler) and the scaled model; compare the final scale
// with 128 * 2^unskipped * 0.5^skipped and the parameters with each other.
void run_scaling_case(const RunFn& run, int unskipped, int skipped, double atol = 1e-7) {
  for (bool enabled : {true, false}) {
    SCOPED_TRACE(enabled ? "enabled" : "disabled");
    ScalingCase c;
    GradScaler scaler(
        GradScalerOptions().init_scale(128.).growth_factor(2.0).enabled(enabled).growth_interval(
            1));
    run(c, c.mod_control, *c.opt_control, scaler, false);
    run(c, c.mod_scaling, *c.opt_scaling, scaler, true);
    const double expected = enabled ? 128. * std::pow(scaler.get_growth_factor(), unskipped) *
                                          std::pow(scaler.get_backoff_factor(), skipped)
                                    : 1.0;
    EXPECT_EQ(scaler.get_scale(), expected);
    auto control = c.mod_control->parameters();
    auto scaling = c.mod_scaling->parameters();
    for (size_t i = 0; i < control.size(); ++i) {
      EXPECT_TRUE(torch::allclose(control[i], scaling[i], /*rtol=*/1e-5, atol))
          << "parameter " << i
          << " differs: max |diff| = " << (control[i] - scaling[i]).abs().max().item<double>();
    }
  }
}

void inject_inf(torch::nn::Sequential& model) {
  torch::NoGradGuard no_grad;
  param(model, "1.weight").mutable_grad().fill_(kInf);
}

TEST(GradScalerTest, Defaults) {
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.get_growth_factor(), 2.0);
  EXPECT_EQ(scaler.get_backoff_factor(), 0.5);
  EXPECT_EQ(scaler.get_growth_interval(), 2000);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  EXPECT_TRUE(scaler.is_enabled());
  EXPECT_FALSE(scaler.scale_tensor().defined()) << "the scale is created lazily";
}

TEST(GradScalerTest, RejectsBadFactorsNamingTheValue) {
  EXPECT_THAT([] { GradScaler(GradScalerOptions().growth_factor(0.9)); },
              ThrowsMessage<c10::ValueError>(
                  HasSubstr("The growth factor must be > 1.0. Got growth_factor=0.9")));
  EXPECT_THAT([] { GradScaler(GradScalerOptions().backoff_factor(1.5)); },
              ThrowsMessage<c10::ValueError>(HasSubstr("The backoff factor must be < 1.0")));
  EXPECT_THAT([] { GradScaler(GradScalerOptions().growth_interval(0)); },
              ThrowsMessage<c10::ValueError>(HasSubstr("growth_interval=0")));
  EXPECT_THAT([] { GradScaler(GradScalerOptions().hysteresis(0)); },
              ThrowsMessage<c10::ValueError>(HasSubstr("hysteresis=0")));
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().growth_factor(0.5).enabled(false)));
}

TEST(GradScalerTest, ScaleCreatesScaleOnFirstUseAndMultiplies) {
  GradScaler scaler(GradScalerOptions().init_scale(2.));
  auto out = scaler.scale(torch::full({1}, 4.0));
  EXPECT_EQ(out.item<float>(), 8.0f);
  ASSERT_TRUE(scaler.scale_tensor().defined());
  EXPECT_EQ(scaler.scale_tensor().dim(), 0);
  EXPECT_EQ(scaler.scale_tensor().scalar_type(), torch::kFloat);
  auto outs =
      scaler.scale(std::vector<torch::Tensor>{torch::full({1}, 4.0), torch::full({2}, 1.0)});
  EXPECT_EQ(outs[0].item<float>(), 8.0f);
  EXPECT_TRUE(torch::equal(outs[1], torch::full({2}, 2.0)));
}

TEST(GradScalerTest, ScaleFollowsPythonTypePromotion) {
  // `outputs * scale` as in Python: a 0-d bf16 loss times the 0-d fp32 scale is fp32, a
  // bf16 tensor with dimensions stays bf16.
  GradScaler scaler;
  EXPECT_EQ(scaler.scale(torch::ones({}, torch::kBFloat16)).scalar_type(), torch::kFloat);
  EXPECT_EQ(scaler.scale(torch::ones({3}, torch::kBFloat16)).scalar_type(), torch::kBFloat16);
}

// test_grad_scaling_update_scale: growth 2, backoff 0.25, interval 2, scale 4.
TEST(GradScalerTest, UpdateScaleTrajectory) {
  GradScaler scaler(
      GradScalerOptions().init_scale(4.).growth_factor(2.).backoff_factor(0.25).growth_interval(2));
  auto p = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD opt({p}, 0.1);
  auto iterate = [&](bool inf) {
    opt.zero_grad();
    scaler.scale(p.sum()).backward();
    if (inf) p.mutable_grad()[0].fill_(kInf);
    scaler.step(opt);
    scaler.update();
  };
  iterate(false);
  EXPECT_EQ(scaler.get_growth_tracker(), 1);
  EXPECT_EQ(scaler.get_scale(), 4.0);
  iterate(false);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  iterate(true);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_TRUE(scaler.last_step_skipped());
}

TEST(GradScalerTest, ScalingCaseMatchesUnscaledControl) {
  run_scaling_case(
      [](ScalingCase& c, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
         GradScaler& scaler, bool try_scaling_api) {
        for (int i = 0; i < static_cast<int>(c.data.size()); ++i) {
          optimizer.zero_grad();
          auto loss = torch::mse_loss(model->forward(c.data[i].first), c.data[i].second);
          if (try_scaling_api) {
            scaler.scale(loss).backward();
            if (i == c.skip_iter && scaler.is_enabled()) inject_inf(model);
            scaler.step(optimizer);
            scaler.update();
          } else {
            loss.backward();
            if (!scaler.is_enabled() || i != c.skip_iter) optimizer.step();
          }
        }
      },
      /*unskipped=*/3, /*skipped=*/1);
}

// test_grad_scaling_clipping: clip the scaled grads at max_norm * scale.
TEST(GradScalerTest, ClippingScaledGrads) {
  run_scaling_case(
      [](ScalingCase& c, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
         GradScaler& scaler, bool try_scaling_api) {
        const double max_norm = 0.2;
        for (int i = 0; i < static_cast<int>(c.data.size()); ++i) {
          optimizer.zero_grad();
          auto loss = torch::mse_loss(model->forward(c.data[i].first), c.data[i].second);
          if (try_scaling_api) {
            scaler.scale(loss).backward();
            torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm * scaler.get_scale());
            if (i == c.skip_iter && scaler.is_enabled()) inject_inf(model);
            scaler.step(optimizer);
            scaler.update();
          } else {
            loss.backward();
            torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm);
            if (!scaler.is_enabled() || i != c.skip_iter) optimizer.step();
          }
        }
      },
      3, 1, /*atol=*/1e-5);
}

// test_grad_scaling_clipping_separate_unscale: unscale_ first, then clip normally.
TEST(GradScalerTest, ClippingAfterUnscale) {
  run_scaling_case(
      [](ScalingCase& c, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
         GradScaler& scaler, bool try_scaling_api) {
        const double max_norm = 0.2;
        for (int i = 0; i < static_cast<int>(c.data.size()); ++i) {
          optimizer.zero_grad();
          auto loss = torch::mse_loss(model->forward(c.data[i].first), c.data[i].second);
          if (try_scaling_api) {
            scaler.scale(loss).backward();
            if (i == c.skip_iter && scaler.is_enabled()) inject_inf(model);
            scaler.unscale_(optimizer);
            torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm, 2.0,
                                              /*error_if_nonfinite=*/false);
            scaler.step(optimizer);
            scaler.update();
          } else {
            loss.backward();
            torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm);
            if (!scaler.is_enabled() || i != c.skip_iter) optimizer.step();
          }
        }
      },
      3, 1, 1e-5);
}

// test_grad_scaling_accumulation: two micro-batches per step.
TEST(GradScalerTest, GradientAccumulation) {
  run_scaling_case(
      [](ScalingCase& c, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
         GradScaler& scaler, bool try_scaling_api) {
        const int iters_to_accumulate = 2;
        for (int i = 0; i < static_cast<int>(c.data.size()); ++i) {
          auto loss = torch::mse_loss(model->forward(c.data[i].first), c.data[i].second) /
                      iters_to_accumulate;
          if (try_scaling_api) {
            scaler.scale(loss).backward();
          } else {
            loss.backward();
          }
          if ((i + 1) % iters_to_accumulate == 0) {
            if (try_scaling_api) {
              scaler.step(optimizer);
              scaler.update();
            } else {
              optimizer.step();
            }
            optimizer.zero_grad();
          }
        }
      },
      2, 0);
}

// test_grad_scaling_penalty: a gradient penalty built from autograd::grad of the scaled loss.
TEST(GradScalerTest, GradientPenalty) {
  run_scaling_case(
      [](ScalingCase& c, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
         GradScaler& scaler, bool try_scaling_api) {
        for (int i = 0; i < static_cast<int>(c.data.size()); ++i) {
          optimizer.zero_grad();
          auto loss = torch::mse_loss(model->forward(c.data[i].first), c.data[i].second);
          std::vector<torch::Tensor> grad_params;
          if (try_scaling_api) {
            auto scaled = torch::autograd::grad({scaler.scale(loss)}, model->parameters(), {},
                                                /*retain_graph=*/true, /*create_graph=*/true);
            const double inv_scale = 1. / scaler.get_scale();
            for (auto& g : scaled) grad_params.push_back(g * inv_scale);
          } else {
            grad_params = torch::autograd::grad({loss}, model->parameters(), {}, true, true);
          }
          auto grad_norm = torch::zeros({});
          for (auto& g : grad_params) grad_norm = grad_norm + g.pow(2).sum();
          loss = loss + grad_norm.sqrt();
          if (try_scaling_api) {
            scaler.scale(loss).backward();
            if (i == c.skip_iter && scaler.is_enabled()) inject_inf(model);
            scaler.step(optimizer);
            scaler.update();
          } else {
            loss.backward();
            if (!scaler.is_enabled() || i != c.skip_iter) optimizer.step();
          }
        }
      },
      3, 1, 1e-5);
}

// test_grad_scaling_multiple: two models, two optimizers, two losses sharing one scaler.
TEST(GradScalerTest, MultipleModelsOptimizersAndLosses) {
  for (bool enabled : {true, false}) {
    SCOPED_TRACE(enabled ? "enabled" : "disabled");
    ScalingCase c0;
    ScalingCase c1;
    const auto& data = c0.data;
    GradScaler scaler(
        GradScalerOptions().init_scale(128.).growth_factor(2.0).enabled(enabled).growth_interval(
            1));
    auto run = [&](torch::nn::Sequential& model0, torch::nn::Sequential& model1,
                   torch::optim::Optimizer& optimizer0, torch::optim::Optimizer& optimizer1,
                   bool try_scaling_api) {
      for (int i = 0; i < static_cast<int>(data.size()); ++i) {
        optimizer0.zero_grad();
        optimizer1.zero_grad();
        auto output0 = model0->forward(data[i].first);
        auto output1 = model1->forward(data[i].first);
        auto loss0 = torch::mse_loss(0.3 * output0 + 0.7 * output1, data[i].second);
        auto loss1 = torch::mse_loss(0.6 * output0 - 0.4 * output1, data[i].second);
        if (try_scaling_api) {
          scaler.scale(loss0).backward({}, /*retain_graph=*/true);
          scaler.scale(loss1).backward();
          if (i == c0.skip_iter && scaler.is_enabled()) inject_inf(model1);
          // As an additional stress test, separately unscale for one of the optimizers.
          scaler.unscale_(optimizer0);
          scaler.step(optimizer0);
          scaler.step(optimizer1);
          scaler.update();
        } else {
          loss0.backward({}, true);
          loss1.backward();
          optimizer0.step();
          if (!scaler.is_enabled() || i != c0.skip_iter) optimizer1.step();
        }
      }
    };
    run(c0.mod_control, c1.mod_control, *c0.opt_control, *c1.opt_control, false);
    run(c0.mod_scaling, c1.mod_scaling, *c0.opt_scaling, *c1.opt_scaling, true);
    EXPECT_EQ(scaler.get_scale(), enabled ? 128. * 8 * 0.5 : 1.0);
    for (auto* pair : {&c0, &c1}) {
      auto control = pair->mod_control->parameters();
      auto scaling = pair->mod_scaling->parameters();
      for (size_t i = 0; i < control.size(); ++i) {
        EXPECT_TRUE(torch::allclose(control[i], scaling[i], 1e-5, 1e-7));
      }
    }
  }
}

// test_grad_scale_will_not_overflow: growth never commits an infinite scale.
TEST(GradScalerTest, ScaleNeverOverflowsToInf) {
  torch::manual_seed(0);
  torch::nn::Linear model(5, 1);
  torch::optim::Adam optimizer(model->parameters());
  GradScaler scaler(GradScalerOptions().growth_interval(1).growth_factor(16).init_scale(1e38));
  optimizer.zero_grad();
  auto x = torch::randn({1, 5});
  auto y = 1e-30 * torch::randn({1, 1});
  auto l = (model->forward(x) - y).pow(2).mean();
  scaler.scale(l).backward();
  scaler.step(optimizer);
  scaler.update();
  EXPECT_TRUE(std::isfinite(scaler.get_scale()));
  EXPECT_FLOAT_EQ(scaler.get_scale(), 1e38f);
}

TEST(GradScalerTest, UnscaleMixedDtypesAndRefusesFp16Grads) {
  GradScaler scaler(GradScalerOptions().init_scale(4.));
  auto a = torch::zeros({3}, torch::requires_grad());
  auto b = torch::zeros({2}, torch::dtype(torch::kBFloat16).requires_grad(true));
  torch::optim::SGD opt({a, b}, 1.0);
  (scaler.scale(a.sum()) + scaler.scale(b.sum().to(torch::kFloat))).backward();
  scaler.unscale_(opt);
  EXPECT_TRUE(torch::equal(a.grad(), torch::ones({3})));
  EXPECT_TRUE(torch::equal(b.grad(), torch::ones({2}, torch::kBFloat16)));

  auto h = torch::zeros({2}, torch::dtype(torch::kHalf).requires_grad(true));
  torch::optim::SGD fp16_opt({h}, 1.0);
  scaler.scale(h.sum().to(torch::kFloat)).backward();
  EXPECT_THAT([&] { scaler.unscale_(fp16_opt); },
              ThrowsMessage<c10::ValueError>(HasSubstr("Attempting to unscale FP16 gradients.")));
}

TEST(GradScalerTest, StageErrorsUsePytorchWording) {
  GradScaler scaler;
  auto p = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD opt({p}, 1.0);
  EXPECT_THAT([&] { scaler.unscale_(opt); },
              ThrowsMessage<c10::Error>(HasSubstr("Attempted unscale_ but _scale is None.")));
  EXPECT_THAT([&] { scaler.update(); },
              ThrowsMessage<c10::Error>(HasSubstr("Attempted update but _scale is None.")));
  scaler.scale(p.sum()).backward();
  EXPECT_THAT([&] { scaler.update(); },
              ThrowsMessage<c10::Error>(HasSubstr("No inf checks were recorded prior to update.")));
  scaler.unscale_(opt);
  EXPECT_THAT(
      [&] { scaler.unscale_(opt); },
      ThrowsMessage<c10::Error>(HasSubstr(
          "unscale_() has already been called on this optimizer since the last update().")));
  scaler.step(opt);
  EXPECT_THAT([&] { scaler.unscale_(opt); },
              ThrowsMessage<c10::Error>(HasSubstr("unscale_() is being called after step().")));
  EXPECT_THAT([&] { scaler.step(opt); },
              ThrowsMessage<c10::Error>(
                  HasSubstr("step() has already been called since the last update().")));
  EXPECT_THAT([&] { scaler.step(opt, [] { return torch::zeros({}); }); },
              ThrowsMessage<c10::Error>(
                  HasSubstr("Closure use is not currently supported if GradScaler is enabled.")));
  scaler.update();
  EXPECT_NO_THROW(scaler.unscale_(opt)) << "update() resets every optimizer to READY";
}

TEST(GradScalerTest, StepWithoutGradsReportsNoInfChecks) {
  GradScaler scaler;
  scaler.scale(torch::ones({}));
  auto p = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD opt({p}, 1.0);
  EXPECT_THAT(
      [&] { scaler.step(opt); },
      ThrowsMessage<c10::Error>(HasSubstr("No inf checks were recorded for this optimizer.")));
}

TEST(GradScalerTest, DisabledScalerPassesThrough) {
  GradScaler scaler(GradScalerOptions().enabled(false));
  auto p = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt({p}, 1.0);
  auto loss = p.sum();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  scaler.scale(loss).backward();
  scaler.unscale_(opt);
  scaler.step(opt);
  scaler.update();
  EXPECT_TRUE(torch::equal(p, torch::zeros({3})));
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(scaler.state_dict().size(), 0u);
  EXPECT_NO_THROW(scaler.step(opt, [] { return torch::zeros({}); }));
}

TEST(GradScalerTest, UpdateWithExplicitScale) {
  GradScaler scaler;
  auto p = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD opt({p}, 1.0);
  scaler.scale(p.sum()).backward();
  scaler.step(opt);
  scaler.update(1024.0);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  scaler.update(torch::full({1}, 8.0));
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_THAT([&] { scaler.update(torch::ones({2})); },
              ThrowsMessage<c10::Error>(HasSubstr("new_scale should be a float or a 1-element")));
  EXPECT_THAT([&] { scaler.update(torch::ones({1}, torch::requires_grad())); },
              ThrowsMessage<c10::Error>(HasSubstr("requires_grad=False")));
}

// test_grad_scaling_state_dict, with lazy and eager initialisation of the target.
TEST(GradScalerTest, StateDictRoundTrip) {
  for (bool lazy_init_scale : {true, false}) {
    GradScaler s0(
        GradScalerOptions().init_scale(3.).growth_factor(4.).backoff_factor(.5).growth_interval(2));
    GradScaler s1(
        GradScalerOptions().init_scale(6.).growth_factor(7.).backoff_factor(.8).growth_interval(1));
    if (lazy_init_scale) s1.scale(torch::full({1}, 4.0));
    const auto state = s0.state_dict();
    EXPECT_EQ(state.size(), 5u);
    for (const char* key :
         {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}) {
      EXPECT_TRUE(state.contains(key)) << key;
    }
    s1.load_state_dict(state);
    EXPECT_EQ(s1.get_scale(), 3.);
    EXPECT_EQ(s1.get_growth_factor(), 4.);
    EXPECT_EQ(s1.get_backoff_factor(), .5);
    EXPECT_EQ(s1.get_growth_interval(), 2);
    EXPECT_EQ(s1.get_growth_tracker(), 0);
  }
}

TEST(GradScalerTest, LoadingEmptyStateDictRaises) {
  GradScaler scaler;
  EXPECT_THAT(
      [&] {
        scaler.load_state_dict(c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
      },
      ThrowsMessage<c10::Error>(HasSubstr("The source state dict is empty, possibly because "
                                          "it was saved from a disabled instance of GradScaler.")));
}

TEST(GradScalerTest, StateSurvivesFileAndArchive) {
  GradScaler scaler(GradScalerOptions().init_scale(256.).growth_interval(3));
  auto p = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD opt({p}, 1.0);
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    scaler.scale(p.sum()).backward();
    scaler.step(opt);
    scaler.update();
  }
  ASSERT_EQ(scaler.get_growth_tracker(), 2);
  const std::string path = ::testing::TempDir() + "mantissa_scaler.pt";
  scaler.save(path);
  GradScaler from_file;
  from_file.load(path);
  EXPECT_EQ(from_file.get_scale(), 256.);
  EXPECT_EQ(from_file.get_growth_tracker(), 2);
  EXPECT_EQ(from_file.get_growth_interval(), 3);

  torch::serialize::OutputArchive out;
  scaler.save(out);
  std::ostringstream buffer;
  out.save_to(buffer);
  torch::serialize::InputArchive in;
  std::istringstream read_back(buffer.str());
  in.load_from(read_back);
  GradScaler from_archive;
  from_archive.load(in);
  EXPECT_EQ(from_archive.get_scale(), 256.);
  EXPECT_EQ(from_archive.get_growth_tracker(), 2);
  std::remove(path.c_str());
}

TEST(GradScalerTest, LoadingAMissingFileNamesIt) {
  GradScaler scaler;
  EXPECT_THAT([&] { scaler.load("/nonexistent/scaler.pt"); },
              ThrowsMessage<c10::Error>(HasSubstr("/nonexistent/scaler.pt")));
}

TEST(GradScalerTest, MoveKeepsState) {
  GradScaler a(GradScalerOptions().init_scale(8.));
  a.scale(torch::ones({}));
  GradScaler b(std::move(a));
  EXPECT_EQ(b.get_scale(), 8.);
  static_assert(!std::is_copy_constructible_v<GradScaler>);
}

// ---- mantissa's extensions -----------------------------------------------------------

// One fp32 parameter; each iteration's gradient is the scale (or inf when asked).
struct Iterate {
  torch::Tensor p = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD opt{std::vector<torch::Tensor>{p}, 1e-3};
  void operator()(GradScaler& scaler, bool inf) {
    opt.zero_grad();
    scaler.scale(p.sum()).backward();
    if (inf) p.mutable_grad()[0].fill_(kInf);
    scaler.step(opt);
    scaler.update();
  }
};

TEST(GradScalerExtensionsTest, HysteresisDelaysBackoff) {
  GradScaler scaler(GradScalerOptions().init_scale(64.).growth_interval(3).hysteresis(2));
  Iterate step;
  step(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 64.) << "first overflow only spends hysteresis";
  step(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 32.);
  step(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 16.) << "hysteresis refills only at a growth";
  for (int i = 0; i < 3; ++i) step(scaler, false);
  EXPECT_EQ(scaler.get_scale(), 32.);
  step(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 32.) << "refilled at the growth";
  EXPECT_EQ(scaler.skipped_steps(), 4);
  EXPECT_EQ(scaler.state_dict().at("_hysteresis_tracker").toInt(), 1);
}

TEST(GradScalerExtensionsTest, ConsecutiveHysteresisRefillsAfterEveryCleanStep) {
  GradScaler scaler(
      GradScalerOptions().init_scale(64.).growth_interval(100).hysteresis(2).consecutive_hysteresis(
          true));
  Iterate step;
  step(scaler, true);
  step(scaler, false);
  step(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 64.);
  step(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 32.);
}

TEST(GradScalerExtensionsTest, MinScaleStopsEndlessOverflow) {
  GradScaler scaler(GradScalerOptions().init_scale(4.).min_scale(1.));
  Iterate step;
  step(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 2.);
  step(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 1.);
  EXPECT_THAT([&] { step(scaler, true); },
              ThrowsMessage<c10::Error>(HasSubstr(
                  "Current loss scale already at minimum - cannot decrease scale anymore.")));
}

TEST(GradScalerExtensionsTest, MinScaleClampsBackoff) {
  GradScaler scaler(GradScalerOptions().init_scale(3.).min_scale(2.));
  Iterate step;
  step(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 2.);
}

TEST(GradScalerExtensionsTest, MaxScaleCapsGrowth) {
  GradScaler scaler(GradScalerOptions().init_scale(4.).growth_interval(1).max_scale(10.));
  Iterate step;
  step(scaler, false);
  EXPECT_EQ(scaler.get_scale(), 8.);
  step(scaler, false);
  EXPECT_EQ(scaler.get_scale(), 10.);
  step(scaler, false);
  EXPECT_EQ(scaler.get_scale(), 10.);
}

TEST(GradScalerExtensionsTest, ExtensionPathEqualsPytorchPathWhenNeutral) {
  // hysteresis 1 and a ceiling above every reachable scale: the device-side update must give
  // the trajectory of ATen's _amp_update_scale_.
  GradScaler plain(GradScalerOptions().init_scale(16.).growth_interval(2));
  GradScaler extended(GradScalerOptions().init_scale(16.).growth_interval(2).max_scale(1e30));
  Iterate a;
  Iterate b;
  const bool pattern[] = {false, false, true, false, true, true, false, false, false, false};
  for (bool inf : pattern) {
    a(plain, inf);
    b(extended, inf);
    EXPECT_EQ(plain.get_scale(), extended.get_scale());
    EXPECT_EQ(plain.get_growth_tracker(), extended.get_growth_tracker());
  }
}

// ---- optimizers that do their own unscaling (SupportsAmpScaling) -----------------------

// SGD on at::_fused_sgd_, which takes grad_scale and found_inf as device tensors: the
// C++ counterpart of Python's torch.optim.SGD(fused=True).
class FusedSgd : public torch::optim::Optimizer, public mantissa::amp::SupportsAmpScaling {
 public:
  FusedSgd(std::vector<torch::Tensor> params, double lr)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<torch::optim::SGDOptions>(lr)),
        lr_(lr) {}
  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> params;
    std::vector<torch::Tensor> grads;
    for (auto& p : param_groups()[0].params()) {
      if (!p.grad().defined()) continue;
      params.push_back(p);
      grads.push_back(p.grad());
    }
    at::_fused_sgd_(params, grads, {}, 0.0, 0.0, lr_, 0.0, false, false, true,
                    grad_scale_.defined() ? std::optional<at::Tensor>(grad_scale_) : std::nullopt,
                    found_inf_.defined() ? std::optional<at::Tensor>(found_inf_) : std::nullopt);
    ++steps_called;
    return {};
  }
  void set_amp_scaling(const at::Tensor& grad_scale, const at::Tensor& found_inf) override {
    grad_scale_ = grad_scale;
    found_inf_ = found_inf;
    saw_grad_scale = grad_scale.defined();
  }
  void clear_amp_scaling() override {
    grad_scale_.reset();
    found_inf_.reset();
  }
  int steps_called = 0;
  bool saw_grad_scale = false;

 private:
  double lr_;
  at::Tensor grad_scale_;
  at::Tensor found_inf_;
};

TEST(GradScalerFusedTest, FusedOptimizerMatchesUnfusedAndSkipsOnInf) {
  for (bool call_unscale : {false, true}) {
    SCOPED_TRACE(call_unscale ? "with unscale_" : "without unscale_");
    torch::manual_seed(0);
    const auto init = torch::randn({5});
    auto fused_p = init.clone().requires_grad_(true);
    auto plain_p = init.clone().requires_grad_(true);
    FusedSgd fused({fused_p}, 0.1);
    torch::optim::SGD plain({plain_p}, 0.1);
    GradScaler fused_scaler(GradScalerOptions().init_scale(1024.).growth_interval(2));
    GradScaler plain_scaler(GradScalerOptions().init_scale(1024.).growth_interval(2));
    const auto target = torch::randn({5});
    for (int i = 0; i < 6; ++i) {
      for (auto [opt, p, scaler] :
           {std::tuple<torch::optim::Optimizer*, torch::Tensor*, GradScaler*>{&fused, &fused_p,
                                                                              &fused_scaler},
            {&plain, &plain_p, &plain_scaler}}) {
        opt->zero_grad();
        scaler->scale((*p - target).pow(2).sum()).backward();
        if (i == 3) p->mutable_grad()[1].fill_(kInf);
        if (call_unscale) scaler->unscale_(*opt);
        scaler->step(*opt);
        scaler->update();
      }
      EXPECT_TRUE(torch::allclose(fused_p, plain_p, 1e-6, 1e-7)) << "iteration " << i;
      EXPECT_EQ(fused_scaler.get_scale(), plain_scaler.get_scale());
    }
    EXPECT_EQ(fused.steps_called, 6)
        << "the fused optimizer decides on the device, so it is always called";
    EXPECT_EQ(fused.saw_grad_scale, !call_unscale);
    EXPECT_EQ(fused_scaler.skipped_steps(), 1);
  }
}

// set_found_inf_reduction: what a sharded run plugs in to combine the ranks' flags. Here the
// "other rank" is simulated: the reduction raises the flag at step 2, although every gradient
// of this process is finite, and the step must be skipped (and the scale backed off) exactly as
// if this process had seen the inf itself; through unscale_ and through a fused step alike.
TEST(GradScalerFusedTest, FoundInfReductionDecidesTheSkip) {
  for (bool call_unscale : {false, true}) {
    SCOPED_TRACE(call_unscale ? "with unscale_" : "without unscale_");
    auto p = torch::ones({4}).requires_grad_(true);
    FusedSgd fused({p}, 0.1);
    GradScaler scaler(GradScalerOptions().init_scale(1024.));
    int calls = 0;
    int step = 0;
    scaler.set_found_inf_reduction([&](at::Tensor& found_inf) {
      ++calls;
      EXPECT_EQ(found_inf.item<float>(), 0.f) << "this process's own gradients are finite";
      if (step == 2) found_inf.fill_(1.f);
    });
    for (step = 0; step < 4; ++step) {
      fused.zero_grad();
      scaler.scale(p.sum()).backward();
      const auto before = p.detach().clone();
      if (call_unscale) scaler.unscale_(fused);
      scaler.step(fused);
      scaler.update();
      EXPECT_EQ(torch::equal(before, p.detach()), step == 2) << "step " << step;
    }
    EXPECT_EQ(calls, 4) << "one flag per step (one device)";
    EXPECT_EQ(scaler.skipped_steps(), 1);
    EXPECT_EQ(scaler.get_scale(), 512.);
  }
}

// A process whose optimizer sees no gradient at all (under fsdp by whole tensors, a rank that
// owns no tensor, or none that had a gradient this step) still takes part in the reduction,
// once per step with a flag of 0, so the collective pairs with the other ranks'; its step is a
// no-op and another rank's inf still skips it and backs the scale off.
TEST(GradScalerTest, FoundInfReductionRunsOnceWithoutGradients) {
  auto p = torch::ones({4}).requires_grad_(true);
  auto elsewhere = torch::ones({2}).requires_grad_(true);  // another process's tensor, say
  torch::optim::SGD sgd({p}, 0.1);
  GradScaler scaler(GradScalerOptions().init_scale(1024.));
  int calls = 0;
  int step = 0;
  scaler.set_found_inf_reduction([&](at::Tensor& found_inf) {
    ++calls;
    EXPECT_EQ(found_inf.item<float>(), 0.f);
    if (step == 1) found_inf.fill_(1.f);
  });
  for (step = 0; step < 3; ++step) {
    sgd.zero_grad();
    scaler.scale(elsewhere.sum()).backward();  // no gradient reaches the optimizer's tensor
    scaler.unscale_(sgd);
    EXPECT_NO_THROW(scaler.step(sgd)) << "step " << step;
    scaler.update();
  }
  EXPECT_EQ(calls, 3) << "one reduction per step";
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(scaler.get_scale(), 512.);
  EXPECT_TRUE(torch::equal(p.detach(), torch::ones({4})));
}

}  // namespace
