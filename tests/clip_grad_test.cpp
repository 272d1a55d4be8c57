// mantissa::clip_grad_norm_ against LibTorch's torch::nn::utils::clip_grad_norm_ and against
// Python's torch.nn.utils.clip_grad_norm_ (tests/golden/make_clip_grad_golden.py).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <mantissa/clip_grad.h>

#include "test_util.h"

// The wheel's LibTorch is a CUDA build; c10/cuda needs the CUDA runtime headers as well.
#if __has_include(<c10/cuda/CUDAFunctions.h>) && __has_include(<cuda_runtime_api.h>)
#include <c10/cuda/CUDAFunctions.h>
#include "golden_util.h"
#define MANTISSA_TEST_HAVE_C10_CUDA 1
#endif

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Parameters with gradients drawn from a fixed seed; `dtypes` gives one entry per parameter.
std::vector<torch::Tensor> make_params(const std::vector<torch::ScalarType>& dtypes, double scale,
                                       int seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> params;
  int64_t size = 3;
  for (const auto dtype : dtypes) {
    auto p = torch::zeros({size, 2}, torch::TensorOptions().dtype(dtype)).requires_grad_();
    p.mutable_grad() = (torch::randn({size, 2}, torch::kDouble) * scale).to(dtype);
    params.push_back(p);
    size += 2;
  }
  return params;
}

std::vector<torch::Tensor> clone_params(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    auto q = p.detach().clone().requires_grad_();
    if (p.grad().defined()) q.mutable_grad() = p.grad().clone();
    out.push_back(q);
  }
  return out;
}

class ClipGradVsLibTorchTest : public ::testing::TestWithParam<double> {};

TEST_P(ClipGradVsLibTorchTest, SameNormAndClippedGrads) {
  const double norm_type = GetParam();
  for (const double max_norm : {0.5, 1e6}) {  // clipping, and a coefficient clamped to 1
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    auto ours = make_params({torch::kFloat, torch::kFloat, torch::kFloat, torch::kFloat}, 2.0, 7);
    auto theirs = clone_params(ours);
    const torch::Tensor total = mantissa::clip_grad_norm_(ours, max_norm, norm_type);
    const double expected = torch::nn::utils::clip_grad_norm_(theirs, max_norm, norm_type);
    EXPECT_EQ(total.dim(), 0);
    EXPECT_EQ(total.scalar_type(), torch::kFloat);
    EXPECT_NEAR(total.item<double>(), expected, 1e-6 * expected);
    for (std::size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(torch::allclose(ours[i].grad(), theirs[i].grad(), 1e-6, 1e-7)) << "param " << i;
    }
    // The clipped grads really have norm max_norm (when clipped).
    if (max_norm < expected) {
      std::vector<torch::Tensor> flat;
      for (const auto& p : ours) flat.push_back(p.grad().flatten());
      EXPECT_NEAR(torch::linalg_vector_norm(torch::cat(flat), norm_type).item<double>(), max_norm,
                  1e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(NormTypes, ClipGradVsLibTorchTest, ::testing::Values(2.0, 1.0, kInf, 3.0),
                         [](const ::testing::TestParamInfo<double>& info) {
                           return std::isinf(info.param)
                                      ? std::string("Inf")
                                      : "P" + std::to_string(static_cast<int>(info.param));
                         });

TEST(ClipGradTest, SkipsParamsWithoutGradsAndHandlesNone) {
  auto params = make_params({torch::kFloat, torch::kFloat}, 3.0, 3);
  auto no_grad = torch::ones({4}, torch::requires_grad());
  params.insert(params.begin() + 1, no_grad);
  auto reference = clone_params(params);
  const auto total = mantissa::clip_grad_norm_(params, 1.0);
  const double expected = torch::nn::utils::clip_grad_norm_(reference, 1.0);
  EXPECT_NEAR(total.item<double>(), expected, 1e-6 * expected);
  EXPECT_FALSE(params[1].grad().defined()) << "no gradient is created";

  // No gradients at all: Python's torch.tensor(0.0), nothing touched.
  std::vector<torch::Tensor> without = {torch::ones({2}, torch::requires_grad())};
  const auto zero = mantissa::clip_grad_norm_(without, 1.0);
  EXPECT_EQ(zero.dim(), 0);
  EXPECT_EQ(zero.scalar_type(), torch::kFloat);
  EXPECT_EQ(zero.item<float>(), 0.f);
  EXPECT_EQ(mantissa::clip_grad_norm_({}, 1.0).item<float>(), 0.f);
}

TEST(ClipGradTest, NonFiniteGradsGiveNonFiniteNorm) {
  auto params = make_params({torch::kFloat, torch::kFloat}, 1.0, 5);
  params[1].mutable_grad()[2][1] = std::numeric_limits<float>::infinity();
  const auto total = mantissa::clip_grad_norm_(params, 1.0);
  EXPECT_TRUE(std::isinf(total.item<double>()));
  EXPECT_TRUE(params[1].grad()[2][1].isnan().item<bool>()) << "inf * 0 = nan, as in Python";

  auto nan_params = make_params({torch::kFloat}, 1.0, 5);
  nan_params[0].mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(mantissa::clip_grad_norm_(nan_params, 1.0, 1.0).item<double>()));
}

TEST(ClipGradTest, ErrorIfNonfiniteUsesPythonsTextAndLeavesGrads) {
  auto params = make_params({torch::kFloat, torch::kFloat}, 1.0, 9);
  params[0].mutable_grad()[1][0] = std::numeric_limits<float>::quiet_NaN();
  const auto before = params[1].grad().clone();
  EXPECT_THAT([&] { mantissa::clip_grad_norm_(params, 1.0, 2.0, /*error_if_nonfinite=*/true); },
              ThrowsMessage<c10::Error>(HasSubstr("The total norm of order 2.0 for gradients from "
                                                  "`parameters` is non-finite, so it cannot be "
                                                  "clipped. To disable this error and scale the "
                                                  "gradients by the non-finite norm anyway, set "
                                                  "`error_if_nonfinite=False`")));
  EXPECT_TRUE(torch::equal(params[1].grad(), before)) << "raises before clipping anything";
  EXPECT_THAT([&] { mantissa::clip_grad_norm_(params, 1.0, kInf, true); },
              ThrowsMessage<c10::Error>(HasSubstr("The total norm of order inf for gradients")));
  EXPECT_THAT([&] { mantissa::get_total_norm({params[0].grad()}, 0.5, true); },
              ThrowsMessage<c10::Error>(HasSubstr("The total norm of order 0.5 for gradients")));
  // Finite grads with the check on: same result as without it.
  auto finite = make_params({torch::kFloat, torch::kBFloat16}, 1.0, 10);
  auto copy = clone_params(finite);
  EXPECT_EQ(mantissa::clip_grad_norm_(finite, 0.1, 2.0, true).item<float>(),
            mantissa::clip_grad_norm_(copy, 0.1, 2.0, false).item<float>());
}

TEST(ClipGradTest, GetTotalNormThenClipEqualsClipGradNorm) {
  auto a = make_params({torch::kFloat, torch::kBFloat16, torch::kDouble}, 2.0, 11);
  auto b = clone_params(a);
  const auto total_a = mantissa::clip_grad_norm_(a, 0.3);
  std::vector<torch::Tensor> grads;
  for (const auto& p : b) grads.push_back(p.grad());
  const auto total_b = mantissa::get_total_norm(grads);
  mantissa::clip_grads_with_norm_(b, 0.3, total_b);
  EXPECT_TRUE(torch::equal(total_a, total_b));
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].grad(), b[i].grad()));
}

// What a sharded run does: each tensor's norm computed apart (here one at a time, on fresh
// copies, as the process holding the tensor would), then stacked as get_total_norm stacks them.
TEST(ClipGradTest, NormsComputedApartGiveGetTotalNormsBits) {
  // Mixed dtypes, interleaved: the stacking order is the groups', not the list's.
  auto params = make_params({torch::kBFloat16, torch::kFloat, torch::kDouble, torch::kFloat,
                             torch::kBFloat16, torch::kFloat},
                            3.0, 13);
  // Larger tensors than make_params gives, so that the reductions vectorize.
  params.push_back(torch::zeros({37, 41}).requires_grad_());
  params.back().mutable_grad() = torch::randn({37, 41});
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  const auto whole = mantissa::per_tensor_norms(grads);
  ASSERT_EQ(whole.size(), grads.size());
  std::vector<torch::Tensor> apart;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    apart.push_back(mantissa::per_tensor_norms({grads[i].clone()}).at(0));
    EXPECT_EQ(apart.back().scalar_type(), grads[i].scalar_type()) << "tensor " << i;
    EXPECT_TRUE(torch::equal(apart.back(), whole[i])) << "tensor " << i;
  }
  const auto total = mantissa::get_total_norm(grads);
  const auto from_norms = mantissa::total_norm_of_norms(apart);
  EXPECT_EQ(from_norms.scalar_type(), total.scalar_type());
  EXPECT_TRUE(torch::equal(from_norms, total));
  // No norms: get_total_norm's answer for no tensors.
  EXPECT_TRUE(torch::equal(mantissa::total_norm_of_norms({}), torch::scalar_tensor(0.0)));
}

// ---------------------------------------------------------------------------------------------
// Golden parity with Python.

const json& golden() { return mantissa_test::golden_file("clip_grad_golden.json"); }

double decode(const json& value) {
  if (value.is_string()) {
    const auto s = value.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    return s == "inf" ? kInf : -kInf;
  }
  return value.get<double>();
}

torch::ScalarType dtype_named(const std::string& name) {
  if (name == "float32") return torch::kFloat;
  if (name == "float64") return torch::kDouble;
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "float16") return torch::kHalf;
  throw std::runtime_error("unknown dtype " + name);
}

torch::Tensor tensor_from(const json& values, const std::vector<int64_t>& shape,
                          torch::ScalarType dtype) {
  std::vector<double> data;
  for (const auto& v : values) data.push_back(decode(v));
  return torch::tensor(data, torch::kDouble).reshape(shape).to(dtype);
}

// One unit in the last place of `dtype`, relative (the spacing just above 1.0).
double ulp_rtol(torch::ScalarType dtype) {
  if (dtype == torch::kBFloat16) return 1.0 / 128;
  if (dtype == torch::kHalf) return 1.0 / 1024;
  return 0.0;
}

void expect_close(double actual, double expected, double rtol, const std::string& what) {
  if (std::isnan(expected)) {
    EXPECT_TRUE(std::isnan(actual)) << what;
  } else if (std::isinf(expected)) {
    EXPECT_EQ(actual, expected) << what;
  } else {
    EXPECT_NEAR(actual, expected, rtol * std::abs(expected) + 1e-12) << what;
  }
}

TEST(ClipGradGoldenTest, MatchesPythonClipGradNorm) {
  const auto& cases = golden()["cases"];
  ASSERT_GE(cases.size(), 10u);
  for (const auto& [name, c] : cases.items()) {
    SCOPED_TRACE(name);
    std::vector<torch::Tensor> params;
    std::vector<torch::ScalarType> dtypes;
    for (const auto& g : c["grads"]) {
      if (g.is_null()) {
        params.push_back(torch::zeros({2}, torch::requires_grad()));
        dtypes.push_back(torch::kFloat);
        continue;
      }
      const auto dtype = dtype_named(g["dtype"].get<std::string>());
      const auto shape = g["shape"].get<std::vector<int64_t>>();
      auto p = torch::zeros(shape, torch::TensorOptions().dtype(dtype)).requires_grad_();
      p.mutable_grad() = tensor_from(g["values"], shape, dtype);
      params.push_back(p);
      dtypes.push_back(dtype);
    }
    const auto total =
        mantissa::clip_grad_norm_(params, c["max_norm"].get<double>(), decode(c["norm_type"]));
    EXPECT_EQ(total.scalar_type(), dtype_named(c["total_norm_dtype"].get<std::string>()));
    // 1e-6 where every gradient is fp32/fp64: another CPU sums in another order, a few fp32 ulps
    // apart. A bf16/fp16 gradient's own norm is rounded to its dtype (as Python does), and a
    // few fp32 ulps can move it one bf16/fp16 ulp; that unit moves the total norm, the clip
    // coefficient and so every clipped gradient of the case, whose own rounding may add one
    // more. So: two ulps of the narrowest dtype in the case, for all its results.
    double rtol = 1e-6;
    for (const auto dtype : dtypes) rtol = std::max(rtol, 2 * ulp_rtol(dtype));
    expect_close(total.item<double>(), decode(c["total_norm"]), rtol, "total norm");
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& want = c["clipped"][i];
      if (want.is_null()) {
        EXPECT_FALSE(params[i].grad().defined());
        continue;
      }
      const auto got = params[i].grad().to(torch::kDouble).flatten();
      ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
      for (int64_t k = 0; k < got.numel(); ++k) {
        expect_close(got[k].item<double>(), decode(want[k]), rtol,
                     "grad " + std::to_string(i) + "[" + std::to_string(k) + "]");
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// On the GPU: same values as on the CPU, and no host sync (CUDA's sync debug mode turns any
// synchronizing call into an error).

TEST(ClipGradCudaTest, MatchesCpuAndNeverSyncs) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  auto cpu = make_params({torch::kFloat, torch::kBFloat16, torch::kFloat}, 2.0, 21);
  std::vector<torch::Tensor> gpu;
  for (const auto& p : cpu) {
    auto q = p.detach().cuda().requires_grad_();
    q.mutable_grad() = p.grad().cuda();
    gpu.push_back(q);
  }
  const auto cpu_total = mantissa::clip_grad_norm_(cpu, 0.5);
  torch::Tensor gpu_total;
  {
#ifdef MANTISSA_TEST_HAVE_C10_CUDA
    auto& warnings = c10::cuda::warning_state();
    const auto previous = warnings.get_sync_debug_mode();
    warnings.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    try {
      gpu_total = mantissa::clip_grad_norm_(gpu, 0.5);
    } catch (...) {
      warnings.set_sync_debug_mode(previous);
      throw;
    }
    warnings.set_sync_debug_mode(previous);
#else
    gpu_total = mantissa::clip_grad_norm_(gpu, 0.5);
#endif
  }
  EXPECT_TRUE(gpu_total.is_cuda());
  EXPECT_EQ(gpu_total.dim(), 0);
  EXPECT_NEAR(gpu_total.item<double>(), cpu_total.item<double>(), 1e-5 * cpu_total.item<double>());
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_TRUE(torch::allclose(gpu[i].grad().cpu().to(torch::kFloat),
                                cpu[i].grad().to(torch::kFloat), 1e-2, 1e-5));
  }
}

}  // namespace
