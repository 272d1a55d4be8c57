// The precision plan: a pure function of the arguments and the model's parameter dtype.
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mantissa/training_arguments.h>

#include "trainer/precision_plan.h"

namespace {

using mantissa::PrecisionPlan;
using mantissa::TrainingArguments;
using mantissa::WeightsMode;
using mantissa::detail::make_precision_plan;
using ::testing::HasSubstr;

TEST(PrecisionPlanTest, Fp32ModelWithoutFlagsTrainsItsOwnWeightsInFp32) {
  const PrecisionPlan plan = make_precision_plan(TrainingArguments(), c10::kFloat);
  EXPECT_EQ(plan.weights, WeightsMode::kModelWeights);
  EXPECT_EQ(plan.compute_dtype, c10::kFloat);
  EXPECT_FALSE(plan.autocast);
  EXPECT_FALSE(plan.loss_scaling);
  EXPECT_EQ(plan.describe(), "fp32 compute, fp32 weights, no loss scaling");
}

TEST(PrecisionPlanTest, Fp32ModelWithBf16IsAutocastOverFp32Weights) {
  const PrecisionPlan plan = make_precision_plan(TrainingArguments().bf16(true), c10::kFloat);
  EXPECT_EQ(plan.weights, WeightsMode::kModelWeights);
  EXPECT_EQ(plan.compute_dtype, c10::kBFloat16);
  EXPECT_TRUE(plan.autocast);
  EXPECT_EQ(plan.describe(), "bf16 autocast, fp32 weights, no loss scaling");
}

TEST(PrecisionPlanTest, MasterWeightsOnCastsAnFp32ModelDownAndKeepsMasters) {
  const PrecisionPlan plan =
      make_precision_plan(TrainingArguments().fp16(true).master_weights("on"), c10::kFloat);
  EXPECT_EQ(plan.weights, WeightsMode::kFp32Masters);
  EXPECT_EQ(plan.param_dtype, c10::kHalf);
  EXPECT_TRUE(plan.loss_scaling);
  EXPECT_FALSE(plan.static_loss_scale.has_value());
  EXPECT_EQ(plan.describe(),
            "fp16 autocast, fp16 weights with fp32 master weights, dynamic loss scaling");
}

TEST(PrecisionPlanTest, Bf16ModelKeepsMastersUnlessTheyAreTurnedOff) {
  EXPECT_EQ(make_precision_plan(TrainingArguments(), c10::kBFloat16).weights,
            WeightsMode::kFp32Masters);
  const PrecisionPlan pure =
      make_precision_plan(TrainingArguments().master_weights("off"), c10::kBFloat16);
  EXPECT_EQ(pure.weights, WeightsMode::kPureLowPrecision);
  EXPECT_THAT(pure.describe(), HasSubstr("pure bf16 weights (no master copy)"));
}

TEST(PrecisionPlanTest, Fp16ModelScalesTheLossAndRefusesPureFp16) {
  const PrecisionPlan plan = make_precision_plan(TrainingArguments().loss_scale(128), c10::kHalf);
  EXPECT_EQ(plan.weights, WeightsMode::kFp32Masters);
  ASSERT_TRUE(plan.static_loss_scale.has_value());
  EXPECT_EQ(*plan.static_loss_scale, 128.0);
  EXPECT_THAT([] { make_precision_plan(TrainingArguments().master_weights("off"), c10::kHalf); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("master_weights=off")));
}

TEST(PrecisionPlanTest, AFlagThatContradictsTheModelDtypeIsRefused) {
  EXPECT_THAT([] { make_precision_plan(TrainingArguments().fp16(true), c10::kBFloat16); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("use --bf16")));
  EXPECT_THAT([] { make_precision_plan(TrainingArguments().bf16(true), c10::kHalf); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("use --fp16")));
}

}  // namespace

namespace {

// TORCH_WARN's messages while it lives.
class Warnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;

 private:
  c10::WarningUtils::WarningHandlerGuard guard_{this};
};

TEST(PrecisionPlanTest, WarnsThatAnUpdateRuleDoesNothingForFp32Weights) {
  const auto args =
      TrainingArguments().optim("adamw_torch_fused").low_precision_update("kahan").bf16(true);
  Warnings fp32_model;
  make_precision_plan(args, c10::kFloat);
  ASSERT_EQ(fp32_model.messages.size(), 1u);
  EXPECT_THAT(fp32_model.messages[0],
              HasSubstr("--low_precision_update kahan has no effect in this run (bf16 autocast, "
                        "fp32 weights"));
}

TEST(PrecisionPlanTest, UpdateRuleForPureBf16WeightsWarnsNothing) {
  Warnings pure_bf16;
  make_precision_plan(TrainingArguments()
                          .optim("adamw_torch_fused")
                          .low_precision_update("kahan")
                          .master_weights("off"),
                      c10::kBFloat16);
  make_precision_plan(TrainingArguments(), c10::kFloat);  // auto: nothing asked, nothing said
  EXPECT_TRUE(pure_bf16.messages.empty());
}

}  // namespace
