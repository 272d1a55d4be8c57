// mantissa::nn::linear_cross_entropy against F::cross_entropy(F::linear(...)): loss and
// gradients, in float32 and under bf16 autocast, with ignored rows.
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/autocast.h>
#include <mantissa/nn/linear_cross_entropy.h>

#include "value_error.h"

namespace {

namespace F = torch::nn::functional;

struct Problem {
  torch::Tensor hidden, weight, bias, targets;
};

// [rows, in] hidden, [vocab, in] weight, a bias, targets with every `ignore_every`-th ignored.
Problem make_problem(int64_t rows, int64_t in, int64_t vocab, bool with_bias, int ignore_every) {
  torch::manual_seed(21);
  Problem p;
  p.hidden = torch::randn({rows, in}).requires_grad_(true);
  p.weight = (torch::randn({vocab, in}) * 0.2).requires_grad_(true);
  if (with_bias) p.bias = (torch::randn({vocab}) * 0.1).requires_grad_(true);
  p.targets = torch::randint(vocab, {rows}, torch::kLong);
  if (ignore_every > 0) {
    for (int64_t i = 0; i < rows; i += ignore_every) p.targets[i] = -100;
  }
  return p;
}

struct Result {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
};

// The loss times `grad_scale` backpropagated (a stand-in for a loss scale), and the gradients;
// under autocast to `autocast_dtype` unless it is float32.
Result run(const Problem& p, bool fused, int64_t chunk, c10::ScalarType autocast_dtype,
           double grad_scale = 1.0) {
  for (auto t : {p.hidden, p.weight, p.bias}) {
    if (t.defined() && t.grad().defined()) t.mutable_grad().reset();
  }
  Result r;
  {
    std::optional<mantissa::amp::Autocast> autocast;
    if (autocast_dtype != torch::kFloat) autocast.emplace(c10::kCPU, autocast_dtype);
    r.loss = fused ? mantissa::nn::linear_cross_entropy(p.hidden, p.weight, p.bias, p.targets, -100,
                                                        chunk)
                   : F::cross_entropy(F::linear(p.hidden, p.weight, p.bias), p.targets);
  }
  (r.loss * grad_scale).backward();
  for (auto t : {p.hidden, p.weight, p.bias}) {
    if (t.defined()) r.grads.push_back(t.grad());
  }
  return r;
}

void expect_close(const Result& want, const Result& got, double rtol, double atol) {
  EXPECT_EQ(got.loss.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::allclose(got.loss, want.loss.to(torch::kFloat), rtol, atol))
      << got.loss.item<double>() << " vs " << want.loss.item<double>();
  ASSERT_EQ(want.grads.size(), got.grads.size());
  for (std::size_t i = 0; i < want.grads.size(); ++i) {
    ASSERT_TRUE(got.grads[i].defined()) << "gradient " << i;
    EXPECT_EQ(got.grads[i].scalar_type(), want.grads[i].scalar_type());
    EXPECT_TRUE(torch::allclose(got.grads[i], want.grads[i], rtol, atol))
        << "gradient " << i << ": max |diff| "
        << (got.grads[i] - want.grads[i]).abs().max().item<double>() << ", max |want| "
        << want.grads[i].abs().max().item<double>();
  }
}

TEST(LinearCrossEntropyTest, MatchesTheUnfusedPairInFp32) {
  const auto p = make_problem(50, 24, 155, /*with_bias=*/true, /*ignore_every=*/7);
  const auto want = run(p, false, 0, torch::kFloat);
  for (int64_t chunk : {0, 1, 8, 50, 64}) {
    SCOPED_TRACE("chunk_size " + std::to_string(chunk));
    expect_close(want, run(p, true, chunk, torch::kFloat), 1e-5, 1e-7);
  }
}

TEST(LinearCrossEntropyTest, ScalesItsSavedGradientsByTheLossGradient) {
  const auto p = make_problem(40, 16, 97, /*with_bias=*/false, /*ignore_every=*/0);
  expect_close(run(p, false, 0, torch::kFloat, 1024.0), run(p, true, 16, torch::kFloat, 1024.0),
               1e-5, 1e-5);
}

TEST(LinearCrossEntropyTest, MatchesTheUnfusedPairUnderBf16Autocast) {
  const auto p = make_problem(64, 32, 155, /*with_bias=*/true, /*ignore_every=*/5);
  const auto want = run(p, false, 0, torch::kBFloat16);
  const auto got = run(p, true, 16, torch::kBFloat16);
  // The logits are bf16 in both; the chunks add their weight gradients in float32.
  expect_close(want, got, 2e-2, 2e-3);
  // And both are near the float32 answer only within bf16's precision: the GEMM did run in bf16.
  const auto fp32 = run(p, false, 0, torch::kFloat);
  EXPECT_FALSE(torch::equal(got.grads[1], fp32.grads[1]));
  // The logits are the bf16 ones: the loss is much nearer the pair's than float32's.
  const double to_pair = (got.loss - want.loss.to(torch::kFloat)).abs().item<double>();
  const double fp32_to_pair = (fp32.loss - want.loss.to(torch::kFloat)).abs().item<double>();
  EXPECT_LT(to_pair, 0.1 * fp32_to_pair) << "float32 is " << fp32_to_pair << " from the pair";
}

TEST(LinearCrossEntropyTest, KeepsSmallGradientsUnderFp16AutocastWithALossScale) {
  // 8192 rows over vocab 2048, every target among the first 16 words: the weight gradient of
  // the other words is made only of softmax / rows, about 6e-8, fp16's smallest subnormal. The
  // pair keeps those because the loss scale multiplies them first; the fused loss computes its
  // gradients before it knows the scale, so it must do so in float32 to be as accurate.
  auto p = make_problem(8192, 16, 2048, /*with_bias=*/false, /*ignore_every=*/0);
  p.targets = torch::randint(16, {8192}, torch::kLong);
  const auto exact = run(p, false, 0, torch::kFloat, 65536.0);
  const auto pair = run(p, false, 0, torch::kHalf, 65536.0);
  const auto got = run(p, true, 1024, torch::kHalf, 65536.0);
  EXPECT_TRUE(torch::allclose(got.loss, pair.loss.to(torch::kFloat), 1e-3, 1e-3));
  auto relative_error = [&](const Result& r) {
    const auto untargeted = [](const Result& x) { return x.grads[1].narrow(0, 16, 2048 - 16); };
    return ((untargeted(r) - untargeted(exact)).norm() / untargeted(exact).norm()).item<double>();
  };
  EXPECT_LE(relative_error(got), 2 * relative_error(pair) + 1e-4)
      << "the pair's relative error is " << relative_error(pair);
}

TEST(LinearCrossEntropyTest, KeepsTheLeadingShapeOfHidden) {
  const auto p = make_problem(24, 8, 11, /*with_bias=*/false, /*ignore_every=*/0);
  auto hidden3d = p.hidden.detach().view({2, 12, 8}).requires_grad_(true);
  auto loss = mantissa::nn::linear_cross_entropy(hidden3d, p.weight, {}, p.targets.view({2, 12}));
  loss.backward();
  EXPECT_EQ(hidden3d.grad().sizes(), hidden3d.sizes());
  const auto want = F::cross_entropy(F::linear(p.hidden, p.weight), p.targets);
  EXPECT_TRUE(torch::allclose(loss, want, 1e-5, 1e-7));
}

TEST(LinearCrossEntropyTest, EveryRowIgnoredGivesNanAndZeroGradientsAsPyTorch) {
  auto p = make_problem(6, 8, 11, /*with_bias=*/true, /*ignore_every=*/1);
  const auto want = run(p, false, 0, torch::kFloat);
  const auto got = run(p, true, 2, torch::kFloat);
  EXPECT_TRUE(std::isnan(want.loss.item<double>()));
  EXPECT_TRUE(std::isnan(got.loss.item<double>()));
  for (std::size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(got.grads[i], want.grads[i])) << "gradient " << i;
  }
}

TEST(LinearCrossEntropyTest, WithoutGradItOnlyComputesTheLoss) {
  const auto p = make_problem(10, 8, 13, /*with_bias=*/false, /*ignore_every=*/3);
  torch::NoGradGuard no_grad;
  const auto loss = mantissa::nn::linear_cross_entropy(p.hidden, p.weight, {}, p.targets);
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_TRUE(torch::allclose(loss, F::cross_entropy(F::linear(p.hidden, p.weight), p.targets),
                              1e-5, 1e-7));
}

TEST(LinearCrossEntropyTest, BadShapesNameWhatIsWrong) {
  const auto p = make_problem(10, 8, 13, /*with_bias=*/false, /*ignore_every=*/0);
  const auto error = mantissa_test::value_error_of;
  using ::testing::HasSubstr;
  EXPECT_THAT(
      error([&] { mantissa::nn::linear_cross_entropy(p.hidden, p.weight.t(), {}, p.targets); }),
      HasSubstr("weight must be [vocab, in] with in = 8"));
  EXPECT_THAT(error([&] {
                mantissa::nn::linear_cross_entropy(p.hidden, p.weight, {},
                                                   p.targets.narrow(0, 0, 9));
              }),
              HasSubstr("9 targets for 10 rows of hidden"));
  EXPECT_THAT(error([&] {
                mantissa::nn::linear_cross_entropy(p.hidden, p.weight, {}, p.targets, -100, -1);
              }),
              HasSubstr("chunk_size must be >= 0"));
  EXPECT_THAT(error([&] {
                mantissa::nn::linear_cross_entropy(p.hidden.to(torch::kLong), p.weight, {},
                                                   p.targets);
              }),
              HasSubstr("got Long of shape [10, 8]"));
  EXPECT_THAT(error([&] {
                mantissa::nn::linear_cross_entropy(p.hidden, p.weight, {},
                                                   p.targets.to(torch::kFloat));
              }),
              HasSubstr("integer class indices, got a Float tensor"));
}

}  // namespace
