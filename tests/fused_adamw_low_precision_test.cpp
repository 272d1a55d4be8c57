// FusedAdamW's low-precision update rules (LowPrecisionUpdate): the rounding primitives against
// float64 and ATen, each rule against a float64 AdamW step, every CPU build and the CUDA kernel
// against the DEFAULT build bit for bit, checkpoints, and a run where nearest rounding stalls.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>
#include <ATen/core/PhiloxRNGEngine.h>

#include <mantissa/optim/fused_adamw.h>
#include <mantissa/optim/low_precision_update.h>

#include "optim/fused_adamw_kernels.h"
#include "optim/low_precision_rounding.h"
#include "test_util.h"

namespace {

namespace d = mantissa::optim::detail;
using mantissa::optim::FusedAdamW;
using mantissa::optim::FusedAdamWOptions;
using mantissa::optim::FusedAdamWParamState;
using mantissa::optim::LowPrecisionUpdate;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

std::uint16_t nearest(bool bf16, float x) { return bf16 ? d::bf16_nearest(x) : d::half_nearest(x); }
std::uint16_t stochastic(bool bf16, float x, std::uint32_t r) {
  return bf16 ? d::bf16_stochastic(x, r) : d::half_stochastic(x, r);
}
double widen(bool bf16, std::uint16_t h) {
  return bf16 ? d::bf16_to_float(h) : d::half_to_float(h);
}

// The dtype's two neighbours of x (equal when x is representable), from the float64 value.
std::pair<double, double> neighbours(bool bf16, float x) {
  const std::uint16_t n = nearest(bf16, x);
  const double v = widen(bf16, n);
  if (v == static_cast<double>(x)) return {v, v};
  // One step of the magnitude away from or towards zero, whichever is on the other side.
  const bool n_above_in_magnitude = std::fabs(v) > std::fabs(static_cast<double>(x));
  const std::uint16_t other =
      n_above_in_magnitude ? static_cast<std::uint16_t>(n - 1) : static_cast<std::uint16_t>(n + 1);
  const double o = (n & 0x7FFF) == 0 && n_above_in_magnitude ? 0.0 : widen(bf16, other);
  return {std::min(v, o), std::max(v, o)};
}

// Random fp32 values over the whole range the tests care about: normal, fp16 subnormal,
// below fp16's smallest subnormal, fp32 subnormal, and near the largest finite values.
std::vector<float> probe_values(int n, std::uint64_t seed) {
  at::philox_engine rng(seed);
  std::vector<float> values{0.f,
                            -0.f,
                            1.f,
                            -1.f,
                            65504.f,
                            65519.f,
                            65520.f,
                            65535.f,
                            1e-8f,
                            6e-8f,
                            5.9604645e-8f,
                            2.9802322e-8f,
                            2.98e-8f,
                            6.1035156e-5f,
                            6.1e-5f,
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),
                            3.3895e38f,
                            std::numeric_limits<float>::max()};
  while (static_cast<int>(values.size()) < n) {
    const std::uint32_t bits = rng();
    values.push_back(d::float_of(bits));
  }
  values.erase(
      std::remove_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); }),
      values.end());
  return values;
}

// ---- the rounding primitives ----------------------------------------------------------

TEST(FusedAdamWRoundingTest, PhiloxIsAtensPhiloxEngine) {
  // Random123's known answer for counter 0, key 0.
  const auto zero = d::philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(zero.word[0], 0x6627e8d5u);
  EXPECT_EQ(zero.word[1], 0xe169c58du);
  EXPECT_EQ(zero.word[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.word[3], 0x9b00dbd8u);
  for (std::uint64_t seed : {0ull, 42ull, 0x123456789abcdefull}) {
    for (std::uint32_t tensor : {0u, 7u}) {
      for (std::uint32_t step : {1u, 1000u}) {
        for (std::uint64_t quad : {0ull, 5ull, (1ull << 33) + 3}) {
          at::philox_engine engine(seed, tensor | (static_cast<std::uint64_t>(step) << 32), quad);
          for (int k = 0; k < 4; ++k) {
            EXPECT_EQ(d::rounding_bits(seed, tensor, step, 4 * quad + k), engine())
                << seed << " " << quad;
          }
        }
      }
    }
  }
}

TEST(FusedAdamWRoundingTest, NearestIsTheCast) {
  for (float x : probe_values(200000, 1)) {
    EXPECT_EQ(d::bf16_nearest(x), c10::BFloat16(x).x) << x;
    EXPECT_EQ(d::half_nearest(x), c10::Half(x).x) << x;
    EXPECT_EQ(d::bf16_to_float(d::bf16_nearest(x)), static_cast<float>(c10::BFloat16(x))) << x;
    EXPECT_EQ(d::half_to_float(d::half_nearest(x)), static_cast<float>(c10::Half(x))) << x;
  }
  for (bool bf16 : {true, false}) {
    EXPECT_TRUE(std::isnan(widen(bf16, nearest(bf16, kNan))));
    EXPECT_TRUE(std::isnan(widen(bf16, nearest(bf16, -kNan))));
    EXPECT_EQ(widen(bf16, nearest(bf16, kInf)), kInf);
    EXPECT_EQ(widen(bf16, nearest(bf16, -kInf)), -kInf);
  }
}

TEST(FusedAdamWRoundingTest, StochasticRoundsToANeighbour) {
  at::philox_engine rng(2);
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    for (float x : probe_values(50000, 3)) {
      const auto [down, up] = neighbours(bf16, x);
      for (std::uint32_t r : {0u, 0xFFFFFFFFu, 0x80000000u, rng(), rng()}) {
        const double v = widen(bf16, stochastic(bf16, x, r));
        const bool overflow = std::isinf(v) && std::fabs(x) >= (bf16 ? 3.3895314e38f : 65504.f);
        EXPECT_TRUE(v == down || v == up || overflow) << x << " r " << r << " gave " << v;
        if (down == up) EXPECT_EQ(v, down) << "representable " << x << " must stay";
        if (v != 0 || x != 0) EXPECT_EQ(std::signbit(v), std::signbit(x)) << x;
      }
    }
    // NaN stays NaN (also one whose payload is only in the discarded bits), inf stays inf,
    // whatever the bits.
    for (std::uint32_t r : {0u, 0xFFFFFFFFu}) {
      EXPECT_TRUE(std::isnan(widen(bf16, stochastic(bf16, kNan, r))));
      EXPECT_TRUE(std::isnan(widen(bf16, stochastic(bf16, d::float_of(0xFF800001u), r))));
      EXPECT_EQ(widen(bf16, stochastic(bf16, kInf, r)), kInf);
      EXPECT_EQ(widen(bf16, stochastic(bf16, -kInf, r)), -kInf);
    }
  }
  // Past the largest finite value: down to it or up to inf.
  EXPECT_EQ(d::bf16_to_float(d::bf16_stochastic(std::numeric_limits<float>::max(), 0)),
            3.3895314e38f);
  EXPECT_EQ(d::bf16_to_float(d::bf16_stochastic(std::numeric_limits<float>::max(), 0xFFFFFFFFu)),
            kInf);
  EXPECT_EQ(d::half_to_float(d::half_stochastic(65535.f, 0)), 65504.f);
  EXPECT_EQ(d::half_to_float(d::half_stochastic(65535.f, 0xFFFFFFFFu)), kInf);
  EXPECT_EQ(d::half_to_float(d::half_stochastic(-1e6f, 0)), -kInf);
}

// The mean over every value of the random bits that matter is x itself, exactly (float64).
TEST(FusedAdamWRoundingTest, StochasticIsExactlyUnbiasedOverAllDraws) {
  auto mean_over = [](bool bf16, float x, int bits) {
    double sum = 0;
    for (std::uint32_t k = 0; k < (1u << bits); ++k)
      sum += widen(bf16, stochastic(bf16, x, k << (32 - bits)));
    return sum / static_cast<double>(1u << bits);
  };
  for (float x : {1.0001f, -3.14159f, 1e-30f, 0.999f, 1e30f, -2.5e-39f}) {
    EXPECT_EQ(mean_over(true, x, 16), static_cast<double>(x)) << x;
  }
  // fp16 normals keep 10 of 23 mantissa bits; subnormals (spacing 2^-24) discard 14 to 23.
  for (float x : {1.0001f, -3.14159f, 0.999f, 6.1e-5f, 1.0e-5f, -3.0e-7f, 6.0e-8f}) {
    const int e = static_cast<int>((d::bits_of(x) >> 23) & 0xFF);
    const int bits = e >= 113 ? 13 : 126 - e;
    EXPECT_EQ(mean_over(false, x, bits), static_cast<double>(x)) << x;
  }
  // Below 2^-24 the neighbours are 0 and 2^-24: up exactly when r < x * 2^56.
  for (float x : {2.9e-8f, 1e-9f, -4e-10f}) {
    const auto t = static_cast<std::uint64_t>(std::ldexp(std::fabs(static_cast<double>(x)), 56));
    ASSERT_EQ(std::ldexp(static_cast<double>(t), -56), std::fabs(static_cast<double>(x)));
    EXPECT_EQ(std::fabs(d::half_to_float(d::half_stochastic(x, static_cast<std::uint32_t>(t - 1)))),
              5.9604644775390625e-8f);
    EXPECT_EQ(d::half_to_float(d::half_stochastic(x, static_cast<std::uint32_t>(t))), 0.f);
  }
}

// The new compensation is the exact part of w + y the stored t lost (float64), rounded once.
TEST(FusedAdamWRoundingTest, KahanBufferHoldsExactlyTheLostPart) {
  at::philox_engine rng(4);
  auto uniform = [&] { return static_cast<double>(rng()) / 4294967296.0; };
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    int lost_nonzero = 0;
    for (int k = 0; k < 20000; ++k) {
      const float w =
          static_cast<float>(widen(bf16, nearest(bf16, static_cast<float>((uniform() - 0.5) * 8))));
      const double relative = std::ldexp(uniform() - 0.5, -static_cast<int>(4 + uniform() * 20));
      const float target = static_cast<float>(w + w * relative);
      std::uint16_t c = nearest(bf16, static_cast<float>(w * std::ldexp(uniform() - 0.5, -10)));
      const float c_old = static_cast<float>(widen(bf16, c));
      const std::uint16_t t =
          bf16 ? d::kahan_write<true>(w, target, &c) : d::kahan_write<false>(w, target, &c);
      const float y = (target - w) + c_old;  // the update, in fp32 by definition
      EXPECT_EQ(t, nearest(bf16, w + y));
      const double lost = (static_cast<double>(w) + y) - widen(bf16, t);  // exact in float64
      ASSERT_EQ(static_cast<double>(static_cast<float>(lost)), lost) << "w " << w << " y " << y;
      EXPECT_EQ(c, nearest(bf16, static_cast<float>(lost))) << "w " << w << " target " << target;
      lost_nonzero += lost != 0;
    }
    EXPECT_GT(lost_nonzero, 10000);  // the cases are ones where rounding loses something
  }
  std::uint16_t c = 0x1234;
  EXPECT_EQ(d::bf16_to_float(d::kahan_write<true>(1.f, kInf, &c)), kInf);
  EXPECT_EQ(c, 0);
  EXPECT_TRUE(std::isnan(d::half_to_float(d::kahan_write<false>(1.f, kNan, &c))));
}

// Each squaring doubles the relative error, so beta^n is within n ulps; the bias correction
// 1 - beta^n, which is what the step uses, within a few 1e-14.
TEST(FusedAdamWRoundingTest, PowBySquaringIsPow) {
  for (double beta : {0.9, 0.999, 0.95, 0.9999}) {
    for (std::uint32_t n : {0u, 1u, 2u, 3u, 10u, 1000u, 123457u, 10000000u}) {
      const double want = std::pow(beta, n);
      EXPECT_NEAR(d::pow_by_squaring(beta, n), want, (n + 1) * 2.3e-16 * want) << beta << "^" << n;
      EXPECT_NEAR(1 - d::pow_by_squaring(beta, n), 1 - want, 1e-13) << beta << "^" << n;
    }
  }
}

// ---- the option -------------------------------------------------------------------------

TEST(FusedAdamWLowPrecisionTest, OptionDefaultsNamesAndErrors) {
  const FusedAdamWOptions defaults;
  EXPECT_EQ(defaults.low_precision_update(), LowPrecisionUpdate::kNearest);
  EXPECT_EQ(defaults.stochastic_rounding_seed(), 0u);
  EXPECT_FALSE(defaults.fp32_moments());
  for (auto rule : {LowPrecisionUpdate::kNearest, LowPrecisionUpdate::kKahan,
                    LowPrecisionUpdate::kStochasticRounding}) {
    EXPECT_EQ(mantissa::optim::parse_low_precision_update(mantissa::optim::to_string(rule)), rule);
  }
  EXPECT_STREQ(mantissa::optim::to_string(LowPrecisionUpdate::kStochasticRounding),
               "stochastic_rounding");
  EXPECT_EQ(mantissa::Choice<LowPrecisionUpdate>("stochastic_rounding").value(),
            LowPrecisionUpdate::kStochasticRounding);
  EXPECT_THAT([] { mantissa::optim::parse_low_precision_update("sr"); },
              ThrowsMessage<c10::ValueError>(HasSubstr(
                  "low_precision_update must be nearest, kahan or stochastic_rounding; got 'sr'")));
  EXPECT_FALSE(FusedAdamWOptions().low_precision_update(LowPrecisionUpdate::kKahan) == defaults);
}

// ---- each rule against a float64 AdamW step -------------------------------------------

torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); }

const FusedAdamWParamState& state_of(const FusedAdamW& opt, const torch::Tensor& p) {
  return static_cast<const FusedAdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
}

double ulp_at(bool bf16, double x) {
  const std::uint16_t h = nearest(bf16, static_cast<float>(std::fabs(x)));
  return widen(bf16, static_cast<std::uint16_t>(h + 1)) - widen(bf16, h);
}

TEST(FusedAdamWLowPrecisionTest, EachRuleMatchesAFloat64Step) {
  const double lr = 2e-3, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    const bool bf16 = dtype == torch::kBFloat16;
    for (auto rule : {LowPrecisionUpdate::kNearest, LowPrecisionUpdate::kKahan,
                      LowPrecisionUpdate::kStochasticRounding}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + mantissa::optim::to_string(rule));
      torch::manual_seed(5);
      auto p = leaf(torch::randn({1000}).to(dtype));
      FusedAdamW opt(
          {p},
          FusedAdamWOptions(lr).weight_decay(wd).fp32_moments(true).low_precision_update(rule));
      int far_from_nearest = 0;
      for (int step = 1; step <= 6; ++step) {
        const auto g = torch::randn({1000}).to(dtype);
        p.mutable_grad() = g;
        std::vector<double> w, m, v, c(1000, 0.0);
        const auto w0 = p.detach().to(torch::kDouble).contiguous();
        w.assign(w0.data_ptr<double>(), w0.data_ptr<double>() + 1000);
        if (step > 1) {
          const auto& s = state_of(opt, p);
          const auto m0 = s.exp_avg().to(torch::kDouble), v0 = s.exp_avg_sq().to(torch::kDouble);
          m.assign(m0.data_ptr<double>(), m0.data_ptr<double>() + 1000);
          v.assign(v0.data_ptr<double>(), v0.data_ptr<double>() + 1000);
          if (rule == LowPrecisionUpdate::kKahan) {
            const auto c0 = s.kahan_comp().to(torch::kDouble);
            c.assign(c0.data_ptr<double>(), c0.data_ptr<double>() + 1000);
          }
        } else {
          m.assign(1000, 0.0);
          v.assign(1000, 0.0);
        }
        opt.step();
        const auto& s = state_of(opt, p);
        const auto g64 = g.to(torch::kDouble);
        const auto w1 = p.detach().to(torch::kDouble);
        const auto c1 = rule == LowPrecisionUpdate::kKahan ? s.kahan_comp().to(torch::kDouble)
                                                           : torch::zeros({1000}, torch::kDouble);
        const auto ga = g64.accessor<double, 1>();
        const auto wa = w1.accessor<double, 1>();
        const auto ca = c1.accessor<double, 1>();
        const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
        for (int i = 0; i < 1000; ++i) {
          const double gi = ga[i];
          const double mi = b1 * m[i] + (1 - b1) * gi;
          const double vi = b2 * v[i] + (1 - b2) * gi * gi;
          const double target =
              w[i] * (1 - lr * wd) - lr / bc1 * mi / (std::sqrt(vi) / std::sqrt(bc2) + eps);
          // fp32 arithmetic (and fp32 moments) around the weight: a few fp32 ulps of it.
          const double slack = 1e-6 * (std::fabs(w[i]) + std::fabs(target)) + 1e-12;
          const double wi = wa[i];
          if (rule == LowPrecisionUpdate::kNearest) {
            EXPECT_LE(std::fabs(wi - target), 0.5 * ulp_at(bf16, target) + slack) << i;
          } else if (rule == LowPrecisionUpdate::kKahan) {
            // Weight + compensation carry the float64 sum, to the compensation's own rounding.
            const double ci = ca[i];
            const double carried = target + c[i];
            EXPECT_LE(std::fabs(wi + ci - carried), 0.5 * ulp_at(bf16, ci) + slack)
                << i << ": w " << wi << " c " << ci << " want " << carried;
            far_from_nearest += std::fabs(wi - target) > 0 && ci != 0;
          } else {
            EXPECT_LT(std::fabs(wi - target), ulp_at(bf16, target) + slack) << i;
            far_from_nearest += wi != widen(bf16, nearest(bf16, static_cast<float>(target)));
          }
        }
      }
      if (rule != LowPrecisionUpdate::kNearest)
        EXPECT_GT(far_from_nearest, 500) << "the rule did something";
    }
  }
}

// One weight value, one update size: the fraction rounded up is the discarded fraction of a
// unit in the last place (within 5 sigma), every result is one of the two neighbours, and the
// bits do not depend on the thread count.
TEST(FusedAdamWLowPrecisionTest, StochasticRoundingIsUnbiasedOverManyDraws) {
  const int64_t n = 1 << 18;  // > 4 chunks: the kernel goes parallel
  auto run = [&](int threads) {
    const int before = at::get_num_threads();
    at::set_num_threads(threads);
    auto p = leaf(torch::ones({n}, torch::kBFloat16));
    FusedAdamW opt(
        {p},
        FusedAdamWOptions(1e-3).weight_decay(0).stochastic_rounding_seed(17).low_precision_update(
            LowPrecisionUpdate::kStochasticRounding));
    p.mutable_grad() = torch::ones({n}, torch::kBFloat16);
    opt.step();  // first Adam step: p = 1 - lr * 1 / (1 + eps) = 0.999 in fp32
    at::set_num_threads(before);
    return p.detach();
  };
  const auto p = run(2);
  // The fp32 result: 1 - float(lr / bias_correction1) * 1 / (1 + eps), near 0.999.
  const double target = static_cast<double>(1.0f - static_cast<float>(1e-3) / (1.0f + 1e-8f));
  const double up = 1.0, down = 1.0 - std::ldexp(1.0, -8);  // bf16's spacing in [0.5, 1)
  const auto pd = p.to(torch::kDouble);
  EXPECT_TRUE((pd.eq(up) | pd.eq(down)).all().item<bool>()) << "only the two neighbours";
  const double fraction_up = pd.eq(up).to(torch::kDouble).mean().item<double>();
  const double expected = (target - down) / (up - down);  // about 0.74
  const double sigma = std::sqrt(expected * (1 - expected) / n);
  EXPECT_NEAR(fraction_up, expected, 5 * sigma);
  EXPECT_NEAR(pd.mean().item<double>(), target, 5 * sigma * (up - down));
  EXPECT_TRUE(torch::equal(p.view(torch::kInt16), run(1).view(torch::kInt16))) << "thread count";
}

// The draws are keyed by seed, step, tensor and element: change any one and the pattern of
// elements rounded up changes (here, the same value in every element of two tensors, each
// spanning several of the kernel's chunks).
TEST(FusedAdamWLowPrecisionTest, StochasticDrawsDependOnSeedStepTensorAndElement) {
  const int64_t n = 3 * 32768;
  auto pattern = [&](std::uint64_t seed, int steps) {
    auto a = leaf(torch::ones({n}, torch::kBFloat16)), b = leaf(torch::ones({n}, torch::kBFloat16));
    FusedAdamW opt(
        {a, b},
        FusedAdamWOptions(1e-3).weight_decay(0).stochastic_rounding_seed(seed).low_precision_update(
            LowPrecisionUpdate::kStochasticRounding));
    for (int s = 0; s < steps; ++s) {
      torch::NoGradGuard no_grad;
      a.fill_(1);  // the same value and (constant grads: m / sqrt(v) = 1) the same update
      b.fill_(1);
      a.mutable_grad() = torch::ones({n}, torch::kBFloat16);
      b.mutable_grad() = torch::ones({n}, torch::kBFloat16);
      opt.step();
    }
    return std::make_pair(a.detach().eq(1), b.detach().eq(1));
  };
  // Independent draws disagree on 2 p (1 - p) of the elements (p, the chance of rounding up,
  // is about 0.74 here); a key left out of the draw would make that nearly 0.
  auto disagree = [](const torch::Tensor& x, const torch::Tensor& y) {
    return x.ne(y).to(torch::kDouble).mean().item<double>();
  };
  const auto [a1, b1] = pattern(5, 1);
  const auto [a2, b2] = pattern(5, 2);
  const auto [a3, b3] = pattern(6, 1);
  EXPECT_TRUE(torch::equal(pattern(5, 1).first, a1)) << "reproducible";
  EXPECT_GT(disagree(a1, b1), 0.3) << "tensor";
  EXPECT_GT(disagree(a1, a2), 0.3) << "step";
  EXPECT_GT(disagree(a1, a3), 0.3) << "seed";
  for (int64_t chunk = 1; chunk < 3; ++chunk) {
    EXPECT_GT(disagree(a1.slice(0, 0, 32768), a1.slice(0, chunk * 32768, (chunk + 1) * 32768)), 0.3)
        << "element";
  }
}

// ---- every CPU build and (below) CUDA give the DEFAULT build's bits --------------------

struct KernelCase {
  torch::Dtype dtype;
  LowPrecisionUpdate rule;
  bool fp32_moments;
  bool amsgrad;
};

std::vector<KernelCase> kernel_cases() {
  std::vector<KernelCase> cases;
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    for (auto rule : {LowPrecisionUpdate::kKahan, LowPrecisionUpdate::kStochasticRounding}) {
      for (bool fp32_moments : {false, true}) {
        for (bool amsgrad : {false, true}) cases.push_back({dtype, rule, fp32_moments, amsgrad});
      }
    }
  }
  return cases;
}

std::string name_of(const KernelCase& k) {
  return std::string(c10::toString(k.dtype)) + " " + mantissa::optim::to_string(k.rule) +
         (k.fp32_moments ? " fp32 moments" : "") + (k.amsgrad ? " amsgrad" : "");
}

torch::Tensor bits(const torch::Tensor& t) {
  return t.element_size() == 2 ? t.view(torch::kInt16) : t.view(torch::kInt32);
}

TEST(FusedAdamWLowPrecisionTest, EveryCpuBuildGivesTheSameBits) {
  const std::string capability = at::get_cpu_capability();
  std::vector<std::pair<std::string, void (*)(const d::AdamWCpuArgs&)>> kernels{
      {"DEFAULT", &d::DEFAULT::fused_adamw_cpu}};
  if (capability == "AVX2" || capability == "AVX512")
    kernels.emplace_back("AVX2", &d::AVX2::fused_adamw_cpu);
  if (capability == "AVX512") kernels.emplace_back("AVX512", &d::AVX512::fused_adamw_cpu);
  const std::vector<int64_t> sizes{1013, 150001, 3};
  for (const auto& k : kernel_cases()) {
    SCOPED_TRACE(name_of(k));
    torch::manual_seed(6);
    const auto moments = k.fp32_moments ? torch::kFloat : k.dtype;
    std::vector<torch::Tensor> p0, g0, m0, v0, x0, c0;
    for (auto n : sizes) {
      p0.push_back(torch::randn({n}).to(k.dtype));
      g0.push_back((torch::randn({n}) * 64).to(k.dtype));
      m0.push_back((torch::randn({n}) * 0.1).to(moments));
      v0.push_back((torch::rand({n}) * 0.1).to(moments));
      x0.push_back((torch::rand({n}) * 0.1).to(moments));
      c0.push_back((torch::randn({n}) * 1e-3).to(k.dtype));
    }
    std::vector<std::vector<torch::Tensor>> results;
    for (const auto& [name, kernel] : kernels) {
      std::vector<torch::Tensor> p, m, v, x, c;
      std::vector<d::AdamWCpuTensor> tensors;
      for (size_t i = 0; i < sizes.size(); ++i) {
        p.push_back(p0[i].clone());
        m.push_back(m0[i].clone());
        v.push_back(v0[i].clone());
        x.push_back(x0[i].clone());
        c.push_back(c0[i].clone());
        d::AdamWCpuTensor t{};
        t.param = p.back().data_ptr();
        t.grad = g0[i].data_ptr();
        t.exp_avg = m.back().data_ptr();
        t.exp_avg_sq = v.back().data_ptr();
        t.max_exp_avg_sq = k.amsgrad ? x.back().data_ptr() : nullptr;
        t.numel = sizes[i];
        t.neg_step_size = -0.01f;
        t.bias_correction2_sqrt = 0.5f;
        t.kahan_comp = k.rule == LowPrecisionUpdate::kKahan ? c.back().data_ptr() : nullptr;
        t.rng_tensor = static_cast<std::uint32_t>(i);
        t.rng_step = 3;
        tensors.push_back(t);
      }
      d::AdamWCpuArgs args{};
      args.param_dtype =
          k.dtype == torch::kBFloat16 ? d::KernelDtype::kBFloat16 : d::KernelDtype::kHalf;
      args.model_dtype = d::KernelDtype::kNone;
      args.amsgrad = k.amsgrad;
      args.rule = k.rule;
      args.fp32_moments = k.fp32_moments;
      args.seed = 0xfeedbeefcafeull;
      args.scalars = {0.999f, 0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, true, 1.f / 64, false};
      args.tensors = tensors.data();
      args.num_tensors = static_cast<int64_t>(tensors.size());
      kernel(args);
      std::vector<torch::Tensor> out;
      for (size_t i = 0; i < sizes.size(); ++i) {
        out.push_back(bits(p[i]));
        out.push_back(bits(m[i]));
        out.push_back(bits(v[i]));
        out.push_back(bits(x[i]));
        out.push_back(bits(c[i]));
      }
      EXPECT_FALSE(torch::equal(out[0], bits(p0[0]))) << name << " changed nothing";
      results.push_back(out);
    }
    for (size_t r = 1; r < results.size(); ++r) {
      for (size_t j = 0; j < results[r].size(); ++j) {
        EXPECT_TRUE(torch::equal(results[r][j], results[0][j]))
            << kernels[r].first << " vs DEFAULT, buffer " << j << ": "
            << results[r][j].ne(results[0][j]).sum().item<int64_t>() << " differ";
      }
    }
  }
}

// ---- checkpoints ------------------------------------------------------------------------

std::string save(const torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load(torch::optim::Optimizer& opt, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  opt.load(archive);
}

TEST(FusedAdamWLowPrecisionTest, ResumeFromAStateDictIsBitwise) {
  for (auto rule : {LowPrecisionUpdate::kKahan, LowPrecisionUpdate::kStochasticRounding}) {
    for (bool fp32_moments : {false, true}) {
      SCOPED_TRACE(std::string(mantissa::optim::to_string(rule)) +
                   (fp32_moments ? " fp32 moments" : ""));
      torch::manual_seed(7);
      std::vector<torch::Tensor> init{torch::randn({33, 5}).to(torch::kBFloat16),
                                      torch::randn({70000}).to(torch::kBFloat16),
                                      torch::randn({9}).to(torch::kHalf)};
      std::vector<std::vector<torch::Tensor>> grads(10);
      for (auto& step : grads) {
        for (const auto& p : init) step.push_back(torch::randn(p.sizes()).to(p.scalar_type()));
      }
      const auto options = FusedAdamWOptions(1e-3)
                               .weight_decay(0.1)
                               .low_precision_update(rule)
                               .fp32_moments(fp32_moments)
                               .stochastic_rounding_seed(1234);
      auto make = [&](std::vector<torch::Tensor>& params, FusedAdamWOptions o) {
        params.clear();
        for (const auto& t : init) params.push_back(leaf(t));
        // Two groups, so the tensor keys span groups.
        std::vector<torch::optim::OptimizerParamGroup> groups;
        groups.emplace_back(std::vector<torch::Tensor>{params[0]},
                            std::make_unique<FusedAdamWOptions>(o));
        groups.emplace_back(std::vector<torch::Tensor>{params[1], params[2]},
                            std::make_unique<FusedAdamWOptions>(o));
        return std::make_unique<FusedAdamW>(std::move(groups), o);
      };
      auto run_steps = [&](std::vector<torch::Tensor>& params, FusedAdamW& opt, int from, int to) {
        for (int s = from; s < to; ++s) {
          for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[s][i].clone();
          opt.step();
        }
      };
      std::vector<torch::Tensor> straight, first, resumed;
      auto straight_opt = make(straight, options);
      run_steps(straight, *straight_opt, 0, 10);
      auto first_opt = make(first, options);
      run_steps(first, *first_opt, 0, 5);
      const auto checkpoint = save(*first_opt);
      // Another rule and seed before loading: both must come from the checkpoint.
      auto resumed_opt = make(resumed, FusedAdamWOptions(0.5).stochastic_rounding_seed(99));
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < resumed.size(); ++i) resumed[i].copy_(first[i]);
      }
      load(*resumed_opt, checkpoint);
      const auto& restored =
          static_cast<const FusedAdamWOptions&>(resumed_opt->param_groups()[1].options());
      EXPECT_EQ(restored.low_precision_update(), rule);
      EXPECT_EQ(restored.stochastic_rounding_seed(), 1234u);
      EXPECT_EQ(restored.fp32_moments(), fp32_moments);
      run_steps(resumed, *resumed_opt, 5, 10);
      for (size_t i = 0; i < straight.size(); ++i) {
        EXPECT_TRUE(torch::equal(bits(straight[i]), bits(resumed[i]))) << "param " << i;
        const auto& a = state_of(*straight_opt, straight[i]);
        const auto& b = state_of(*resumed_opt, resumed[i]);
        EXPECT_EQ(b.exp_avg().scalar_type(), fp32_moments ? torch::kFloat : init[i].scalar_type());
        EXPECT_TRUE(torch::equal(bits(a.exp_avg()), bits(b.exp_avg()))) << i;
        EXPECT_EQ(a.kahan_comp().defined(), rule == LowPrecisionUpdate::kKahan);
        if (rule == LowPrecisionUpdate::kKahan) {
          EXPECT_TRUE(torch::equal(bits(a.kahan_comp()), bits(b.kahan_comp()))) << i;
          EXPECT_GT(a.kahan_comp().ne(0).sum().item<int64_t>(), 0) << "a compensation to restore";
        }
      }
    }
  }
}

// An archive without the new options and buffers (torch::optim::AdamW's, or ours from before)
// loads as nearest; switching to Kahan afterwards starts from zero compensation.
TEST(FusedAdamWLowPrecisionTest, OldArchivesLoadAsNearest) {
  torch::manual_seed(8);
  auto p = leaf(torch::randn({100}).to(torch::kBFloat16));
  torch::optim::AdamW adamw({p}, torch::optim::AdamWOptions(1e-3));
  p.mutable_grad() = torch::randn({100}).to(torch::kBFloat16);
  adamw.step();
  FusedAdamW fused({p}, FusedAdamWOptions(1e-3).low_precision_update(LowPrecisionUpdate::kKahan));
  load(fused, save(adamw));
  auto& options = static_cast<FusedAdamWOptions&>(fused.param_groups()[0].options());
  EXPECT_EQ(options.low_precision_update(), LowPrecisionUpdate::kNearest);
  EXPECT_FALSE(state_of(fused, p).kahan_comp().defined());
  fused.step();
  EXPECT_FALSE(state_of(fused, p).kahan_comp().defined());
  options.low_precision_update(LowPrecisionUpdate::kKahan);
  fused.step();
  EXPECT_TRUE(state_of(fused, p).kahan_comp().defined());
  EXPECT_EQ(state_of(fused, p).step().item<float>(), 3.f);
}

// ---- the reason for the rules ----------------------------------------------------------

// Weights near 1 and Adam steps of 1e-4: below half of bf16's and fp16's spacing there, so
// nearest rounding never moves a weight, while both compensated rules follow the fp32 run.
TEST(FusedAdamWLowPrecisionTest, NearestStallsWhereCompensatedRulesLearn) {
  const int64_t n = 4096;
  const int steps = 200;
  torch::manual_seed(9);
  const auto start_values = 1 + 0.01 * torch::rand({n});
  auto train = [&](const torch::Tensor& start, torch::Dtype dtype, LowPrecisionUpdate rule) {
    auto p = leaf(start.to(dtype));
    FusedAdamW opt(
        {p}, FusedAdamWOptions(1e-4).weight_decay(0).low_precision_update(rule).fp32_moments(true));
    for (int s = 0; s < steps; ++s) {
      p.mutable_grad() = p.detach().to(torch::kFloat).sub(0.5).to(dtype);  // pull towards 0.5
      opt.step();
    }
    return p.detach().to(torch::kFloat);
  };
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto start = start_values.to(dtype).to(torch::kFloat);
    const auto fp32 = train(start, torch::kFloat, LowPrecisionUpdate::kNearest);
    const double fp32_moved = (start - fp32).mean().item<double>();
    EXPECT_NEAR(fp32_moved, steps * 1e-4, 2e-3);
    EXPECT_TRUE(torch::equal(train(start, dtype, LowPrecisionUpdate::kNearest), start))
        << "nearest stalls";
    for (auto rule : {LowPrecisionUpdate::kKahan, LowPrecisionUpdate::kStochasticRounding}) {
      const auto low = train(start, dtype, rule);
      const double moved = (start - low).mean().item<double>();
      EXPECT_NEAR(moved, fp32_moved, 0.05 * fp32_moved) << mantissa::optim::to_string(rule);
    }
  }
}

// ---- edges -------------------------------------------------------------------------------

TEST(FusedAdamWLowPrecisionTest, NanAndInfStayAndSkippedStepsWriteNothing) {
  for (auto rule : {LowPrecisionUpdate::kKahan, LowPrecisionUpdate::kStochasticRounding}) {
    SCOPED_TRACE(mantissa::optim::to_string(rule));
    auto p = leaf(torch::tensor({1.f, kInf, -kInf, kNan, 2.f}).to(torch::kBFloat16));
    FusedAdamW opt({p}, FusedAdamWOptions(1e-3).low_precision_update(rule));
    p.mutable_grad() = torch::tensor({kNan, 1.f, 1.f, 1.f, 1.f}).to(torch::kBFloat16);
    opt.step();
    const auto v = p.detach().to(torch::kFloat);
    EXPECT_TRUE(std::isnan(v[0].item<float>()));
    EXPECT_EQ(v[1].item<float>(), kInf);
    EXPECT_EQ(v[2].item<float>(), -kInf);
    EXPECT_TRUE(std::isnan(v[3].item<float>()));
    EXPECT_TRUE(std::isfinite(v[4].item<float>()));
    // A step GradScaler skips (found_inf != 0) leaves params, compensation and step alone.
    const auto before = p.detach().clone();
    const auto comp = rule == LowPrecisionUpdate::kKahan ? state_of(opt, p).kahan_comp().clone()
                                                         : torch::Tensor();
    opt.set_amp_scaling(torch::full({}, 2.f), torch::ones({}));
    opt.step();
    opt.clear_amp_scaling();
    EXPECT_TRUE(torch::equal(bits(p.detach()), bits(before)));
    if (comp.defined()) EXPECT_TRUE(torch::equal(bits(state_of(opt, p).kahan_comp()), bits(comp)));
    EXPECT_EQ(state_of(opt, p).step().item<float>(), 1.f);
  }
}

TEST(FusedAdamWLowPrecisionTest, OddLayoutsTakeTheKernelOrAreRefusedNamingTheRule) {
  // A gradient laid out unlike its parameter is copied for the kernel: same bits as a dense one.
  torch::manual_seed(10);
  const auto init = torch::randn({16, 8}).to(torch::kBFloat16);
  const auto grad = torch::randn({16, 8}).to(torch::kBFloat16);
  auto a = leaf(init), b = leaf(init);
  const auto o =
      FusedAdamWOptions(1e-2).low_precision_update(LowPrecisionUpdate::kStochasticRounding);
  FusedAdamW oa({a}, o), ob({b}, o);
  a.mutable_grad() = grad.clone();
  b.mutable_grad() = grad.t().contiguous().t();
  oa.step();
  ob.step();
  EXPECT_TRUE(torch::equal(bits(a.detach()), bits(b.detach())));
  // A parameter that is not dense has no kernel, and the rules have no fallback.
  auto base = torch::randn({16, 8}).to(torch::kBFloat16);
  auto view = base.slice(1, 0, 8, 2).detach().requires_grad_(true);
  view.mutable_grad() = torch::ones_like(view);
  FusedAdamW oc({view}, FusedAdamWOptions().low_precision_update(LowPrecisionUpdate::kKahan));
  EXPECT_THAT([&] { oc.step(); }, ThrowsMessage<c10::ValueError>(HasSubstr(
                                      "low_precision_update=kahan needs a dense parameter")));
}

// ---- CUDA (skipped without a GPU) -------------------------------------------------------

TEST(FusedAdamWLowPrecisionCudaTest, KernelMatchesTheCpuKernelBitForBit) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  std::vector<std::vector<int64_t>> shapes{{}, {7}, {1000}, {65537}, {321 * 65536 + 5}};
  for (int i = 0; i < 30; ++i) shapes.push_back({1 + 97 * i});  // more than one launch's 24
  for (const auto& k : kernel_cases()) {
    {
      const bool scaled = k.amsgrad;  // half the cases unscale in the kernel
      SCOPED_TRACE(name_of(k) + (scaled ? " scaled" : ""));
      torch::manual_seed(11);
      std::vector<torch::Tensor> cpu, gpu;
      for (const auto& shape : shapes) {
        const auto init = torch::randn(shape).to(k.dtype);
        cpu.push_back(leaf(init));
        gpu.push_back(leaf(init.cuda()));
      }
      const auto options = FusedAdamWOptions(1e-2)
                               .weight_decay(0.1)
                               .amsgrad(k.amsgrad)
                               .low_precision_update(k.rule)
                               .fp32_moments(k.fp32_moments)
                               .stochastic_rounding_seed(77);
      FusedAdamW cpu_opt(cpu, options), gpu_opt(gpu, options);
      for (int step = 0; step < 4; ++step) {
        for (size_t i = 0; i < shapes.size(); ++i) {
          const auto g = (torch::randn(shapes[i]) * (scaled ? 1024 : 1)).to(k.dtype);
          cpu[i].mutable_grad() = g.clone();
          gpu[i].mutable_grad() = g.cuda();
        }
        if (scaled) {
          cpu_opt.set_amp_scaling(torch::full({}, 1024.f), torch::zeros({}));
          gpu_opt.set_amp_scaling(torch::full({}, 1024.f, torch::kCUDA),
                                  torch::zeros({}, torch::kCUDA));
        }
        cpu_opt.step();
        gpu_opt.step();
        cpu_opt.clear_amp_scaling();
        gpu_opt.clear_amp_scaling();
      }
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_TRUE(torch::equal(bits(cpu[i].detach()), bits(gpu[i].detach().cpu())))
            << "param " << i << ": " << cpu[i].ne(gpu[i].cpu()).sum().item<int64_t>() << " differ";
        const auto& cs = state_of(cpu_opt, cpu[i]);
        const auto& gs = state_of(gpu_opt, gpu[i]);
        EXPECT_TRUE(torch::equal(bits(cs.exp_avg()), bits(gs.exp_avg().cpu()))) << "exp_avg " << i;
        EXPECT_TRUE(torch::equal(bits(cs.exp_avg_sq()), bits(gs.exp_avg_sq().cpu())))
            << "exp_avg_sq " << i;
        if (k.rule == LowPrecisionUpdate::kKahan) {
          EXPECT_TRUE(torch::equal(bits(cs.kahan_comp()), bits(gs.kahan_comp().cpu())))
              << "kahan_comp " << i;
        }
        EXPECT_EQ(gs.step().item<float>(), 4.f);
      }
    }
  }
}

}  // namespace
