// The pieces of the evaluation loop: the examples each process takes, what a batch adds, and the
// model's mode after an evaluation that failed half-way.
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "toy_training.h"
#include "trainer/eval_mode_guard.h"
#include "trainer/evaluation.h"
#include "trainer/precision_plan.h"
#include "trainer/single_process.h"

namespace {

using mantissa::Batch;
using mantissa::ModelOutput;
using mantissa::detail::EvaluationAccumulator;
using mantissa::detail::EvaluationShard;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(EvaluationShardTest, EachProcessTakesEveryWorldSizethExampleFromItsRank) {
  // 10 examples over 3 processes: 0 3 6 9 / 1 4 7 / 2 5 8.
  const EvaluationShard first{10, 0, 3};
  const EvaluationShard last{10, 2, 3};
  EXPECT_EQ(first.size(), 4);
  EXPECT_EQ(last.size(), 3);
  EXPECT_EQ(first.indices(0, 4), (std::vector<std::size_t>{0, 3, 6, 9}));
  EXPECT_EQ(last.indices(1, 3), (std::vector<std::size_t>{5, 8}));
  const auto alone =
      mantissa::detail::evaluation_shard(5, mantissa::detail::SingleProcess(), "eval");
  EXPECT_EQ(alone.size(), 5);
  EXPECT_EQ(alone.indices(3, 5), (std::vector<std::size_t>{3, 4}));
}

TEST(EvaluationAccumulatorTest, WeightsTheLossByExamplesAndCountsCorrectPredictions) {
  EvaluationAccumulator sums(c10::kCPU, /*keep_rows=*/true, /*classification=*/true, {});
  // Batch 1: 2 examples, loss 1, both right. Batch 2: 1 example, loss 4, wrong.
  sums.add(torch::tensor(1.0), torch::tensor({{0.f, 1.f}, {2.f, 0.f}}),
           torch::tensor({1, 0}, torch::kLong), 2);
  sums.add(torch::tensor(4.0), torch::tensor({{0.f, 1.f}}), torch::tensor({0}, torch::kLong), 1);
  const auto totals = sums.totals();
  EXPECT_EQ(sums.steps(), 2);
  EXPECT_DOUBLE_EQ(totals.loss_sum, 6.0);
  EXPECT_DOUBLE_EQ(totals.loss_examples, 3.0);
  EXPECT_DOUBLE_EQ(totals.correct, 2.0);
  EXPECT_TRUE(totals.classification);
  EXPECT_TRUE(totals.have_labels);
  const auto rows = sums.rows();
  EXPECT_EQ(rows.predictions.sizes(), (std::vector<std::int64_t>{3, 2}));
  EXPECT_TRUE(torch::equal(rows.label_ids, torch::tensor({1, 0, 0}, torch::kLong)));
  // A batch with float labels is no classification any more; a batch without logits cannot be
  // kept.
  sums.add(torch::Tensor(), torch::tensor({{1.f, 0.f}}), torch::tensor({0.5f}), 1);
  EXPECT_FALSE(sums.totals().classification);
  EXPECT_THAT([&] { sums.add(torch::tensor(1.0), torch::Tensor(), torch::Tensor(), 1); },
              ThrowsMessage<c10::ValueError>(HasSubstr("the model returned no logits")));
}

TEST(EvalModeGuardTest, RestoresTrainModeAndLeavesEvalModeAlone) {
  auto model = mantissa_test::make_toy_model();
  {
    const mantissa::detail::EvalModeGuard guard(*model);
    EXPECT_FALSE(model->is_training());
  }
  EXPECT_TRUE(model->is_training());
  model->eval();
  { const mantissa::detail::EvalModeGuard guard(*model); }
  EXPECT_FALSE(model->is_training());
}

TEST(EvaluationTest, AForwardThatThrowsLeavesTheModelInTrainMode) {
  auto model = mantissa_test::make_toy_model();
  const auto args = mantissa_test::toy_args(mantissa_test::toy_output_dir());
  const auto plan = mantissa::detail::make_precision_plan(args, c10::kFloat);
  int calls = 0;
  int fail_at = 2;
  const mantissa::ForwardFn forward = [&](const Batch& batch) -> ModelOutput {
    EXPECT_FALSE(model->is_training());  // evaluation runs in eval mode
    if (++calls == fail_at) throw std::runtime_error("forward failed (simulated)");
    return model->forward(batch.data);
  };
  const mantissa::LossWithOutputsFn no_loss;
  const mantissa::MetricsFn no_metrics;
  const mantissa::PreprocessLogitsFn no_preprocess;
  mantissa::detail::SingleProcess alone;
  std::set<std::string> warned;
  const mantissa::detail::EvaluationParts parts{
      args, plan, c10::kCPU, *model, forward, no_loss, no_metrics, no_preprocess, alone, warned};
  const auto dataset = mantissa::make_batch_source(mantissa_test::ToyDataset(40));
  ASSERT_TRUE(model->is_training());
  EXPECT_THAT([&] { mantissa::detail::run_evaluation(parts, dataset, "eval", false, false); },
              ThrowsMessage<std::runtime_error>(HasSubstr("forward failed (simulated)")));
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(model->is_training());

  // Without the failure the same evaluation runs every batch and also restores the mode.
  calls = 0;
  fail_at = -1;
  const auto result = mantissa::detail::run_evaluation(parts, dataset, "eval", false, false);
  EXPECT_EQ(calls, 3);  // 40 examples in batches of 16
  EXPECT_EQ(result.metrics.count("eval_loss"), 1u);
  EXPECT_EQ(result.metrics.count("eval_accuracy"), 1u);
  EXPECT_TRUE(model->is_training());
}

}  // namespace
