// include/mantissa/optim/muon.h: `--optim muon` against torch.optim.Muon + torch.optim.AdamW
// over the same split (tests/golden/make_muon_golden.py), the split by name, and the checks.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/optim/muon.h>
#include <mantissa/optim/optimizer_registry.h>
#include <mantissa/training_arguments.h>

#include "golden_util.h"

namespace {

using mantissa::optim::Muon;
using mantissa::optim::MuonOptions;
using mantissa::optim::MuonParamState;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// The script's `pattern`: the same float64 formula of the element's index and the step.
torch::Tensor pattern(const std::vector<int64_t>& shape, int salt, int step, double scale) {
  int64_t n = 1;
  for (const auto d : shape) n *= d;
  const auto i = torch::arange(n, torch::kDouble);
  return (torch::sin(i * 0.37 + 1.3 * salt + 0.71 * step) * (1 + 0.5 * torch::cos(i * 0.11)) *
          scale)
      .reshape(shape);
}

std::string number(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

// `--optim muon` over HF's weight-decay groups of `names` / `params`, as the Trainer builds it.
std::unique_ptr<torch::optim::Optimizer> build(const mantissa::TrainingArguments& args,
                                               const std::vector<std::string>& names,
                                               const std::vector<torch::Tensor>& params) {
  mantissa::optim::OptimizerBuildInputs inputs{args, {}, /*first_group_decays=*/true};
  std::vector<torch::Tensor> decay, no_decay;
  std::vector<std::string> decay_names, no_decay_names;
  for (std::size_t i = 0; i < params.size(); ++i) {
    (params[i].dim() >= 2 ? decay : no_decay).push_back(params[i]);
    (params[i].dim() >= 2 ? decay_names : no_decay_names).push_back(names[i]);
  }
  inputs.groups.emplace_back(decay);
  inputs.groups.emplace_back(no_decay);
  inputs.group_names = {decay_names, no_decay_names};
  return mantissa::optim::find_optimizer("muon")->build(std::move(inputs));
}

TEST(MuonTest, MatchesTorchMuonAndAdamWOverTwentySteps) {
  const auto& doc = mantissa_test::golden_file("muon_golden.json");
  for (const auto& c : doc["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto dtype = mantissa_test::golden_dtype(c["dtype"]);
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    for (std::size_t k = 0; k < c["params"].size(); ++k) {
      names.push_back(c["params"][k]["name"]);
      shapes.push_back(c["params"][k]["shape"].get<std::vector<int64_t>>());
      params.push_back(pattern(shapes[k], static_cast<int>(k), -1, 0.5).to(dtype).requires_grad_());
    }
    const auto& abc = c["ns_coefficients"];
    const std::string extra = "momentum=" + number(c["momentum"]) +
                              ",nesterov=" + (c["nesterov"].get<bool>() ? "True" : "False") +
                              ",ns_steps=" + std::to_string(c["ns_steps"].get<int>()) +
                              ",adjust_lr_fn=" + c["adjust_lr_fn"].get<std::string>() +
                              ",adamw_lr=" + number(c["adamw_lr"]) +
                              ",ns_coefficients=" + number(abc[0]) + ":" + number(abc[1]) + ":" +
                              number(abc[2]);
    const auto args = mantissa::TrainingArguments()
                          .optim("muon")
                          .optim_args(extra)
                          .learning_rate(c["lr"].get<double>())
                          .weight_decay(c["weight_decay"].get<double>())
                          .adam_beta1(c["betas"][0].get<double>())
                          .adam_beta2(c["betas"][1].get<double>())
                          .adam_epsilon(c["adam_eps"].get<double>());
    auto optimizer = build(args, names, params);
    const int steps = doc["steps"].get<int>();
    for (int step = 0; step < steps; ++step) {
      for (std::size_t k = 0; k < params.size(); ++k) {
        params[k].mutable_grad() =
            pattern(shapes[k], static_cast<int>(k), step, 0.1 * (1 + step % 3)).to(dtype);
      }
      optimizer->step();
    }
    for (std::size_t k = 0; k < params.size(); ++k) {
      const auto& p = c["params"][k];
      SCOPED_TRACE(names[k]);
      const auto theirs =
          torch::tensor(p["final"].get<std::vector<double>>(), torch::kDouble).reshape(shapes[k]);
      const auto ours = params[k].to(torch::kDouble);
      const double worst =
          ((ours - theirs).abs() / theirs.abs().clamp_min(1.0)).max().item<double>();
      const bool muon_matrix = p["state"].contains("momentum_buffer");
      if (muon_matrix) {
        // Where the golden file was written the difference is 0. Elsewhere (another CPU's bf16
        // GEMM, or ATEN_CPU_CAPABILITY=default rounding the momentum differently) the bf16
        // Newton-Schulz output can round the other way: allow per step a fraction of the
        // largest step an element can take, lr * adjust * |O| with |O| near 1 (1/128 of it for
        // fp32 parameters, 1/8 for bf16 ones, whose momentum is bf16 too). Measured under
        // ATEN_CPU_CAPABILITY=default: 1.2e-4 (fp32), 0.035 (bf16), against 5.4e-3 and 0.087.
        const double rows = static_cast<double>(shapes[k][0]);
        const double cols = static_cast<double>(shapes[k][1]);
        const double adjust = c["adjust_lr_fn"] == "match_rms_adamw"
                                  ? 0.2 * std::sqrt(std::max(rows, cols))
                                  : std::sqrt(std::max(1.0, rows / cols));
        const double largest_step = c["lr"].get<double>() * adjust;
        const double tolerance =
            steps * largest_step * std::ldexp(1.0, dtype == torch::kBFloat16 ? -3 : -7);
        EXPECT_LE((ours - theirs).abs().max().item<double>(), tolerance);
      } else if (dtype == torch::kBFloat16) {
        // One bf16 unit in the last place of the value.
        const auto ulp = theirs.abs().clamp_min(1e-30) * std::ldexp(1.0, -7);
        EXPECT_TRUE(((ours - theirs).abs() <= ulp).all().item<bool>()) << "beyond one bf16 ulp";
      } else {
        EXPECT_LE(worst, 1e-5);
      }
      const auto& state = static_cast<const MuonParamState&>(
          *optimizer->state().at(params[k].unsafeGetTensorImpl()));
      double worst_state = 0;
      for (const auto& [key, tensor] : std::vector<std::pair<std::string, torch::Tensor>>{
               {"momentum_buffer", state.momentum_buffer()},
               {"exp_avg", state.exp_avg()},
               {"exp_avg_sq", state.exp_avg_sq()}}) {
        ASSERT_EQ(tensor.defined(), p["state"].contains(key)) << key;
        if (!tensor.defined()) continue;
        const auto expected =
            torch::tensor(p["state"][key].get<std::vector<double>>(), torch::kDouble);
        worst_state =
            std::max(worst_state, ((tensor.to(torch::kDouble).flatten() - expected).abs() /
                                   expected.abs().clamp_min(1e-3))
                                      .max()
                                      .item<double>());
      }
      // The gradients are fixed, so the fp32 states do not see the iteration's rounding.
      if (dtype != torch::kBFloat16) EXPECT_LE(worst_state, 1e-5);
      if (!p["step"].is_null()) EXPECT_EQ(state.step(), p["step"].get<double>());
      std::cout << "[ muon ] " << c["name"].get<std::string>() << " " << names[k]
                << ": max relative parameter difference " << worst << ", state " << worst_state
                << "\n";
    }
  }
}

TEST(MuonTest, SplitsByNameAndShape) {
  std::vector<std::string> names{"wte.weight", "blocks.0.attn.qkv.weight", "blocks.0.ln1.weight",
                                 "blocks.0.conv.weight", "lm_head.weight"};
  std::vector<torch::Tensor> params{torch::zeros({10, 4}), torch::zeros({12, 4}), torch::zeros({4}),
                                    torch::zeros({2, 2, 2}), torch::zeros({10, 4})};
  auto is_muon = [](torch::optim::Optimizer& optimizer, const torch::Tensor& t) {
    for (const auto& group : optimizer.param_groups()) {
      for (const auto& p : group.params()) {
        if (p.is_same(t)) return static_cast<const MuonOptions&>(group.options()).use_muon();
      }
    }
    ADD_FAILURE() << "not in the optimizer";
    return false;
  };
  const auto args = mantissa::TrainingArguments().optim("muon").weight_decay(0.1);
  auto optimizer = build(args, names, params);
  EXPECT_FALSE(is_muon(*optimizer, params[0])) << "an embedding stays on AdamW";
  EXPECT_TRUE(is_muon(*optimizer, params[1]));
  EXPECT_FALSE(is_muon(*optimizer, params[2]));
  EXPECT_FALSE(is_muon(*optimizer, params[3])) << "Muon takes 2-d tensors only";
  EXPECT_FALSE(is_muon(*optimizer, params[4])) << "the LM head stays on AdamW";
  // The 1-d group does not decay; the others do.
  for (const auto& group : optimizer->param_groups()) {
    const auto& o = static_cast<const MuonOptions&>(group.options());
    EXPECT_EQ(o.weight_decay(), group.params()[0].dim() == 1 ? 0.0 : 0.1);
  }
  // adamw_params replaces the list of names kept on AdamW.
  auto custom =
      build(mantissa::TrainingArguments(args).optim_args("adamw_params=qkv"), names, params);
  EXPECT_TRUE(is_muon(*custom, params[0]));
  EXPECT_FALSE(is_muon(*custom, params[1]));
}

TEST(MuonTest, RefusesBadOptionsNamingTheValue) {
  const auto validate = [](const std::string& extra) {
    return [extra] {
      mantissa::TrainingArguments().optim("muon").optim_args(extra).use_cpu(true).validate();
    };
  };
  EXPECT_THAT(validate("adjust_lr_fn=sqrt"),
              ThrowsMessage<c10::ValueError>(HasSubstr("adjust_lr_fn sqrt is not supported")));
  EXPECT_THAT(validate("ns_steps=100"),
              ThrowsMessage<c10::ValueError>(HasSubstr("ns_steps must be in [1, 100), got 100")));
  EXPECT_THAT(validate("momentum=-1"),
              ThrowsMessage<c10::ValueError>(HasSubstr("momentum should be >= 0 but is: -1")));
  EXPECT_THAT(validate("ns_coefficients=1:2"),
              ThrowsMessage<c10::ValueError>(HasSubstr("must be three numbers a:b:c")));
  EXPECT_THAT(validate("nesterov=maybe"),
              ThrowsMessage<c10::ValueError>(HasSubstr("nesterov=maybe is not a boolean")));
  EXPECT_NO_THROW(validate("adjust_lr_fn=match_rms_adamw,nesterov=False,ns_steps=3")());
  EXPECT_THAT([] { Muon({torch::optim::OptimizerParamGroup({torch::zeros({3})})}); },
              ThrowsMessage<c10::ValueError>(HasSubstr("a use_muon group holds one of shape [3]")));
}

TEST(MuonTest, OrthogonalisesToSingularValuesNearOne) {
  torch::manual_seed(3);
  const auto g = torch::randn({16, 8});
  const auto o = mantissa::optim::muon_orthogonalise(g, MuonOptions());
  EXPECT_EQ(o.scalar_type(), torch::kBFloat16);
  const auto s = torch::linalg_svdvals(o.to(torch::kFloat));
  // The quintic iteration leaves them roughly in [0.5, 1.5], not at 1 exactly.
  EXPECT_GT(s.min().item<float>(), 0.3);
  EXPECT_LT(s.max().item<float>(), 1.5);
  const auto sg = torch::linalg_svdvals(g);
  EXPECT_GT((sg.max() / sg.min()).item<float>(), 2.0f) << "the input was not already orthogonal";
}

}  // namespace
