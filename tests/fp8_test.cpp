// mantissa::fp8: casts, the two scaling recipes, Float8Linear and its conversion, against
// torchao 0.18 and a Python twin of TransformerEngine's delayed-scaling update
// (tests/golden/make_fp8_golden.py writes fp8_golden.json).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/autocast.h>
#include <mantissa/distributed.h>
#include <mantissa/fp8/cast.h>
#include <mantissa/fp8/convert.h>
#include <mantissa/fp8/float8_linear.h>
#include <mantissa/fp8/recipe.h>
#include <mantissa/fp8/scaling_state.h>

#include "golden_util.h"
#include "multiprocess.h"
#include "test_util.h"

// The wheel's LibTorch is a CUDA build; c10/cuda needs the CUDA runtime headers as well.
#if __has_include(<c10/cuda/CUDAFunctions.h>) && __has_include(<cuda_runtime_api.h>)
#include <c10/cuda/CUDAFunctions.h>
#define MANTISSA_TEST_HAVE_C10_CUDA 1
#endif
#include "device_info.h"

namespace {

using json = nlohmann::json;
using mantissa::fp8::AmaxComputeAlgo;
using mantissa::fp8::Float8Format;
using mantissa::fp8::Float8Linear;
using mantissa::fp8::Float8Recipe;
using mantissa::fp8::Float8ScalingState;
using mantissa::fp8::ScalingRecipe;
using ::testing::HasSubstr;

const json& golden() { return mantissa_test::golden_file("fp8_golden.json"); }

double decode(const json& v) { return mantissa_test::golden_number(v); }

torch::Tensor tensor_from(const json& doc) { return mantissa_test::golden_tensor(doc); }

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

std::vector<uint32_t> bits_of(const torch::Tensor& t) {
  const torch::Tensor flat = t.to(torch::kFloat).contiguous().cpu().flatten();
  std::vector<uint32_t> out;
  for (int64_t i = 0; i < flat.numel(); ++i) out.push_back(bits_of(flat[i].item<float>()));
  return out;
}

/// |actual - expected| <= ulps units of the last place of `dtype` at each element's magnitude
/// (bf16: 2^-7 relative) plus `atol`; `extra_magnitude` (broadcast to the shape) is added to the
/// magnitude where a rounding happened at a larger value than the result's (a sum that cancels).
/// Prints the first offending element.
void expect_close_ulps(const torch::Tensor& actual, const torch::Tensor& expected, double ulps,
                       c10::ScalarType dtype, double atol, const std::string& what,
                       const torch::Tensor& extra_magnitude = {}) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double eps = dtype == torch::kBFloat16 ? std::ldexp(1.0, -7)
                     : dtype == torch::kHalf   ? std::ldexp(1.0, -10)
                                               : std::ldexp(1.0, -23);
  const torch::Tensor a = actual.to(torch::kDouble).flatten();
  const torch::Tensor e = expected.to(torch::kDouble).flatten();
  torch::Tensor magnitude = torch::maximum(a.abs(), e.abs());
  if (extra_magnitude.defined()) {
    magnitude = magnitude + extra_magnitude.to(torch::kDouble).expand(actual.sizes()).flatten();
  }
  const torch::Tensor bound = ulps * eps * magnitude + atol;
  const torch::Tensor bad = (a - e).abs().gt(bound);
  if (bad.any().item<bool>()) {
    const int64_t i = bad.nonzero()[0][0].item<int64_t>();
    ADD_FAILURE() << what << ": element " << i << " is " << a[i].item<double>() << ", expected "
                  << e[i].item<double>() << " (" << bad.sum().item<int64_t>() << " of " << a.numel()
                  << " off)";
  }
}

// ------------------------------------------------------------------------------------------------
// casts and scales

TEST(Fp8CastTest, MaxValuesAndUnknownDtype) {
  EXPECT_EQ(mantissa::fp8::float8_max(torch::kFloat8_e4m3fn), 448.0);
  EXPECT_EQ(mantissa::fp8::float8_max(torch::kFloat8_e5m2), 57344.0);
  EXPECT_THAT([] { mantissa::fp8::float8_max(torch::kBFloat16); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("not BFloat16")));
}

TEST(Fp8CastTest, SaturatesFiniteOverflowAndKeepsNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto x = torch::tensor({1000.0, 448.0, 464.0, 465.0, -1000.0, 1.0, nan});
  const auto e4m3 = mantissa::fp8::to_float8_saturated(x, torch::kFloat8_e4m3fn).to(torch::kFloat);
  const auto head = e4m3.narrow(0, 0, 6);
  EXPECT_TRUE(head.equal(torch::tensor({448.0f, 448.0f, 448.0f, 448.0f, -448.0f, 1.0f}))) << e4m3;
  EXPECT_TRUE(std::isnan(e4m3[6].item<float>()));
  const auto e5m2 = mantissa::fp8::to_float8_saturated(torch::tensor({70000.0, 61440.0, -1e9}),
                                                       torch::kFloat8_e5m2);
  EXPECT_TRUE(e5m2.to(torch::kFloat).equal(torch::tensor({57344.0f, 57344.0f, -57344.0f})));
}

TEST(Fp8CastTest, QuantizeScalesInFloat32) {
  const auto x = torch::tensor({1.0, -2.0, 300.0}, torch::kBFloat16);
  const auto q = mantissa::fp8::quantize(x, torch::tensor({2.0f}), torch::kFloat8_e4m3fn);
  EXPECT_EQ(q.scalar_type(), torch::kFloat8_e4m3fn);
  EXPECT_TRUE(q.to(torch::kFloat).equal(torch::tensor({2.0f, -4.0f, 448.0f})));
  EXPECT_THAT(
      [&] {
        mantissa::fp8::quantize(x, torch::tensor({2.0}, torch::kDouble), torch::kFloat8_e4m3fn);
      },
      ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("one float32 value")));
}

TEST(Fp8CastTest, AmaxAndCurrentScale) {
  using mantissa::fp8::current_scale;
  using mantissa::fp8::tensor_amax;
  const auto a = tensor_amax(torch::tensor({-3.5, 2.0, 1.0}, torch::kBFloat16));
  EXPECT_EQ(a.dim(), 0);
  EXPECT_EQ(a.scalar_type(), torch::kFloat);
  EXPECT_EQ(a.item<float>(), 3.5f);
  EXPECT_EQ(tensor_amax(torch::empty({0, 4})).item<float>(), 0.0f);

  // 448 / 3.5 = 128 exactly; 57344 / 3 rounds once from float64 to fp32.
  EXPECT_EQ(current_scale(a, torch::kFloat8_e4m3fn).item<float>(), 128.0f);
  EXPECT_EQ(current_scale(torch::tensor(3.0f), torch::kFloat8_e5m2).item<float>(),
            static_cast<float>((1.0 / 3.0) * 57344.0));
  // amax 0 is clamped to 1e-12 (torchao's EPS), a non-finite amax poisons the cast.
  EXPECT_EQ(current_scale(torch::tensor(0.0f), torch::kFloat8_e4m3fn).item<float>(),
            static_cast<float>((1.0 / 1e-12) * 448.0));
  EXPECT_EQ(current_scale(torch::tensor(INFINITY), torch::kFloat8_e4m3fn).item<float>(), 0.0f);
  EXPECT_TRUE(std::isnan(current_scale(torch::tensor(NAN), torch::kFloat8_e4m3fn).item<float>()));
}

TEST(Fp8RecipeTest, ValidatesFieldsAndMapsFormats) {
  using mantissa::fp8::float8_dtype;
  using mantissa::fp8::TensorRole;
  EXPECT_THAT([] { Float8Recipe().amax_history_len(0).validate(); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  HasSubstr("fp8_amax_history_len must be at least 1, got 0")));
  EXPECT_THAT([] { Float8Recipe().margin(-1).validate(); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  HasSubstr("fp8_margin must be in [0, 64], got -1")));
  EXPECT_NO_THROW(Float8Recipe().validate());
  EXPECT_EQ(float8_dtype(Float8Format::kHybrid, TensorRole::kInput), torch::kFloat8_e4m3fn);
  EXPECT_EQ(float8_dtype(Float8Format::kHybrid, TensorRole::kGradOutput), torch::kFloat8_e5m2);
  EXPECT_EQ(float8_dtype(Float8Format::kE4M3, TensorRole::kGradOutput), torch::kFloat8_e4m3fn);
}

// ------------------------------------------------------------------------------------------------
// delayed scaling state

Float8Recipe delayed_recipe_of(const json& c) {
  return Float8Recipe()
      .recipe(ScalingRecipe::kDelayed)
      .amax_history_len(c["amax_history_len"].get<int64_t>())
      .margin(c["margin"].get<int64_t>())
      .amax_compute_algo(c["amax_compute_algo"] == "max" ? AmaxComputeAlgo::kMax
                                                         : AmaxComputeAlgo::kMostRecent)
      .fp8_format(c["fp8_format"] == "HYBRID" ? Float8Format::kHybrid : Float8Format::kE4M3);
}

// The scales and the rolled history after every update, bit for bit, including steps that
// record 0, inf and NaN (the scale stays) and a tiny amax (a huge scale).
TEST(Float8ScalingStateTest, UpdatesMatchTransformerEngineBitForBit) {
  for (const auto& [name, c] : golden()["delayed_state"].items()) {
    SCOPED_TRACE(name);
    Float8ScalingState state(delayed_recipe_of(c));
    ASSERT_EQ(state.add_layer("layer"), 0);
    ASSERT_EQ(state.num_scales(), 3);
    for (size_t step = 0; step < c["recorded"].size(); ++step) {
      SCOPED_TRACE("update " + std::to_string(step));
      for (const auto& entry : c["recorded"][step]) {
        state.record_amax_(entry[0].get<int64_t>(),
                           torch::tensor(static_cast<float>(decode(entry[1]))));
      }
      state.update_();
      const auto& after = c["after_update"][step];
      EXPECT_EQ(bits_of(state.scales()), after["scale_bits"].get<std::vector<uint32_t>>());
      std::vector<uint32_t> history;
      for (const auto& row : after["history_bits"]) {
        for (const auto& b : row) history.push_back(b.get<uint32_t>());
      }
      EXPECT_EQ(bits_of(state.amax_history()), history);
    }
  }
}

TEST(Float8ScalingStateTest, LayoutNamesAndErrors) {
  EXPECT_THAT(
      [] { Float8ScalingState(Float8Recipe().recipe(ScalingRecipe::kCurrent)); },
      ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("fp8_recipe='current' keeps no state")));
  Float8ScalingState state(Float8Recipe().amax_history_len(5));
  EXPECT_EQ(state.add_layer("a"), 0);
  EXPECT_EQ(state.add_layer("b.fc"), 3);
  EXPECT_EQ(state.names()[4], "b.fc.weight");
  EXPECT_EQ(state.names()[5], "b.fc.grad_output");
  EXPECT_EQ(state.amax_history().sizes(), (std::vector<int64_t>{5, 6}));
  EXPECT_TRUE(state.scales().equal(torch::ones({6})));
  EXPECT_TRUE(state.current_amaxes().is_contiguous());
  EXPECT_THAT([&] { state.scale(6); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("column 6 does not exist")));
}

TEST(Float8ScalingStateTest, StateDictRoundTripsAndRefusesOtherShapes) {
  Float8ScalingState state(Float8Recipe().amax_history_len(3));
  state.add_layer("fc");
  for (int step = 1; step <= 4; ++step) {
    for (int64_t column = 0; column < 3; ++column) {
      state.record_amax_(column, torch::tensor(0.25f * step * (column + 1)));
    }
    state.update_();
  }
  state.record_amax_(1, torch::tensor(7.0f));  // mid-step: recorded but not yet used
  const auto saved = state.state_dict();

  Float8ScalingState restored(Float8Recipe().amax_history_len(3));
  restored.add_layer("fc");
  restored.load_state_dict(saved);
  EXPECT_TRUE(restored.amax_history().equal(state.amax_history()));
  EXPECT_TRUE(restored.scales().equal(state.scales()));
  // The next update is the same too.
  state.update_();
  restored.update_();
  EXPECT_EQ(bits_of(restored.scales()), bits_of(state.scales()));

  Float8ScalingState longer(Float8Recipe().amax_history_len(4));
  longer.add_layer("fc");
  EXPECT_THAT([&] { longer.load_state_dict(saved); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  HasSubstr("'amax_history' is a Float tensor of shape [3, 3], but this model's is "
                            "a Float tensor of shape [4, 3]")));
  torch::OrderedDict<std::string, torch::Tensor> partial;
  partial.insert("scale", torch::ones({3}));
  EXPECT_THAT([&] { restored.load_state_dict(partial); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("has no 'amax_history' entry")));
}

// The data-parallel hook reduces all layers' amaxes in one call, and writes back a reduction
// that returns a new tensor.
TEST(Float8ScalingStateTest, AllReduceIsOneCallForAllLayers) {
  Float8ScalingState state(Float8Recipe().amax_history_len(2));
  for (const char* name : {"a", "b", "c"}) state.add_layer(name);
  for (int64_t column = 0; column < 9; ++column) state.record_amax_(column, torch::tensor(1.0f));
  const auto other_rank = torch::arange(9, torch::kFloat) * 0.5f;  // 0, 0.5, ..., 4
  int calls = 0;
  mantissa::fp8::all_reduce_amaxes_(state, [&](torch::Tensor& amaxes) {
    ++calls;
    EXPECT_EQ(amaxes.numel(), 9);
    amaxes = torch::maximum(amaxes, other_rank);  // a new tensor, not in place
  });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(state.current_amaxes().equal(torch::maximum(torch::ones({9}), other_rank)));
  state.update_();
  EXPECT_EQ(state.scales()[8].item<float>(), 57344.0f / 4.0f);  // e5m2's max over amax 4
}

// Two ranks (two threads, Gloo on 127.0.0.1): after the hook both hold the elementwise max of
// what each recorded, so both compute the same scales.
TEST(Float8ScalingStateTest, AllReduceOverGlooGivesEveryRankTheSameScales) {
  const uint16_t port = mantissa::testing::free_port();
  std::vector<torch::Tensor> scales(2);
  std::vector<std::string> errors(2);
  auto rank_main = [&](int rank) {
    try {
      mantissa::distributed::DistributedEnvironment env;
      env.rank = env.local_rank = rank;
      env.world_size = env.local_world_size = 2;
      env.master_addr = "127.0.0.1";
      env.master_port = port;
      env.gloo_socket_ifname = "lo";
      const auto group = mantissa::distributed::init_process_group(
          env, mantissa::distributed::Backend::kGloo, std::chrono::seconds(60));
      Float8ScalingState state(Float8Recipe().amax_history_len(2));
      state.add_layer("a");
      state.add_layer("b");
      for (int64_t column = 0; column < 6; ++column) {
        // rank 0 sees the larger amax on even columns, rank 1 on odd ones
        const bool larger = (column % 2 == 0) == (rank == 0);
        state.record_amax_(column, torch::tensor(larger ? 4.0f + column : 1.0f));
      }
      mantissa::fp8::all_reduce_amaxes_(state, *group);
      state.update_();
      scales[rank] = state.scales().clone();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread rank0(rank_main, 0), rank1(rank_main, 1);
  rank0.join();
  rank1.join();
  ASSERT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_TRUE(scales[0].equal(scales[1]));
  const auto amaxes = torch::arange(6, torch::kFloat) + 4.0f;
  const auto maxima = torch::tensor({448.0f, 448.0f, 57344.0f, 448.0f, 448.0f, 57344.0f});
  EXPECT_TRUE(scales[0].equal(maxima / amaxes)) << scales[0];
}

// ------------------------------------------------------------------------------------------------
// Float8Linear

Float8Linear layer_from(const json& c) {
  const auto weight = tensor_from(c["weight"]);
  const bool has_bias = !c["bias"].is_null();
  Float8Linear layer(torch::nn::LinearOptions(weight.size(1), weight.size(0)).bias(has_bias));
  torch::NoGradGuard no_grad;
  layer->weight.copy_(weight);
  if (has_bias) layer->bias.copy_(tensor_from(c["bias"]));
  return layer;
}

struct StepResult {
  torch::Tensor output, grad_x;
};

StepResult run_step(Float8Linear& layer, const torch::Tensor& x_value,
                    const torch::Tensor& grad_output, bool autocast) {
  auto x = x_value.clone().requires_grad_(true);
  torch::Tensor y;
  {
    mantissa::amp::Autocast guard(torch::kCPU, torch::kBFloat16, autocast);
    y = layer->forward(x);
  }
  y.backward(grad_output);
  return {y.detach(), x.grad()};
}

// torchao's tensorwise Float8Linear on the CPU: same fp8 operands and scales, so grad_input and
// grad_weight agree to the GEMM's rounding; the output differs by where the bias is added
// (inside the GEMM here, after a bf16 rounding in torchao): at most one bf16 rounding.
TEST(Float8LinearTest, CurrentScalingMatchesTorchao) {
  for (const auto& [name, c] : golden()["current"].items()) {
    SCOPED_TRACE(name);
    Float8Linear layer = layer_from(c);
    layer->enable_current_scaling();
    const auto grad_output = tensor_from(c["grad_output"]);
    const auto result =
        run_step(layer, tensor_from(c["x"]), grad_output, c["autocast"].get<bool>());
    const auto expected = tensor_from(c["output"]);
    ASSERT_EQ(result.output.scalar_type(), expected.scalar_type());
    const c10::ScalarType out = expected.scalar_type();
    // torchao rounds x·Wᵀ to `out` and then adds the rounded bias: two more roundings, at
    // |x·Wᵀ| <= |y| + |b| and at |b|, which a sum that cancels does not shrink.
    torch::Tensor extra_magnitude =
        c["bias"].is_null() ? torch::zeros({}) : 2 * tensor_from(c["bias"]).abs();
    if (out == torch::kFloat) {
      // An fp32 output keeps the GEMM's summation order visible: where the CPU has AMX-INT8,
      // _scaled_mm runs oneDNN's kernel instead of the emulated fp32 matmul the golden file was
      // made with (a live torchao run on such a CPU differs from the file the same way). Two
      // orders of a K-term sum differ by at most K units of the last place of sum |x_k w_k|.
      const torch::Tensor x = tensor_from(c["x"]).to(torch::kFloat);
      const torch::Tensor w = tensor_from(c["weight"]).to(torch::kFloat);
      extra_magnitude = extra_magnitude + w.size(1) * torch::matmul(x.abs(), w.abs().t());
    }
    expect_close_ulps(result.output, expected, 1.0, out, 0.0, "output", extra_magnitude);
    EXPECT_EQ(result.grad_x.scalar_type(), tensor_from(c["x"]).scalar_type());
    expect_close_ulps(result.grad_x, tensor_from(c["grad_x"]), 1.0, out, 0.0, "grad_x");
    expect_close_ulps(layer->weight.grad(), tensor_from(c["grad_weight"]), 1.0, out, 0.0,
                      "grad_weight");
    if (!c["bias"].is_null()) {
      expect_close_ulps(layer->bias.grad(), tensor_from(c["grad_bias"]), 1.0, out, 0.0,
                        "grad_bias");
    }
  }
}

// The delayed recipe through the layer: step 1 casts with scales of 1 and records its amaxes,
// the update gives TE's scales (bit for bit), step 2 casts with them like the Python twin.
TEST(Float8LinearTest, DelayedScalingMatchesPythonTwin) {
  const json& c = golden()["delayed_layer"];
  Float8Linear layer = layer_from(c);
  auto state = std::make_shared<Float8ScalingState>(delayed_recipe_of(c));
  layer->enable_delayed_scaling(state, state->add_layer("fc"));
  run_step(layer, tensor_from(c["x"][0]), tensor_from(c["grad_output"][0]), true);
  state->update_();
  EXPECT_EQ(bits_of(state->scales()), c["step2_scale_bits"].get<std::vector<uint32_t>>());

  layer->zero_grad();
  const auto result =
      run_step(layer, tensor_from(c["x"][1]), tensor_from(c["grad_output"][1]), true);
  expect_close_ulps(result.output, tensor_from(c["step2_output"]), 1.0, torch::kBFloat16, 0.0,
                    "output");
  expect_close_ulps(result.grad_x, tensor_from(c["step2_grad_x"]), 1.0, torch::kBFloat16, 0.0,
                    "grad_x");
  expect_close_ulps(layer->weight.grad(), tensor_from(c["step2_grad_weight"]), 1.0,
                    torch::kBFloat16, 0.0, "grad_weight");
  expect_close_ulps(layer->bias.grad(), tensor_from(c["step2_grad_bias"]), 4.0, torch::kFloat,
                    1e-12, "grad_bias");
}

// Row 0 of the history holds max|x|, max|W|, max|dY| of the step, the larger over two
// micro-batches; evaluation records nothing.
TEST(Float8LinearTest, DelayedScalingRecordsAmaxesPerStep) {
  torch::manual_seed(3);
  Float8Linear layer(32, 16);
  auto state = std::make_shared<Float8ScalingState>(Float8Recipe().amax_history_len(4));
  layer->enable_delayed_scaling(state, state->add_layer("fc"));
  const auto x1 = torch::randn({8, 32}), x2 = torch::randn({8, 32}) * 3;
  const auto g1 = torch::randn({8, 16}) * 5, g2 = torch::randn({8, 16});
  run_step(layer, x1, g1, false);
  run_step(layer, x2, g2, false);
  const auto expected = torch::stack({torch::maximum(x1.abs().max(), x2.abs().max()),
                                      layer->weight.detach().abs().max(),
                                      torch::maximum(g1.abs().max(), g2.abs().max())});
  EXPECT_TRUE(state->current_amaxes().equal(expected)) << state->current_amaxes();

  state->update_();
  layer->eval();
  torch::NoGradGuard no_grad;
  layer->forward(x1 * 100);
  EXPECT_TRUE(state->current_amaxes().equal(torch::zeros({3})));
}

// Outliers beyond the scaled range saturate instead of turning into NaN; an inf (an fp16
// overflow) still reaches the output, under both recipes, so a loss scaler skips the step.
TEST(Float8LinearTest, SaturatesOutliersButPropagatesOverflow) {
  torch::manual_seed(4);
  for (ScalingRecipe recipe : {ScalingRecipe::kCurrent, ScalingRecipe::kDelayed}) {
    SCOPED_TRACE(mantissa::fp8::to_string(recipe));
    Float8Linear layer(16, 16);
    auto state = std::make_shared<Float8ScalingState>(Float8Recipe().amax_history_len(2));
    if (recipe == ScalingRecipe::kDelayed) {
      layer->enable_delayed_scaling(state, state->add_layer("fc"));
    } else {
      layer->enable_current_scaling();
    }
    auto x = torch::randn({4, 16});
    x[0][0] = 1e4;  // delayed scale 1: beyond e4m3's 448
    auto grad_output = torch::randn({4, 16});
    grad_output[2][1] = 1e6;  // beyond e5m2's 57344
    const auto finite = run_step(layer, x, grad_output, false);
    EXPECT_TRUE(finite.output.isfinite().all().item<bool>());
    EXPECT_TRUE(finite.grad_x.isfinite().all().item<bool>());
    EXPECT_TRUE(layer->weight.grad().isfinite().all().item<bool>());

    layer->zero_grad();
    grad_output[3][0] = INFINITY;  // an overflowed fp16 gradient
    run_step(layer, x, grad_output, false);
    EXPECT_FALSE(layer->weight.grad().isfinite().all().item<bool>());
    x[1][3] = INFINITY;
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(layer->forward(x).isnan().any().item<bool>());
  }
}

TEST(Float8LinearTest, IsATorchLinearUntilEnabled) {
  torch::manual_seed(11);
  torch::nn::Linear reference(torch::nn::LinearOptions(24, 40));
  torch::manual_seed(11);
  Float8Linear layer(torch::nn::LinearOptions(24, 40));
  EXPECT_FALSE(layer->is_float8());
  EXPECT_TRUE(layer->weight.equal(reference->weight));
  EXPECT_TRUE(layer->bias.equal(reference->bias));
  std::vector<std::string> names;
  for (const auto& p : layer->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
  const auto x = torch::randn({3, 5, 24});
  EXPECT_TRUE(layer->forward(x).equal(reference->forward(x)));

  Float8Linear shared(reference);
  EXPECT_TRUE(shared->weight.is_same(reference->weight));
  layer->enable_current_scaling();
  EXPECT_THAT(
      [&] {
        layer->forward(torch::randn({2, 23}));
      },
      ::testing::ThrowsMessage<c10::ValueError>(
          HasSubstr("Float8Linear(in_features=24) got an input of shape [2, 23]")));
  EXPECT_THAT(
      [&] {
        layer->forward(torch::randn({2, 24}, torch::kDouble));
      },
      ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("got Double")));
  std::ostringstream printed;
  printed << *layer;
  EXPECT_THAT(printed.str(), HasSubstr("in_features=24, out_features=40, bias=true, fp8=current"));
}

// ------------------------------------------------------------------------------------------------
// convert_to_float8_training

struct MixedModelImpl : torch::nn::Module {
  Float8Linear embed{nullptr}, hidden1{nullptr}, odd{nullptr}, hidden2{nullptr}, head{nullptr};
  torch::nn::Linear plain{nullptr};
  MixedModelImpl() {
    embed = register_module("embed", Float8Linear(32, 64));
    hidden1 = register_module("hidden1", Float8Linear(64, 64));
    odd = register_module("odd", Float8Linear(64, 40));
    plain = register_module("plain", torch::nn::Linear(64, 64));
    hidden2 = register_module("hidden2", Float8Linear(64, 32));
    head = register_module("head", Float8Linear(32, 16));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(embed->forward(x));
    x = torch::relu(hidden1->forward(x));
    x = torch::relu(plain->forward(x)) + odd->forward(x).mean(-1, /*keepdim=*/true);
    return head->forward(torch::relu(hidden2->forward(x)));
  }
};
TORCH_MODULE(MixedModel);

TEST(ConvertToFloat8Test, DefaultFilterSkipsEndsAndOddShapes) {
  torch::manual_seed(5);
  MixedModel model;
  std::vector<torch::Tensor> before = model->parameters();
  const auto conversion = mantissa::fp8::convert_to_float8_training(*model);
  EXPECT_EQ(conversion.float8_layers, (std::vector<std::string>{"hidden1", "hidden2"}));
  EXPECT_EQ(conversion.filtered_out, (std::vector<std::string>{"embed", "odd", "head"}));
  EXPECT_EQ(conversion.not_convertible, (std::vector<std::string>{"plain"}));
  EXPECT_TRUE(model->hidden1->is_float8());
  EXPECT_FALSE(model->head->is_float8());
  ASSERT_NE(conversion.state, nullptr);
  EXPECT_EQ(conversion.state->num_scales(), 6);
  EXPECT_EQ(conversion.state->names()[3], "hidden2.input");
  // The same parameters under the same names: optimizers and checkpoints do not notice.
  const auto after = model->parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(after[i].is_same(before[i]));
  EXPECT_THAT(conversion.describe(),
              HasSubstr("fp8 delayed (HYBRID, amax history 1024, max, margin 0): 2 of 6 linear "
                        "layers (hidden1, hidden2); high precision: embed, odd, head; "
                        "torch::nn::Linear, not convertible (declare as Float8Linear): plain"));
}

TEST(ConvertToFloat8Test, CustomFilterAndCurrentRecipe) {
  MixedModel model;
  const auto conversion = mantissa::fp8::convert_to_float8_training(
      *model, Float8Recipe().recipe(ScalingRecipe::kCurrent).fp8_format(Float8Format::kE4M3),
      [](const mantissa::fp8::LinearLayerInfo& layer) { return layer.name != "hidden1"; });
  EXPECT_EQ(conversion.float8_layers,
            (std::vector<std::string>{"embed", "odd", "hidden2", "head"}));
  EXPECT_EQ(conversion.state, nullptr);
  EXPECT_EQ(model->head->fp8_format(), Float8Format::kE4M3);
  EXPECT_THAT(conversion.describe(), HasSubstr("fp8 current (E4M3): 4 of 6 linear layers"));
  EXPECT_THAT([&] { mantissa::fp8::convert_to_float8_training(*model, Float8Recipe().margin(-2)); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr("fp8_margin")));
}

// A few AdamW steps of the converted model under bf16 autocast with the delayed recipe, the
// state updated after each step: the loss falls as with the high-precision model, and resuming
// from a saved state (weights, optimizer, scaling state) repeats the run bit for bit.
TEST(ConvertToFloat8Test, TrainsAndResumesBitwiseWithDelayedScaling) {
  auto make = [] {
    torch::manual_seed(21);
    return MixedModel();
  };
  // Seeded: LibTorch's default generator starts from another seed in every process.
  torch::manual_seed(22);
  const auto data = torch::randn({64, 32});
  const auto target = torch::randn({64, 16});
  auto train = [&](MixedModel& model, mantissa::fp8::Float8Conversion& conversion,
                   torch::optim::AdamW& optimizer, int steps) {
    std::vector<float> losses;
    for (int step = 0; step < steps; ++step) {
      optimizer.zero_grad();
      torch::Tensor loss;
      {
        mantissa::amp::Autocast guard(torch::kCPU, torch::kBFloat16);
        loss = torch::mse_loss(model->forward(data).to(torch::kFloat), target);
      }
      loss.backward();
      optimizer.step();
      conversion.state->update_();
      losses.push_back(loss.item<float>());
    }
    return losses;
  };
  MixedModel model = make();
  auto conversion =
      mantissa::fp8::convert_to_float8_training(*model, Float8Recipe().amax_history_len(8));
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  const auto first = train(model, conversion, optimizer, 6);
  EXPECT_LT(first.back(), first.front() * 0.9f);

  // Snapshot after 6 steps, continue 3 steps; then restore the snapshot in a fresh model.
  std::vector<torch::Tensor> weights;
  for (const auto& p : model->parameters()) weights.push_back(p.detach().clone());
  std::stringstream optimizer_bytes;
  {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to(optimizer_bytes);
  }
  const auto scaling = conversion.state->state_dict();
  const auto continued = train(model, conversion, optimizer, 3);

  MixedModel resumed = make();
  auto resumed_conversion =
      mantissa::fp8::convert_to_float8_training(*resumed, Float8Recipe().amax_history_len(8));
  {
    torch::NoGradGuard no_grad;
    const auto params = resumed->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(weights[i]);
  }
  torch::optim::AdamW resumed_optimizer(resumed->parameters(), torch::optim::AdamWOptions(1e-2));
  {
    torch::serialize::InputArchive archive;
    archive.load_from(optimizer_bytes);
    resumed_optimizer.load(archive);
  }
  resumed_conversion.state->load_state_dict(scaling);
  const auto again = train(resumed, resumed_conversion, resumed_optimizer, 3);
  EXPECT_EQ(again, continued);
  EXPECT_EQ(bits_of(resumed_conversion.state->scales()), bits_of(conversion.state->scales()));
}

// ------------------------------------------------------------------------------------------------
// On the GPU (SM89+): cuBLASLt's FP8 GEMMs with column-major second operands, the padded token
// dimension of grad_weight, no host sync in forward, backward or the state update, and the CPU
// path's numbers up to the GEMM's accumulation order.

/// CUDA's sync debug mode set to "error" for a scope: any host sync inside throws.
class SyncIsAnError {
 public:
#ifdef MANTISSA_TEST_HAVE_C10_CUDA
  SyncIsAnError() : previous_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~SyncIsAnError() { c10::cuda::warning_state().set_sync_debug_mode(previous_); }

 private:
  c10::cuda::SyncDebugMode previous_;
#endif
};

TEST(Float8LinearCudaTest, MatchesTheCpuPathWithoutHostSync) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  const auto& info = mantissa::detail::query_device_info();
  if (info.cuda_capability_major * 10 + info.cuda_capability_minor < 89) {
    GTEST_SKIP() << "FP8 _scaled_mm needs compute capability 8.9 or newer";
  }
  for (ScalingRecipe recipe : {ScalingRecipe::kCurrent, ScalingRecipe::kDelayed}) {
    SCOPED_TRACE(mantissa::fp8::to_string(recipe));
    torch::manual_seed(8);
    Float8Linear cpu(64, 48);
    Float8Linear gpu(64, 48);
    {
      torch::NoGradGuard no_grad;
      gpu->weight.copy_(cpu->weight);
      gpu->bias.copy_(cpu->bias);
    }
    gpu->to(torch::kCUDA);
    auto cpu_state = std::make_shared<Float8ScalingState>(Float8Recipe().amax_history_len(4));
    auto gpu_state = std::make_shared<Float8ScalingState>(Float8Recipe().amax_history_len(4),
                                                          torch::Device(torch::kCUDA));
    if (recipe == ScalingRecipe::kDelayed) {
      cpu->enable_delayed_scaling(cpu_state, cpu_state->add_layer("fc"));
      gpu->enable_delayed_scaling(gpu_state, gpu_state->add_layer("fc"));
    } else {
      cpu->enable_current_scaling();
      gpu->enable_current_scaling();
    }
    for (int step = 0; step < 2; ++step) {
      const auto x = torch::randn({3, 7, 64}).to(torch::kBFloat16);  // 21 tokens: padded to 32
      const auto g = (torch::randn({3, 7, 48}) * 1e-3).to(torch::kBFloat16);
      const auto want = run_step(cpu, x, g, true);
      auto xg = x.cuda().requires_grad_(true);
      torch::Tensor y;
      {
        SyncIsAnError no_sync;
        mantissa::amp::Autocast guard(torch::kCUDA, torch::kBFloat16);
        y = gpu->forward(xg);
        y.backward(g.cuda());
        if (recipe == ScalingRecipe::kDelayed) gpu_state->update_();
      }
      if (recipe == ScalingRecipe::kDelayed) cpu_state->update_();
      expect_close_ulps(y.cpu(), want.output, 2.0, torch::kBFloat16, 1e-3, "output");
      expect_close_ulps(xg.grad().cpu(), want.grad_x, 2.0, torch::kBFloat16, 1e-6, "grad_x");
      expect_close_ulps(gpu->weight.grad().cpu(), cpu->weight.grad(), 2.0, torch::kBFloat16, 1e-6,
                        "grad_weight");
      cpu->zero_grad();
      gpu->zero_grad();
    }
    if (recipe == ScalingRecipe::kDelayed) {
      EXPECT_EQ(bits_of(gpu_state->scales()), bits_of(cpu_state->scales()));
    }
  }
}

}  // namespace
