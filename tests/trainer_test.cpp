// The Trainer end to end on the CPU: resume, accumulation, skipped steps, divergence errors,
// bad input, checkpoint rotation and crash safety, evaluation and callbacks.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/trainer.h>
#include "io/filesystem.h"

#include "io_test_util.h"
#include "test_util.h"
#include "toy_training.h"
#include "trainer/checkpoint.h"
#include "trainer/run_schedule.h"

namespace {

using mantissa::Batch;
using mantissa::LogEntry;
using mantissa::Trainer;
using mantissa::TrainerCallback;
using mantissa::TrainerControl;
using mantissa::TrainerState;
using mantissa::TrainingArguments;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using mantissa_test::ToyDataset;

struct MlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{8, 16};
  torch::nn::Dropout dropout{0.1};
  torch::nn::Linear fc2{16, 4};
  MlpImpl() {
    register_module("fc1", fc1);
    register_module("dropout", dropout);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(dropout(torch::relu(fc1(x)))); }
};
TORCH_MODULE(Mlp);

Mlp make_model(uint64_t seed = 1) {
  torch::manual_seed(seed);
  return Mlp();
}

// Kept after the test (a run's output folder is worth a look when a test fails).
std::string temp_dir() {
  return mantissa::io::make_temp_directory(::testing::TempDir(), "mantissa-trainer-");
}

// The CPU suite's arguments (TrainerCudaTest below sets the GPU's).
TrainingArguments base_args(const std::string& output_dir) {
  return mantissa_test::toy_args(output_dir);
}

std::vector<torch::Tensor> params_of(const Mlp& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

std::vector<double> logged(const TrainerState& state, const std::string& key) {
  std::vector<double> values;
  for (const auto& entry : state.log_history) {
    if (auto it = entry.find(key); it != entry.end()) values.push_back(it->second);
  }
  return values;
}

// Stops the run after `step` optimizer steps (as a crash would, but cleanly).
struct StopAt : TrainerCallback {
  explicit StopAt(int64_t step) : step_(step) {}
  void on_step_end(const TrainingArguments&, TrainerState& state,
                   TrainerControl& control) override {
    if (state.global_step == step_) control.should_training_stop = true;
  }
  int64_t step_;
};

TEST(TrainerTest, ResumeContinuesTheIdenticalTrajectory) {
  for (bool fp16 : {false, true}) {
    SCOPED_TRACE(fp16 ? "fp16 + GradScaler" : "fp32");
    const auto dir_a = temp_dir();
    const auto dir_b = temp_dir();
    auto args_a =
        base_args(dir_a).max_steps(20).fp16(fp16).initial_scale_power(8).loss_scale_window(3);
    auto straight = make_model();
    Trainer a(straight, args_a, ToyDataset(100));
    a.train();

    auto args_b = args_a;
    args_b.output_dir(dir_b).save_strategy("steps").save_steps(10);
    auto first_half = make_model();
    Trainer b1(first_half, args_b, ToyDataset(100));
    b1.add_callback(std::make_shared<StopAt>(10));
    b1.train();
    ASSERT_TRUE(mantissa::io::is_directory(dir_b + "/checkpoint-10"));

    auto resumed =
        make_model(/*seed=*/99);  // different init: everything must come from the checkpoint
    Trainer b2(resumed, args_b, ToyDataset(100));
    b2.train("latest");

    EXPECT_EQ(b2.state().global_step, 20);
    const auto pa = params_of(straight);
    const auto pb = params_of(resumed);
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
    EXPECT_EQ(a.scaler().get_scale(), b2.scaler().get_scale());
    EXPECT_EQ(logged(a.state(), "loss"), logged(b2.state(), "loss"));
    EXPECT_EQ(logged(a.state(), "learning_rate"), logged(b2.state(), "learning_rate"));
  }
}

TEST(TrainerTest, DataloaderWorkersGiveTheSameRun) {
  auto run = [](int64_t workers) {
    auto model = make_model();
    Trainer trainer(model, base_args(temp_dir()).max_steps(12).dataloader_num_workers(workers),
                    ToyDataset(100));
    trainer.train();
    return params_of(model);
  };
  const auto inline_loading = run(0);
  const auto prefetched = run(3);
  for (size_t i = 0; i < inline_loading.size(); ++i)
    EXPECT_TRUE(torch::equal(inline_loading[i], prefetched[i]));
}

TEST(TrainerTest, GradientAccumulationMatchesOneLargeBatch) {
  auto run = [](int64_t batch, int64_t accumulation) {
    torch::manual_seed(3);
    auto model = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                       torch::nn::Linear(16, 4));
    auto args = base_args(temp_dir())
                    .per_device_train_batch_size(batch)
                    .gradient_accumulation_steps(accumulation)
                    .num_train_epochs(3)
                    .optim("sgd")
                    .learning_rate(0.1)
                    .max_grad_norm(0.0);
    Trainer trainer(model, args, ToyDataset(64));
    trainer.train();
    EXPECT_EQ(trainer.state().global_step, 6);
    return model->parameters();
  };
  const auto big = run(32, 1);
  const auto accumulated = run(8, 4);
  for (size_t i = 0; i < big.size(); ++i) {
    EXPECT_TRUE(torch::allclose(big[i], accumulated[i], 1e-5, 1e-6))
        << "max |diff| " << (big[i] - accumulated[i]).abs().max().item<double>();
  }
}

// Records the learning rate and parameters after every step.
struct Recorder : TrainerCallback {
  Trainer* trainer = nullptr;
  Mlp model{nullptr};
  std::vector<double> lrs;
  std::vector<std::vector<torch::Tensor>> params;
  void on_step_end(const TrainingArguments&, TrainerState&, TrainerControl&) override {
    lrs.push_back(trainer->optimizer().param_groups()[0].options().get_lr());
    params.push_back(params_of(model));
  }
};

TEST(TrainerTest, SkippedStepLeavesParamsAndScheduleAndIsLogged) {
  auto model = make_model();
  model->dropout->options.p(0.0);
  auto args = base_args(temp_dir()).fp16(true).max_steps(6).logging_steps(1);
  Trainer trainer(model, args, ToyDataset(100));
  int calls = 0;
  trainer.set_compute_loss([&](const Batch& batch) {
    auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
    return ++calls == 3 ? loss * std::numeric_limits<float>::infinity() : loss;
  });
  auto recorder = std::make_shared<Recorder>();
  recorder->trainer = &trainer;
  recorder->model = model;
  trainer.add_callback(recorder);
  ::testing::internal::CaptureStdout();
  trainer.train();
  const auto out = ::testing::internal::GetCapturedStdout();
  EXPECT_THAT(
      out,
      HasSubstr(
          "step 3: gradients overflowed (inf/nan) at loss scale 65536; optimizer step skipped"));
  EXPECT_EQ(trainer.state().skipped_steps, 1);
  ASSERT_EQ(recorder->lrs.size(), 6u);
  EXPECT_EQ(recorder->lrs[2], recorder->lrs[1])
      << "the scheduler must not advance on a skipped step";
  EXPECT_LT(recorder->lrs[3], recorder->lrs[2]);
  for (size_t i = 0; i < recorder->params[2].size(); ++i) {
    EXPECT_TRUE(torch::equal(recorder->params[2][i], recorder->params[1][i]));
    EXPECT_FALSE(torch::equal(recorder->params[3][i], recorder->params[2][i]));
  }
  EXPECT_EQ(trainer.scaler().get_scale(), 32768.0);
  EXPECT_EQ(logged(trainer.state(), "skipped_steps").back(), 1.0);
}

TEST(TrainerTest, OptimizerAndSchedulerCanBePassedIn) {
  auto model = make_model();
  Trainer trainer(model, base_args(temp_dir()).max_steps(4), ToyDataset(64));
  trainer.set_optimizer_factory([](std::vector<torch::optim::OptimizerParamGroup> groups) {
    return std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(0.5));
  });
  trainer.set_lr_scheduler_factory([](torch::optim::Optimizer& optimizer, int64_t total) {
    EXPECT_EQ(total, 4);
    return std::make_unique<mantissa::LrScheduler>(optimizer,
                                                   [](int64_t step) { return 1.0 / (1 + step); });
  });
  auto recorder = std::make_shared<Recorder>();
  recorder->trainer = &trainer;
  recorder->model = model;
  trainer.add_callback(recorder);
  trainer.train();
  EXPECT_NE(dynamic_cast<torch::optim::SGD*>(&trainer.optimizer()), nullptr);
  EXPECT_EQ(recorder->lrs, (std::vector<double>{0.5 / 2, 0.5 / 3, 0.5 / 4, 0.5 / 5}));
}

TEST(TrainerTest, LrSchedulerKwargsShapeTheOptimizersLr) {
  auto model = make_model();
  const mantissa::LrSchedulerKwargs kwargs = {
      {"num_decay_steps", 2}, {"decay_type", "linear"}, {"min_lr_ratio", 0.25}};
  auto args = base_args(temp_dir())
                  .max_steps(6)
                  .learning_rate(0.1)
                  .warmup_steps(2)
                  .lr_scheduler_type("warmup_stable_decay")
                  .lr_scheduler_kwargs(kwargs);
  Trainer trainer(model, args, ToyDataset(64));
  auto recorder = std::make_shared<Recorder>();
  recorder->trainer = &trainer;
  recorder->model = model;
  trainer.add_callback(recorder);
  trainer.train();
  // 2 warmup steps from 0.25 * lr, 2 stable, 2 of linear decay down to 0.25 * lr.
  ASSERT_EQ(recorder->lrs.size(), 6u);
  const std::vector<double> by_hand = {0.0625, 0.1, 0.1, 0.1, 0.0625, 0.025};
  for (std::size_t i = 0; i < by_hand.size(); ++i) {
    const auto step = static_cast<int64_t>(i) + 1;
    EXPECT_EQ(recorder->lrs[i],
              0.1 * mantissa::schedule_factor("warmup_stable_decay", step, 2, 6, kwargs))
        << "step " << step;
    EXPECT_DOUBLE_EQ(recorder->lrs[i], by_hand[i]) << "step " << step;
  }
}

TEST(TrainerTest, EndlessFp16OverflowStopsWithAClearError) {
  auto model = make_model();
  auto args = base_args(temp_dir()).fp16(true).max_steps(50).max_consecutive_nonfinite(5);
  Trainer trainer(model, args, ToyDataset(100));
  trainer.set_compute_loss([&](const Batch& batch) {
    return torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target) *
           std::numeric_limits<float>::infinity();
  });
  ::testing::internal::CaptureStdout();
  EXPECT_THAT([&] { trainer.train(); },
              ThrowsMessage<c10::Error>(AllOf(HasSubstr("5 optimizer steps in a row were skipped"),
                                              HasSubstr("--bf16"))));
  ::testing::internal::GetCapturedStdout();
}

TEST(TrainerTest, NonFiniteLossesStopABf16Run) {
  auto model = make_model();
  auto args =
      base_args(temp_dir()).bf16(true).max_steps(20).logging_steps(4).max_consecutive_nonfinite(3);
  Trainer trainer(model, args, ToyDataset(100));
  trainer.set_compute_loss([&](const Batch& batch) {
    return torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target) *
           std::nan("");
  });
  ::testing::internal::CaptureStdout();
  EXPECT_THAT(
      [&] { trainer.train(); },
      ThrowsMessage<c10::Error>(HasSubstr("the loss was not finite for 4 micro-batches in a row")));
  ::testing::internal::GetCapturedStdout();
}

TEST(TrainerTest, BadInputFailsBeforeAnyWork) {
  const auto dir = temp_dir();
  EXPECT_THAT([&] { Trainer(make_model(), base_args(dir), ToyDataset(0)).train(); },
              ThrowsMessage<c10::ValueError>(HasSubstr("the training dataset is empty")));
  EXPECT_THAT(
      [&] {
        Trainer(make_model(),
                base_args(dir).per_device_train_batch_size(64).dataloader_drop_last(true),
                ToyDataset(10))
            .train();
      },
      ThrowsMessage<c10::ValueError>(HasSubstr(
          "per_device_train_batch_size (64) is larger than the training dataset (10 examples)")));

  mantissa::io::create_directories(dir + "/checkpoint-3");
  EXPECT_THAT([&] { Trainer(make_model(), base_args(dir).max_steps(2), ToyDataset(10)).train(); },
              ThrowsMessage<c10::ValueError>(
                  HasSubstr("already exists and is not empty. Use --overwrite_output_dir")));
  EXPECT_NO_THROW(
      Trainer(make_model(), base_args(dir).max_steps(2).overwrite_output_dir(true), ToyDataset(10))
          .train());

  auto bf16_model = make_model();
  bf16_model->to(torch::kBFloat16);
  EXPECT_THAT([&] { Trainer(bf16_model, base_args(temp_dir()).fp16(true), ToyDataset(10)); },
              ThrowsMessage<c10::ValueError>(
                  HasSubstr("the model's parameters are bf16 but --fp16 was given")));
  EXPECT_THAT([&] { Trainer(make_model(), base_args(dir).learning_rate(-1), ToyDataset(10)); },
              ThrowsMessage<c10::ValueError>(HasSubstr("learning_rate")));
}

// Issue 11, defect 7: sizes at the int64 limit either train as asked or fail naming the flag;
// none wraps around into a run that trains nothing and returns as if it had finished.
TEST(TrainerTest, RunCountsBeyondInt64AreErrorsNamingTheFlag) {
  // 100 examples in batches of 1: 100 optimizer steps per epoch, so 1e18 epochs are 1e20 steps.
  EXPECT_THAT(
      [&] {
        Trainer(make_model(),
                base_args(temp_dir()).per_device_train_batch_size(1).num_train_epochs(1e18),
                ToyDataset(100))
            .train();
      },
      ThrowsMessage<c10::ValueError>(HasSubstr(
          "--num_train_epochs 1e+18 of 100 optimizer steps each is more optimizer steps than a "
          "64-bit count holds")));
  // 1e16 epochs of 100 steps fit, but not with 100 examples each. (Stopped after one step, in
  // case the check is missing.)
  EXPECT_THAT(
      [&] {
        Trainer trainer(
            make_model(),
            base_args(temp_dir()).per_device_train_batch_size(100).num_train_epochs(1e16),
            ToyDataset(10000));
        trainer.add_callback(std::make_shared<StopAt>(1));
        trainer.train();
      },
      ThrowsMessage<c10::ValueError>(
          HasSubstr("--num_train_epochs 1e+16 (1000000000000000000 optimizer steps) of "
                    "--per_device_train_batch_size 100 x --gradient_accumulation_steps 1 examples "
                    "each is more "
                    "examples than a 64-bit count holds")));
}

TEST(TrainerTest, BatchSizeAtTheInt64LimitTrainsOnTheWholeDataset) {
  const auto model = make_model();
  const auto before = params_of(model);
  Trainer trainer(model,
                  base_args(temp_dir())
                      .per_device_train_batch_size(std::numeric_limits<int64_t>::max())
                      .num_train_epochs(1),
                  ToyDataset(100));
  trainer.train();
  EXPECT_EQ(trainer.state().global_step, 1) << "one batch of all 100 examples";
  EXPECT_EQ(trainer.state().num_train_epochs, 1);
  EXPECT_FALSE(torch::equal(params_of(model)[0], before[0]));
}

TEST(TrainerTest, MaxStepsAtTheInt64LimitTrainsUntilStopped) {
  Trainer trainer(make_model(),
                  base_args(temp_dir())
                      .per_device_train_batch_size(1)
                      .max_steps(std::numeric_limits<int64_t>::max()),
                  ToyDataset(16));
  trainer.add_callback(std::make_shared<StopAt>(3));
  trainer.train();
  EXPECT_EQ(trainer.state().global_step, 3);
  EXPECT_EQ(trainer.state().max_steps, std::numeric_limits<int64_t>::max());
}

TEST(TrainerTest, WorkerCountAtTheInt64LimitPrefetchesTheRestOfTheEpoch) {
  auto run = [](int64_t workers) {
    auto model = make_model();
    Trainer trainer(model, base_args(temp_dir()).max_steps(4).dataloader_num_workers(workers),
                    ToyDataset(40));
    trainer.train();
    EXPECT_EQ(trainer.state().global_step, 4);
    return params_of(model);
  };
  const auto inline_loading = run(0);
  const auto all_at_once = run(std::numeric_limits<int64_t>::max());
  for (size_t i = 0; i < inline_loading.size(); ++i)
    EXPECT_TRUE(torch::equal(inline_loading[i], all_at_once[i]));
}

// The run's schedule as a pure function of the arguments and the dataset's size.
TEST(RunScheduleTest, StepsAndEpochsFromTheArguments) {
  using mantissa::detail::make_run_schedule;
  const auto args =
      TrainingArguments().per_device_train_batch_size(8).gradient_accumulation_steps(3);
  auto s = make_run_schedule(100, TrainingArguments(args).num_train_epochs(2.5));
  EXPECT_EQ(s.batches_per_epoch, 13);  // ceil(100 / 8)
  EXPECT_EQ(s.updates_per_epoch, 5);   // ceil(13 / 3)
  EXPECT_EQ(s.max_steps, 13);          // ceil(2.5 * 5)
  EXPECT_EQ(s.num_epochs, 3);
  s = make_run_schedule(100, TrainingArguments(args).max_steps(11));
  EXPECT_EQ(s.max_steps, 11);
  EXPECT_EQ(s.num_epochs, 3);  // ceil(11 / 5)
  s = make_run_schedule(100,
                        TrainingArguments(args).dataloader_drop_last(true).num_train_epochs(1));
  EXPECT_EQ(s.batches_per_epoch, 12);
  EXPECT_EQ(s.updates_per_epoch, 4);

  const int64_t max = std::numeric_limits<int64_t>::max();
  s = make_run_schedule(100,
                        TrainingArguments().per_device_train_batch_size(max).num_train_epochs(1));
  EXPECT_EQ(s.batches_per_epoch, 1);
  EXPECT_EQ(s.max_steps, 1);
  s = make_run_schedule(10, TrainingArguments().per_device_train_batch_size(1).max_steps(max));
  EXPECT_EQ(s.num_epochs, max / 10 + 1);  // ceil, without the overflow of (a + b - 1) / b
  EXPECT_THAT(
      [&] {
        make_run_schedule(
            100, TrainingArguments().per_device_train_batch_size(1).num_train_epochs(1e17));
      },
      ThrowsMessage<c10::ValueError>(
          HasSubstr("--num_train_epochs 1e+17 of 100 optimizer steps each")));
  EXPECT_THAT([&] { make_run_schedule(0, TrainingArguments()); },
              ThrowsMessage<c10::ValueError>(HasSubstr("the training dataset is empty")));
}

TEST(TrainerTest, SaveTotalLimitKeepsTheNewestCheckpoints) {
  const auto dir = temp_dir();
  auto args = base_args(dir).max_steps(10).save_strategy("steps").save_steps(2).save_total_limit(2);
  Trainer trainer(make_model(), args, ToyDataset(100));
  trainer.train();
  std::vector<std::string> names;
  for (const auto& path : mantissa::detail::sorted_checkpoints(dir))
    names.push_back(path.substr(dir.size() + 1));
  EXPECT_EQ(names, (std::vector<std::string>{"checkpoint-8", "checkpoint-10"}));
  for (const char* file : {"model.safetensors", "optimizer.pt", "scheduler.pt", "scaler.pt",
                           "rng_state.pth", "trainer_state.json", "training_args.json"}) {
    EXPECT_TRUE(mantissa::io::path_exists(dir + "/checkpoint-10/" + file)) << file;
  }
  EXPECT_TRUE(mantissa::io::path_exists(dir + "/trainer_log.jsonl"));
}

TEST(TrainerTest, CorruptCheckpointNamesTheFile) {
  const auto dir = temp_dir();
  auto args = base_args(dir).max_steps(4).save_strategy("steps").save_steps(4);
  Trainer(make_model(), args, ToyDataset(50)).train();
  const auto checkpoint = dir + "/checkpoint-4";

  const auto optimizer_file = checkpoint + "/optimizer.pt";
  ASSERT_EQ(::unlink(optimizer_file.c_str()), 0);
  EXPECT_THAT(
      [&] { Trainer(make_model(), args, ToyDataset(50)).train(checkpoint); },
      ThrowsMessage<c10::Error>(HasSubstr("checkpoint file '" + optimizer_file + "' is missing")));

  const auto state_file = checkpoint + "/trainer_state.json";
  FILE* f = std::fopen(state_file.c_str(), "w");
  std::fputs("{ not json", f);
  std::fclose(f);
  EXPECT_THAT(
      [&] { Trainer(make_model(), args, ToyDataset(50)).train("latest"); },
      ThrowsMessage<c10::Error>(HasSubstr("cannot load checkpoint file '" + state_file + "'")));
}

TEST(TrainerTest, EvaluationReportsLossAndAccuracyAndEarlyStoppingStops) {
  auto model = make_model();
  auto args =
      base_args(temp_dir()).max_steps(40).eval_strategy("steps").eval_steps(5).learning_rate(0.0);
  Trainer trainer(model, args, ToyDataset(100), ToyDataset(40, /*seed=*/5));
  auto early = std::make_shared<mantissa::EarlyStoppingCallback>(/*patience=*/2);
  trainer.add_callback(early);
  trainer.train();
  // learning_rate 0: eval_loss never improves after the first evaluation, so training stops
  // after the third evaluation (step 15) instead of running to 40.
  EXPECT_EQ(trainer.state().global_step, 15);
  const auto metrics = trainer.evaluate();
  ASSERT_TRUE(metrics.count("eval_loss"));
  ASSERT_TRUE(metrics.count("eval_accuracy"));
  EXPECT_GE(metrics.at("eval_accuracy"), 0.0);
  EXPECT_LE(metrics.at("eval_accuracy"), 1.0);
  EXPECT_EQ(logged(trainer.state(), "eval_loss").size(), 4u);
}

TEST(TrainerTest, TrainingLearnsTheToyProblemInEachPrecision) {
  for (const char* mode :
       {"fp32", "bf16", "fp16", "bf16-model", "bf16-model-fused", "fp32-fused"}) {
    SCOPED_TRACE(mode);
    auto model = make_model();
    auto args = base_args(temp_dir()).num_train_epochs(8).learning_rate(2e-2).logging_steps(1000);
    const std::string m = mode;
    if (m == "bf16") args.bf16(true);
    if (m == "fp16") args.fp16(true);
    if (m.rfind("bf16-model", 0) == 0) model->to(torch::kBFloat16);
    if (m.find("fused") != std::string::npos) args.optim("adamw_mantissa_fused");
    Trainer trainer(model, args, ToyDataset(256), ToyDataset(256));
    const auto before = trainer.evaluate().at("eval_accuracy");
    trainer.train();
    const auto after = trainer.evaluate().at("eval_accuracy");
    EXPECT_GT(after, 0.85) << "before training: " << before;
    if (m.rfind("bf16-model", 0) == 0) {
      EXPECT_EQ(trainer.precision_plan().weights, mantissa::WeightsMode::kFp32Masters);
      EXPECT_EQ(model->fc1->weight.scalar_type(), torch::kBFloat16);
    }
    if (m == "fp16") EXPECT_TRUE(trainer.precision_plan().loss_scaling);
  }
}

// A checkpoint's files are read by Python's own tools: safetensors, and torch.load with
// weights_only=True (what HF's Trainer uses on resume).
TEST(TrainerTest, CheckpointFilesLoadInPython) {
  const auto dir = temp_dir();
  const auto scratch = temp_dir();
  std::string python;
  MANTISSA_SKIP_WITHOUT_PYTHON_MODULES(python, "torch, safetensors.torch", scratch);
  auto model = make_model();
  auto args = base_args(dir).fp16(true).max_steps(4).save_strategy("steps").save_steps(4);
  Trainer trainer(model, args, ToyDataset(64));
  trainer.train();
  const auto result = mantissa_test::run_python(python, R"(
import json, sys, torch
from safetensors.torch import load_file
d = sys.argv[1]
m = load_file(d + "/model.safetensors")
print("model", ",".join(sorted(m)), repr(float(m["fc1.weight"].double().sum())))
s = torch.load(d + "/scaler.pt", weights_only=True)
print("scaler", repr(s["scale"]), s["_growth_tracker"], s["growth_interval"])
sch = torch.load(d + "/scheduler.pt", weights_only=True)
print("scheduler", sch["last_epoch"])
r = torch.load(d + "/rng_state.pth", weights_only=True)
print("rng", r["cpu"].dtype, r["cpu"].numel() > 0)
print("state", json.load(open(d + "/trainer_state.json"))["global_step"])
)",
                                                dir + "/checkpoint-4", scratch);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const double weight_sum = model->fc1->weight.to(torch::kDouble).sum().item<double>();
  EXPECT_THAT(result.output, HasSubstr("model fc1.bias,fc1.weight,fc2.bias,fc2.weight"));
  const auto model_start = result.output.find("model ");
  const auto model_line =
      result.output.substr(model_start, result.output.find('\n', model_start) - model_start);
  EXPECT_NEAR(std::stod(model_line.substr(model_line.rfind(' ') + 1)), weight_sum, 1e-9);
  EXPECT_THAT(result.output,
              HasSubstr("scaler " + std::to_string(static_cast<int>(trainer.scaler().get_scale())) +
                        ".0 4 2000"));
  EXPECT_THAT(result.output, HasSubstr("scheduler 4"));
  EXPECT_THAT(result.output, HasSubstr("rng torch.uint8 True"));
  EXPECT_THAT(result.output, HasSubstr("state 4"));
}

TEST(TrainerTest, DeeplyNestedCheckpointFilesAreRefusedWithoutCrashing) {
  // A 100k-deep value used to overflow the stack in the error message (nlohmann's recursive
  // dump()); now the nesting is refused before parsing, and resuming names the file.
  const std::string open(100'000, '['), close(100'000, ']');
  EXPECT_THAT(
      [&] {
        TrainerState::from_json(R"({"epoch":0,"global_step":0,"log_history":[{"loss":)" + open +
                                close + "}]}");
      },
      ThrowsMessage<c10::Error>(
          HasSubstr("trainer_state.json is not valid JSON: arrays and objects nest deeper")));

  const auto dir = temp_dir();
  auto args = base_args(dir).max_steps(4).save_strategy("steps").save_steps(4);
  Trainer(make_model(), args, ToyDataset(50)).train();
  const auto checkpoint = dir + "/checkpoint-4";
  const auto write = [](const std::string& path, const std::string& bytes) {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  };
  const auto model_file = checkpoint + "/model.safetensors";
  std::string header = "{\"a\":" + open + close + "}";
  std::string model(8, '\0');
  for (int i = 0; i < 8; ++i) model[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write(model_file, model + header);
  EXPECT_THAT([&] { Trainer(make_model(), args, ToyDataset(50)).train(checkpoint); },
              ThrowsMessage<c10::Error>(
                  AllOf(HasSubstr("'" + model_file + "'"), HasSubstr("nest deeper than 127"))));

  const auto state_file = checkpoint + "/trainer_state.json";
  write(state_file, R"({"epoch":0,"global_step":4,"best_metric":)" + open + close + "}");
  EXPECT_THAT(
      [&] { Trainer(make_model(), args, ToyDataset(50)).train(checkpoint); },
      ThrowsMessage<c10::Error>(AllOf(HasSubstr("cannot load checkpoint file '" + state_file + "'"),
                                      HasSubstr("nest deeper than 127"))));
}

TEST(TrainerTest, TrainerStateJsonRoundTrip) {
  TrainerState state;
  state.global_step = 12;
  state.epoch = 1.5;
  state.best_metric = 0.25;
  state.log_history = {{{"loss", 0.5}, {"step", 5}}, {{"eval_loss", std::nan("")}, {"step", 10}}};
  const auto back = TrainerState::from_json(state.to_json());
  EXPECT_EQ(back.global_step, 12);
  EXPECT_EQ(back.epoch, 1.5);
  EXPECT_EQ(back.best_metric, 0.25);
  ASSERT_EQ(back.log_history.size(), 2u);
  EXPECT_EQ(back.log_history[0].at("loss"), 0.5);
  EXPECT_TRUE(std::isnan(back.log_history[1].at("eval_loss")));
  EXPECT_THAT(state.to_json(), HasSubstr("\"global_step\": 12"));
  EXPECT_THAT([] { TrainerState::from_json("[1, 2]"); },
              ThrowsMessage<c10::Error>(HasSubstr("JSON object")));
}

// cuda_graph where no graph can be made (here: the CPU): one line says why, and the run is
// the eager one, loss for loss.
TEST(TrainerTest, CudaGraphWithoutAGpuSaysWhyAndTrainsEagerly) {
  auto run = [](bool graph, std::string* out) {
    auto model = make_model();
    auto args = base_args(temp_dir())
                    .max_steps(10)
                    .logging_steps(1)
                    .optim("adamw_torch_fused")
                    .cuda_graph(graph);
    Trainer trainer(model, args, ToyDataset(100));
    ::testing::internal::CaptureStdout();
    trainer.train();
    *out = ::testing::internal::GetCapturedStdout();
    return logged(trainer.state(), "loss");
  };
  std::string eager_out;
  std::string graph_out;
  const auto eager = run(false, &eager_out);
  const auto graphed = run(true, &graph_out);
  ASSERT_EQ(eager.size(), 10u);
  EXPECT_EQ(graphed, eager);
  EXPECT_THAT(graph_out,
              HasSubstr("cuda_graph: off, training eagerly: the device is cpu; CUDA graphs need a "
                        "CUDA device"));
  EXPECT_THAT(eager_out, ::testing::Not(HasSubstr("cuda_graph")));
}

TEST(TrainerCudaTest, LearnsOnTheGpuInBf16AndFp16) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  for (const char* mode : {"bf16", "fp16", "bf16-model"}) {
    SCOPED_TRACE(mode);
    auto model = make_model();
    auto args = base_args(temp_dir())
                    .use_cpu(false)
                    .num_train_epochs(8)
                    .learning_rate(2e-2)
                    .logging_steps(1000);
    const std::string m = mode;
    if (m == "bf16") args.bf16(true);
    if (m == "fp16") args.fp16(true);
    if (m == "bf16-model") model->to(torch::kBFloat16);
    Trainer trainer(model, args, ToyDataset(256), ToyDataset(256));
    trainer.train();
    EXPECT_EQ(model->fc1->weight.device().type(), torch::kCUDA);
    EXPECT_GT(trainer.evaluate().at("eval_accuracy"), 0.85);
  }
}

// The captured step is the eager step: the same losses, parameters and loss scale in each
// precision, with the smaller last batch of each epoch (100 = 12 x 8 + 4) run eagerly.
TEST(TrainerCudaTest, CudaGraphReplaysTheEagerRun) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  // fp16-overflow starts the loss scale at 2^30: the first steps overflow and are skipped,
  // eagerly and then inside the graph, until the scale has backed off.
  for (const std::string mode : {"fp32", "bf16", "fp16", "fp16-overflow", "bf16-model"}) {
    SCOPED_TRACE(mode);
    struct Run {
      std::vector<double> losses;
      std::vector<torch::Tensor> params;
      double scale;
      std::string out;
      int64_t skipped;
    };
    auto run = [&](bool graph) {
      auto model = make_model();
      model->dropout->options.p(0.0);
      auto args = base_args(temp_dir())
                      .use_cpu(false)
                      .num_train_epochs(2)
                      .logging_steps(1)
                      .optim("adamw_torch_fused")
                      .weight_decay(0.01)
                      .cuda_graph(graph);
      if (mode == "bf16") args.bf16(true);
      if (mode == "fp16") args.fp16(true);
      if (mode == "fp16-overflow") args.fp16(true).initial_scale_power(30);
      if (mode == "bf16-model") model->to(torch::kBFloat16);
      Trainer trainer(model, args, ToyDataset(100));
      ::testing::internal::CaptureStdout();
      trainer.train();
      Run r{logged(trainer.state(), "loss"),
            {},
            trainer.scaler().get_scale(),
            ::testing::internal::GetCapturedStdout(),
            trainer.state().skipped_steps};
      for (const auto& p : model->parameters())
        EXPECT_FALSE(p.grad().defined()) << "gradients are None after train()";
      for (const auto& p : model->parameters())
        r.params.push_back(p.detach().cpu().to(torch::kFloat));
      return r;
    };
    const auto eager = run(false);
    const auto graphed = run(true);
    EXPECT_THAT(graphed.out,
                HasSubstr("cuda_graph: step 4 captured (data [8, 8] Float, target [8] Long)"));
    EXPECT_THAT(graphed.out,
                HasSubstr("cuda_graph: a batch of shape [4, 8] does not fit the captured step"));
    EXPECT_THAT(graphed.out,
                ::testing::Not(HasSubstr("shape [8, 8] does not fit")));  // full batches replay
    EXPECT_EQ(graphed.skipped, eager.skipped);
    if (mode == "fp16-overflow")
      EXPECT_GT(graphed.skipped, 3) << "some skips must happen inside the graph";
    ASSERT_EQ(graphed.losses.size(), eager.losses.size());
    for (size_t i = 0; i < eager.losses.size(); ++i) {
      EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-6 * std::abs(eager.losses[i]))
          << "step " << i + 1;
    }
    for (size_t i = 0; i < eager.params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(graphed.params[i], eager.params[i], 1e-5, 1e-6)) << "param " << i;
    }
    EXPECT_EQ(graphed.scale, eager.scale);
  }
}

}  // namespace
