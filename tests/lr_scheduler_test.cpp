// Hugging Face's lr schedules over LambdaLR: golden parity with PyTorch + the transformers
// formulas (tests/golden/make_lr_schedule_golden.py), state dicts, files, and Python interop.
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <mantissa/lr_scheduler.h>

#include "golden_util.h"
#include "io_test_util.h"

namespace {

using mantissa::LrScheduler;
using mantissa::schedule_factor;
using mantissa_test::TempDir;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

const json& golden() { return mantissa_test::golden_file("lr_schedules.json"); }

// An SGD optimizer with one param group per base lr.
struct TwoGroups {
  explicit TwoGroups(const std::vector<double>& lrs)
      : optimizer(make_groups(lrs), torch::optim::SGDOptions(0.1)) {}
  static std::vector<torch::optim::OptimizerParamGroup> make_groups(
      const std::vector<double>& lrs) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (double lr : lrs) {
      groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({1}, torch::requires_grad())},
                          std::make_unique<torch::optim::SGDOptions>(lr));
    }
    return groups;
  }
  std::vector<double> lrs() const {
    std::vector<double> out;
    for (const auto& group : optimizer.param_groups()) out.push_back(group.options().get_lr());
    return out;
  }
  torch::optim::SGD optimizer;
};

void expect_close(double actual, double expected, const std::string& what) {
  // 1e-12 relative; zero must be exactly zero.
  EXPECT_NEAR(actual, expected, 1e-12 * std::abs(expected)) << what;
}

TEST(LrSchedulerGoldenTest, MatchesTransformersSchedulesOnLambdaLR) {
  const auto& doc = golden();
  const auto base_lrs = doc["base_lrs"].get<std::vector<double>>();
  int compared = 0;
  for (const auto& config : doc["configs"]) {
    const auto warmup = config["num_warmup_steps"].get<int64_t>();
    const auto total = config["num_training_steps"].get<int64_t>();
    const auto steps = config["steps"].get<int64_t>();
    for (const auto& [name, expected] : config["schedules"].items()) {
      SCOPED_TRACE(name + " warmup " + std::to_string(warmup) + " total " + std::to_string(total));
      TwoGroups groups(base_lrs);
      LrScheduler scheduler(groups.optimizer, name, warmup, total);
      for (int64_t step = 0; step <= steps; ++step) {
        if (step > 0) scheduler.step();
        const auto want = expected["lrs"][step].get<std::vector<double>>();
        const auto got = groups.lrs();
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t g = 0; g < want.size(); ++g) {
          const std::string what = "step " + std::to_string(step) + " group " + std::to_string(g);
          expect_close(got[g], want[g], what);
          expect_close(scheduler.get_last_lr()[g], want[g], what);
          expect_close(base_lrs[g] * schedule_factor(name, step, warmup, total), want[g], what);
          ++compared;
        }
        EXPECT_EQ(scheduler.last_epoch(), step);
      }
      const auto& state = expected["state_dict"];
      const auto ours = scheduler.state_dict();
      EXPECT_EQ(ours.at("last_epoch").toInt(), state["last_epoch"].get<int64_t>());
      EXPECT_EQ(ours.at("_step_count").toInt(), state["_step_count"].get<int64_t>());
      EXPECT_EQ(ours.at("base_lrs").toDoubleVector(), state["base_lrs"].get<std::vector<double>>());
      const auto last_lr = ours.at("_last_lr").toDoubleVector();
      const auto want_last = state["_last_lr"].get<std::vector<double>>();
      ASSERT_EQ(last_lr.size(), want_last.size());
      for (std::size_t g = 0; g < last_lr.size(); ++g)
        expect_close(last_lr[g], want_last[g], "_last_lr");
    }
  }
  EXPECT_EQ(compared, (37 + 13 + 8) * 4 * 2) << "every step of every config, schedule and group";
}

TEST(LrSchedulerTest, WarmupThenLinearDecayByHand) {
  TwoGroups groups({1.0});
  LrScheduler scheduler(groups.optimizer, "linear", 2, 6);
  // factor(0)=0, 0.5, then (6-s)/4: 1, 0.75, 0.5, 0.25, 0, and stays 0.
  const std::vector<double> expected = {0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0};
  for (std::size_t s = 0; s < expected.size(); ++s) {
    if (s > 0) scheduler.step();
    EXPECT_DOUBLE_EQ(groups.lrs()[0], expected[s]) << "step " << s;
  }
  EXPECT_EQ(scheduler.base_lrs(), std::vector<double>{1.0});
  EXPECT_EQ(scheduler.type(), "linear");
}

TEST(LrSchedulerTest, ScheduleFactorEdgeCases) {
  EXPECT_EQ(schedule_factor("constant", 1000, 0, 0), 1.0);
  EXPECT_EQ(schedule_factor("constant_with_warmup", 0, 0, 0), 1.0);
  EXPECT_EQ(schedule_factor("constant_with_warmup", 3, 4, 0), 0.75);
  EXPECT_EQ(schedule_factor("cosine", 5, 5, 30), 1.0);
  EXPECT_EQ(schedule_factor("cosine", 30, 5, 30), 0.0);
  EXPECT_NEAR(schedule_factor("cosine", 35, 5, 30), 0.5 * (1 + std::cos(M_PI * 30.0 / 25.0)), 1e-15)
      << "HF's cosine rises again after the last step; no clamp beyond max(0, .)";
  EXPECT_EQ(schedule_factor("linear", 4, 4, 4), 0.0)
      << "max(1, total - warmup) guards the division";
}

TEST(LrSchedulerTest, UnknownTypeUsesHfWording) {
  TwoGroups groups({1e-3});
  EXPECT_THAT([&] { LrScheduler(groups.optimizer, "foo", 0, 10); },
              ThrowsMessage<c10::ValueError>(HasSubstr(
                  "foo is not a valid SchedulerType, please select one of ['linear', 'cosine', "
                  "'constant', 'constant_with_warmup']")));
  EXPECT_THROW(schedule_factor("Linear", 0, 0, 10), c10::ValueError);
  EXPECT_THAT([&] { LrScheduler(groups.optimizer, "linear", -1, 10); },
              ThrowsMessage<c10::ValueError>(HasSubstr("num_warmup_steps must be >= 0, got -1")));
  EXPECT_THAT([&] { schedule_factor("cosine", 0, 0, -5); },
              ThrowsMessage<c10::ValueError>(HasSubstr("num_training_steps must be >= 0, got -5")));
  EXPECT_EQ(groups.lrs()[0], 1e-3) << "a rejected scheduler leaves the optimizer alone";
}

TEST(LrSchedulerTest, WorksThroughGetLrOfAnyOptimizer) {
  auto w = torch::zeros({3}, torch::requires_grad());
  torch::optim::AdamW adamw({w}, torch::optim::AdamWOptions(2e-3));
  LrScheduler scheduler(adamw, "constant_with_warmup", 4, 100);
  EXPECT_EQ(static_cast<torch::optim::AdamWOptions&>(adamw.param_groups()[0].options()).lr(), 0.0);
  scheduler.step();
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamWOptions&>(adamw.param_groups()[0].options()).lr(),
                   5e-4);
}

TEST(LrSchedulerTest, StateDictHasPyTorchKeysAndResumes) {
  TwoGroups groups({1e-3, 3e-4});
  LrScheduler scheduler(groups.optimizer, "cosine", 5, 30);
  for (int i = 0; i < 12; ++i) scheduler.step();
  const auto state = scheduler.state_dict();
  std::vector<std::string> keys;
  for (const auto& entry : state) keys.push_back(entry.key().toStringRef());
  EXPECT_THAT(keys, ::testing::UnorderedElementsAre("base_lrs", "last_epoch", "_step_count",
                                                    "_is_initial", "_get_lr_called_within_step",
                                                    "_last_lr", "lr_lambdas"));
  EXPECT_EQ(state.at("last_epoch").toInt(), 12);
  EXPECT_EQ(state.at("_step_count").toInt(), 13);
  EXPECT_EQ(state.at("base_lrs").toDoubleVector(), (std::vector<double>{1e-3, 3e-4}));
  EXPECT_EQ(state.at("_last_lr").toDoubleVector(), scheduler.get_last_lr());
  EXPECT_EQ(state.at("lr_lambdas").toListRef().size(), 2u);

  // Resume: a fresh scheduler (which sets lr to factor(0) = 0) loads the state and continues
  // exactly where the first one is.
  TwoGroups resumed_groups({1e-3, 3e-4});
  LrScheduler resumed(resumed_groups.optimizer, "cosine", 5, 30);
  resumed.load_state_dict(state);
  EXPECT_EQ(resumed.last_epoch(), 12);
  EXPECT_EQ(resumed.get_last_lr(), scheduler.get_last_lr());
  scheduler.step();
  resumed.step();
  EXPECT_EQ(resumed_groups.lrs(), groups.lrs());
  EXPECT_EQ(resumed.state_dict().at("_step_count").toInt(), 14);
}

TEST(LrSchedulerTest, LoadStateDictChecksItsInput) {
  TwoGroups groups({1e-3, 3e-4});
  LrScheduler scheduler(groups.optimizer, "linear", 0, 10);
  TwoGroups one_group({1e-3});
  LrScheduler other(one_group.optimizer, "linear", 0, 10);
  EXPECT_THAT([&] { scheduler.load_state_dict(other.state_dict()); },
              ThrowsMessage<c10::ValueError>(
                  HasSubstr("'base_lrs' has 1 entries but the optimizer has 2 param groups")));
  c10::impl::GenericDict missing(c10::StringType::get(), c10::AnyType::get());
  missing.insert("base_lrs", c10::List<double>({1e-3, 3e-4}));
  EXPECT_THAT([&] { scheduler.load_state_dict(missing); },
              ThrowsMessage<c10::ValueError>(HasSubstr("has no key 'last_epoch'")));
  missing.insert("last_epoch", std::string("three"));
  EXPECT_THAT([&] { scheduler.load_state_dict(missing); },
              ThrowsMessage<c10::ValueError>(HasSubstr("'last_epoch' must be an int")));
  EXPECT_EQ(scheduler.last_epoch(), 0) << "a rejected state leaves the scheduler as it was";
}

TEST(LrSchedulerTest, SaveAndLoadAFile) {
  TempDir dir;
  TwoGroups groups({1e-3, 3e-4});
  LrScheduler scheduler(groups.optimizer, "linear", 3, 20);
  for (int i = 0; i < 7; ++i) scheduler.step();
  scheduler.save(dir.file("scheduler.pt"));
  TwoGroups other_groups({1e-3, 3e-4});
  LrScheduler loaded(other_groups.optimizer, "linear", 3, 20);
  loaded.load(dir.file("scheduler.pt"));
  EXPECT_EQ(loaded.last_epoch(), 7);
  EXPECT_EQ(loaded.get_last_lr(), scheduler.get_last_lr());
  EXPECT_THAT([&] { loaded.load(dir.file("absent.pt")); },
              ThrowsMessage<c10::Error>(HasSubstr("absent.pt")));
}

// Python reads our scheduler.pt into HF's LambdaLR and continues; we read Python's.
constexpr const char* kPythonSchedulerScript = R"PY(
import functools, math, sys
import torch

def linear(current_step, *, num_warmup_steps, num_training_steps):  # transformers' lambda
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))

def make():
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": 1e-3}, {"params": [params[1]], "lr": 3e-4}])
    lam = functools.partial(linear, num_warmup_steps=3, num_training_steps=20)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lam)

mode, path = sys.argv[1].split(":", 1)
if mode == "read":
    state = torch.load(path)  # weights_only=True by default: plain containers only
    assert state["last_epoch"] == 7 and state["_step_count"] == 8, state
    assert state["base_lrs"] == [1e-3, 3e-4], state
    assert state["lr_lambdas"] == [{}, {}], state
    opt, sched = make()
    sched.load_state_dict(state)
    assert sched.get_last_lr() == state["_last_lr"], (sched.get_last_lr(), state["_last_lr"])
    sched.step()
    print("PY_LR", repr(sched.get_last_lr()[0]), repr(sched.get_last_lr()[1]))
else:
    opt, sched = make()
    for _ in range(9):
        opt.step()
        sched.step()
    torch.save(sched.state_dict(), path)
    print("PY_SAVED", repr(sched.get_last_lr()[0]))
)PY";

TEST(LrSchedulerInteropTest, PythonLoadsOurSchedulerPt) {
  TempDir dir;
  std::string python;
  MANTISSA_SKIP_WITHOUT_PYTHON_MODULES(python, "torch", dir.path());
  TwoGroups groups({1e-3, 3e-4});
  LrScheduler scheduler(groups.optimizer, "linear", 3, 20);
  for (int i = 0; i < 7; ++i) scheduler.step();
  scheduler.save(dir.file("scheduler.pt"));
  const auto result = mantissa_test::run_python(python, kPythonSchedulerScript,
                                                "read:" + dir.file("scheduler.pt"), dir.path());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  scheduler.step();
  const auto lrs = scheduler.get_last_lr();
  // Python's repr of the same doubles: compare as parsed numbers.
  const auto at = result.output.find("PY_LR ");
  ASSERT_NE(at, std::string::npos) << result.output;
  std::istringstream in(result.output.substr(at + 6));
  double py0 = 0, py1 = 0;
  in >> py0 >> py1;
  EXPECT_EQ(py0, lrs[0]);
  EXPECT_EQ(py1, lrs[1]);
}

TEST(LrSchedulerInteropTest, WeLoadPythonsSchedulerPt) {
  TempDir dir;
  std::string python;
  MANTISSA_SKIP_WITHOUT_PYTHON_MODULES(python, "torch", dir.path());
  const auto path = dir.file("python_scheduler.pt");
  const auto result =
      mantissa_test::run_python(python, kPythonSchedulerScript, "write:" + path, dir.path());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  TwoGroups groups({1e-3, 3e-4});
  LrScheduler scheduler(groups.optimizer, "linear", 3, 20);
  scheduler.load(path);
  EXPECT_EQ(scheduler.last_epoch(), 9);
  EXPECT_EQ(scheduler.state_dict().at("_step_count").toInt(), 10);
  EXPECT_EQ(scheduler.base_lrs(), (std::vector<double>{1e-3, 3e-4}));
  EXPECT_DOUBLE_EQ(scheduler.get_last_lr()[0], 1e-3 * (20.0 - 9.0) / 17.0);
  scheduler.step();
  EXPECT_DOUBLE_EQ(groups.lrs()[0], 1e-3 * (20.0 - 10.0) / 17.0);
}

}  // namespace
