// The line a run prints after its first update: the bytes of optimizer state, counted from
// the tensors, and what fp32 masters add.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/optim/adafactor.h>
#include <mantissa/trainer.h>

#include "toy_training.h"
#include "trainer/optimizer_state_report.h"

namespace {

using ::testing::HasSubstr;

// The toy MLP: fc1 [16, 8] + [16], fc2 [4, 16] + [4]: 212 parameters.
constexpr std::int64_t kToyParameters = 16 * 8 + 16 + 4 * 16 + 4;

void one_step(torch::optim::Optimizer& optimizer, mantissa_test::ToyMlp& model) {
  optimizer.zero_grad();
  model->forward(torch::randn({4, 8})).square().mean().backward();
  optimizer.step();
}

TEST(OptimizerStateReportTest, CountsTheStateTensorsTheRegistryLists) {
  auto model = mantissa_test::make_toy_model();
  torch::optim::AdamW adamw(model->parameters());
  auto before = mantissa::detail::measure_optimizer_state(adamw, nullptr);
  ASSERT_TRUE(before.has_value());
  EXPECT_EQ(before->optimizer, "adamw_torch");
  EXPECT_EQ(before->parameters, kToyParameters);
  EXPECT_EQ(before->state_bytes, 0) << "no state before the first step";
  one_step(adamw, model);
  const auto adamw_size = mantissa::detail::measure_optimizer_state(adamw, nullptr);
  EXPECT_EQ(adamw_size->state_bytes, kToyParameters * 8) << "exp_avg and exp_avg_sq in fp32";
  EXPECT_EQ(mantissa::detail::describe_optimizer_state_size(*adamw_size),
            "mantissa: optimizer adamw_torch holds 1.7 KiB of state (8.00 bytes per parameter, "
            "212 parameters)");

  // Adafactor keeps a row and a column per matrix and a full second moment per vector.
  mantissa::optim::Adafactor adafactor(model->parameters());
  one_step(adafactor, model);
  const auto factored = mantissa::detail::measure_optimizer_state(adafactor, nullptr);
  ASSERT_TRUE(factored.has_value());
  EXPECT_EQ(factored->optimizer, "adafactor");
  EXPECT_EQ(factored->state_bytes, 4 * ((16 + 8) + 16 + (4 + 16) + 4));

  // A class the registry does not know gets no line.
  struct Unlisted : torch::optim::SGD {
    using torch::optim::SGD::SGD;
  } unlisted(model->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_FALSE(mantissa::detail::measure_optimizer_state(unlisted, nullptr).has_value());
}

TEST(OptimizerStateReportTest, MastersBesideLowPrecisionWeightsAreCountedApart) {
  auto model = mantissa_test::make_toy_model();
  model->to(torch::kBFloat16);
  mantissa::amp::MasterWeights masters(model->parameters());
  mantissa::detail::OptimizerStateSize size;
  size.optimizer = "adamw_torch_fused";
  size.parameters = kToyParameters;
  size.state_bytes = kToyParameters * 8;
  const auto measured = mantissa::detail::measure_optimizer_state(
      torch::optim::AdamW(masters.master_params()), &masters);
  EXPECT_EQ(measured->master_bytes, kToyParameters * 4);
  size.master_bytes = measured->master_bytes;
  EXPECT_THAT(mantissa::detail::describe_optimizer_state_size(size),
              HasSubstr("8.00 bytes per parameter, 212 parameters); fp32 masters 848 bytes more"));
  EXPECT_EQ(mantissa::detail::bytes_text(640), "640 bytes");
  EXPECT_EQ(mantissa::detail::bytes_text(12 * 1024), "12.0 KiB");
  EXPECT_EQ(mantissa::detail::bytes_text(3 * 1024 * 1024 / 2), "1.50 MiB");
}

TEST(OptimizerStateReportTest, ATrainingRunPrintsTheLineOnceAfterItsFirstUpdate) {
  const auto dir = mantissa_test::toy_output_dir();
  ::testing::internal::CaptureStdout();
  mantissa::Trainer trainer(mantissa_test::make_toy_model(),
                            mantissa_test::toy_args(dir).max_steps(3).optim("adamw_torch"),
                            mantissa_test::ToyDataset(100));
  trainer.train();
  const auto out = ::testing::internal::GetCapturedStdout();
  const std::string line =
      "mantissa: optimizer adamw_torch holds 1.7 KiB of state (8.00 bytes per parameter";
  EXPECT_THAT(out, HasSubstr(line));
  EXPECT_EQ(out.find(line), out.rfind(line)) << "printed once: " << out;
}

}  // namespace
