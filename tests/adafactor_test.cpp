// include/mantissa/optim/adafactor.h: 20 steps against HF's Adafactor as HF's Trainer builds it
// (tests/golden/make_adafactor_golden.py), its checks, and its archive.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/optim/adafactor.h>
#include <mantissa/optim/optimizer_registry.h>
#include <mantissa/training_arguments.h>

#include "golden_util.h"

namespace {

using mantissa::optim::Adafactor;
using mantissa::optim::AdafactorOptions;
using mantissa::optim::AdafactorParamState;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

torch::Tensor from_values(const nlohmann::json& values, const std::vector<int64_t>& shape,
                          c10::ScalarType dtype) {
  return torch::tensor(values.get<std::vector<double>>(), torch::kDouble).reshape(shape).to(dtype);
}

// The largest |a - b| relative to max(1, |b|).
double max_relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto bd = b.to(torch::kDouble);
  return ((a.to(torch::kDouble) - bd).abs() / bd.abs().clamp_min(1.0)).max().item<double>();
}

// The options and groups of a golden case, built through the registry entry as `--optim
// adafactor --optim_args ...` does.
std::unique_ptr<torch::optim::Optimizer> build_case(const nlohmann::json& c,
                                                    std::vector<torch::Tensor>& params) {
  std::string extra;
  for (const auto& [key, value] : c["optim_args"].items()) {
    std::ostringstream pair;
    pair.precision(17);
    pair << key << "=" << value.get<double>();
    extra += (extra.empty() ? "" : ",") + pair.str();
  }
  auto args = mantissa::TrainingArguments()
                  .optim("adafactor")
                  .learning_rate(c["lr"].get<double>())
                  .weight_decay(c["weight_decay"].get<double>());
  if (!extra.empty()) args.optim_args(extra);
  mantissa::optim::OptimizerBuildInputs inputs{args, {}, /*first_group_decays=*/true};
  std::vector<torch::Tensor> decay, no_decay;
  for (std::size_t i = 0; i < params.size(); ++i) {
    (c["params"][i]["group"].get<int>() == 0 ? decay : no_decay).push_back(params[i]);
  }
  inputs.groups.emplace_back(decay);
  inputs.groups.emplace_back(no_decay);
  return mantissa::optim::find_optimizer("adafactor")->build(std::move(inputs));
}

TEST(AdafactorTest, MatchesHfAdafactorOverTwentySteps) {
  const auto& doc = mantissa_test::golden_file("adafactor_golden.json");
  for (const auto& c : doc["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto dtype = mantissa_test::golden_dtype(c["dtype"]);
    std::vector<torch::Tensor> params;
    for (const auto& p : c["params"]) {
      params.push_back(from_values(p["initial"], p["shape"], dtype).requires_grad_());
    }
    auto optimizer = build_case(c, params);
    ASSERT_NE(dynamic_cast<Adafactor*>(optimizer.get()), nullptr);
    for (const auto& step_grads : c["grads"]) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        params[i].mutable_grad() = from_values(step_grads[i], params[i].sizes().vec(), dtype);
      }
      optimizer->step();
    }
    double worst_param = 0, worst_state = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& p = c["params"][i];
      const auto expected = from_values(p["final"], p["shape"], dtype);
      if (dtype == torch::kBFloat16) {
        // One bf16 unit in the last place: both round the same fp32 result to nearest.
        const auto ulp = expected.to(torch::kFloat).abs() * std::ldexp(1.0, -7);
        EXPECT_TRUE(((params[i].to(torch::kFloat) - expected.to(torch::kFloat)).abs() <=
                     ulp.clamp_min(1e-30))
                        .all()
                        .item<bool>())
            << p["name"];
      } else {
        worst_param = std::max(worst_param, max_relative_error(params[i], expected));
      }
      const auto& state = static_cast<const AdafactorParamState&>(
          *optimizer->state().at(params[i].unsafeGetTensorImpl()));
      EXPECT_EQ(state.step(), p["step"].get<int64_t>());
      const std::map<std::string, torch::Tensor> ours{{"exp_avg_sq_row", state.exp_avg_sq_row()},
                                                      {"exp_avg_sq_col", state.exp_avg_sq_col()},
                                                      {"exp_avg_sq", state.exp_avg_sq()},
                                                      {"exp_avg", state.exp_avg()}};
      for (const auto& [key, tensor] : ours) {
        ASSERT_EQ(tensor.defined(), p["state"].contains(key)) << p["name"] << " " << key;
        if (!tensor.defined()) continue;
        const auto expected_state =
            from_values(p["state"][key]["values"], p["state"][key]["shape"], torch::kFloat);
        ASSERT_EQ(tensor.sizes(), expected_state.sizes()) << key;
        EXPECT_EQ(tensor.scalar_type(), torch::kFloat) << key;
        if (dtype != torch::kBFloat16) {
          worst_state = std::max(worst_state, max_relative_error(tensor, expected_state));
        }
      }
    }
    EXPECT_LE(worst_param, 1e-6);
    EXPECT_LE(worst_state, 1e-6);
    std::cout << "[ adafactor ] " << c["name"].get<std::string>()
              << ": max relative difference, parameters " << worst_param << ", state "
              << worst_state << "\n";
  }
}

TEST(AdafactorTest, RefusesBadOptionsNamingTheValue) {
  const auto error = [](const std::string& extra) {
    return [extra] {
      mantissa::TrainingArguments().optim("adafactor").optim_args(extra).use_cpu(true).validate();
    };
  };
  EXPECT_THAT(error("decay_rate=0.5"),
              ThrowsMessage<c10::ValueError>(HasSubstr("decay_rate must be negative")));
  EXPECT_THAT(error("clip_threshold=0"),
              ThrowsMessage<c10::ValueError>(HasSubstr("clip_threshold must be positive, got 0")));
  EXPECT_THAT(error("beta1=1.5"),
              ThrowsMessage<c10::ValueError>(HasSubstr("beta1 must be in [0, 1] or None")));
  EXPECT_THAT(error("relative_step=True"),
              ThrowsMessage<c10::ValueError>(
                  HasSubstr("optim adafactor does not take 'relative_step' (it takes beta1, "
                            "clip_threshold, decay_rate, eps)")));
  EXPECT_THAT(error("eps=abc"), ThrowsMessage<c10::ValueError>(
                                    HasSubstr("optim_args: eps=abc is not a finite number")));
  EXPECT_THAT(error("beta1"), ThrowsMessage<c10::ValueError>(
                                  HasSubstr("'beta1' in 'beta1' is not one key=value pair")));
  EXPECT_NO_THROW(error("beta1 = 0.9, clip_threshold=2")());
  EXPECT_NO_THROW(error("beta1=None")());
}

TEST(AdafactorTest, SavesAndLoadsItsStateUnderHfKeys) {
  torch::manual_seed(0);
  auto w = torch::randn({4, 3}).requires_grad_();
  auto b = torch::randn({4}).requires_grad_();
  Adafactor first({w, b}, AdafactorOptions(0.1).beta1(0.5));
  for (int i = 0; i < 2; ++i) {
    w.mutable_grad() = torch::randn({4, 3});
    b.mutable_grad() = torch::randn({4});
    first.step();
  }
  std::ostringstream saved;
  torch::serialize::OutputArchive out;
  first.save(out);
  out.save_to(saved);

  auto w2 = w.detach().clone().requires_grad_();
  auto b2 = b.detach().clone().requires_grad_();
  Adafactor second({w2, b2}, AdafactorOptions(0.1).beta1(0.5));
  std::istringstream in_stream(saved.str());
  torch::serialize::InputArchive in;
  in.load_from(in_stream);
  second.load(in);
  const auto& state =
      static_cast<const AdafactorParamState&>(*second.state().at(w2.unsafeGetTensorImpl()));
  EXPECT_EQ(state.step(), 2);
  EXPECT_EQ(state.exp_avg_sq_row().sizes(), (std::vector<int64_t>{4}));
  EXPECT_EQ(state.exp_avg_sq_col().sizes(), (std::vector<int64_t>{3}));
  // The next step is the same in both.
  const auto gw = torch::randn({4, 3});
  const auto gb = torch::randn({4});
  w.mutable_grad() = gw;
  b.mutable_grad() = gb;
  w2.mutable_grad() = gw;
  b2.mutable_grad() = gb;
  first.step();
  second.step();
  EXPECT_TRUE(torch::equal(w, w2));
  EXPECT_TRUE(torch::equal(b, b2));

  // A factored moment of the wrong shape is refused with both shapes.
  auto w3 = torch::randn({3, 4}).requires_grad_();
  auto b3 = torch::randn({4}).requires_grad_();
  Adafactor wrong({w3, b3}, AdafactorOptions(0.1).beta1(0.5));
  std::istringstream again(saved.str());
  torch::serialize::InputArchive in2;
  in2.load_from(again);
  EXPECT_THAT([&] { wrong.load(in2); },
              ThrowsMessage<c10::ValueError>(HasSubstr(
                  "the state 'exp_avg_sq_row' of parameter 0 has shape [4] but [3] was expected")));
}

}  // namespace
