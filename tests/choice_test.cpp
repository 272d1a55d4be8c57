// mantissa::Choice: an enum that reads, writes and compares by its spelling.
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mantissa/argument_enums.h>
#include <mantissa/training_arguments.h>

namespace {

using mantissa::Choice;
using mantissa::OptimizerNames;
using mantissa::SaveStrategy;
using mantissa::SchedulerType;
using ::testing::HasSubstr;

TEST(ChoiceTest, SpellingAndEnumNameTheSameValue) {
  const Choice<SaveStrategy> by_name = "epoch";
  const Choice<SaveStrategy> by_enum = SaveStrategy::kEpoch;
  EXPECT_TRUE(by_name.is_valid());
  EXPECT_EQ(by_name.value(), SaveStrategy::kEpoch);
  EXPECT_EQ(by_name, by_enum);
  EXPECT_EQ(by_enum.name(), "epoch");
  EXPECT_TRUE(by_name == SaveStrategy::kEpoch);
  EXPECT_TRUE(SaveStrategy::kEpoch == by_name);
  EXPECT_TRUE(by_name != SaveStrategy::kBest);
  EXPECT_TRUE(by_name != Choice<SaveStrategy>("steps"));
}

// Whether `a == b` compiles for an A and a B.
template <class A, class B, class = void>
struct EqualityCompiles : std::false_type {};
template <class A, class B>
struct EqualityCompiles<A, B, std::void_t<decltype(std::declval<A>() == std::declval<B>())>>
    : std::true_type {};
template <class A, class B, class = void>
struct InequalityCompiles : std::false_type {};
template <class A, class B>
struct InequalityCompiles<A, B, std::void_t<decltype(std::declval<A>() != std::declval<B>())>>
    : std::true_type {};

template <class A, class B>
constexpr bool comparable = EqualityCompiles<A, B>::value || EqualityCompiles<B, A>::value ||
                            InequalityCompiles<A, B>::value || InequalityCompiles<B, A>::value;

TEST(ChoiceTest, ComparesWithEnumeratorsButNotWithStrings) {
  using C = Choice<SaveStrategy>;
  static_assert(comparable<C, SaveStrategy>);
  static_assert(comparable<C, C>);
  static_assert(!comparable<C, const char*>);
  static_assert(!comparable<C, const char(&)[6]>);
  static_assert(!comparable<C, std::string>);
  static_assert(!comparable<C, std::string_view>);
  static_assert(!comparable<Choice<mantissa::IntervalStrategy>, const char*>);
  static_assert(!comparable<Choice<mantissa::DdpCommHook>, std::string>);
  EXPECT_EQ(C("epoch").name(), "epoch") << "the spelling stays readable through name()";
}

TEST(ChoiceTest, EveryEnumeratorHasItsOwnSpelling) {
  for (std::size_t i = 0; i < Choice<SchedulerType>::size(); ++i) {
    const Choice<SchedulerType> c = Choice<SchedulerType>::name_at(i);
    ASSERT_TRUE(c.is_valid()) << Choice<SchedulerType>::name_at(i);
    EXPECT_EQ(static_cast<std::size_t>(c.value()), i);
  }
  EXPECT_EQ(Choice<SchedulerType>(SchedulerType::kConstantWithWarmup).name(),
            "constant_with_warmup");
  EXPECT_EQ(Choice<SchedulerType>(SchedulerType::kWarmupStableDecay).name(), "warmup_stable_decay");
}

TEST(ChoiceTest, AnUnknownSpellingIsKeptUntilItsValueIsAsked) {
  const Choice<OptimizerNames> c = "adam";
  EXPECT_FALSE(c.is_valid());
  EXPECT_EQ(c.name(), "adam");
  EXPECT_FALSE(c == OptimizerNames::kAdamWTorch) << "an invalid choice equals no enumerator";
  EXPECT_THAT([&] { (void)c.value(); },
              ::testing::ThrowsMessage<c10::ValueError>(HasSubstr(
                  "adam is not a valid OptimizerNames, please select one of ['adamw_torch', "
                  "'adamw_torch_fused', 'adamw_mantissa_fused', 'sgd']")));
  // Case matters, as in Python's enums.
  EXPECT_FALSE(Choice<SaveStrategy>("Steps").is_valid());
}

TEST(ChoiceTest, PrintsItsSpelling) {
  std::ostringstream out;
  out << Choice<SchedulerType>(SchedulerType::kCosine) << " " << Choice<SchedulerType>("bogus");
  EXPECT_EQ(out.str(), "cosine bogus");
}

TEST(ChoiceTest, TrainingArgumentsFieldsTakeEnumsAndSpellings) {
  auto args = mantissa::TrainingArguments().optim(OptimizerNames::kSgd).save_strategy("epoch");
  EXPECT_EQ(args.optim(), OptimizerNames::kSgd);
  EXPECT_EQ(args.save_strategy().value(), SaveStrategy::kEpoch);
  const auto parsed = mantissa::TrainingArguments::parse({"--lr_scheduler_type", "cosine"});
  EXPECT_EQ(parsed.lr_scheduler_type().value(), SchedulerType::kCosine);
  const auto read = mantissa::TrainingArguments::from_json(args.to_json());
  EXPECT_EQ(read.optim().value(), OptimizerNames::kSgd);
  EXPECT_THAT(args.to_json(), HasSubstr("\"optim\": \"sgd\""));
}

}  // namespace
