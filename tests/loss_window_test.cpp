// The training-loss window without training: averages, the nan/inf filter, the streak.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include <torch/torch.h>

#include "trainer/loss_window.h"

namespace {

using mantissa::detail::LossWindow;

torch::Tensor loss(float value) { return torch::tensor(value); }

TEST(LossWindowTest, MeanPerUpdateAndRunTotal) {
  LossWindow window(c10::kCPU, /*nan_inf_filter=*/true);
  window.start(0);
  window.add(loss(1.0f), 0);
  window.add(loss(3.0f), 1);
  EXPECT_DOUBLE_EQ(window.close(2), 2.0);
  EXPECT_EQ(window.start_step(), 2);
  window.add(loss(5.0f), 2);
  EXPECT_DOUBLE_EQ(window.run_total(), 9.0);
  EXPECT_DOUBLE_EQ(window.close(2), 0.0);  // an empty window
}

TEST(LossWindowTest, NonFiniteLossIsReplacedByTheWindowAverage) {
  for (const bool on_device : {false, true}) {
    LossWindow window(c10::kCPU, /*nan_inf_filter=*/true);
    if (on_device) window.count_updates_on_device();
    window.start(4);  // a resumed run: the window opens at step 4
    window.add(loss(2.0f), 4);
    window.count_update();
    window.add(loss(4.0f), 5);
    window.count_update();
    window.add(loss(std::numeric_limits<float>::quiet_NaN()), 6);  // counts as (2 + 4) / 3
    window.count_update();
    EXPECT_DOUBLE_EQ(window.close(7), 8.0 / 3.0) << "on_device=" << on_device;
  }
}

TEST(LossWindowTest, WithoutTheFilterNonFiniteLossesAreKept) {
  LossWindow window(c10::kCPU, /*nan_inf_filter=*/false);
  window.start(0);
  window.add(loss(1.0f), 0);
  window.add(loss(std::numeric_limits<float>::infinity()), 1);
  EXPECT_TRUE(std::isinf(window.close(2)));
}

TEST(LossWindowTest, ConsecutiveNonFiniteLossesStopTheRun) {
  LossWindow window(c10::kCPU, /*nan_inf_filter=*/true);
  window.start(0);
  const auto nan = std::numeric_limits<float>::quiet_NaN();
  window.add(loss(nan), 0);
  window.add(loss(nan), 1);
  EXPECT_NO_THROW(window.check_nonfinite(3));
  EXPECT_NO_THROW(window.check_nonfinite(0));  // 0: never
  window.add(loss(nan), 2);
  EXPECT_THAT([&] { window.check_nonfinite(3); },
              ::testing::ThrowsMessage<c10::Error>(
                  ::testing::HasSubstr("the loss was not finite for 3 micro-batches in a row")));
  window.add(loss(1.0f), 3);  // a finite loss resets the streak
  EXPECT_NO_THROW(window.check_nonfinite(3));
}

}  // namespace
