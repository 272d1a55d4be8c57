// The Trainer API that Hugging Face users reach for: named batches and models returning their
// loss, predict(), evaluate(dataset, prefix), preprocess_logits_for_metrics, loss functions
// with outputs, load_best_model_at_end, and what callbacks reach through their context.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <mantissa/io/safetensors.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/nn/pretrained_config.h>
#include <mantissa/trainer.h>

#include "io/atomic_file.h"
#include "io/filesystem.h"
#include "sequence_toy.h"
#include "toy_training.h"

namespace {

using mantissa::Batch;
using mantissa::Trainer;
using mantissa_test::pad_sequences;
using mantissa_test::Sequence;
using mantissa_test::SequenceClassifier;
using mantissa_test::SequenceDataset;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

mantissa::BatchSource padded(SequenceDataset dataset, std::int64_t min_length = 0) {
  return mantissa::make_batch_source(std::move(dataset),
                                     [min_length](const std::vector<Sequence>& examples) {
                                       return pad_sequences(examples, min_length);
                                     });
}

mantissa::TrainingArguments sequence_args(const std::string& dir) {
  return mantissa_test::toy_args(dir).learning_rate(3e-2).per_device_eval_batch_size(7);
}

SequenceClassifier make_classifier() {
  torch::manual_seed(3);
  return SequenceClassifier();
}

std::string read_text(const std::string& path) {
  const auto bytes = mantissa::io::read_file(path);
  return std::string(bytes.begin(), bytes.end());
}

TEST(TrainerHfApiTest, ATwoInputModelTrainsOnTheLossItReturns) {
  auto model = make_classifier();
  Trainer trainer(model, sequence_args(mantissa_test::toy_output_dir()).num_train_epochs(4),
                  padded(SequenceDataset(96, 1)), padded(SequenceDataset(40, 2)));
  const auto before = trainer.evaluate();
  const auto result = trainer.train();
  const auto after = trainer.evaluate();
  EXPECT_LT(after.at("eval_loss"), before.at("eval_loss") - 0.05);
  EXPECT_GT(after.at("eval_accuracy"), 0.7);
  EXPECT_EQ(result.global_step, 4 * 12);
  EXPECT_GT(model->forward_calls, 0);
}

TEST(TrainerHfApiTest, TokensSeenCountTheInputIdsOnly) {
  auto model = make_classifier();
  Trainer trainer(model, sequence_args(mantissa_test::toy_output_dir()).max_steps(3),
                  padded(SequenceDataset(24, 1), /*min_length=*/20));
  trainer.train();
  // Three batches of 8 padded to 20 tokens; the attention mask and labels do not count.
  EXPECT_EQ(trainer.state().num_input_tokens_seen, 3 * 8 * 20);
}

TEST(TrainerHfApiTest, PaddingDoesNotChangeWhatPredictReturns) {
  auto model = make_classifier();
  Trainer trainer(model, sequence_args(mantissa_test::toy_output_dir()),
                  padded(SequenceDataset(16, 1)));
  const auto tight = trainer.predict(padded(SequenceDataset(10, 5)));
  const auto loose = trainer.predict(padded(SequenceDataset(10, 5), /*min_length=*/30));
  ASSERT_EQ(tight.predictions.sizes(), (std::vector<std::int64_t>{10, 2}));
  EXPECT_TRUE(torch::allclose(tight.predictions, loose.predictions, 1e-5, 1e-6));
  EXPECT_EQ(tight.label_ids.sizes(), (std::vector<std::int64_t>{10}));
}

TEST(TrainerHfApiTest, PredictReturnsLabelsAndTestMetricsAndLogsNothing) {
  struct Recorder : mantissa::TrainerCallback {
    void on_predict(const mantissa::TrainingArguments&, mantissa::TrainerState&,
                    mantissa::TrainerControl&, const mantissa::LogEntry& metrics) override {
      seen = metrics;
    }
    mantissa::LogEntry seen;
  };
  auto recorder = std::make_shared<Recorder>();
  Trainer trainer(make_classifier(), sequence_args(mantissa_test::toy_output_dir()),
                  padded(SequenceDataset(16, 1)));
  trainer.add_callback(recorder);
  SequenceDataset test_set(15, 9);
  std::vector<std::int64_t> expected_labels;
  for (size_t i = 0; i < 15; ++i) expected_labels.push_back(test_set.get(i).label);
  const auto out = trainer.predict(padded(test_set));
  EXPECT_TRUE(torch::equal(out.label_ids, torch::tensor(expected_labels)));
  EXPECT_EQ(out.predictions.scalar_type(), torch::kFloat);
  for (const char* key : {"test_loss", "test_accuracy", "test_runtime", "test_samples_per_second",
                          "test_steps_per_second"}) {
    EXPECT_EQ(out.metrics.count(key), 1u) << key;
  }
  EXPECT_EQ(recorder->seen, out.metrics);
  EXPECT_TRUE(trainer.state().log_history.empty());
}

TEST(TrainerHfApiTest, EvaluateTakesADatasetAndAPrefixAndReportsStepsPerSecond) {
  Trainer trainer(make_classifier(), sequence_args(mantissa_test::toy_output_dir()),
                  padded(SequenceDataset(16, 1)), padded(SequenceDataset(14, 2)));
  const auto own = trainer.evaluate();
  EXPECT_EQ(own.count("eval_steps_per_second"), 1u);
  const auto other = trainer.evaluate(padded(SequenceDataset(21, 3)), "val");
  EXPECT_EQ(other.count("val_loss"), 1u);
  EXPECT_EQ(other.count("eval_loss"), 0u);
  EXPECT_NE(other.at("val_loss"), own.at("eval_loss"));
  const auto renamed = trainer.evaluate("dev");
  EXPECT_DOUBLE_EQ(renamed.at("dev_loss"), own.at("eval_loss"));
  ASSERT_EQ(trainer.state().log_history.size(), 3u);
  EXPECT_EQ(trainer.state().log_history[1].count("val_loss"), 1u);
}

TEST(TrainerHfApiTest, PreprocessedLogitsAreWhatMetricsAndPredictSee) {
  Trainer trainer(make_classifier(), sequence_args(mantissa_test::toy_output_dir()),
                  padded(SequenceDataset(16, 1)), padded(SequenceDataset(14, 2)));
  trainer.set_preprocess_logits_for_metrics(
      [](const torch::Tensor& logits, const torch::Tensor&) { return logits.argmax(-1); });
  std::vector<std::int64_t> shape;
  trainer.set_compute_metrics([&](const torch::Tensor& predictions, const torch::Tensor& labels) {
    shape = predictions.sizes().vec();
    return mantissa::LogEntry{
        {"matches", predictions.eq(labels).sum().item<double>() / predictions.numel()}};
  });
  const auto metrics = trainer.evaluate();
  EXPECT_EQ(shape, (std::vector<std::int64_t>{14}));
  EXPECT_DOUBLE_EQ(metrics.at("eval_matches"), metrics.at("eval_accuracy"));
  const auto out = trainer.predict(padded(SequenceDataset(5, 4)));
  EXPECT_EQ(out.predictions.scalar_type(), torch::kLong);
  EXPECT_EQ(out.metrics.count("test_matches"), 1u);
}

TEST(TrainerHfApiTest, AUserMetricNamedAsABuiltInOneWinsAndIsWarnedAboutOnce) {
  Trainer trainer(make_classifier(), sequence_args(mantissa_test::toy_output_dir()),
                  padded(SequenceDataset(16, 1)), padded(SequenceDataset(14, 2)));
  trainer.set_compute_metrics([](const torch::Tensor&, const torch::Tensor&) {
    return mantissa::LogEntry{{"accuracy", -1.0}, {"f1", 0.5}};
  });
  mantissa_test::WarningCapture warnings;
  const auto first = trainer.evaluate();
  const auto second = trainer.evaluate();
  EXPECT_EQ(first.at("eval_accuracy"), -1.0);  // the user's value, as in HF
  EXPECT_EQ(second.at("eval_accuracy"), -1.0);
  EXPECT_EQ(first.at("eval_f1"), 0.5);
  std::size_t said = 0;
  for (const auto& message : warnings.messages) {
    if (message.find("replaces the built-in eval_accuracy") != std::string::npos) ++said;
    EXPECT_EQ(message.find("eval_f1"), std::string::npos) << message;
  }
  EXPECT_EQ(said, 1u);
}

TEST(TrainerHfApiTest, ALossWithOutputsRunsTheForwardOncePerEvaluationBatch) {
  auto model = make_classifier();
  Trainer trainer(model, sequence_args(mantissa_test::toy_output_dir()),
                  padded(SequenceDataset(16, 1)), padded(SequenceDataset(14, 2)));
  trainer.set_compute_metrics([](const torch::Tensor&, const torch::Tensor&) {
    return mantissa::LogEntry{{"one", 1.0}};
  });
  trainer.set_compute_loss([model](const Batch& batch) mutable {
    auto outputs = model->forward(batch);
    return std::make_pair(outputs.loss * 2, outputs);
  });
  const auto calls = model->forward_calls;
  const auto metrics = trainer.evaluate();
  EXPECT_EQ(model->forward_calls - calls, 2);     // 14 examples in batches of 7
  EXPECT_EQ(metrics.count("eval_accuracy"), 0u);  // a user's loss: no accuracy guessed

  // A loss that returns only the loss: the predictions need a second forward.
  trainer.set_compute_loss(
      [model](const Batch& batch) mutable { return model->forward(batch).loss; });
  const auto calls2 = model->forward_calls;
  trainer.evaluate();
  EXPECT_EQ(model->forward_calls - calls2, 4);
}

TEST(TrainerHfApiTest, ALossFuncGetsTheOutputsOfTheOneForward) {
  auto model = make_classifier();
  Trainer trainer(model, sequence_args(mantissa_test::toy_output_dir()).max_steps(2),
                  padded(SequenceDataset(16, 1)), padded(SequenceDataset(14, 2)));
  std::int64_t calls = 0;
  trainer.set_compute_loss_func([&](const mantissa::ModelOutput& outputs, const Batch& batch) {
    ++calls;
    return torch::nn::functional::cross_entropy(outputs.logits, batch["labels"]) + 1.0;
  });
  const auto before = model->forward_calls;
  const auto metrics = trainer.evaluate();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(model->forward_calls - before, 2);
  trainer.train();
  EXPECT_GT(trainer.state().log_history.back().at("train_loss"), 1.0);
  EXPECT_GT(metrics.at("eval_loss"), 1.0);
}

TEST(TrainerHfApiTest, APositionalModelGetsTheFirstEntries) {
  torch::manual_seed(3);
  mantissa_test::PositionalClassifier model;
  Trainer trainer(model, sequence_args(mantissa_test::toy_output_dir()).max_steps(4),
                  padded(SequenceDataset(32, 1)), padded(SequenceDataset(14, 2)));
  const auto before = trainer.evaluate().at("eval_loss");
  trainer.train();
  EXPECT_NE(trainer.evaluate().at("eval_loss"), before);
}

TEST(TrainerHfApiTest, LabelNamesChooseTheLabelEntry) {
  struct Renamed : torch::data::datasets::BatchDataset<Renamed, Batch> {
    Batch get_batch(c10::ArrayRef<size_t> indices) override {
      auto b = inner.get_batch(indices);
      return Batch{{"x", b.data}, {"y", b.target}};
    }
    torch::optional<size_t> size() const override { return inner.size(); }
    mantissa_test::ToyDataset inner{64};
  };
  auto args = mantissa_test::toy_args(mantissa_test::toy_output_dir()).max_steps(2);
  Trainer unnamed(mantissa_test::make_toy_model(), args, Renamed());
  EXPECT_THAT([&] { unnamed.train(); },
              ThrowsMessage<c10::ValueError>(AllOf(HasSubstr("no labels"),
                                                   HasSubstr("looked for labels or target"),
                                                   HasSubstr("the batch has x, y"))));
  Trainer named(mantissa_test::make_toy_model(),
                args.overwrite_output_dir(true).label_names(std::vector<std::string>{"y"}),
                Renamed(), Renamed());
  named.train();
  EXPECT_EQ(named.evaluate().count("eval_accuracy"), 1u);
}

TEST(TrainerHfApiTest, FloatLabelsWithTheDefaultLossSayHowToGiveAnother) {
  struct Regression : torch::data::datasets::BatchDataset<Regression, Batch> {
    Batch get_batch(c10::ArrayRef<size_t> indices) override {
      const auto n = static_cast<std::int64_t>(indices.size());
      return {torch::randn({n, 8}), torch::randn({n, 4})};
    }
    torch::optional<size_t> size() const override { return 16; }
  };
  Trainer trainer(mantissa_test::make_toy_model(),
                  mantissa_test::toy_args(mantissa_test::toy_output_dir()), Regression());
  EXPECT_THAT([&] { trainer.train(); },
              ThrowsMessage<c10::ValueError>(AllOf(HasSubstr("cross-entropy"),
                                                   HasSubstr("'target' holds Float"),
                                                   HasSubstr("set_compute_loss"))));
}

// ---- best model ---------------------------------------------------------------------------

/// compute_metrics reporting `score` values in turn, one per evaluation.
mantissa::MetricsFn scripted_scores(std::vector<double> scores) {
  auto next = std::make_shared<std::size_t>(0);
  return [scores, next](const torch::Tensor&, const torch::Tensor&) {
    return mantissa::LogEntry{{"score", scores.at((*next)++)}};
  };
}

TEST(TrainerHfApiTest, LoadBestModelAtEndWithoutAnEvaluationInTheRunSaysSoAtStartAndEnd) {
  // --eval_steps 50 --max_steps 20: no evaluation, so no best model; both ends of the run say it.
  auto args = mantissa_test::toy_args(mantissa_test::toy_output_dir())
                  .max_steps(20)
                  .eval_strategy("steps")
                  .eval_steps(50)
                  .save_strategy("steps")
                  .save_steps(50)
                  .load_best_model_at_end(true);
  Trainer trainer(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100),
                  mantissa_test::ToyDataset(30, 5));
  mantissa_test::WarningCapture warnings;
  trainer.train();
  EXPECT_FALSE(trainer.state().best_model_checkpoint);
  bool at_start = false;
  bool at_end = false;
  for (const auto& message : warnings.messages) {
    at_start |= message.find(
                    "no evaluation falls within this run (eval_strategy steps, "
                    "eval_steps 50, steps 0 to 20)") != std::string::npos;
    at_end |= message.find("no best model was found") != std::string::npos;
  }
  EXPECT_TRUE(at_start);
  EXPECT_TRUE(at_end);
}

TEST(TrainerHfApiTest, LoadBestModelAtEndLoadsTheBestCheckpointAndKeepsOnlyIt) {
  const auto dir = mantissa_test::toy_output_dir();
  auto model = mantissa_test::make_toy_model();
  auto args = mantissa_test::toy_args(dir)
                  .max_steps(12)
                  .eval_strategy("steps")
                  .eval_steps(4)
                  .save_strategy("steps")
                  .save_steps(4)
                  .save_total_limit(1)
                  .load_best_model_at_end(true)
                  .metric_for_best_model("score");
  Trainer trainer(model, args, mantissa_test::ToyDataset(100), mantissa_test::ToyDataset(30, 5));
  trainer.set_compute_metrics(scripted_scores({0.5, 0.9, 0.7}));
  trainer.train();

  const auto best = mantissa::io::join_path(dir, "checkpoint-8");
  EXPECT_EQ(trainer.state().best_global_step, 8);
  EXPECT_EQ(trainer.state().best_model_checkpoint, best);
  EXPECT_DOUBLE_EQ(*trainer.state().best_metric, 0.9);
  // HF: with save_total_limit 1 the run ends with the best checkpoint alone.
  EXPECT_TRUE(mantissa::io::is_directory(best));
  EXPECT_FALSE(mantissa::io::path_exists(mantissa::io::join_path(dir, "checkpoint-4")));
  EXPECT_FALSE(mantissa::io::path_exists(mantissa::io::join_path(dir, "checkpoint-12")));
  // The model holds the best checkpoint's weights.
  auto reference = mantissa_test::make_toy_model(99);
  mantissa::io::load_module_safetensors(mantissa::io::join_path(best, "model.safetensors"),
                                        *reference);
  for (const auto& item : reference->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), model->named_parameters()[item.key()])) << item.key();
  }
  const auto saved =
      nlohmann::json::parse(read_text(mantissa::io::join_path(best, "trainer_state.json")));
  EXPECT_EQ(saved.at("best_global_step"), 8);
  EXPECT_EQ(saved.at("best_model_checkpoint"), best);
}

TEST(TrainerHfApiTest, WithoutLoadBestTheLastWeightsStayAndTwoCheckpointsAreKept) {
  const auto dir = mantissa_test::toy_output_dir();
  auto model = mantissa_test::make_toy_model();
  auto args = mantissa_test::toy_args(dir)
                  .max_steps(12)
                  .eval_strategy("steps")
                  .eval_steps(4)
                  .save_strategy("steps")
                  .save_steps(4)
                  .save_total_limit(2)
                  .metric_for_best_model("score")
                  .greater_is_better(false);
  Trainer trainer(model, args, mantissa_test::ToyDataset(100), mantissa_test::ToyDataset(30, 5));
  trainer.set_compute_metrics(scripted_scores({0.5, 0.9, 0.7}));
  trainer.train();
  // Lower is better here: the first evaluation ranks best, and is kept beside the latest.
  EXPECT_EQ(trainer.state().best_global_step, 4);
  EXPECT_TRUE(mantissa::io::is_directory(mantissa::io::join_path(dir, "checkpoint-4")));
  EXPECT_FALSE(mantissa::io::path_exists(mantissa::io::join_path(dir, "checkpoint-8")));
  EXPECT_TRUE(mantissa::io::is_directory(mantissa::io::join_path(dir, "checkpoint-12")));
}

TEST(TrainerHfApiTest, AnUnknownMetricForBestModelListsTheReportedOnes) {
  auto args = mantissa_test::toy_args(mantissa_test::toy_output_dir())
                  .max_steps(4)
                  .eval_strategy("steps")
                  .eval_steps(2)
                  .metric_for_best_model("f1");
  Trainer trainer(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100),
                  mantissa_test::ToyDataset(30, 5));
  EXPECT_THAT([&] { trainer.train(); },
              ThrowsMessage<c10::ValueError>(
                  AllOf(HasSubstr("'eval_f1'"), HasSubstr("eval_accuracy, eval_loss"))));
}

TEST(TrainerHfApiTest, EarlyStoppingRanksByMetricForBestModel) {
  auto args = mantissa_test::toy_args(mantissa_test::toy_output_dir())
                  .max_steps(40)
                  .eval_strategy("steps")
                  .eval_steps(4)
                  .metric_for_best_model("score");
  Trainer trainer(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100),
                  mantissa_test::ToyDataset(30, 5));
  // Higher is better for "score": it improves twice, then stalls for two evaluations.
  trainer.set_compute_metrics(scripted_scores({0.5, 0.6, 0.7, 0.7, 0.65, 0.9, 0.9, 0.9, 0.9, 0.9}));
  trainer.add_callback(std::make_shared<mantissa::EarlyStoppingCallback>(/*patience=*/2));
  trainer.train();
  EXPECT_EQ(trainer.state().global_step, 5 * 4);
  EXPECT_DOUBLE_EQ(*trainer.state().best_metric, 0.7);
}

// ---- callbacks ----------------------------------------------------------------------------

TEST(TrainerHfApiTest, CallbacksReachTheModelOptimizerAndSchedulerThroughTheirContext) {
  struct Watcher : mantissa::TrainerCallback {
    void on_step_end(const mantissa::TrainingArguments&, mantissa::TrainerState&,
                     mantissa::TrainerControl&) override {
      model = context().model;
      optimizer = context().optimizer;
      scheduler = context().lr_scheduler;
      learning_rates.push_back(context().learning_rate());
      loss_scale = context().loss_scale();
    }
    torch::nn::Module* model = nullptr;
    torch::optim::Optimizer* optimizer = nullptr;
    mantissa::LrScheduler* scheduler = nullptr;
    std::vector<double> learning_rates;
    double loss_scale = 0;
  };
  auto watcher = std::make_shared<Watcher>();
  auto model = mantissa_test::make_toy_model();
  Trainer trainer(model,
                  mantissa_test::toy_args(mantissa_test::toy_output_dir())
                      .max_steps(4)
                      .learning_rate(0.1)
                      .lr_scheduler_type("linear"),
                  mantissa_test::ToyDataset(100));
  trainer.add_callback(watcher);
  trainer.train();
  EXPECT_EQ(watcher->model, model.ptr().get());
  EXPECT_EQ(watcher->optimizer, &trainer.optimizer());
  EXPECT_EQ(watcher->scheduler, &trainer.lr_scheduler());
  EXPECT_THAT(watcher->learning_rates,
              ::testing::ElementsAre(::testing::DoubleNear(0.075, 1e-12),
                                     ::testing::DoubleNear(0.05, 1e-12),
                                     ::testing::DoubleNear(0.025, 1e-12), 0.0));
  EXPECT_EQ(watcher->loss_scale, 1.0);
}

TEST(TrainerHfApiTest, ContextOutsideAnEventThrows) {
  struct Peeker : mantissa::TrainerCallback {
    const mantissa::TrainerCallbackContext& peek() const { return context(); }
  };
  Peeker peeker;
  EXPECT_THAT([&] { peeker.peek(); },
              ThrowsMessage<c10::Error>(HasSubstr("only available inside an event")));
}

}  // namespace

namespace {

// The toy MLP as a model that knows its config.json.
struct ConfiguredMlpImpl : mantissa_test::ToyMlpImpl, mantissa::nn::HasPretrainedConfig {
  std::string pretrained_config_json(c10::ScalarType dtype) const override {
    return nlohmann::json{{"model_type", "toy_mlp"}, {"dtype", c10::toString(dtype)}}.dump();
  }
};
TORCH_MODULE(ConfiguredMlp);

TEST(TrainerHfApiTest, SaveModelAndCheckpointsWriteTheConfigOfAModelThatHasOne) {
  const auto dir = mantissa_test::toy_output_dir();
  torch::manual_seed(1);
  ConfiguredMlp model;
  model->to(torch::kBFloat16);
  Trainer trainer(model,
                  mantissa_test::toy_args(dir).max_steps(2).save_strategy("steps").save_steps(2),
                  mantissa_test::ToyDataset(100));
  trainer.train();
  trainer.save_model(dir + "/final");
  for (const auto& folder : {dir + "/final", dir + "/checkpoint-2"}) {
    ASSERT_TRUE(mantissa::io::path_exists(folder + "/config.json")) << folder;
    const auto config = nlohmann::json::parse(read_text(folder + "/config.json"));
    EXPECT_EQ(config.at("model_type"), "toy_mlp") << folder;
    EXPECT_EQ(config.at("dtype"), "BFloat16") << folder << ": the weights' dtype";
    EXPECT_TRUE(mantissa::io::path_exists(folder + "/model.safetensors")) << folder;
  }
  // A model without one gets none.
  const auto plain_dir = mantissa_test::toy_output_dir();
  Trainer plain(mantissa_test::make_toy_model(), mantissa_test::toy_args(plain_dir).max_steps(1),
                mantissa_test::ToyDataset(100));
  plain.train();
  plain.save_model(plain_dir + "/final");
  EXPECT_TRUE(mantissa::io::path_exists(plain_dir + "/final/model.safetensors"));
  EXPECT_FALSE(mantissa::io::path_exists(plain_dir + "/final/config.json"));
}

}  // namespace
