// mantissa::set_seed, HF's transformers.set_seed.
#include <cstdlib>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/seed.h>

namespace {

TEST(SetSeedTest, TheSameSeedGivesTheSameWeightsAndDraws) {
  mantissa::set_seed(123);
  const torch::nn::Linear first(8, 4);
  const int first_rand = std::rand();
  mantissa::set_seed(123);
  const torch::nn::Linear second(8, 4);
  const int second_rand = std::rand();
  EXPECT_TRUE(torch::equal(first->weight, second->weight));
  EXPECT_EQ(first_rand, second_rand);
  mantissa::set_seed(124);
  EXPECT_FALSE(torch::equal(first->weight, torch::nn::Linear(8, 4)->weight));
}

TEST(SetSeedTest, DeterministicTurnsOnDeterministicAlgorithms) {
  auto& context = at::globalContext();
  const bool before = context.deterministicAlgorithms();
  mantissa::set_seed(1, /*deterministic=*/true);
  EXPECT_TRUE(context.deterministicAlgorithms());
  context.setDeterministicAlgorithms(before, /*warn_only=*/false);
}

}  // namespace
