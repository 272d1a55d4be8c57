// The Trainer with a pure bf16 model: --low_precision_update picks FusedAdamW's rule, the plan
// says which, a resumed run continues bit for bit under each rule, and a non-finite
// compensation in a checkpoint is refused.
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/optim/fused_adamw.h>
#include <mantissa/trainer.h>

#include "toy_training.h"

namespace {

using mantissa::LowPrecisionUpdateMode;
using mantissa::Trainer;
using mantissa::TrainingArguments;
using mantissa::optim::LowPrecisionUpdate;
using mantissa_test::make_toy_model;
using mantissa_test::toy_args;
using mantissa_test::ToyDataset;
using mantissa_test::ToyMlp;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

ToyMlp bf16_toy_model() {
  auto model = make_toy_model();
  model->to(torch::kBFloat16);
  return model;
}

TrainingArguments pure_bf16_args(const std::string& dir) {
  return toy_args(dir).master_weights("off").learning_rate(1e-3).max_steps(8);
}

std::vector<torch::Tensor> weights_of(const ToyMlp& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i].view(torch::kShort), b[i].view(torch::kShort))) return false;
  }
  return true;
}

LowPrecisionUpdate rule_of(Trainer& trainer) {
  const auto& group = trainer.optimizer().param_groups().front();
  return static_cast<const mantissa::optim::FusedAdamWOptions&>(group.options())
      .low_precision_update();
}

TEST(LowPrecisionTrainerTest, AutoPicksKahanForAPureBf16ModelWithFusedAdamW) {
  Trainer trainer(bf16_toy_model(), pure_bf16_args(mantissa_test::toy_output_dir()),
                  ToyDataset(100));
  EXPECT_EQ(trainer.precision_plan().low_precision_update, LowPrecisionUpdate::kKahan);
  EXPECT_THAT(trainer.precision_plan().describe(),
              HasSubstr("pure bf16 weights (no master copy), kahan updates"));
  EXPECT_EQ(rule_of(trainer), LowPrecisionUpdate::kKahan);
}

TEST(LowPrecisionTrainerTest, TheNamedRuleReachesTheOptimizer) {
  for (const auto mode : {LowPrecisionUpdateMode::kNearest, LowPrecisionUpdateMode::kKahan,
                          LowPrecisionUpdateMode::kStochasticRounding}) {
    SCOPED_TRACE(mantissa::Choice<LowPrecisionUpdateMode>(mode).name());
    Trainer trainer(bf16_toy_model(),
                    pure_bf16_args(mantissa_test::toy_output_dir()).low_precision_update(mode),
                    ToyDataset(100));
    const auto rule = trainer.precision_plan().low_precision_update;
    EXPECT_EQ(static_cast<int>(rule) + 1, static_cast<int>(mode)) << "enums in the same order";
    EXPECT_EQ(rule_of(trainer), rule);
  }
  // An fp32 model (or one with masters) has nothing to compensate.
  Trainer fp32(make_toy_model(),
               toy_args(mantissa_test::toy_output_dir()).low_precision_update("kahan"),
               ToyDataset(100));
  EXPECT_EQ(fp32.precision_plan().low_precision_update, LowPrecisionUpdate::kNearest);
}

TEST(LowPrecisionTrainerTest, CompensatedRulesTrainDifferentWeightsThanNearest) {
  std::vector<std::vector<torch::Tensor>> results;
  for (const char* rule : {"nearest", "kahan", "stochastic_rounding"}) {
    auto model = bf16_toy_model();
    Trainer(model, pure_bf16_args(mantissa_test::toy_output_dir()).low_precision_update(rule),
            ToyDataset(100))
        .train();
    results.push_back(weights_of(model));
  }
  EXPECT_FALSE(same_bits(results[0], results[1])) << "kahan ran as nearest";
  EXPECT_FALSE(same_bits(results[0], results[2])) << "stochastic_rounding ran as nearest";
  EXPECT_FALSE(same_bits(results[1], results[2]));
}

TEST(LowPrecisionTrainerTest, ResumedRunContinuesBitForBitUnderEachRule) {
  for (const char* rule : {"kahan", "stochastic_rounding"}) {
    SCOPED_TRACE(rule);
    // One run of 8 steps that saves checkpoint-4 on the way, then a second that resumes there.
    const auto dir = mantissa_test::toy_output_dir();
    const auto args =
        pure_bf16_args(dir).low_precision_update(rule).save_strategy("steps").save_steps(4);
    auto straight = bf16_toy_model();
    Trainer(straight, args, ToyDataset(100)).train();

    auto resumed = bf16_toy_model();
    Trainer(resumed, TrainingArguments(args).output_dir(mantissa_test::toy_output_dir()),
            ToyDataset(100))
        .train(dir + "/checkpoint-4");
    EXPECT_TRUE(same_bits(weights_of(straight), weights_of(resumed)));
  }
}

TEST(LowPrecisionTrainerTest, ANonFiniteKahanCompensationIsRefusedOnResume) {
  const auto dir = mantissa_test::toy_output_dir();
  const auto args = pure_bf16_args(dir)
                        .low_precision_update("kahan")
                        .max_steps(4)
                        .save_strategy("steps")
                        .save_steps(4);
  Trainer trainer(bf16_toy_model(), args, ToyDataset(100));
  trainer.train();
  // The saved optimizer state with one compensation entry made NaN, written over optimizer.pt.
  auto& optimizer = trainer.optimizer();
  const auto& first = optimizer.param_groups().front().params().front();
  auto& state = static_cast<mantissa::optim::FusedAdamWParamState&>(
      *optimizer.state().at(first.unsafeGetTensorImpl()));
  ASSERT_TRUE(state.kahan_comp().defined());
  state.kahan_comp().view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  archive.save_to(dir + "/checkpoint-4/optimizer.pt");

  Trainer resumed(bf16_toy_model(),
                  TrainingArguments(args).output_dir(mantissa_test::toy_output_dir()),
                  ToyDataset(100));
  EXPECT_THAT([&] { resumed.train(dir + "/checkpoint-4"); },
              ThrowsMessage<c10::ValueError>(AllOf(
                  HasSubstr("optimizer.pt"), HasSubstr("the state 'kahan_comp' of parameter 0"),
                  HasSubstr("holds NaN or infinite values: 1 of its"))));
}

TEST(LowPrecisionTrainerTest, CompensatedRulesNeedFusedAdamW) {
  EXPECT_THAT([] { TrainingArguments().optim("sgd").low_precision_update("kahan").validate(); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  HasSubstr("low_precision_update kahan is not a rule optim sgd has")));
  EXPECT_NO_THROW(TrainingArguments().optim("sgd").low_precision_update("nearest").validate());
  // auto falls back to nearest for an optimizer without compensated rules.
  Trainer trainer(bf16_toy_model(),
                  pure_bf16_args(mantissa_test::toy_output_dir()).optim("adamw_torch"),
                  ToyDataset(100));
  EXPECT_EQ(trainer.precision_plan().low_precision_update, LowPrecisionUpdate::kNearest);
}

}  // namespace
