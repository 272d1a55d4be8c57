// mantissa::Batch (named tensors), make_batch_source and make_forward: how datasets and models
// meet the Trainer.
#include <cstdint>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/batch.h>
#include <mantissa/model_forward.h>

namespace {

using mantissa::Batch;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(BatchTest, NamedEntriesKeepTheirOrderAndAnswerByName) {
  const auto ids = torch::arange(6).view({2, 3});
  const auto mask = torch::ones({2, 3}, torch::kLong);
  const auto labels = torch::tensor({1, 0});
  Batch batch{{"input_ids", ids}, {"attention_mask", mask}, {"labels", labels}};
  EXPECT_THAT(batch.names(), ElementsAre("input_ids", "attention_mask", "labels"));
  EXPECT_TRUE(batch["input_ids"].is_same(ids));
  EXPECT_TRUE(batch.at("labels").is_same(labels));
  EXPECT_TRUE(batch.contains("attention_mask"));
  EXPECT_FALSE(batch.contains("pixel_values"));
  EXPECT_EQ(batch.size(), 3u);
  EXPECT_EQ(batch.num_examples(), 2);
  EXPECT_FALSE(batch.data.defined());
}

TEST(BatchTest, AMissingNameListsTheEntriesThereAre) {
  Batch batch{{"input_ids", torch::zeros({2, 3})}, {"labels", torch::zeros({2})}};
  EXPECT_THAT([&] { (void)batch["label"]; },
              ThrowsMessage<c10::ValueError>(AllOf(HasSubstr("no tensor named 'label'"),
                                                   HasSubstr("it has input_ids, labels"))));
  EXPECT_THAT([] { (void)Batch()["x"]; }, ThrowsMessage<c10::ValueError>(HasSubstr("it has none")));
}

TEST(BatchTest, AnExampleBatchIsDataAndTargetByMemberAndByName) {
  const auto x = torch::randn({4, 8});
  const auto y = torch::tensor({0, 1, 2, 3});
  const Batch batch(torch::data::Example<>(x, y));
  EXPECT_TRUE(batch.data.is_same(x));
  EXPECT_TRUE(batch.target.is_same(y));
  EXPECT_TRUE(batch["data"].is_same(x));
  EXPECT_TRUE(batch["target"].is_same(y));
  EXPECT_THAT(batch.names(), ElementsAre("data", "target"));
  EXPECT_EQ(batch.num_examples(), 4);
}

TEST(BatchTest, SetReplacesAndAddRefusesADuplicate) {
  Batch batch{{"a", torch::zeros({1})}};
  batch.set("a", torch::ones({1}));
  batch.set("data", torch::full({1}, 2.0));  // the member slot, placed first
  EXPECT_EQ(batch["a"].item<float>(), 1.0f);
  EXPECT_THAT(batch.names(), ElementsAre("data", "a"));
  EXPECT_THAT([&] { batch.add("a", torch::zeros({1})); },
              ThrowsMessage<c10::ValueError>(HasSubstr("already has a tensor named 'a'")));
  auto twice = [] { return Batch{{"x", torch::zeros({1})}, {"x", torch::zeros({1})}}; };
  EXPECT_THAT(twice, ThrowsMessage<c10::ValueError>(HasSubstr("'x'")));
}

TEST(BatchTest, MapKeepsNamesAndAppliesToEveryEntry) {
  const Batch batch{{"input_ids", torch::ones({2, 2}, torch::kLong)}, {"w", torch::ones({2})}};
  const auto doubled = batch.map([](const torch::Tensor& t) { return t * 2; });
  EXPECT_THAT(doubled.names(), ElementsAre("input_ids", "w"));
  EXPECT_EQ(doubled["input_ids"].sum().item<std::int64_t>(), 8);
  EXPECT_EQ(batch["input_ids"].sum().item<std::int64_t>(), 4);
}

TEST(BatchTest, StackExamplesStacksEachEntryAndChecksNames) {
  std::vector<Batch> examples;
  for (int i = 0; i < 3; ++i) {
    examples.push_back(
        Batch{{"input_ids", torch::full({4}, i, torch::kLong)}, {"labels", torch::tensor(i)}});
  }
  const auto batch = mantissa::stack_examples(examples);
  EXPECT_EQ(batch["input_ids"].sizes(), (std::vector<std::int64_t>{3, 4}));
  EXPECT_TRUE(torch::equal(batch["labels"], torch::tensor({0, 1, 2})));
  examples.push_back(Batch{{"input_ids", torch::zeros({4}, torch::kLong)}});
  EXPECT_THAT([&] { mantissa::stack_examples(examples); },
              ThrowsMessage<c10::ValueError>(HasSubstr("no tensor named 'labels'")));
  EXPECT_THAT([] { mantissa::stack_examples(std::vector<Batch>{}); },
              ThrowsMessage<c10::ValueError>(HasSubstr("no examples")));
}

// An example dataset whose examples are named tensors: stacked by make_batch_source.
class NamedExamples : public torch::data::datasets::Dataset<NamedExamples, Batch> {
 public:
  Batch get(size_t index) override {
    const auto i = static_cast<std::int64_t>(index);
    return Batch{{"input_ids", torch::full({3}, i, torch::kLong)}, {"labels", torch::tensor(i)}};
  }
  torch::optional<size_t> size() const override { return 5; }
};

// An example dataset of LibTorch Examples.
class PairExamples : public torch::data::datasets::Dataset<PairExamples> {
 public:
  torch::data::Example<> get(size_t index) override {
    return {torch::full({2}, static_cast<double>(index)),
            torch::tensor(static_cast<int64_t>(index))};
  }
  torch::optional<size_t> size() const override { return 4; }
};

// Variable-length examples of a type the Trainer does not know: a collator pads them.
struct Sentence {
  std::vector<std::int64_t> ids;
  std::int64_t label;
};
class Sentences : public torch::data::datasets::Dataset<Sentences, Sentence> {
 public:
  Sentence get(size_t index) override {
    return {std::vector<std::int64_t>(index + 1, 7), static_cast<std::int64_t>(index % 2)};
  }
  torch::optional<size_t> size() const override { return 3; }
};

TEST(BatchSourceTest, NamedExamplesAreStacked) {
  auto source = mantissa::make_batch_source(NamedExamples());
  EXPECT_EQ(source.size, 5u);
  const std::vector<size_t> indices{4, 1};
  const auto batch = source.get_batch(indices);
  EXPECT_TRUE(torch::equal(batch["labels"], torch::tensor({4, 1})));
  EXPECT_EQ(batch["input_ids"].sizes(), (std::vector<std::int64_t>{2, 3}));
}

TEST(BatchSourceTest, LibTorchExamplesAreStackedIntoDataAndTarget) {
  auto source = mantissa::make_batch_source(PairExamples());
  const std::vector<size_t> indices{0, 3};
  const auto batch = source.get_batch(indices);
  EXPECT_TRUE(torch::equal(batch.target, torch::tensor({0, 3})));
  EXPECT_EQ(batch.data.sizes(), (std::vector<std::int64_t>{2, 2}));
}

TEST(BatchSourceTest, ACollatorTurnsAnyExamplesIntoABatch) {
  auto pad = [](std::vector<Sentence> sentences) {
    std::int64_t longest = 0;
    for (const auto& s : sentences) longest = std::max<std::int64_t>(longest, s.ids.size());
    const auto n = static_cast<std::int64_t>(sentences.size());
    auto ids = torch::zeros({n, longest}, torch::kLong);
    auto mask = torch::zeros({n, longest}, torch::kLong);
    auto labels = torch::empty({n}, torch::kLong);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto& s = sentences[static_cast<size_t>(i)];
      const auto len = static_cast<std::int64_t>(s.ids.size());
      ids[i].narrow(0, 0, len).copy_(torch::tensor(s.ids));
      mask[i].narrow(0, 0, len).fill_(1);
      labels[i] = s.label;
    }
    return Batch{{"input_ids", ids}, {"attention_mask", mask}, {"labels", labels}};
  };
  auto source = mantissa::make_batch_source(Sentences(), pad);
  EXPECT_EQ(source.size, 3u);
  const std::vector<size_t> indices{0, 2};
  const auto batch = source.get_batch(indices);
  EXPECT_TRUE(torch::equal(batch["attention_mask"], torch::tensor({{1, 0, 0}, {1, 1, 1}})));
  EXPECT_TRUE(torch::equal(batch["labels"], torch::tensor({0, 0})));
}

// ---- make_forward: what a model's forward may take and return --------------------------

struct BatchModelImpl : torch::nn::Module {
  mantissa::ModelOutput forward(const Batch& batch) {
    const auto logits = batch["input_ids"].to(torch::kFloat) * 2;
    return {logits.sum(), logits};
  }
};
TORCH_MODULE(BatchModel);

struct TwoTensorModelImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& a, const torch::Tensor& b) { return a - b; }
};
TORCH_MODULE(TwoTensorModel);

struct OneTensorModelImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x + 1; }
};
TORCH_MODULE(OneTensorModel);

TEST(MakeForwardTest, ABatchForwardGetsTheWholeBatchAndItsLossIsKept) {
  const auto forward = mantissa::make_forward(BatchModel());
  const auto out = forward(Batch{{"labels", torch::zeros({2})}, {"input_ids", torch::ones({2})}});
  EXPECT_EQ(out.loss.item<float>(), 4.0f);
  EXPECT_TRUE(torch::equal(out.logits, torch::full({2}, 2.0)));
}

TEST(MakeForwardTest, ATensorForwardGetsTheFirstEntriesInOrder) {
  const auto two = mantissa::make_forward(TwoTensorModel());
  const auto out = two(Batch{{"input_ids", torch::full({2}, 5.0)},
                             {"attention_mask", torch::full({2}, 1.0)},
                             {"labels", torch::zeros({2})}});
  EXPECT_FALSE(out.loss.defined());
  EXPECT_TRUE(torch::equal(out.logits, torch::full({2}, 4.0)));

  const auto one = mantissa::make_forward(OneTensorModel());
  EXPECT_TRUE(
      torch::equal(one(Batch(torch::zeros({3}), torch::ones({3}))).logits, torch::ones({3})));

  EXPECT_THAT(
      [&] {
        two(Batch{{"input_ids", torch::zeros({2})}});
      },
      ThrowsMessage<c10::ValueError>(AllOf(HasSubstr("takes 2 tensors"),
                                           HasSubstr("has 1 (input_ids)"),
                                           HasSubstr("forward(const mantissa::Batch&)"))));
}

TEST(MakeForwardTest, ASequentialGetsTheFirstEntry) {
  torch::nn::Sequential model(torch::nn::Linear(2, 1));
  const auto forward = mantissa::make_forward(model);
  const auto x = torch::ones({3, 2});
  EXPECT_TRUE(torch::equal(forward(Batch(x, torch::zeros({3}))).logits, model->forward(x)));
}

TEST(MakeForwardTest, AFunctionOfOneTensorGetsTheFirstEntry) {
  const auto forward =
      mantissa::forward_of_first_entry([](const torch::Tensor& ids) { return ids * 3; });
  const auto out = forward(Batch{{"input_ids", torch::ones({2})}, {"labels", torch::zeros({2})}});
  EXPECT_TRUE(torch::equal(out.logits, torch::full({2}, 3.0)));
}

}  // namespace
