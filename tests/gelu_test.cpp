// mantissa::nn::gelu against at::gelu and its backward: the tanh form bit for bit in float32,
// bfloat16 and float16, on one, two and three threads, at sizes with and without scalar tails; the
// pure functions that decide where ATen's kernels run scalar code; fallbacks and errors.
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/nn/gelu.h>

#include "nn/gelu_kernels.h"
#include "value_error.h"

namespace {

using mantissa::nn::detail::parallel_for_ranges;
using mantissa::nn::detail::Ranges;
using mantissa::nn::detail::scalar_tails;

TEST(GeluRangesTest, OneRangeWhenSmallOrSingleThreaded) {
  EXPECT_EQ(parallel_for_ranges(100, 32768, 2), (Ranges{{0, 100}}));
  EXPECT_EQ(parallel_for_ranges(32768, 32768, 2), (Ranges{{0, 32768}}));
  EXPECT_EQ(parallel_for_ranges(1000000, 32768, 1), (Ranges{{0, 1000000}}));
  EXPECT_TRUE(parallel_for_ranges(0, 32768, 2).empty());
}

TEST(GeluRangesTest, SplitsLikeAtParallelFor) {
  EXPECT_EQ(parallel_for_ranges(70000, 32768, 2), (Ranges{{0, 35000}, {35000, 70000}}));
  // ceil(70000 / 32768) = 3 tasks of ceil(70000 / 3) = 23334 elements.
  EXPECT_EQ(parallel_for_ranges(70000, 32768, 4),
            (Ranges{{0, 23334}, {23334, 46668}, {46668, 70000}}));
  // ATen's forward grain (numel / threads): two halves, the last one shorter when odd.
  EXPECT_EQ(parallel_for_ranges(20001, 10000, 2), (Ranges{{0, 10001}, {10001, 20001}}));
}

TEST(GeluRangesTest, ScalarTailsArePastTheLastWholeBlock) {
  EXPECT_EQ(scalar_tails(Ranges{{0, 23334}, {23334, 46668}}, 64),
            (Ranges{{23296, 23334}, {46630, 46668}}));
  EXPECT_TRUE(scalar_tails(Ranges{{0, 128}, {128, 256}}, 64).empty());
  EXPECT_EQ(scalar_tails(Ranges{{0, 10}}, 64), (Ranges{{0, 10}}));
}

TEST(GeluRangesTest, ForwardGrainIsAtensChoice) {
  EXPECT_EQ(mantissa::nn::detail::aten_gelu_forward_grain(16384, 2), 32768);
  EXPECT_EQ(mantissa::nn::detail::aten_gelu_forward_grain(16385, 2), 8192);
  EXPECT_EQ(mantissa::nn::detail::aten_gelu_forward_grain(3000000, 1), 3000000);
}

// Sets ATen's intra-op thread count for one scope.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : previous_(at::get_num_threads()) {
    at::set_num_threads(threads);
  }
  ~ThreadCount() { at::set_num_threads(previous_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int previous_;
};

std::string dtype_name(const testing::TestParamInfo<torch::ScalarType>& info) {
  return c10::toString(info.param);
}

class GeluBitwiseTest : public testing::TestWithParam<torch::ScalarType> {};

// Output and input gradient of mantissa::nn::gelu and of at::gelu on the same values.
void expect_same_bits(int64_t numel, int threads, torch::ScalarType dtype) {
  SCOPED_TRACE("numel " + std::to_string(numel) + ", " + std::to_string(threads) + " threads");
  ThreadCount scope(threads);
  torch::manual_seed(numel + threads);
  // Wide enough for tanh to saturate at both ends.
  const auto values = (torch::randn({numel}) * 3).to(dtype);
  const auto grad_output = torch::randn({numel}).to(dtype);

  const auto ours_input = values.clone().requires_grad_(true);
  const auto ours = mantissa::nn::gelu(ours_input, "tanh");
  ASSERT_NE(ours.grad_fn(), nullptr);
  EXPECT_THAT(ours.grad_fn()->name(), testing::HasSubstr("GeluFunction"));
  ours.backward(grad_output);

  const auto aten_input = values.clone().requires_grad_(true);
  const auto aten = at::gelu(aten_input, "tanh");
  aten.backward(grad_output);

  ASSERT_EQ(ours.scalar_type(), dtype);
  ASSERT_EQ(ours_input.grad().scalar_type(), dtype);
  EXPECT_TRUE(torch::equal(ours, aten))
      << "largest difference "
      << (ours.to(torch::kFloat) - aten.to(torch::kFloat)).abs().max().item<float>();
  EXPECT_TRUE(torch::equal(ours_input.grad(), aten_input.grad()))
      << "largest difference "
      << (ours_input.grad().to(torch::kFloat) - aten_input.grad().to(torch::kFloat))
             .abs()
             .max()
             .item<float>();
}

TEST_P(GeluBitwiseTest, MatchesAtenBitForBit) {
  // 1 and 63: all tail; 4096: whole blocks; 20001: ATen's forward splits it over two threads
  // and its backward does not; 70001: both split, with scalar tails inside; 3 x 2^20: the MLP of
  // char_gpt `small`.
  for (const int64_t numel : {1, 63, 4096, 20001, 70001, 3 << 20}) {
    for (const int threads : {1, 2, 3}) expect_same_bits(numel, threads, GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GeluBitwiseTest,
                         testing::Values(torch::kFloat, torch::kBFloat16, torch::kHalf),
                         dtype_name);

TEST(GeluTest, KeepsTheShapeOfTheInput) {
  const auto input = torch::randn({2, 3, 5}, torch::requires_grad());
  const auto output = mantissa::nn::gelu(input, "tanh");
  EXPECT_EQ(output.sizes(), input.sizes());
  output.sum().backward();
  EXPECT_EQ(input.grad().sizes(), input.sizes());
  EXPECT_TRUE(torch::equal(output, at::gelu(input, "tanh")));
}

TEST(GeluTest, TheExactFormIsAtenGelu) {
  const auto input = torch::randn({100}, torch::requires_grad());
  const auto output = mantissa::nn::gelu(input);
  EXPECT_THAT(output.grad_fn()->name(), testing::HasSubstr("GeluBackward"));
  EXPECT_TRUE(torch::equal(output, at::gelu(input)));
}

TEST(GeluTest, WithoutGradientsItIsAtenGelu) {
  const auto input = torch::randn({100});
  const auto output = mantissa::nn::gelu(input, "tanh");
  EXPECT_EQ(output.grad_fn(), nullptr);
  EXPECT_TRUE(torch::equal(output, at::gelu(input, "tanh")));

  const auto leaf = torch::randn({100}, torch::requires_grad());
  torch::NoGradGuard no_grad;
  EXPECT_EQ(mantissa::nn::gelu(leaf, "tanh").grad_fn(), nullptr);
}

TEST(GeluTest, StridedAndDoubleInputsFallBackToAten) {
  const auto base = torch::randn({40, 30}, torch::requires_grad());
  const auto transposed = base.t();
  const auto output = mantissa::nn::gelu(transposed, "tanh");
  EXPECT_THAT(output.grad_fn()->name(), testing::Not(testing::HasSubstr("GeluFunction")));
  EXPECT_TRUE(torch::equal(output, at::gelu(transposed, "tanh")));

  const auto wide = torch::randn({100}, torch::dtype(torch::kDouble).requires_grad(true));
  const auto wide_output = mantissa::nn::gelu(wide, "tanh");
  EXPECT_EQ(wide_output.scalar_type(), torch::kDouble);
  EXPECT_TRUE(torch::equal(wide_output, at::gelu(wide, "tanh")));
}

TEST(GeluTest, GradientFlowsToEarlierLayers) {
  torch::manual_seed(3);
  const auto weight = torch::randn({16, 8}, torch::requires_grad());
  const auto input = torch::randn({4, 16});
  mantissa::nn::gelu(at::matmul(input, weight), "tanh").pow(2).sum().backward();
  const auto ours = weight.grad().clone();
  weight.mutable_grad().reset();
  at::gelu(at::matmul(input, weight), "tanh").pow(2).sum().backward();
  EXPECT_TRUE(torch::equal(ours, weight.grad()));
}

TEST(GeluTest, AViewWithAnOffsetAndAStridedGradient) {
  torch::manual_seed(4);
  const auto base = torch::randn({3, 1000}) * 3;
  // Row 1 of `base`: contiguous, 1000 elements in.
  const auto ours_input = base.clone().requires_grad_(true);
  const auto aten_input = base.clone().requires_grad_(true);
  const auto ours = mantissa::nn::gelu(ours_input[1], "tanh");
  const auto aten = at::gelu(aten_input[1], "tanh");
  EXPECT_THAT(ours.grad_fn()->name(), testing::HasSubstr("GeluFunction"));
  EXPECT_TRUE(torch::equal(ours, aten));
  // A gradient that is a strided view: ATen's backward then runs its scalar code (the C
  // library's tanhf) where ours used the vector derivative (SLEEF's tanh), so the two agree to
  // rounding, not bit for bit (seen here: 1.4e-6 on 1.36, 9 ulp, from 1 - tanh^2).
  const auto grad = torch::randn({1000, 2}).select(1, 0);
  ours.backward(grad);
  aten.backward(grad);
  EXPECT_TRUE(torch::allclose(ours_input.grad(), aten_input.grad(), /*rtol=*/1e-5, /*atol=*/1e-6));
  EXPECT_TRUE(torch::equal(ours_input.grad()[0], torch::zeros({1000})));
}

TEST(GeluTest, TheDerivativeIsFreedByTheBackward) {
  const auto input = torch::randn({256}, torch::requires_grad());
  const auto output = mantissa::nn::gelu(input, "tanh").sum();
  output.backward();
  // Like any node whose saved tensors were released: a second backward needs retain_graph.
  EXPECT_THROW(output.backward(), c10::Error);
}

TEST(GeluTest, RejectsAnUnknownApproximation) {
  const auto input = torch::randn({4}, torch::requires_grad());
  EXPECT_THAT(mantissa_test::value_error_of([&] { mantissa::nn::gelu(input, "sigmoid"); }),
              testing::HasSubstr("\"sigmoid\""));
}

TEST(GeluTest, DoubleBackwardSaysWhatToUseInstead) {
  const auto input = torch::randn({8}, torch::requires_grad());
  const auto output = mantissa::nn::gelu(input, "tanh").sum();
  try {
    torch::autograd::grad({output}, {input}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "expected c10::NotImplementedError";
  } catch (const c10::NotImplementedError& e) {
    EXPECT_THAT(e.what_without_backtrace(), testing::HasSubstr("at::gelu"));
  }
}

}  // namespace
