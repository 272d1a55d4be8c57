// FusedAdamW's low-precision rules applied to another optimizer's fp32 result
// (src/optim/low_precision_write.h): Kahan keeps what rounding loses, stochastic rounding is
// right on average and a pure function of its key, nearest is a cast.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "optim/low_precision_write.h"

namespace {

using mantissa::optim::LowPrecisionUpdate;
using mantissa::optim::detail::RoundingKey;
using mantissa::optim::detail::write_low_precision_;

// 1 + 1e-3 is below half a bf16 unit at 1 (2^-8 / 2): nearest rounding never moves.
constexpr double kStep = 1e-3;

TEST(LowPrecisionWriteTest, NearestLosesSmallUpdatesAndKahanKeepsThem) {
  at::Tensor no_comp;  // nearest and stochastic rounding keep none
  auto nearest = torch::ones({64}, torch::kBFloat16);
  auto kahan = torch::ones({64}, torch::kBFloat16);
  auto comp = torch::zeros({64}, torch::kBFloat16);
  for (int step = 1; step <= 40; ++step) {
    write_low_precision_(nearest, nearest.to(torch::kFloat) + kStep, LowPrecisionUpdate::kNearest,
                         no_comp, {}, "test");
    write_low_precision_(kahan, kahan.to(torch::kFloat) + kStep, LowPrecisionUpdate::kKahan, comp,
                         {}, "test");
  }
  EXPECT_TRUE(torch::equal(nearest, torch::ones({64}, torch::kBFloat16)));
  // The weight plus its compensation is the sum of the 40 updates, to the compensation's
  // rounding; the weight alone is within one bf16 unit of it.
  const auto total = kahan.to(torch::kDouble) + comp.to(torch::kDouble);
  EXPECT_NEAR(total.max().item<double>(), 1.0 + 40 * kStep, 2e-4);
  EXPECT_NEAR(kahan.to(torch::kDouble).max().item<double>(), 1.0 + 40 * kStep, 1.0 / 128);
  EXPECT_GT(kahan.to(torch::kDouble).min().item<double>(), 1.0);
}

TEST(LowPrecisionWriteTest, StochasticRoundingIsRightOnAverageAndAFunctionOfItsKey) {
  const std::int64_t n = 1 << 18;
  const auto target = torch::full({n}, 1.0 + kStep, torch::kFloat);
  at::Tensor no_comp;
  auto write = [&](RoundingKey key) {
    auto p = torch::ones({n}, torch::kBFloat16);
    write_low_precision_(p, target, LowPrecisionUpdate::kStochasticRounding, no_comp, key, "test");
    return p;
  };
  const auto a = write({7, 3, 11});
  // Each element is one of the two neighbours of 1.001, and their mean is 1.001.
  const auto up = a.to(torch::kDouble).gt(1.0);
  EXPECT_TRUE(torch::logical_or(up, a.to(torch::kDouble).eq(1.0)).all().item<bool>());
  EXPECT_NEAR(a.to(torch::kDouble).mean().item<double>(), 1.0 + kStep, 5e-5);
  EXPECT_TRUE(torch::equal(a, write({7, 3, 11}))) << "the same key draws the same bits";
  for (const RoundingKey other :
       {RoundingKey{8, 3, 11}, RoundingKey{7, 4, 11}, RoundingKey{7, 3, 12}}) {
    EXPECT_FALSE(torch::equal(a, write(other)));
  }
  // A non-contiguous parameter gets the same values as a contiguous one.
  auto strided = torch::ones({n, 2}, torch::kBFloat16).select(1, 0);
  write_low_precision_(strided, target, LowPrecisionUpdate::kStochasticRounding, no_comp, {7, 3, 11},
                       "test");
  EXPECT_TRUE(torch::equal(strided, a));
}

TEST(LowPrecisionWriteTest, Float16TakesTheSameRules) {
  auto p = torch::ones({8}, torch::kHalf);
  at::Tensor comp;  // made by the first Kahan write, as an optimizer's state starts
  // Half a float16 unit at 1 is 2^-11: 1e-4 is lost to nearest rounding, kept by Kahan.
  for (int step = 0; step < 20; ++step) {
    write_low_precision_(p, p.to(torch::kFloat) + 1e-4, LowPrecisionUpdate::kKahan, comp, {},
                         "test");
  }
  ASSERT_TRUE(comp.defined());
  EXPECT_EQ(comp.scalar_type(), torch::kHalf);
  EXPECT_EQ(comp.sizes(), p.sizes());
  EXPECT_NEAR((p.to(torch::kDouble) + comp.to(torch::kDouble)).max().item<double>(), 1.002, 2e-5);
}

}  // namespace
