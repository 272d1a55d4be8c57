// Hugging Face's lr schedules over LambdaLR: bit-for-bit parity with transformers.get_scheduler
// and its lr_scheduler_kwargs (tests/golden/make_lr_schedule_golden.py), the kwargs' checks,
// state dicts, files, and Python interop.
#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <set>
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

using mantissa::check_lr_scheduler_kwargs;
using mantissa::LrScheduler;
using mantissa::LrSchedulerKwargs;
using mantissa::schedule_factor;
using mantissa_test::TempDir;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

const json& golden() { return mantissa_test::golden_file("lr_schedules.json"); }

// An SGD optimizer with one param group per base lr, and `defaults_lr` as its default lr (what
// polynomial's lr_end and min_lr are relative to, as `optimizer.defaults["lr"]` in Python).
struct TwoGroups {
  explicit TwoGroups(const std::vector<double>& lrs, double defaults_lr = 0.1)
      : optimizer(make_groups(lrs), torch::optim::SGDOptions(defaults_lr)) {}
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

// The kwargs of a golden case, with JSON's integers as integers and its floats as floats (as
// Python passed them to transformers).
LrSchedulerKwargs kwargs_of(const json& object) {
  LrSchedulerKwargs kwargs;
  for (const auto& [key, value] : object.items()) {
    if (value.is_number_integer()) {
      kwargs[key] = value.get<int64_t>();
    } else if (value.is_number_float()) {
      kwargs[key] = value.get<double>();
    } else {
      kwargs[key] = value.get<std::string>();
    }
  }
  return kwargs;
}

// The same double, bit for bit (0.0 and -0.0 differ; so would two nans).
::testing::AssertionResult same_bits(double actual, double expected) {
  if (std::memcmp(&actual, &expected, sizeof(double)) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << std::setprecision(17) << actual << " is not " << expected << " ("
         << std::nextafter(expected, actual) - expected << " per ulp)";
}

TEST(LrSchedulerGoldenTest, MatchesTransformersSchedulesBitForBit) {
  const auto& doc = golden();
  const auto base_lrs = doc["base_lrs"].get<std::vector<double>>();
  const auto defaults_lr = doc["defaults_lr"].get<double>();
  std::set<std::string> schedules;
  int compared = 0;
  for (const auto& c : doc["cases"]) {
    const auto name = c["name"].get<std::string>();
    const auto kwargs = kwargs_of(c["kwargs"]);
    const auto warmup = c["num_warmup_steps"].get<int64_t>();
    const auto total = c["num_training_steps"].get<int64_t>();
    const auto steps = c["steps"].get<int64_t>();
    SCOPED_TRACE(name + " " + c["kwargs"].dump() + " warmup " + std::to_string(warmup) + " total " +
                 std::to_string(total));
    schedules.insert(name);
    TwoGroups groups(base_lrs, defaults_lr);
    LrScheduler scheduler(groups.optimizer, name, warmup, total, kwargs);
    EXPECT_EQ(scheduler.kwargs(), kwargs);
    for (int64_t step = 0; step <= steps; ++step) {
      if (step > 0) scheduler.step();
      const auto want = c["lrs"][step].get<std::vector<double>>();
      const auto got = groups.lrs();
      ASSERT_EQ(got.size(), want.size());
      const double f = schedule_factor(name, step, warmup, total, kwargs, defaults_lr);
      for (std::size_t g = 0; g < want.size(); ++g) {
        SCOPED_TRACE("step " + std::to_string(step) + " group " + std::to_string(g));
        EXPECT_TRUE(same_bits(got[g], want[g]));
        EXPECT_TRUE(same_bits(scheduler.get_last_lr()[g], want[g]));
        EXPECT_TRUE(same_bits(base_lrs[g] * f, want[g]));
        ++compared;
      }
      EXPECT_EQ(scheduler.last_epoch(), step);
    }
    const auto& state = c["state_dict"];
    const auto ours = scheduler.state_dict();
    EXPECT_EQ(ours.at("last_epoch").toInt(), state["last_epoch"].get<int64_t>());
    EXPECT_EQ(ours.at("_step_count").toInt(), state["_step_count"].get<int64_t>());
    EXPECT_EQ(ours.at("base_lrs").toDoubleVector(), state["base_lrs"].get<std::vector<double>>());
    const auto last_lr = ours.at("_last_lr").toDoubleVector();
    const auto want_last = state["_last_lr"].get<std::vector<double>>();
    ASSERT_EQ(last_lr.size(), want_last.size());
    for (std::size_t g = 0; g < last_lr.size(); ++g)
      EXPECT_TRUE(same_bits(last_lr[g], want_last[g]));
  }
  // Every schedule mantissa has is in the file, and every step of every case was compared.
  for (std::size_t i = 0; i < mantissa::Choice<mantissa::SchedulerType>::size(); ++i) {
    EXPECT_EQ(schedules.count(mantissa::Choice<mantissa::SchedulerType>::name_at(i)), 1u)
        << mantissa::Choice<mantissa::SchedulerType>::name_at(i) << " has no golden case";
  }
  EXPECT_EQ(doc["cases"].size(), 46u);
  EXPECT_GT(compared, 46 * 2 * 8);
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
                  "'cosine_with_restarts', 'polynomial', 'constant', 'constant_with_warmup', "
                  "'inverse_sqrt', 'cosine_with_min_lr', 'cosine_warmup_with_min_lr', "
                  "'warmup_stable_decay']")));
  EXPECT_THROW(schedule_factor("Linear", 0, 0, 10), c10::ValueError);
  EXPECT_THAT([&] { LrScheduler(groups.optimizer, "linear", -1, 10); },
              ThrowsMessage<c10::ValueError>(HasSubstr("num_warmup_steps must be >= 0, got -1")));
  EXPECT_THAT([&] { schedule_factor("cosine", 0, 0, -5); },
              ThrowsMessage<c10::ValueError>(HasSubstr("num_training_steps must be >= 0, got -5")));
  EXPECT_EQ(groups.lrs()[0], 1e-3) << "a rejected scheduler leaves the optimizer alone";
}

// ---- lr_scheduler_kwargs ----------------------------------------------------------------------

// The message of the c10::ValueError that checking `kwargs` for `type` throws, or a marker.
std::string kwargs_error(const char* type, const LrSchedulerKwargs& kwargs,
                         std::optional<double> initial_lr = 1e-3) {
  try {
    check_lr_scheduler_kwargs(type, kwargs, initial_lr);
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "<no exception>";
}

TEST(LrSchedulerKwargsTest, AKeyTheScheduleDoesNotTakeNamesWhatItTakes) {
  EXPECT_THAT(kwargs_error("cosine", {{"num_cycle", 2}}),
              HasSubstr("lr_scheduler_kwargs: 'num_cycle': 2 is not an argument of the cosine "
                        "schedule (transformers' get_cosine_schedule_with_warmup), which takes "
                        "num_cycles"));
  EXPECT_THAT(kwargs_error("linear", {{"num_cycles", 0.5}}),
              HasSubstr("'num_cycles': 0.5 is not an argument of the linear schedule "
                        "(transformers' get_linear_schedule_with_warmup), which takes no "
                        "lr_scheduler_kwargs"));
  EXPECT_THAT(kwargs_error("warmup_stable_decay", {{"num_decay_steps", 10}, {"decay", "linear"}}),
              HasSubstr("which takes num_decay_steps, num_stable_steps, warmup_type, decay_type, "
                        "min_lr_ratio, num_cycles"));
  EXPECT_THAT(kwargs_error("polynomial", {{"num_training_steps", 100}}),
              HasSubstr("the length come from --warmup_steps / --warmup_ratio and the run's "
                        "number of steps"));
  // HF calls constant's and constant_with_warmup's functions without the kwargs; mantissa
  // refuses them rather than ignore them.
  EXPECT_THAT(kwargs_error("constant", {{"num_cycles", 2}}),
              HasSubstr("is not an argument of the constant schedule"));
  EXPECT_THAT(kwargs_error("constant_with_warmup", {{"last_epoch", 3}}),
              HasSubstr("is not an argument of the constant_with_warmup schedule"));
  EXPECT_THAT(kwargs_error("cosine", {{std::string(200, 'k'), 1}}),
              HasSubstr("'" + std::string(60, 'k') + "...': 1 is not an argument"))
      << "a long key is cut short";
}

TEST(LrSchedulerKwargsTest, AValueOfTheWrongTypeNamesKeyAndValue) {
  EXPECT_THAT(kwargs_error("cosine", {{"num_cycles", "two"}}),
              HasSubstr("lr_scheduler_kwargs: num_cycles of the cosine schedule must be a "
                        "number, got 'two' (a string)"));
  EXPECT_THAT(kwargs_error("inverse_sqrt", {{"timescale", 2.5}}),
              HasSubstr("timescale of the inverse_sqrt schedule must be an integer (a number of "
                        "steps), got 2.5 (a float)"));
  EXPECT_THAT(kwargs_error("warmup_stable_decay", {{"num_decay_steps", 10.0}}),
              HasSubstr("num_decay_steps of the warmup_stable_decay schedule must be an integer "
                        "(a number of steps), got 10.0 (a float)"));
  EXPECT_THAT(kwargs_error("warmup_stable_decay", {{"num_decay_steps", 10}, {"decay_type", 1}}),
              HasSubstr("decay_type of the warmup_stable_decay schedule must be a string, got 1 "
                        "(an integer)"));
  EXPECT_EQ(kwargs_error("cosine_with_restarts", {{"num_cycles", 3}}), "<no exception>")
      << "an integer is a number";
  EXPECT_EQ(kwargs_error("polynomial", {{"lr_end", 0}, {"power", 2}}), "<no exception>");
}

TEST(LrSchedulerKwargsTest, BadValuesNameKeyAndValue) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct BadCase {
    const char* type;
    LrSchedulerKwargs kwargs;
    const char* message;
  };
  const std::vector<BadCase> cases = {
      {"cosine",
       {{"num_cycles", -1}},
       "num_cycles of the cosine schedule counts cosine waves: it must be >= 0, got -1"},
      {"cosine",
       {{"num_cycles", nan}},
       "num_cycles of the cosine schedule must be a finite number, got nan"},
      {"polynomial", {{"power", 0.0}}, "power of the polynomial schedule must be > 0, got 0.0"},
      {"polynomial",
       {{"lr_end", -1e-5}},
       "lr_end of the polynomial schedule is a learning rate: it must be >= 0, got -1e-05"},
      // HF's check and text, against the optimizer's lr (1e-3 here).
      {"polynomial",
       {{"lr_end", 1e-3}},
       "lr_end (0.001) must be smaller than initial lr (0.001) for the polynomial schedule"},
      {"inverse_sqrt",
       {{"timescale", 0}},
       "timescale of the inverse_sqrt schedule must be at least 1 (a number of steps), got 0"},
      {"cosine_with_min_lr",
       {},
       "One of min_lr or min_lr_rate should be set through the `lr_scheduler_kwargs` "
       "(cosine_with_min_lr got neither)"},
      {"cosine_warmup_with_min_lr",
       {{"min_lr", 1e-5}, {"min_lr_rate", 0.1}},
       "Only one of min_lr or min_lr_rate should be set (cosine_warmup_with_min_lr got both)"},
      {"cosine_with_min_lr",
       {{"min_lr_rate", 1.5}},
       "min_lr_rate of the cosine_with_min_lr schedule is a fraction of the initial lr: it must "
       "lie in [0, 1], got 1.5"},
      {"cosine_with_min_lr",
       {{"min_lr", 2e-3}},
       "min_lr of the cosine_with_min_lr schedule is a learning rate: it must lie in [0, the "
       "initial lr 0.001], got 0.002"},
      {"cosine_warmup_with_min_lr",
       {{"min_lr_rate", 0.1}, {"warmup_lr_rate", -0.5}},
       "warmup_lr_rate of the cosine_warmup_with_min_lr schedule is the first step's fraction of "
       "the lr: it must lie in [0, 1], got -0.5"},
      {"warmup_stable_decay",
       {},
       "the warmup_stable_decay schedule (transformers' get_wsd_schedule) needs num_decay_steps"},
      {"warmup_stable_decay",
       {{"num_decay_steps", -1}},
       "num_decay_steps of the warmup_stable_decay schedule must be >= 0, got -1"},
      {"warmup_stable_decay",
       {{"num_decay_steps", 1}, {"num_stable_steps", -2}},
       "num_stable_steps of the warmup_stable_decay schedule must be >= 0, got -2"},
      {"warmup_stable_decay",
       {{"num_decay_steps", 1}, {"decay_type", "exp"}},
       "Unknown decay type: exp, expected 'linear', 'cosine' or '1-sqrt'"},
      {"warmup_stable_decay",
       {{"num_decay_steps", 1}, {"warmup_type", "Linear"}},
       "Unknown warmup type: Linear, expected 'linear', 'cosine' or '1-sqrt'"},
      {"warmup_stable_decay",
       {{"num_decay_steps", 1}, {"min_lr_ratio", 2}},
       "min_lr_ratio of the warmup_stable_decay schedule is a fraction of the lr: it must lie in "
       "[0, 1], got 2 (an integer)"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(kwargs_error(c.type, c.kwargs), HasSubstr(c.message)) << c.type;
  }
  // polynomial's default lr_end of 1e-7 needs a larger lr, as in HF.
  EXPECT_THAT(kwargs_error("polynomial", {}, 1e-8),
              HasSubstr("lr_end (1e-07) must be smaller than initial lr (1e-08)"));
  EXPECT_THAT(kwargs_error("cosine_with_min_lr", {{"min_lr", 0.0}}, 0.0),
              HasSubstr("min_lr of the cosine_with_min_lr schedule is divided by the initial lr, "
                        "which is 0.0"));
}

TEST(LrSchedulerKwargsTest, EdgeValuesAreAccepted) {
  EXPECT_EQ(kwargs_error("cosine", {{"num_cycles", 0}}), "<no exception>");
  EXPECT_EQ(kwargs_error("cosine_with_min_lr", {{"min_lr_rate", 1}}), "<no exception>");
  EXPECT_EQ(kwargs_error("cosine_with_min_lr", {{"min_lr", 1e-3}}), "<no exception>");
  EXPECT_EQ(kwargs_error("cosine_warmup_with_min_lr", {{"min_lr_rate", 0}, {"warmup_lr_rate", 0}}),
            "<no exception>");
  EXPECT_EQ(kwargs_error("warmup_stable_decay", {{"num_decay_steps", 0}, {"min_lr_ratio", 1.0}}),
            "<no exception>");
  EXPECT_EQ(kwargs_error("inverse_sqrt", {{"timescale", 1}}), "<no exception>");
  // Without the optimizer's lr, the checks that need it wait for the scheduler.
  EXPECT_EQ(kwargs_error("polynomial", {{"lr_end", 1.0}}, std::nullopt), "<no exception>");
  EXPECT_EQ(kwargs_error("cosine_with_min_lr", {{"min_lr", 5.0}}, std::nullopt), "<no exception>");
}

TEST(LrSchedulerKwargsTest, TheSchedulerChecksAgainstItsOptimizer) {
  TwoGroups groups({1e-3, 3e-4}, /*defaults_lr=*/1e-3);
  EXPECT_THAT(
      [&] {
        LrScheduler(groups.optimizer, "polynomial", 0, 10, {{"lr_end", 2e-3}});
      },
      ThrowsMessage<c10::ValueError>(
          HasSubstr("lr_end (0.002) must be smaller than initial lr (0.001)")));
  EXPECT_THAT(
      [&] {
        LrScheduler(groups.optimizer, "cosine", 0, 10, {{"min_lr", 1e-5}});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("is not an argument of the cosine")));
  // Python divides by num_training_steps - num_warmup_steps at the last step.
  EXPECT_THAT([&] { LrScheduler(groups.optimizer, "polynomial", 4, 4); },
              ThrowsMessage<c10::ValueError>(
                  HasSubstr("the polynomial schedule decays over num_training_steps - "
                            "num_warmup_steps steps, which is 0 here (4 - 4")));
  EXPECT_EQ(groups.lrs(), (std::vector<double>{1e-3, 3e-4})) << "rejected: the lrs are untouched";
  EXPECT_THAT([&] { schedule_factor("polynomial", 0, 0, 10); },
              ThrowsMessage<c10::ValueError>(HasSubstr(
                  "the polynomial schedule is relative to the optimizer's initial lr: pass "
                  "initial_lr")));
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(
      [&] {
        schedule_factor("warmup_stable_decay", 0, 5, 10,
                        {{"num_decay_steps", 1}, {"num_stable_steps", max}});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("add up to more steps than a 64-bit count holds")));
  // A step count near the int64 limit stays finite where Python's integers would not overflow.
  EXPECT_GT(schedule_factor("inverse_sqrt", max, 0, 0, {{"timescale", max}}), 0.0);
  EXPECT_EQ(schedule_factor("warmup_stable_decay", max, 0, max, {{"num_decay_steps", max}}), 0.0);
}

TEST(LrSchedulerKwargsTest, SchedulesByHand) {
  // cosine_with_restarts, 2 cycles over 8 steps: 1 at the start of each cycle, 0.5 half-way.
  EXPECT_EQ(schedule_factor("cosine_with_restarts", 0, 0, 8, {{"num_cycles", 2}}), 1.0);
  EXPECT_DOUBLE_EQ(schedule_factor("cosine_with_restarts", 2, 0, 8, {{"num_cycles", 2}}), 0.5);
  EXPECT_EQ(schedule_factor("cosine_with_restarts", 4, 0, 8, {{"num_cycles", 2}}), 1.0);
  EXPECT_EQ(schedule_factor("cosine_with_restarts", 8, 0, 8, {{"num_cycles", 2}}), 0.0);
  // polynomial with power 1 is linear from lr down to lr_end (absolute: lr 1e-2, lr_end 1e-3).
  EXPECT_DOUBLE_EQ(schedule_factor("polynomial", 5, 0, 10, {{"lr_end", 1e-3}}, 1e-2), 0.55);
  EXPECT_DOUBLE_EQ(schedule_factor("polynomial", 11, 0, 10, {{"lr_end", 1e-3}}, 1e-2), 0.1);
  // inverse_sqrt: 1 at the end of the warmup, 1/2 at four times the timescale.
  EXPECT_EQ(schedule_factor("inverse_sqrt", 4, 4, 0), 1.0);
  EXPECT_EQ(schedule_factor("inverse_sqrt", 16, 4, 0), 0.5);
  EXPECT_EQ(schedule_factor("inverse_sqrt", 20000, 0, 0), 1.0 / std::sqrt(3.0))
      << "no warmup: timescale 10000";
  // cosine_with_min_lr ends at min_lr_rate, or at min_lr / lr.
  EXPECT_DOUBLE_EQ(schedule_factor("cosine_with_min_lr", 10, 0, 10, {{"min_lr_rate", 0.1}}), 0.1);
  EXPECT_DOUBLE_EQ(schedule_factor("cosine_with_min_lr", 10, 0, 10, {{"min_lr", 1e-4}}, 1e-3), 0.1);
  // warmup_stable_decay: 2 warmup, 3 stable, 4 decay (linear) down to 0.2, then 0.2.
  const LrSchedulerKwargs wsd = {
      {"num_decay_steps", 4}, {"decay_type", "linear"}, {"min_lr_ratio", 0.2}};
  const std::vector<double> expected = {0.2, 0.6, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2};
  for (std::size_t step = 0; step < expected.size(); ++step) {
    EXPECT_NEAR(schedule_factor("warmup_stable_decay", step, 2, 9, wsd), expected[step], 1e-15)
        << "step " << step;
  }
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
