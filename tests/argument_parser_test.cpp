// mantissa/argument_parser.h: TrainingArguments flags and a program's own flags on one command
// line, one --help, defaults that the command line overrides.
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mantissa/argument_parser.h>

#include "value_error.h"

namespace {

using mantissa::ArgumentParser;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::ThrowsMessage;

TEST(ArgumentParserTest, EachFlagGoesToItsOwner) {
  ArgumentParser parser("Trains a toy.", "toy_trainer");
  int hidden = 64;
  std::string corpus;
  parser.app().add_option("--hidden", hidden, "width of the hidden layer");
  parser.app().add_option("--corpus", corpus);
  const auto args = parser.parse(
      "toy_trainer", {"--hidden", "128", "--bf16", "--corpus=a.txt", "--learning_rate", "3e-4"});
  EXPECT_EQ(hidden, 128);
  EXPECT_EQ(corpus, "a.txt");
  EXPECT_TRUE(args.bf16());
  EXPECT_DOUBLE_EQ(args.learning_rate(), 3e-4);
}

TEST(ArgumentParserTest, DefaultsApplyUnlessTheCommandLineSaysOtherwise) {
  const std::vector<std::pair<std::string, std::string>> defaults = {
      {"eval_strategy", "steps"}, {"eval_steps", "50"}, {"metric_for_best_model", "accuracy"}};
  const auto untouched = ArgumentParser().set_defaults(defaults).parse("p", {});
  EXPECT_EQ(untouched.eval_strategy().name(), "steps");
  EXPECT_EQ(untouched.eval_steps(), std::optional<double>(50.0));
  EXPECT_EQ(untouched.metric_for_best_model(), std::optional<std::string>("accuracy"));
  const auto typed = ArgumentParser().set_defaults(defaults).parse("p", {"--eval_steps", "5"});
  EXPECT_EQ(typed.eval_steps(), std::optional<double>(5.0));
  EXPECT_EQ(typed.eval_strategy().name(), "steps");
}

TEST(ArgumentParserTest, OneHelpListsBothKindsOfFlags) {
  ArgumentParser parser("Trains a toy.", "toy_trainer");
  int hidden = 64;
  parser.app().add_option("--hidden", hidden, "width of the hidden layer")->capture_default_str();
  const auto help = parser.help();
  EXPECT_THAT(help, HasSubstr("Trains a toy."));
  EXPECT_THAT(help, HasSubstr("--hidden"));
  EXPECT_THAT(help, HasSubstr("width of the hidden layer"));
  EXPECT_THAT(help, HasSubstr("--learning_rate"));
  EXPECT_THAT(help, HasSubstr("--per_device_train_batch_size"));
  EXPECT_LT(help.find("--hidden"), help.find("--learning_rate"));  // the program's flags first
  EXPECT_EXIT(parser.parse("toy_trainer", {"--bf16", "--help"}), ::testing::ExitedWithCode(0), "");
}

// What `parse` prints for --help, read back: the child of a death test sends stdout to stderr,
// which EXPECT_EXIT matches.
void expect_help_output(ArgumentParser& parser, const std::string& program,
                        const std::string& regex) {
  EXPECT_EXIT(
      {
        ::dup2(STDERR_FILENO, STDOUT_FILENO);
        parser.parse(program, {"--help"});
      },
      ::testing::ExitedWithCode(0), regex);
}

TEST(ArgumentParserTest, HelpShowsTheProgramsDefaultsNameAndOneHeading) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ArgumentParser parser("Trains a toy.");  // no program name: argv[0]'s base name
  int hidden = 64;
  parser.app().add_option("--hidden", hidden, "width of the hidden layer")->capture_default_str();
  parser.set_defaults({{"learning_rate", "3e-3"}, {"bf16", "true"}});
  // argparse shows the program's set_defaults, not the dataclass's.
  expect_help_output(parser, "/opt/bin/toy_trainer",
                     "Usage: toy_trainer \\[OPTIONS\\].*Peak learning rate, reached after "
                     "warmup\\. \\(default: 0\\.003\\)");
  const std::string help = parser.help();
  EXPECT_THAT(help, HasSubstr("Peak learning rate, reached after warmup. (default: 0.003)"));
  EXPECT_THAT(help, Not(HasSubstr("(default: 5e-05)")));
  // One heading for the TrainingArguments flags.
  const auto heading = help.find("TrainingArguments options:");
  ASSERT_NE(heading, std::string::npos);
  EXPECT_THAT(help.substr(0, heading), Not(HasSubstr("TrainingArguments")));
  EXPECT_EQ(help.find("TrainingArguments options:", heading + 1), std::string::npos);
  // A name given to the constructor stays.
  ArgumentParser named("Trains a toy.", "my_name");
  expect_help_output(named, "/opt/bin/toy_trainer", "Usage: my_name ");
}

TEST(ArgumentParserTest, IntegerFlagsRefuseValuesBeyond64Bits) {
  // CLI11 2.1 reads integers with strtoll and kept the clamped INT64_MAX.
  ArgumentParser parser;
  std::int64_t chunk = 0;
  std::uint64_t count = 0;
  int small = 0;
  std::vector<std::int64_t> sizes;
  parser.app().add_option("--chunk", chunk)->check(CLI::NonNegativeNumber);  // type INT:NONNEGATIVE
  parser.app().add_option("--count", count);
  parser.app().add_option("--small", small);
  parser.app().add_option("--sizes", sizes);
  const auto error = [&](const std::vector<std::string>& given) {
    return mantissa_test::value_error_of([&] { parser.parse("p", given); });
  };
  EXPECT_THAT(error({"--chunk", "9223372036854775808"}),
              HasSubstr("--chunk: invalid value '9223372036854775808' (out of range for a 64-bit "
                        "integer)"));
  EXPECT_THAT(error({"--sizes", "-9223372036854775809"}),
              HasSubstr("--sizes: invalid value '-9223372036854775809' (out of range"));
  EXPECT_THAT(error({"--small", "99999999999999999999"}), HasSubstr("--small"));
  EXPECT_THAT(error({"--sizes", "1", "18446744073709551616"}),
              HasSubstr("--sizes: invalid value '18446744073709551616'"));
  EXPECT_THAT(error({"--count", "18446744073709551616"}),
              HasSubstr("--count: invalid value '18446744073709551616' (out of range for an "
                        "unsigned 64-bit integer)"));
  EXPECT_THAT(error({"--count", "-1"}),
              HasSubstr("--count: invalid value '-1' (out of range for an unsigned 64-bit "
                        "integer)"));
  const std::string huge(100'000, '9');
  const std::string long_message = error({"--sizes", huge});
  EXPECT_THAT(long_message, HasSubstr("9999..."));
  EXPECT_LT(long_message.size(), 300u);
  // The edges, and CLI11's other spellings, still read.
  parser.parse("p", {"--chunk", "9223372036854775807", "--count", "18446744073709551615", "--sizes",
                     "-9223372036854775808", "0x10"});
  EXPECT_EQ(chunk, std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(count, std::numeric_limits<std::uint64_t>::max());
  EXPECT_THAT(sizes, ::testing::ElementsAre(std::numeric_limits<std::int64_t>::min(), 16));
}

TEST(ArgumentParserTest, UnknownFlagsAndBadValuesAreNamed) {
  ArgumentParser parser;
  int hidden = 64;
  parser.app().add_option("--hidden", hidden)->check(CLI::PositiveNumber);
  EXPECT_THAT(
      [&] {
        parser.parse("p", {"--hiden", "3"});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("unrecognized arguments: --hiden 3")));
  EXPECT_THAT(
      [&] {
        ArgumentParser().parse("p", {"--learning_rate", "abc"});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("--learning_rate")));
  ArgumentParser positive;
  positive.app().add_option("--hidden", hidden)->check(CLI::PositiveNumber);
  EXPECT_THAT(
      [&] {
        positive.parse("p", {"--hidden", "-2"});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("--hidden")));
  EXPECT_THAT(
      [&] {
        ArgumentParser().set_defaults({{"no_such_field", "1"}}).parse("p", {});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("--no_such_field")));
}

}  // namespace
