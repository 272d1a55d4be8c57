// mantissa/argument_parser.h: TrainingArguments flags and a program's own flags on one command
// line, one --help, defaults that the command line overrides.
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mantissa/argument_parser.h>

namespace {

using mantissa::ArgumentParser;
using ::testing::HasSubstr;
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
  EXPECT_EXIT(parser.parse("toy_trainer", {"--bf16", "--help"}), ::testing::ExitedWithCode(0),
              "");
}

TEST(ArgumentParserTest, UnknownFlagsAndBadValuesAreNamed) {
  ArgumentParser parser;
  int hidden = 64;
  parser.app().add_option("--hidden", hidden)->check(CLI::PositiveNumber);
  EXPECT_THAT([&] { parser.parse("p", {"--hiden", "3"}); },
              ThrowsMessage<c10::ValueError>(HasSubstr("unrecognized arguments: --hiden 3")));
  EXPECT_THAT([&] { ArgumentParser().parse("p", {"--learning_rate", "abc"}); },
              ThrowsMessage<c10::ValueError>(HasSubstr("--learning_rate")));
  ArgumentParser positive;
  positive.app().add_option("--hidden", hidden)->check(CLI::PositiveNumber);
  EXPECT_THAT([&] { positive.parse("p", {"--hidden", "-2"}); },
              ThrowsMessage<c10::ValueError>(HasSubstr("--hidden")));
  EXPECT_THAT([&] { ArgumentParser().set_defaults({{"no_such_field", "1"}}).parse("p", {}); },
              ThrowsMessage<c10::ValueError>(HasSubstr("--no_such_field")));
}

}  // namespace
