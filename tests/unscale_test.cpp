// Ports test_torch.py's test_grad_scaling_unscale cases onto mantissa's
// non_finite_check_and_unscale_, and checks the fallback against ATen bit for bit.
#include <limits>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/unscale.h>

namespace {

using mantissa::amp::non_finite_check_and_unscale_;
using mantissa::amp::detail::non_finite_check_and_unscale_fallback_;
using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

struct Case {
  std::vector<torch::Tensor> grads;
  bool has_inf;
};

std::vector<Case> pytorch_cases(torch::Dtype dtype) {
  const auto g = torch::full({20, 20}, 4.0, torch::dtype(dtype));
  auto ginf = g.clone();
  ginf[2][2].fill_(kInf);
  auto gnan = g.clone();
  gnan[2][2].fill_(kNan);
  using torch::indexing::Slice;
  return {
      {{g.clone(), g.clone()}, false},
      {{g.clone(), g.clone().t()}, false},
      {{g.clone(), g.clone().index({Slice(), Slice(0, 5)})}, false},
      {{g.clone().index({Slice(), Slice(0, 5)}), g.clone().index({Slice(), Slice(0, 5)})}, false},
      {{g.clone(), ginf.clone()}, true},
      {{g.clone(), gnan.clone()}, true},
      {{g.clone(), ginf.clone().index({Slice(), Slice(0, 5)})}, true},
      {{g.clone(), gnan.clone().index({Slice(), Slice(0, 5)})}, true},
      {{ginf.clone(), g.clone().index({Slice(), Slice(0, 5)})}, true},
      {{ginf.clone().t(), g.clone()}, true},
  };
}

class UnscaleTest : public ::testing::TestWithParam<torch::Dtype> {};

TEST_P(UnscaleTest, UnscalesAndDetectsInfNanLikePytorch) {
  const auto inv_scale = torch::full({1}, 0.25, torch::kFloat);
  auto found_inf = torch::full({1}, 0.0, torch::kFloat);
  for (auto& [grads, has_inf] : pytorch_cases(GetParam())) {
    found_inf.zero_();
    non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    if (has_inf) {
      EXPECT_EQ(found_inf.item<float>(), 1.0f);
    } else {
      EXPECT_EQ(found_inf.item<float>(), 0.0f);
      for (const auto& grad : grads) EXPECT_TRUE(torch::equal(grad, torch::ones_like(grad)));
    }
  }
}

TEST_P(UnscaleTest, FallbackMatchesAtenBitForBit) {
  torch::manual_seed(0);
  const auto source = (torch::randn({37, 19}) * 1000).to(GetParam());
  const auto inv_scale = torch::full({1}, 1.0 / 3.0, torch::kFloat);
  auto ours = std::vector<torch::Tensor>{source.clone(), source.clone().t()};
  auto aten = std::vector<torch::Tensor>{source.clone(), source.clone().t()};
  auto found_ours = torch::zeros({1});
  auto found_aten = torch::zeros({1});
  non_finite_check_and_unscale_fallback_(ours, found_ours, inv_scale);
  at::_amp_foreach_non_finite_check_and_unscale_(aten, found_aten, inv_scale);
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_TRUE(torch::equal(ours[i], aten[i]));
  EXPECT_EQ(found_ours.item<float>(), 0.0f);
  EXPECT_EQ(found_aten.item<float>(), 0.0f);
}

TEST_P(UnscaleTest, FallbackFindsInfAndNan) {
  auto grads = pytorch_cases(GetParam());
  const auto inv_scale = torch::full({1}, 0.25, torch::kFloat);
  for (auto& [tensors, has_inf] : grads) {
    auto found_inf = torch::zeros({1});
    non_finite_check_and_unscale_fallback_(tensors, found_inf, inv_scale);
    EXPECT_EQ(found_inf.item<float>(), has_inf ? 1.0f : 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, UnscaleTest,
                         ::testing::Values(torch::kFloat, torch::kDouble, torch::kBFloat16,
                                           torch::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(UnscaleArgumentsTest, FoundInfStaysSetAcrossCalls) {
  auto found_inf = torch::zeros({1});
  const auto inv_scale = torch::ones({1});
  std::vector<torch::Tensor> bad{torch::full({3}, kInf)};
  std::vector<torch::Tensor> good{torch::ones({3})};
  non_finite_check_and_unscale_(bad, found_inf, inv_scale);
  non_finite_check_and_unscale_(good, found_inf, inv_scale);
  EXPECT_EQ(found_inf.item<float>(), 1.0f);
}

TEST(UnscaleArgumentsTest, MixedDtypesInOneCallAreRejected) {
  auto found_inf = torch::zeros({1});
  std::vector<torch::Tensor> grads{torch::ones({3}), torch::ones({3}, torch::kDouble)};
  EXPECT_THAT([&] { non_finite_check_and_unscale_(grads, found_inf, torch::ones({1})); },
              ::testing::ThrowsMessage<c10::Error>(HasSubstr("must share one device and dtype")));
}

TEST(UnscaleArgumentsTest, FoundInfMustBeFloat) {
  auto found_inf = torch::zeros({1}, torch::kDouble);
  std::vector<torch::Tensor> grads{torch::ones({3})};
  EXPECT_THAT([&] { non_finite_check_and_unscale_(grads, found_inf, torch::ones({1})); },
              ::testing::ThrowsMessage<c10::Error>(HasSubstr("found_inf must be a float tensor.")));
}

}  // namespace
