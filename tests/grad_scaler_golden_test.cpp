// Golden parity with torch.amp.GradScaler: tests/golden/make_grad_scaler_golden.py ran the same
// 50-step scenario in Python (PyTorch from the project venv) and wrote its trajectory. Scale and
// growth tracker must match exactly: they follow from which steps overflowed, and each update is
// one float multiply. Parameters match to kRtol * |value| + kAtol: matmul, tanh and the loss's
// reduction round differently in the last bit on another CPU or under another
// ATEN_CPU_CAPABILITY, and 50 steps of momentum carry those bits along. The generator keeps every
// weight below 10, so the absolute part stays meaningful.
#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <mantissa/amp/grad_scaler.h>
#include "golden_util.h"

namespace {

using mantissa::amp::GradScaler;
using mantissa::amp::GradScalerOptions;
using nlohmann::json;

const json& golden() { return mantissa_test::golden_file("grad_scaler_golden.json"); }

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

torch::Tensor tensor_from(const json& values, at::IntArrayRef shape) {
  std::vector<float> data = values.get<std::vector<float>>();
  return torch::from_blob(data.data(), shape, torch::kFloat).clone();
}

class GradScalerGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GradScalerGoldenTest, MatchesTorchAmpGradScaler) {
  const auto& doc = golden();
  const auto& scenario = doc["scenarios"][GetParam()];
  const auto& settings = scenario["settings"];

  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 4));
  auto params = model->named_parameters();
  {
    torch::NoGradGuard no_grad;
    for (auto& item : params) {
      item.value().copy_(tensor_from(doc["initial_params"][item.key()], item.value().sizes()));
    }
  }
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(doc["optimizer"]["lr"].get<double>())
                                  .momentum(doc["optimizer"]["momentum"].get<double>()));
  GradScaler scaler(GradScalerOptions()
                        .init_scale(settings["init_scale"].get<double>())
                        .growth_factor(settings["growth_factor"].get<double>())
                        .backoff_factor(settings["backoff_factor"].get<double>())
                        .growth_interval(settings["growth_interval"].get<std::int64_t>()));

  const int steps = doc["steps"].get<int>();
  int skipped = 0;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const auto& batch = doc["batches"][step];
    const auto x = tensor_from(batch["x"], {6, 8});
    const auto y = tensor_from(batch["y"], {6, 4});
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    scaler.scale(loss).backward();
    const auto inject = doc["inject"].find(std::to_string(step));
    if (inject != doc["inject"].end()) {
      const auto kind = (*inject)[0].get<std::string>();
      const float value = kind == "nan"   ? std::numeric_limits<float>::quiet_NaN()
                          : kind == "inf" ? std::numeric_limits<float>::infinity()
                                          : -std::numeric_limits<float>::infinity();
      torch::NoGradGuard no_grad;
      params[(*inject)[1].get<std::string>()].mutable_grad().view({-1})[1].fill_(value);
    }
    scaler.step(optimizer);
    scaler.update();
    skipped += scaler.last_step_skipped();
    if (step == doc["huge_batch"].get<int>()) {
      EXPECT_TRUE(scaler.last_step_skipped()) << "the huge batch's scaled gradients overflow";
    }

    const auto& expected = scenario["trajectory"][step];
    ASSERT_EQ(scaler.get_scale(), expected["scale"].get<double>());
    ASSERT_EQ(scaler.get_growth_tracker(), expected["growth_tracker"].get<std::int64_t>());
    for (auto& item : params) {
      const auto want = tensor_from(expected["params"][item.key()], item.value().sizes());
      ASSERT_LT(want.abs().max().item<double>(), doc["bound"].get<double>())
          << "the reference run must keep its weights bounded, or kAtol means nothing";
      ASSERT_TRUE(torch::allclose(item.value(), want, kRtol, kAtol))
          << item.key() << " max |diff| " << (item.value() - want).abs().max().item<double>()
          << ", largest |value| " << want.abs().max().item<double>();
    }
  }
  EXPECT_EQ(scaler.skipped_steps(), skipped);
  EXPECT_GE(skipped, 8) << "the scenario injects seven overflows and has one huge batch";

  const auto& want_state = scenario["final_state_dict"];
  const auto state = scaler.state_dict();
  EXPECT_EQ(state.at("scale").toDouble(), want_state["scale"].get<double>());
  EXPECT_EQ(state.at("_growth_tracker").toInt(), want_state["_growth_tracker"].get<std::int64_t>());
  EXPECT_EQ(state.at("growth_interval").toInt(), want_state["growth_interval"].get<std::int64_t>());
}

INSTANTIATE_TEST_SUITE_P(Scenarios, GradScalerGoldenTest,
                         ::testing::Values("pytorch_defaults_fast_growth", "odd_factors"));

}  // namespace
