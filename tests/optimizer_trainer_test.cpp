// The Trainer with --optim adafactor, adamw_torch_8bit and muon: each trains in every precision
// mode, resumes bit for bit, leaves everything unchanged on a step the fp16 scaler skips, and the
// combinations it cannot run are refused naming both settings.
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/optim/adafactor.h>
#include <mantissa/optim/adamw_8bit.h>
#include <mantissa/optim/muon.h>
#include <mantissa/trainer.h>

#include "toy_training.h"

namespace {

using mantissa::Trainer;
using mantissa::TrainingArguments;
using mantissa_test::toy_args;
using mantissa_test::ToyDataset;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// 8 -> 512 -> 4: fc1.weight has 4096 elements, so 8-bit AdamW quantises it (and keeps fc2's
// 2048 plain); Muon takes both weights, AdamW the biases.
struct WideMlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{8, 512};
  torch::nn::Linear fc2{512, 4};
  WideMlpImpl() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
};
TORCH_MODULE(WideMlp);

WideMlp make_model(c10::ScalarType dtype = torch::kFloat) {
  torch::manual_seed(1);
  WideMlp model;
  model->to(dtype);
  return model;
}

std::vector<torch::Tensor> weights_of(const WideMlp& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].scalar_type() != b[i].scalar_type()) return false;
    const auto bits = a[i].element_size() == 4 ? torch::kInt : torch::kShort;
    if (!torch::equal(a[i].view(bits), b[i].view(bits))) return false;
  }
  return true;
}

bool all_finite(const std::vector<torch::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (!torch::isfinite(t).all().item<bool>()) return false;
  }
  return true;
}

class NewOptimizerTrainerTest : public ::testing::TestWithParam<const char*> {
 protected:
  TrainingArguments args(const std::string& dir) const {
    return toy_args(dir).optim(GetParam()).learning_rate(3e-3).max_steps(6);
  }
};

TEST_P(NewOptimizerTrainerTest, TrainsInEveryPrecisionMode) {
  struct Mode {
    const char* name;
    c10::ScalarType model_dtype;
    bool bf16, fp16;
    const char* master_weights;
  };
  for (const Mode& mode : {Mode{"fp32", torch::kFloat, false, false, "auto"},
                           Mode{"bf16 autocast", torch::kFloat, true, false, "auto"},
                           Mode{"bf16 model, fp32 masters", torch::kBFloat16, true, false, "auto"},
                           Mode{"pure bf16", torch::kBFloat16, true, false, "off"},
                           Mode{"fp16 autocast + scaler", torch::kFloat, false, true, "auto"}}) {
    SCOPED_TRACE(mode.name);
    auto model = make_model(mode.model_dtype);
    const auto before = weights_of(model);
    Trainer trainer(model,
                    args(mantissa_test::toy_output_dir())
                        .bf16(mode.bf16)
                        .fp16(mode.fp16)
                        .master_weights(mode.master_weights)
                        .max_grad_norm(0.5),
                    ToyDataset(100));
    trainer.train();
    const auto after = weights_of(model);
    EXPECT_TRUE(all_finite(after));
    for (std::size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(after[i].scalar_type(), mode.model_dtype);
      EXPECT_FALSE(torch::equal(after[i], before[i])) << "parameter " << i << " did not move";
    }
    // With masters the optimizer updates the fp32 copies.
    for (const auto& group : trainer.optimizer().param_groups()) {
      for (const auto& p : group.params()) {
        EXPECT_EQ(p.scalar_type(),
                  std::string(mode.master_weights) == "auto" ? torch::kFloat : mode.model_dtype);
      }
    }
  }
}

TEST_P(NewOptimizerTrainerTest, ResumedRunContinuesBitForBit) {
  for (const bool pure_bf16 : {false, true}) {
    SCOPED_TRACE(pure_bf16 ? "pure bf16" : "fp32");
    const auto dtype = pure_bf16 ? torch::kBFloat16 : torch::kFloat;
    const auto dir = mantissa_test::toy_output_dir();
    auto run_args = args(dir).max_steps(8).save_strategy("steps").save_steps(4);
    if (pure_bf16) run_args.bf16(true).master_weights("off");
    auto straight = make_model(dtype);
    Trainer(straight, run_args, ToyDataset(100)).train();

    auto resumed = make_model(dtype);
    Trainer again(resumed, TrainingArguments(run_args).output_dir(mantissa_test::toy_output_dir()),
                  ToyDataset(100));
    again.train(dir + "/checkpoint-4");
    EXPECT_EQ(again.state().global_step, 8);
    EXPECT_TRUE(same_bits(weights_of(straight), weights_of(resumed)));
  }
}

// Pure bf16 under FusedAdamW's rules: Kahan keeps the updates nearest rounding loses (so the
// weights end elsewhere), stochastic rounding is a function of the seed, and a run resumes bit
// for bit under each (the compensation is saved; the rounding bits depend only on the seed,
// the tensor and the step).
TEST_P(NewOptimizerTrainerTest, PureBf16TakesFusedAdamWsRules) {
  auto run = [&](const char* rule, std::int64_t seed) {
    auto model = make_model(torch::kBFloat16);
    Trainer trainer(model,
                    args(mantissa_test::toy_output_dir())
                        .bf16(true)
                        .master_weights("off")
                        .learning_rate(1e-4)
                        .low_precision_update(rule)
                        .seed(seed),
                    ToyDataset(100));
    trainer.train();
    return weights_of(model);
  };
  const auto nearest = run("nearest", 7);
  const auto kahan = run("kahan", 7);
  const auto stochastic = run("stochastic_rounding", 7);
  for (const auto* weights : {&nearest, &kahan, &stochastic}) EXPECT_TRUE(all_finite(*weights));
  EXPECT_FALSE(same_bits(nearest, kahan));
  EXPECT_FALSE(same_bits(nearest, stochastic));
  EXPECT_TRUE(same_bits(stochastic, run("stochastic_rounding", 7)));
  EXPECT_FALSE(same_bits(stochastic, run("stochastic_rounding", 8)));

  for (const char* rule : {"kahan", "stochastic_rounding"}) {
    SCOPED_TRACE(rule);
    const auto dir = mantissa_test::toy_output_dir();
    const auto run_args = args(dir)
                              .bf16(true)
                              .master_weights("off")
                              .low_precision_update(rule)
                              .max_steps(8)
                              .save_strategy("steps")
                              .save_steps(4);
    auto straight = make_model(torch::kBFloat16);
    Trainer(straight, run_args, ToyDataset(100)).train();
    auto resumed = make_model(torch::kBFloat16);
    Trainer again(resumed, TrainingArguments(run_args).output_dir(mantissa_test::toy_output_dir()),
                  ToyDataset(100));
    again.train(dir + "/checkpoint-4");
    EXPECT_TRUE(same_bits(weights_of(straight), weights_of(resumed)));
  }
}

TEST_P(NewOptimizerTrainerTest, AStepTheScalerSkipsChangesNothing) {
  auto model = make_model();
  Trainer trainer(model, args(mantissa_test::toy_output_dir()).fp16(true).max_steps(4),
                  ToyDataset(100));
  int calls = 0;
  trainer.set_compute_loss([&](const mantissa::Batch& batch) {
    auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
    return ++calls == 3 ? loss * std::numeric_limits<float>::infinity() : loss;
  });
  struct Recorder : mantissa::TrainerCallback {
    WideMlp model{nullptr};
    std::vector<std::vector<torch::Tensor>> params;
    void on_step_end(const TrainingArguments&, mantissa::TrainerState&,
                     mantissa::TrainerControl&) override {
      params.push_back(weights_of(model));
    }
  };
  auto recorder = std::make_shared<Recorder>();
  recorder->model = model;
  trainer.add_callback(recorder);
  ::testing::internal::CaptureStdout();
  trainer.train();
  ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(trainer.state().skipped_steps, 1);
  ASSERT_EQ(recorder->params.size(), 4u);
  EXPECT_TRUE(same_bits(recorder->params[2], recorder->params[1])) << "the skipped step moved";
  EXPECT_FALSE(same_bits(recorder->params[3], recorder->params[2]));
}

TEST_P(NewOptimizerTrainerTest, RefusesWhatItCannotRun) {
  const auto base = args(mantissa_test::toy_output_dir());
  EXPECT_NO_THROW(TrainingArguments(base).low_precision_update("kahan").validate());
  EXPECT_NO_THROW(TrainingArguments(base).low_precision_update("stochastic_rounding").validate());
  // Sharded by whole tensors under either mode, with either state dict type (fsdp.optim_*,
  // fsdp.full_optim_* and fsdp.*optim_sharded_state_dict run them).
  EXPECT_NO_THROW(TrainingArguments(base).fsdp("shard_grad_op").validate());
  EXPECT_NO_THROW(TrainingArguments(base).fsdp("full_shard").validate());
  for (const char* fsdp : {"shard_grad_op", "full_shard"}) {
    EXPECT_NO_THROW(TrainingArguments(base)
                        .fsdp(fsdp)
                        .fsdp_config(R"({"state_dict_type": "SHARDED_STATE_DICT"})")
                        .validate());
  }
  EXPECT_THAT([&] { TrainingArguments(base).optim_args("no_such_key=1").validate(); },
              ThrowsMessage<c10::ValueError>(
                  HasSubstr("optim " + std::string(GetParam()) + " does not take 'no_such_key'")));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, NewOptimizerTrainerTest,
                         ::testing::Values("adafactor", "adamw_torch_8bit", "muon"),
                         [](const auto& info) { return std::string(info.param); });

TEST(NewOptimizerTrainerTest, TheOptimizersAreTheExpectedClasses) {
  auto build = [](const char* name) {
    auto model = make_model();
    Trainer trainer(model, toy_args(mantissa_test::toy_output_dir()).optim(name).max_steps(1),
                    ToyDataset(16));
    trainer.train();
    const auto& optimizer = trainer.optimizer();
    return std::string(typeid(optimizer).name());
  };
  EXPECT_EQ(build("adafactor"), typeid(mantissa::optim::Adafactor).name());
  EXPECT_EQ(build("adamw_torch_8bit"), typeid(mantissa::optim::AdamW8bit).name());
  EXPECT_EQ(build("muon"), typeid(mantissa::optim::Muon).name());
}

}  // namespace
