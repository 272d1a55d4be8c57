// MasterWeights: fp32 masters for a bf16/fp16 model, with LibTorch's own optimizers.
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>

namespace {

using mantissa::amp::GradScaler;
using mantissa::amp::GradScalerOptions;
using mantissa::amp::MasterWeights;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr float kInf = std::numeric_limits<float>::infinity();

torch::Tensor leaf(torch::Tensor t) { return t.detach().requires_grad_(true); }

// A bf16 model's parameters and an fp32 model's, holding the same (bf16-representable) values.
struct TwinParams {
  std::vector<torch::Tensor> bf16;
  std::vector<torch::Tensor> fp32;
  explicit TwinParams(const std::vector<std::vector<int64_t>>& shapes, double scale = 1.0) {
    for (const auto& shape : shapes) {
      auto values = (torch::randn(shape) * scale).to(torch::kBFloat16);
      bf16.push_back(leaf(values.clone()));
      fp32.push_back(leaf(values.to(torch::kFloat)));
    }
  }
};

TEST(MasterWeightsTest, LowPrecisionParamsGetFp32MastersFp32ParamsAreTheirOwn) {
  auto w = leaf(torch::randn({4, 3}).to(torch::kBFloat16));
  auto h = leaf(torch::randn({5}).to(torch::kHalf));
  auto b = leaf(torch::randn({3}));
  MasterWeights masters({w, h, b});
  ASSERT_EQ(masters.master_params().size(), 3u);
  ASSERT_EQ(masters.model_params().size(), 3u);
  EXPECT_TRUE(masters.has_low_precision());
  for (int i : {0, 1}) {
    const auto& master = masters.master_params()[i];
    EXPECT_EQ(master.scalar_type(), torch::kFloat);
    EXPECT_TRUE(master.is_leaf());
    EXPECT_TRUE(master.requires_grad());
    EXPECT_FALSE(master.is_same(masters.model_params()[i]));
    EXPECT_TRUE(torch::equal(master, masters.model_params()[i].to(torch::kFloat)));
  }
  EXPECT_TRUE(masters.master_params()[2].is_same(b)) << "an fp32 parameter is its own master";
  EXPECT_TRUE(masters.master_of(w).is_same(masters.master_params()[0]));
  EXPECT_EQ(masters.numel(), 12 + 5 + 3);
}

TEST(MasterWeightsTest, Fp32ModelNeedsNoMasters) {
  torch::nn::Linear model(4, 3);
  MasterWeights masters(*model);
  EXPECT_FALSE(masters.has_low_precision());
  EXPECT_EQ(masters.bytes(), 0);
  EXPECT_EQ(masters.bytes_per_parameter(), 0);
  for (size_t i = 0; i < masters.master_params().size(); ++i) {
    EXPECT_TRUE(masters.master_params()[i].is_same(masters.model_params()[i]));
  }
}

TEST(MasterWeightsTest, BytesPerParameterIsMeasuredFromTheTensorsHeld) {
  torch::nn::Linear model(64, 32);
  model->to(torch::kBFloat16);
  MasterWeights masters(*model);
  // 4 bytes of fp32 master + 4 of fp32 master gradient, both allocated up front.
  EXPECT_EQ(masters.bytes(), (64 * 32 + 32) * 8);
  EXPECT_EQ(masters.bytes_per_parameter(), 8);

  // Frozen parameters need no gradient buffer.
  auto frozen = torch::randn({100}).to(torch::kBFloat16);
  MasterWeights frozen_masters({frozen});
  EXPECT_EQ(frozen_masters.bytes_per_parameter(), 4);
}

TEST(MasterWeightsTest, RejectsBadParametersNamingTheIndex) {
  EXPECT_THAT(
      [] {
        MasterWeights({torch::randn({2}), torch::Tensor()});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("model parameter 1 is undefined")));
  EXPECT_THAT([] { MasterWeights({torch::ones({2}, torch::kLong)}); },
              ThrowsMessage<c10::ValueError>(HasSubstr("model parameter 0 has dtype Long")));
  auto w = leaf(torch::randn({2}).to(torch::kBFloat16));
  MasterWeights masters({w});
  EXPECT_THAT(
      [&] {
        masters.masters_for({w, torch::randn({2})});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("tensor 1 is not one of the model parameters")));
  EXPECT_THAT([&] { masters.master_of(torch::randn({2})); },
              ThrowsMessage<c10::ValueError>(HasSubstr("not one of the model parameters")));
}

TEST(MasterWeightsTest, TiedWeightsShareOneMaster) {
  auto w = leaf(torch::randn({6}).to(torch::kBFloat16));
  MasterWeights masters({w, w});
  EXPECT_TRUE(masters.master_params()[0].is_same(masters.master_params()[1]));
  EXPECT_EQ(masters.numel(), 6);
  EXPECT_EQ(masters.bytes_per_parameter(), 8);
}

TEST(MasterWeightsTest, CopyGradsToMastersCastsExactlyAndReusesTheBuffer) {
  auto w = leaf(torch::randn({3, 5}).to(torch::kBFloat16));
  auto u = leaf(torch::randn({2}).to(torch::kBFloat16));
  MasterWeights masters({w, u});
  (w.to(torch::kFloat).pow(2).sum() * 3).backward();
  masters.copy_grads_to_masters();
  const auto& mg = masters.master_params()[0].grad();
  ASSERT_TRUE(mg.defined());
  EXPECT_EQ(mg.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(mg, w.grad().to(torch::kFloat)));
  EXPECT_FALSE(masters.master_params()[1].grad().defined()) << "u got no gradient";
  const void* buffer = mg.data_ptr();

  masters.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(masters.master_params()[0].grad().defined());
  (w.to(torch::kFloat).sum()).backward();
  masters.copy_grads_to_masters();
  EXPECT_EQ(masters.master_params()[0].grad().data_ptr(), buffer) << "no new allocation per step";
  EXPECT_TRUE(torch::equal(masters.master_params()[0].grad(), torch::ones({3, 5})));

  masters.zero_grad(/*set_to_none=*/false);
  EXPECT_TRUE(torch::equal(masters.master_params()[0].grad(), torch::zeros({3, 5})));
  EXPECT_TRUE(torch::equal(w.grad(), torch::zeros({3, 5}, torch::kBFloat16)));
}

TEST(MasterWeightsTest, CopyMastersToModelRoundsToNearest) {
  auto w = leaf(torch::zeros({3}, torch::kBFloat16));
  MasterWeights masters({w});
  {
    torch::NoGradGuard no_grad;
    // 1 + 2^-9 is halfway between two bf16 values: ties to even (1.0); 1 + 3 * 2^-9 rounds up.
    masters.master_params()[0].copy_(
        torch::tensor({1.0f + 0.001953125f, 1.0f + 3 * 0.001953125f, 0.1f}));
  }
  masters.copy_masters_to_model();
  EXPECT_TRUE(torch::equal(w, torch::tensor({1.0f, 1.0078125f, 0.1f}).to(torch::kBFloat16)));
  {
    torch::NoGradGuard no_grad;
    w.fill_(2.0);
  }
  masters.copy_model_to_masters();
  EXPECT_TRUE(torch::equal(masters.master_params()[0], torch::full({3}, 2.0f)));
}

// The plumbing is exact: a bf16 model with fp32 masters and AdamW, fed the same (bf16) gradients
// as an fp32 model with AdamW, follows the fp32 trajectory bit for bit in its masters.
TEST(MasterWeightsTest, MastersFollowTheFp32TrajectoryExactlyForEqualGradients) {
  torch::manual_seed(0);
  TwinParams twin({{16, 8}, {8}, {33}});
  MasterWeights masters(twin.bf16);
  auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
  torch::optim::AdamW with_masters(masters.master_params(), options);
  torch::optim::AdamW fp32(twin.fp32, options);
  for (int step = 0; step < 30; ++step) {
    with_masters.zero_grad();
    fp32.zero_grad();
    for (size_t i = 0; i < twin.bf16.size(); ++i) {
      const auto g = torch::randn_like(twin.fp32[i]).to(torch::kBFloat16);
      twin.bf16[i].mutable_grad() = g;
      twin.fp32[i].mutable_grad() = g.to(torch::kFloat);
    }
    masters.copy_grads_to_masters();
    with_masters.step();
    masters.copy_masters_to_model();
    fp32.step();
  }
  for (size_t i = 0; i < twin.fp32.size(); ++i) {
    EXPECT_TRUE(torch::equal(masters.master_params()[i], twin.fp32[i])) << "tensor " << i;
    EXPECT_TRUE(torch::equal(twin.bf16[i], twin.fp32[i].to(torch::kBFloat16))) << "tensor " << i;
  }
}

// Real training: a bf16 linear regression with fp32 masters stays within bf16 rounding of the
// fp32 run, while updating the bf16 weights in place (no masters) loses the small updates.
TEST(MasterWeightsTest, Bf16TrainingWithMastersTracksFp32AndBeatsPureBf16) {
  torch::manual_seed(1);
  const auto x = torch::randn({256, 32});
  const auto true_w = torch::randn({1, 32});
  const auto y = x.mm(true_w.t());
  TwinParams twin({{1, 32}}, 4.0);
  auto& w32 = twin.fp32[0];
  auto& w16 = twin.bf16[0];
  auto pure = leaf(w16.clone());
  MasterWeights masters({w16});
  const auto options = torch::optim::AdamWOptions(2e-4).weight_decay(0.0);
  torch::optim::AdamW opt32({w32}, options);
  torch::optim::AdamW opt_masters(masters.master_params(), options);
  torch::optim::AdamW opt_pure({pure}, options);
  auto loss_of = [&](const torch::Tensor& w) {
    return torch::mse_loss(x.to(w.scalar_type()).mm(w.t()).to(torch::kFloat), y);
  };
  for (int step = 0; step < 200; ++step) {
    opt32.zero_grad();
    loss_of(w32).backward();
    opt32.step();

    masters.zero_grad();
    loss_of(w16).backward();
    masters.copy_grads_to_masters();
    opt_masters.step();
    masters.copy_masters_to_model();

    opt_pure.zero_grad();
    loss_of(pure).backward();
    opt_pure.step();
  }
  const double err_masters = (masters.master_params()[0] - w32).abs().max().item<double>();
  const double err_pure = (pure.to(torch::kFloat) - w32).abs().max().item<double>();
  const double total_move = 200 * 2e-4;  // AdamW moves each weight by at most ~lr per step
  EXPECT_LT(err_masters, 0.05 * total_move) << "masters drift from fp32 by " << err_masters;
  EXPECT_GT(err_pure, 5 * err_masters) << "pure bf16: " << err_pure << ", masters: " << err_masters;
}

TEST(MasterWeightsTest, SkippedStepChangesNothing) {
  torch::manual_seed(2);
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::Linear(8, 2));
  model->to(torch::kBFloat16);
  MasterWeights masters(*model);
  torch::optim::AdamW optimizer(masters.master_params(), torch::optim::AdamWOptions(1e-2));
  GradScaler scaler(GradScalerOptions().init_scale(1024.));
  const auto x = torch::randn({4, 8}, torch::kBFloat16);
  auto iterate = [&](bool inject_inf) {
    masters.zero_grad();
    optimizer.zero_grad();
    scaler.scale(model->forward(x).to(torch::kFloat).pow(2).mean()).backward();
    if (inject_inf) model->parameters()[1].mutable_grad()[0] = kInf;
    masters.copy_grads_to_masters();
    scaler.unscale_(optimizer);
    torch::nn::utils::clip_grad_norm_(masters.master_params(), 1.0, 2.0,
                                      /*error_if_nonfinite=*/false);
    scaler.step(optimizer);
    masters.copy_masters_to_model();
    scaler.update();
  };
  iterate(false);
  std::vector<torch::Tensor> model_before, masters_before, exp_avg_before;
  for (const auto& p : model->parameters()) model_before.push_back(p.detach().clone());
  for (const auto& m : masters.master_params()) {
    masters_before.push_back(m.detach().clone());
    const auto& state =
        static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(m.unsafeGetTensorImpl()));
    exp_avg_before.push_back(state.exp_avg().clone());
  }
  iterate(true);
  EXPECT_TRUE(scaler.last_step_skipped());
  EXPECT_EQ(scaler.get_scale(), 512.);
  for (size_t i = 0; i < model_before.size(); ++i) {
    EXPECT_TRUE(torch::equal(model->parameters()[i], model_before[i])) << i;
    EXPECT_TRUE(torch::equal(masters.master_params()[i], masters_before[i])) << i;
    const auto& state = static_cast<torch::optim::AdamWParamState&>(
        *optimizer.state().at(masters.master_params()[i].unsafeGetTensorImpl()));
    EXPECT_TRUE(torch::equal(state.exp_avg(), exp_avg_before[i])) << i;
    EXPECT_EQ(state.step(), 1);
  }
  iterate(false);
  EXPECT_FALSE(torch::equal(model->parameters()[0], model_before[0])) << "training resumes";
}

TEST(MasterWeightsTest, Fp16ModelGoesThroughGradScalerWithoutTheFp16Error) {
  // "Attempting to unscale FP16 gradients." is what PyTorch says to a model loaded in fp16;
  // with masters the optimizer only ever sees fp32 gradients.
  torch::manual_seed(3);
  auto w = leaf(torch::randn({4}).to(torch::kHalf));
  MasterWeights masters({w});
  torch::optim::SGD optimizer(masters.master_params(), 0.5);
  GradScaler scaler(GradScalerOptions().init_scale(1024.));
  scaler.scale(w.to(torch::kFloat).sum()).backward();
  masters.copy_grads_to_masters();
  EXPECT_NO_THROW(scaler.unscale_(optimizer));
  scaler.step(optimizer);
  masters.copy_masters_to_model();
  scaler.update();
  EXPECT_TRUE(torch::allclose(masters.master_params()[0].grad(), torch::ones({4})));

  torch::optim::SGD plain({w}, 0.5);
  GradScaler refusing;
  refusing.scale(w.to(torch::kFloat).sum()).backward();
  EXPECT_THAT([&] { refusing.unscale_(plain); },
              ThrowsMessage<c10::ValueError>(HasSubstr("Attempting to unscale FP16 gradients.")));
}

TEST(MasterWeightsTest, ParameterGroupsAndOtherOptimizers) {
  torch::manual_seed(4);
  torch::nn::Linear model(6, 3);
  model->to(torch::kBFloat16);
  MasterWeights masters(*model);
  // HF's two groups: weights decay, biases do not.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(masters.masters_for({model->weight}),
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).weight_decay(0.1)));
  groups.emplace_back(masters.masters_for({model->bias}),
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).weight_decay(0.0)));
  torch::optim::AdamW adamw(groups, torch::optim::AdamWOptions(1e-2));
  torch::optim::Adam adam(masters.master_params(), torch::optim::AdamOptions(1e-2));
  torch::optim::SGD sgd(masters.master_params(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  for (torch::optim::Optimizer* optimizer :
       std::initializer_list<torch::optim::Optimizer*>{&adamw, &adam, &sgd}) {
    const auto before = masters.master_params()[0].detach().clone();
    masters.zero_grad();
    model->forward(torch::randn({5, 6}, torch::kBFloat16)).to(torch::kFloat).sum().backward();
    masters.copy_grads_to_masters();
    optimizer->step();
    masters.copy_masters_to_model();
    EXPECT_FALSE(torch::equal(masters.master_params()[0], before));
    EXPECT_TRUE(torch::equal(model->weight, masters.master_params()[0].to(torch::kBFloat16)));
  }
}

TEST(MasterWeightsTest, SaveLoadRestoresMastersAndModel) {
  torch::manual_seed(5);
  auto w = leaf(torch::randn({3, 4}).to(torch::kBFloat16));
  auto b = leaf(torch::randn({4}));
  MasterWeights masters({w, b});
  {
    torch::NoGradGuard no_grad;
    masters.master_params()[0].add_(1e-4);  // below bf16 resolution: only the master knows
  }
  torch::serialize::OutputArchive out;
  masters.save(out);
  std::ostringstream buffer;
  out.save_to(buffer);

  auto w2 = leaf(torch::zeros({3, 4}, torch::kBFloat16));
  auto b2 = leaf(torch::zeros({4}));
  MasterWeights restored({w2, b2});
  const auto master_impl = restored.master_params()[0].unsafeGetTensorImpl();
  torch::serialize::InputArchive in;
  std::istringstream read_back(buffer.str());
  in.load_from(read_back);
  restored.load(in);
  EXPECT_EQ(restored.master_params()[0].unsafeGetTensorImpl(), master_impl) << "loaded in place";
  EXPECT_TRUE(torch::equal(restored.master_params()[0], masters.master_params()[0]));
  EXPECT_TRUE(torch::equal(w2, masters.master_params()[0].to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(b2, b));

  MasterWeights wrong({leaf(torch::zeros({3, 4}, torch::kBFloat16))});
  std::istringstream again(buffer.str());
  torch::serialize::InputArchive in2;
  in2.load_from(again);
  EXPECT_THAT(
      [&] { wrong.load(in2); },
      ThrowsMessage<c10::ValueError>(HasSubstr("the archive holds 2 masters, this model has 1")));
}

// The bytes of `masters.save(out, params)` (all of them without `params`), read back.
std::string saved_bytes(const MasterWeights& masters, const std::vector<torch::Tensor>* params) {
  torch::serialize::OutputArchive out;
  if (params != nullptr) {
    masters.save(out, *params);
  } else {
    masters.save(out);
  }
  std::ostringstream buffer;
  out.save_to(buffer);
  return buffer.str();
}

void read_into(torch::serialize::InputArchive& in, const std::string& bytes) {
  std::istringstream stream(bytes);
  in.load_from(stream);
}

TEST(MasterWeightsTest, SavesAndLoadsAChosenShare) {
  // A whole model's masters, and the share one process owns (the sharding by whole tensors).
  torch::manual_seed(6);
  auto a = leaf(torch::randn({2, 3}).to(torch::kBFloat16));
  auto b = leaf(torch::randn({4}).to(torch::kBFloat16));
  auto c = leaf(torch::randn({5}));
  MasterWeights whole({a, b, c});
  {
    torch::NoGradGuard no_grad;
    for (auto& m : whole.master_params()) m.add_(1e-4);  // below bf16 resolution
  }
  // The share {c, a} saved as a MasterWeights over exactly those writes it; one loads it whole.
  const std::vector<torch::Tensor> share{c, a};
  auto c2 = leaf(torch::zeros({5}));
  auto a2 = leaf(torch::zeros({2, 3}, torch::kBFloat16));
  MasterWeights owner({c2, a2});
  torch::serialize::InputArchive in;
  read_into(in, saved_bytes(whole, &share));
  owner.load(in);
  EXPECT_TRUE(torch::equal(owner.master_params()[0], whole.master_of(c)));
  EXPECT_TRUE(torch::equal(owner.master_params()[1], whole.master_of(a)));
  EXPECT_TRUE(torch::equal(a2, whole.master_of(a).to(torch::kBFloat16)));

  // One parameter's master out of the whole file, the others neither read nor touched.
  auto b3 = leaf(torch::zeros({4}, torch::kBFloat16));
  auto a3 = leaf(torch::zeros({2, 3}, torch::kBFloat16));
  MasterWeights part({a3, b3});
  const auto all = saved_bytes(whole, nullptr);
  torch::serialize::InputArchive in_all;
  read_into(in_all, all);
  part.load(in_all, {b3}, {1}, 3);
  EXPECT_TRUE(torch::equal(part.master_of(b3), whole.master_of(b)));
  EXPECT_TRUE(torch::equal(b3, whole.master_of(b).to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(part.master_of(a3), torch::zeros({2, 3}))) << "a master was touched";

  // Wrong count, a position past the file, a shape that differs, a tensor it does not hold.
  const auto refused = [&](const std::function<void(torch::serialize::InputArchive&)>& load,
                           const std::string& words) {
    torch::serialize::InputArchive again;
    read_into(again, all);
    EXPECT_THAT([&] { load(again); }, ThrowsMessage<c10::ValueError>(HasSubstr(words)));
  };
  refused([&](auto& arc) { part.load(arc, {b3}, {1}, 4); },
          "the archive holds 3 masters, this model has 4");
  refused([&](auto& arc) { part.load(arc, {b3}, {3}, 3); }, "position 3 of parameter 0");
  refused([&](auto& arc) { part.load(arc, {b3}, {0}, 3); },
          "master 0 has shape [2, 3] in the archive but [4] in the model");
  refused([&](auto& arc) { part.load(arc, {b}, {1}, 3); }, "is not one of the model parameters");
  torch::serialize::OutputArchive out;
  EXPECT_THAT([&] { part.save(out, {c}); },
              ThrowsMessage<c10::ValueError>(HasSubstr("is not one of the model parameters")));
}

TEST(MasterWeightsTest, PureLowPrecisionWarnsOncePerDtype) {
  struct Capture : c10::WarningHandler {
    std::vector<std::string> messages;
    void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  } capture;
  c10::WarningUtils::WarningHandlerGuard guard(&capture);
  const bool first = mantissa::amp::warn_pure_low_precision_once(torch::kBFloat16);
  const bool second = mantissa::amp::warn_pure_low_precision_once(torch::kBFloat16);
  EXPECT_FALSE(second);
  EXPECT_FALSE(mantissa::amp::warn_pure_low_precision_once(torch::kFloat));
  ASSERT_EQ(capture.messages.size(), first ? 1u : 0u);
  if (first) {
    EXPECT_THAT(capture.messages[0], HasSubstr("without fp32 master weights"));
    EXPECT_THAT(capture.messages[0], HasSubstr("rounds away"));
  }
}

}  // namespace
