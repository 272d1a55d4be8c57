// report_to as a list of registered integrations: the registry, what a list means ("none",
// "all", mixes, repeats, unknown names), its forms on the command line and in
// training_args.json, and an integration added from outside the library that a Trainer reports
// to.
#include <mantissa/integrations.h>

#include <cstddef>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <mantissa/report_to.h>
#include <mantissa/tensorboard_callback.h>
#include <mantissa/trainer.h>
#include "io/filesystem.h"

#include "toy_training.h"
#include "trainer/reporting.h"
#include "value_error.h"

namespace {

using mantissa::LogEntry;
using mantissa::ReportTo;
using mantissa::Trainer;
using mantissa::TrainerCallback;
using mantissa::TrainerControl;
using mantissa::TrainerState;
using mantissa::TrainingArguments;
using mantissa_test::value_error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Registered while the test binary's statics are initialised, before main() and in no
// particular order with the library's own: the registry must already hold tensorboard.
const bool kStaticTrackerRegistered = [] {
  mantissa::register_integration(
      "static_tracker", [] { return std::make_shared<TrainerCallback>(); },
      "does nothing; registered by a static initialiser");
  return true;
}();

std::size_t count_lines(const std::string& path) {
  std::ifstream in(path);
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

// A toy integration: keeps each log it receives, and how many lines trainer_log.jsonl held at
// that moment.
class ToyTracker : public TrainerCallback {
 public:
  void on_log(const TrainingArguments& args, TrainerState& /*state*/, TrainerControl& /*control*/,
              const LogEntry& logs) override {
    logs_.push_back(logs);
    jsonl_lines_.push_back(
        count_lines(mantissa::io::join_path(args.output_dir(), "trainer_log.jsonl")));
  }
  std::vector<LogEntry> logs_;
  std::vector<std::size_t> jsonl_lines_;
};

// Every ToyTracker the registry's factory made, in order; and whether it should return null.
struct ToyTrackerFactory {
  std::vector<std::shared_ptr<ToyTracker>> made;
  bool return_null = false;
};

ToyTrackerFactory& toy_factory() {
  static ToyTrackerFactory factory;
  return factory;
}

// Registers "toy_tracker" the first time (a name stays registered for the whole process).
void register_toy_tracker() {
  static const bool registered = [] {
    mantissa::register_integration(
        "toy_tracker",
        []() -> std::shared_ptr<TrainerCallback> {
          if (toy_factory().return_null) return nullptr;
          toy_factory().made.push_back(std::make_shared<ToyTracker>());
          return toy_factory().made.back();
        },
        "records the logs it gets, for a test");
    return true;
  }();
  ASSERT_TRUE(registered);
}

std::vector<std::string> registered_names() {
  std::vector<std::string> names;
  for (const auto& info : mantissa::registered_integrations()) names.push_back(info.name);
  return names;
}

std::string validate_error(const TrainingArguments& args) {
  return value_error_of([&] { args.validate(); });
}

// ---- the registry -----------------------------------------------------------------------------

TEST(IntegrationRegistryTest, TensorboardFirstThenWhatProgramsRegister) {
  ASSERT_TRUE(kStaticTrackerRegistered);
  register_toy_tracker();
  const auto names = registered_names();
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(names.front(), "tensorboard");
  EXPECT_THAT(names, ::testing::Contains("static_tracker"));
  EXPECT_THAT(names, ::testing::Contains("toy_tracker"));
  EXPECT_TRUE(mantissa::is_registered_integration("tensorboard"));
  EXPECT_FALSE(mantissa::is_registered_integration("wandb"));
  EXPECT_EQ(mantissa::registered_integrations().front().description,
            "event files under output_dir/runs/ for tensorboard --logdir");
  EXPECT_NE(std::dynamic_pointer_cast<mantissa::TensorBoardCallback>(
                mantissa::make_integration_callback("tensorboard")),
            nullptr);
  // report_to's callbacks: one per name, in the list's order, each a new one.
  const auto callbacks = mantissa::detail::make_reporting_callbacks(
      TrainingArguments().report_to("toy_tracker,tensorboard"));
  ASSERT_EQ(callbacks.size(), 2u);
  EXPECT_EQ(callbacks[0], toy_factory().made.back());
  EXPECT_NE(std::dynamic_pointer_cast<mantissa::TensorBoardCallback>(callbacks[1]), nullptr);
  EXPECT_THAT(mantissa::detail::make_reporting_callbacks(TrainingArguments()), IsEmpty());
}

TEST(IntegrationRegistryTest, RefusesNamesReportToCannotHold) {
  const auto nothing = [] { return std::make_shared<TrainerCallback>(); };
  const auto error = [&](const std::string& name) {
    return value_error_of([&] { mantissa::register_integration(name, nothing); });
  };
  EXPECT_THAT(error(""), HasSubstr("register_integration: '' cannot name an integration"));
  EXPECT_THAT(error("a,b"), HasSubstr("'a,b' cannot name an integration: report_to needs a name "
                                      "that is not empty, with no comma and no whitespace"));
  EXPECT_THAT(error("my tracker"), HasSubstr("'my tracker' cannot name an integration"));
  EXPECT_THAT(error("none"), HasSubstr("'none' cannot name an integration: report_to reads it as "
                                       "no integration"));
  EXPECT_THAT(error("all"), HasSubstr("reads it as every integration"));
  EXPECT_THAT(error("tensorboard"),
              HasSubstr("register_integration: 'tensorboard' is registered already"));
  EXPECT_THAT(value_error_of([] { mantissa::register_integration("no_factory", nullptr); }),
              HasSubstr("'no_factory' has no factory"));
  EXPECT_FALSE(mantissa::is_registered_integration("no_factory"));
  EXPECT_THAT(value_error_of([] { mantissa::make_integration_callback("wandb"); }),
              HasSubstr("report_to: 'wandb' is not a registered integration (registered: "
                        "tensorboard, "));
  register_toy_tracker();
  toy_factory().return_null = true;
  const auto null_error =
      value_error_of([] { mantissa::make_integration_callback("toy_tracker"); });
  toy_factory().return_null = false;
  EXPECT_THAT(null_error,
              HasSubstr("the factory of integration 'toy_tracker' returned a null callback"));
}

// ---- what a list means --------------------------------------------------------------------------

TEST(ReportToTest, NoneAndAllAloneAreHuggingFacesShorthands) {
  register_toy_tracker();
  // "none" is the empty list, however it is spelt; it is the default.
  for (const ReportTo& none : {ReportTo(), ReportTo("none"), ReportTo{"none"}, ReportTo{},
                               ReportTo(std::vector<std::string>{})}) {
    EXPECT_THAT(none.names(), IsEmpty());
    EXPECT_TRUE(none.empty());
    EXPECT_EQ(none.text(), "none");
  }
  EXPECT_EQ(TrainingArguments().report_to(), ReportTo());
  EXPECT_EQ(TrainingArguments().report_to("tensorboard").report_to({}).report_to(), ReportTo());
  // "all" is every integration registered when it is read, tensorboard first.
  EXPECT_EQ(ReportTo("all").names(), registered_names());
  EXPECT_EQ(ReportTo{"all"}.names(), registered_names());
  EXPECT_THAT(ReportTo("all").names(), ::testing::Contains("toy_tracker"));
  EXPECT_EQ(validate_error(TrainingArguments().report_to("all")), "<no c10::ValueError>");
  EXPECT_EQ(validate_error(TrainingArguments().report_to("none")), "<no c10::ValueError>");
  // Among other names neither stands for anything; HF fails on them when the Trainer starts
  // ("none is not supported"), here validate() says why.
  EXPECT_EQ(ReportTo("tensorboard,none").names(),
            (std::vector<std::string>{"tensorboard", "none"}));
  EXPECT_EQ(validate_error(TrainingArguments().report_to("tensorboard,none")),
            "report_to: 'none' (in 'tensorboard,none') stands for no integration and cannot be "
            "combined with other names; give it alone");
  EXPECT_EQ(validate_error(TrainingArguments().report_to({"all", "tensorboard"})),
            "report_to: 'all' (in 'all,tensorboard') stands for every registered integration and "
            "cannot be combined with other names; give it alone");
  EXPECT_THAT(validate_error(TrainingArguments().report_to("none,none")),
              HasSubstr("'none' (in 'none,none') stands for no integration"));
}

TEST(ReportToTest, NamesAreCheckedOneByOne) {
  register_toy_tracker();
  // The setter takes a name, a comma-separated text or a list; a list's items are not split.
  EXPECT_THAT(TrainingArguments().report_to("tensorboard").report_to().names(),
              ElementsAre("tensorboard"));
  EXPECT_THAT(TrainingArguments().report_to({"tensorboard"}).report_to().names(),
              ElementsAre("tensorboard"));
  EXPECT_EQ(TrainingArguments().report_to({"toy_tracker", "tensorboard"}).report_to(),
            ReportTo("toy_tracker,tensorboard"));
  EXPECT_THAT(ReportTo{"tensorboard,toy_tracker"}.names(), ElementsAre("tensorboard,toy_tracker"));
  EXPECT_EQ((ReportTo{"toy_tracker", "tensorboard"}.text()), "toy_tracker,tensorboard");
  EXPECT_EQ(validate_error(TrainingArguments().report_to("toy_tracker,tensorboard")),
            "<no c10::ValueError>");
  // An unknown name, with the list it came in and the names there are.
  const auto unknown = validate_error(TrainingArguments().report_to("tensorboard,wandb"));
  EXPECT_THAT(unknown, HasSubstr("report_to: 'wandb' (in 'tensorboard,wandb') is not a registered "
                                 "integration; choose none, all, or names among: tensorboard, "));
  EXPECT_THAT(unknown, HasSubstr("toy_tracker"));
  EXPECT_THAT(unknown, HasSubstr("register_integration()"));
  EXPECT_THAT(validate_error(TrainingArguments().report_to("Tensorboard")),
              HasSubstr("'Tensorboard' (in 'Tensorboard') is not a registered integration"));
  EXPECT_THAT(validate_error(TrainingArguments().report_to("tensorboard,")),
              HasSubstr("'' (in 'tensorboard,') is not a registered integration"));
  EXPECT_THAT(validate_error(TrainingArguments().report_to("")),
              HasSubstr("'' (in '') is not a registered integration"));
  EXPECT_THAT(validate_error(TrainingArguments().report_to({"tensorboard,toy_tracker"})),
              HasSubstr("'tensorboard,toy_tracker' (in 'tensorboard,toy_tracker') is not"));
  // A repeat would report every entry twice.
  EXPECT_EQ(validate_error(TrainingArguments().report_to("tensorboard,toy_tracker,tensorboard")),
            "report_to: 'tensorboard' (in 'tensorboard,toy_tracker,tensorboard') is named twice; "
            "each integration reports once");
  // A hostile value costs a line.
  const std::string long_name(5000, 'x');
  EXPECT_LT(validate_error(TrainingArguments().report_to(long_name)).size(), 600u);
}

// ---- the command line and training_args.json ----------------------------------------------------

TEST(ReportToTest, CommandLineTakesCommaSeparatedNames) {
  register_toy_tracker();
  EXPECT_THAT(
      TrainingArguments::parse({"--report_to", "tensorboard,toy_tracker"}).report_to().names(),
      ElementsAre("tensorboard", "toy_tracker"));
  EXPECT_THAT(TrainingArguments::parse({"--report-to=none"}).report_to().names(), IsEmpty());
  EXPECT_EQ(TrainingArguments::parse({"--report_to", "all"}).report_to().names(),
            registered_names());
  EXPECT_THAT(value_error_of([] {
                TrainingArguments::parse({"--report_to", "wandb"});
              }),
              HasSubstr("report_to: 'wandb' (in 'wandb') is not a registered integration"));
  // --help shows TEXT, the default as the command line spells it, and what is registered now.
  const std::string help = TrainingArguments::help_text();
  EXPECT_THAT(help, HasSubstr("--report_to TEXT"));
  EXPECT_THAT(help, HasSubstr("Registered: tensorboard (event files under output_dir/runs/ for "
                              "tensorboard --logdir);"));
  EXPECT_THAT(help,
              HasSubstr("toy_tracker (records the logs it gets, for a test). (default: none)"));
  EXPECT_THAT(TrainingArguments::flags_help_text({"--report_to", "tensorboard"}),
              HasSubstr("(default: tensorboard)"));
}

TEST(ReportToTest, TrainingArgsJsonHoldsHuggingFacesList) {
  register_toy_tracker();
  const auto json_of = [](const TrainingArguments& args) {
    return nlohmann::ordered_json::parse(args.to_json())["report_to"];
  };
  // As HF's to_json_string writes it: the list after "none" and "all" were replaced.
  EXPECT_EQ(json_of(TrainingArguments()), nlohmann::ordered_json::array());
  EXPECT_THAT(TrainingArguments().to_json(), HasSubstr("\"report_to\": [],"));
  EXPECT_EQ(json_of(TrainingArguments().report_to("toy_tracker,tensorboard")),
            nlohmann::ordered_json({"toy_tracker", "tensorboard"}));
  EXPECT_THAT(TrainingArguments().report_to("tensorboard").to_json(),
              HasSubstr("\"report_to\": [\n    \"tensorboard\"\n  ],"));
  EXPECT_EQ(json_of(TrainingArguments().report_to("all")),
            nlohmann::ordered_json(registered_names()));
  // Read back as the same list.
  for (const auto& report_to : {ReportTo(), ReportTo("tensorboard"), ReportTo("all"),
                                ReportTo("toy_tracker,tensorboard")}) {
    const auto args = TrainingArguments().report_to(report_to);
    const auto read = TrainingArguments::from_json(args.to_json());
    EXPECT_EQ(read.report_to(), report_to) << report_to;
    EXPECT_EQ(read, args);
    EXPECT_EQ(read.to_json(), args.to_json());
  }
  const auto read = [](const std::string& value) {
    return TrainingArguments::from_json(R"({"report_to": )" + value + "}", false).report_to();
  };
  EXPECT_THAT(read(R"(["none"])").names(), IsEmpty());
  EXPECT_EQ(read(R"(["all"])").names(), registered_names());
  // The single string older files hold, read as the command line reads it.
  EXPECT_THAT(read(R"("none")").names(), IsEmpty());
  EXPECT_THAT(read(R"("tensorboard")").names(), ElementsAre("tensorboard"));
  EXPECT_EQ(read(R"("all")").names(), registered_names());
  EXPECT_THAT(read(R"("tensorboard,toy_tracker")").names(),
              ElementsAre("tensorboard", "toy_tracker"));
  // Unknown names are kept as written when reading without validation, and written back.
  const auto kept = TrainingArguments::from_json(R"({"report_to": "tensorboard,wandb"})", false);
  EXPECT_THAT(kept.report_to().names(), ElementsAre("tensorboard", "wandb"));
  EXPECT_THAT(kept.to_json(), HasSubstr("\"report_to\": [\n    \"tensorboard\",\n    \"wandb\"\n"));
  EXPECT_THAT(validate_error(kept), HasSubstr("report_to: 'wandb' (in 'tensorboard,wandb')"));
  EXPECT_THAT(value_error_of([] { TrainingArguments::from_json(R"({"report_to": ["wandb"]})"); }),
              HasSubstr("'wandb' (in 'wandb') is not a registered integration"));
  // What is neither a list of strings nor a string.
  EXPECT_THAT(value_error_of([&] { read("null"); }),
              HasSubstr("report_to: expected a list of integration names or one string, got null"));
  EXPECT_THAT(value_error_of([&] { read("3"); }),
              HasSubstr("report_to: expected a list of integration names or one string, got 3"));
  EXPECT_THAT(value_error_of([&] { read(R"(["tensorboard", 3])"); }),
              HasSubstr("report_to: expected a list of strings, but it holds 3"));
}

// ---- a Trainer reporting to an integration registered here -------------------------------------

TEST(IntegrationTrainerTest, ToyIntegrationGetsEveryLogAfterTrainerLogJsonl) {
  register_toy_tracker();
  const auto dir = mantissa_test::toy_output_dir();
  const auto args = mantissa_test::toy_args(dir)
                        .max_steps(12)
                        .logging_steps(4)
                        .eval_strategy("steps")
                        .eval_steps(6)
                        .report_to("toy_tracker");
  const auto made_before = toy_factory().made.size();
  Trainer trainer(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100),
                  mantissa_test::ToyDataset(40, 3));
  ASSERT_EQ(toy_factory().made.size(), made_before + 1);  // one callback for this Trainer
  const auto tracker = toy_factory().made.back();
  trainer.train();

  // Logs at 4, 8, 12, evaluations at 6 and 12, and the run's summary: what log_history holds,
  // without the "step" the history adds.
  const auto& history = trainer.state().log_history;
  ASSERT_EQ(history.size(), 6u);
  ASSERT_EQ(tracker->logs_.size(), history.size());
  for (std::size_t i = 0; i < history.size(); ++i) {
    LogEntry expected = history[i];
    expected.erase("step");
    EXPECT_EQ(tracker->logs_[i], expected) << "entry " << i;
    // trainer_log.jsonl had the entry before this callback saw it.
    EXPECT_EQ(tracker->jsonl_lines_[i], i + 1) << "entry " << i;
  }
  EXPECT_EQ(count_lines(mantissa::io::join_path(dir, "trainer_log.jsonl")), history.size());
}

TEST(IntegrationTrainerTest, NoIntegrationStillWritesTrainerLogJsonl) {
  register_toy_tracker();
  const auto dir = mantissa_test::toy_output_dir();
  const auto made_before = toy_factory().made.size();
  Trainer trainer(mantissa_test::make_toy_model(),
                  mantissa_test::toy_args(dir).max_steps(4).logging_steps(2),
                  mantissa_test::ToyDataset(100));
  trainer.train();
  EXPECT_EQ(toy_factory().made.size(), made_before);
  // Logs at 2 and 4, and the summary, each line with the step.
  std::ifstream in(mantissa::io::join_path(dir, "trainer_log.jsonl"));
  std::vector<double> steps;
  for (std::string line; std::getline(in, line);) {
    steps.push_back(nlohmann::json::parse(line).at("step").get<double>());
  }
  EXPECT_THAT(steps, ElementsAre(2.0, 4.0, 4.0));
}

}  // namespace
