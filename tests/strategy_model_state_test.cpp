// The model's state and forward passes go through the Strategy: checkpoints write
// model.safetensors from `model_state_dict`, loads (resume and the best model) go through
// `load_model_state_dict`, and evaluation holds `forward_context` around each batch. A
// strategy that keeps its parameters elsewhere (full sharding) relies on exactly these seams,
// so the tests use one that changes what the seams hand over and checks that the files and the
// model follow.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/io/safetensors.h>
#include <mantissa/trainer.h>

#include "io/filesystem.h"
#include "toy_training.h"
#include "trainer/checkpoint_files.h"
#include "trainer/evaluation.h"
#include "trainer/precision_plan.h"
#include "trainer/single_process.h"

namespace {

using mantissa::Batch;
using mantissa::ModelOutput;
using mantissa::Trainer;
using mantissa::TrainingArguments;
using mantissa::TrainerState;
using mantissa_test::make_toy_model;
using mantissa_test::toy_args;
using mantissa_test::ToyDataset;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// A lone-process strategy whose model state is the module's times `factor` on the way out and
// divided by it on the way in, and which records its forward scopes.
class ScalingStrategy final : public mantissa::detail::SingleProcess {
 public:
  explicit ScalingStrategy(double factor) : factor_(factor) {}

  mantissa::io::NamedTensors model_state_dict(const torch::nn::Module& module) const override {
    auto state = SingleProcess::model_state_dict(module);
    for (auto& [name, tensor] : state) tensor = tensor * factor_;
    return state;
  }
  void load_model_state_dict(torch::nn::Module& module, const mantissa::io::NamedTensors& state,
                             const std::string& origin) override {
    origins.push_back(origin);
    auto scaled = state;
    for (auto& [name, tensor] : scaled) tensor = tensor / factor_;
    SingleProcess::load_model_state_dict(module, scaled, origin);
  }
  mantissa::detail::ForwardScope forward_context(
      const mantissa::detail::ForwardPass& pass) override {
    events.push_back(pass.training ? "enter train" : "enter eval");
    return mantissa::detail::ForwardScope([this] { events.push_back("exit"); });
  }

  std::vector<std::string> origins;
  std::vector<std::string> events;

 private:
  double factor_;
};

// The parts of a checkpoint of a trained toy run, with `model` as the model.
struct TrainedRun {
  std::string dir;
  TrainingArguments args;
  mantissa_test::ToyMlp model = make_toy_model();
  std::unique_ptr<Trainer> trainer;
  TrainerState state;
  mantissa::amp::GradScaler scaler{mantissa::amp::GradScalerOptions().enabled(false)};

  TrainedRun() : dir(mantissa_test::toy_output_dir()), args(toy_args(dir).max_steps(2)) {
    trainer = std::make_unique<Trainer>(model, args, ToyDataset(40));
    trainer->train();
    state = trainer->state();
  }
  mantissa::detail::CheckpointParts parts() {
    mantissa::detail::CheckpointParts parts;
    parts.model = model.ptr().get();
    parts.optimizer = &trainer->optimizer();
    parts.scheduler = &trainer->lr_scheduler();
    parts.scaler = &scaler;
    parts.state = &state;
    parts.args = &args;
    return parts;
  }
};

TEST(StrategyModelStateTest, CheckpointsWriteWhatTheStrategyHandsOver) {
  TrainedRun run;
  ScalingStrategy strategy(2.0);
  strategy.save_checkpoint(run.dir, run.parts());
  const auto file = run.dir + "/checkpoint-2/model.safetensors";
  const auto saved = mantissa::io::load_safetensors(file);
  const auto own = mantissa::io::module_state_dict(*run.model);
  ASSERT_EQ(saved.size(), own.size());
  for (std::size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(saved[i].first, own[i].first);
    EXPECT_TRUE(torch::equal(saved[i].second, own[i].second * 2.0)) << saved[i].first;
  }
}

TEST(StrategyModelStateTest, LoadsGoThroughTheStrategyAndNameTheFile) {
  TrainedRun run;
  ScalingStrategy strategy(2.0);
  strategy.save_checkpoint(run.dir, run.parts());
  const auto checkpoint = run.dir + "/checkpoint-2";
  std::vector<torch::Tensor> before;
  for (const auto& p : run.model->parameters()) before.push_back(p.detach().clone());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : run.model->parameters()) p.fill_(0.5);
  }
  strategy.load_checkpoint(checkpoint, run.parts());
  const auto after = run.model->parameters();
  for (std::size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(after[i], before[i])) << i;  // x2 out, /2 in: exact
  }
  ASSERT_EQ(strategy.origins.size(), 1U);
  EXPECT_THAT(strategy.origins[0], HasSubstr(checkpoint + "/model.safetensors"));

  // The best-model load takes the same way.
  strategy.load_checkpoint_weights(*run.model, checkpoint, nullptr);
  EXPECT_EQ(strategy.origins.size(), 2U);
}

TEST(StrategyModelStateTest, ALoadThatDoesNotFitNamesTheFileAndChangesNothing) {
  TrainedRun run;
  mantissa::detail::SingleProcess strategy;
  strategy.save_checkpoint(run.dir, run.parts());
  const auto file = run.dir + "/checkpoint-2/model.safetensors";
  auto state = mantissa::io::load_safetensors(file);
  state.pop_back();
  auto fresh = make_toy_model(5);
  const auto before = fresh->parameters()[0].detach().clone();
  EXPECT_THAT([&] { strategy.load_model_state_dict(*fresh, state, " from '" + file + "'"); },
              ThrowsMessage<c10::Error>(
                  AllOf(HasSubstr("Missing key(s) in state_dict"), HasSubstr(file))));
  EXPECT_TRUE(torch::equal(fresh->parameters()[0], before));
}

TEST(StrategyModelStateTest, EvaluationHoldsAForwardScopeAroundEachBatch) {
  auto model = make_toy_model();
  const auto args = toy_args(mantissa_test::toy_output_dir()).per_device_eval_batch_size(16);
  const auto plan = mantissa::detail::make_precision_plan(args, c10::kFloat);
  ScalingStrategy strategy(1.0);
  int forwards_inside = 0;
  const mantissa::ForwardFn forward = [&](const Batch& batch) -> ModelOutput {
    if (!strategy.events.empty() && strategy.events.back() == "enter eval") ++forwards_inside;
    return model->forward(batch.data);
  };
  const mantissa::LossWithOutputsFn no_loss;
  const mantissa::MetricsFn no_metrics;
  const mantissa::PreprocessLogitsFn no_preprocess;
  std::set<std::string> warned;
  const mantissa::detail::EvaluationParts parts{
      args, plan, c10::kCPU, *model, forward, no_loss, no_metrics, no_preprocess, strategy, warned};
  mantissa::detail::run_evaluation(parts, mantissa::make_batch_source(ToyDataset(40)), "eval",
                                   false, false);
  // 40 examples in batches of 16: three batches, each forward inside its own scope.
  EXPECT_THAT(strategy.events, ElementsAre("enter eval", "exit", "enter eval", "exit",
                                           "enter eval", "exit"));
  EXPECT_EQ(forwards_inside, 3);
}

}  // namespace
