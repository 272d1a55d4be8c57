// The training loop driven with a fake step engine, a fake strategy and recording actions: the
// order of events, the resume skip, accumulation boundaries and what is due after each update,
// without a model or an optimizer.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "trainer/callback_handler.h"
#include "trainer/interval_policy.h"
#include "trainer/loss_window.h"
#include "trainer/progress.h"
#include "trainer/run_schedule.h"
#include "trainer/single_process.h"
#include "trainer/training_loop.h"

namespace {

using mantissa::LogEntry;
using mantissa::TrainerControl;
using mantissa::TrainerState;
using mantissa::TrainingArguments;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

using Events = std::vector<std::string>;

/// Records each micro-batch as "batch <first example> <in_group><B at a boundary>" and adds a
/// loss of 1 to the loss window; an update completes at every boundary.
class FakeEngine final : public mantissa::detail::StepEngine {
 public:
  FakeEngine(Events& events, mantissa::detail::LossWindow& window, TrainerState& state)
      : events_(events), window_(window), state_(state) {}
  bool train_batch(const mantissa::Batch& batch, std::int64_t in_group, bool boundary) override {
    events_.push_back("batch " + std::to_string(batch.at("input").item<std::int64_t>()) + " " +
                      std::to_string(in_group) + (boundary ? "B" : ""));
    window_.add(torch::ones({}), state_.global_step);
    if (boundary) window_.count_update();
    return boundary;
  }
  torch::Tensor last_grad_norm() const override { return {}; }

 private:
  Events& events_;
  mantissa::detail::LossWindow& window_;
  TrainerState& state_;
};

/// A lone process that also records the epochs' orders and the steps it runs; its order is the
/// examples in order, so that a batch names its position.
class RecordingStrategy final : public mantissa::detail::SingleProcess {
 public:
  explicit RecordingStrategy(Events& events) : events_(events) {}
  torch::Tensor epoch_order(std::int64_t n, std::uint64_t, std::int64_t epoch,
                            bool) const override {
    events_.push_back("order epoch " + std::to_string(epoch));
    return torch::arange(n, torch::kLong);
  }
  bool run_step(const std::function<bool()>& step) const override {
    ++steps;
    return step();
  }

  mutable int steps = 0;

 private:
  Events& events_;
};

/// Records the events the loop fires; can stop training after a given global step.
class RecordingCallback final : public mantissa::TrainerCallback {
 public:
  explicit RecordingCallback(Events& events) : events_(events) {}
  void on_train_begin(const TrainingArguments&, TrainerState&, TrainerControl&) override {
    events_.push_back("on_train_begin");
  }
  void on_train_end(const TrainingArguments&, TrainerState&, TrainerControl&) override {
    events_.push_back("on_train_end");
  }
  void on_epoch_begin(const TrainingArguments&, TrainerState&, TrainerControl&) override {
    events_.push_back("on_epoch_begin");
  }
  void on_epoch_end(const TrainingArguments&, TrainerState&, TrainerControl&) override {
    events_.push_back("on_epoch_end");
  }
  void on_step_begin(const TrainingArguments&, TrainerState&, TrainerControl&) override {
    events_.push_back("on_step_begin");
  }
  void on_step_end(const TrainingArguments&, TrainerState& state,
                   TrainerControl& control) override {
    events_.push_back("on_step_end " + std::to_string(state.global_step));
    if (stop_after > 0 && state.global_step == stop_after) control.should_training_stop = true;
  }

  std::int64_t stop_after = 0;

 private:
  Events& events_;
};

/// A dataset whose batch holds the index of its first example as `input`.
mantissa::BatchSource indexed_dataset(std::size_t n) {
  mantissa::BatchSource source;
  source.size = n;
  source.get_batch = [](c10::ArrayRef<std::size_t> indices) {
    mantissa::Batch batch;
    batch.set("input", torch::tensor(static_cast<std::int64_t>(indices.front())));
    return batch;
  };
  return source;
}

/// Everything a loop needs, built from `args` over a dataset of `n` examples.
struct LoopHarness {
  explicit LoopHarness(TrainingArguments arguments, std::size_t n)
      : args(std::move(arguments)),
        train(indexed_dataset(n)),
        schedule(mantissa::detail::make_run_schedule(n, args)),
        intervals(mantissa::detail::make_interval_policy(args)),
        strategy(events),
        callback(std::make_shared<RecordingCallback>(events)),
        callbacks(args, state, control, context),
        engine(events, loss_window, state) {
    callbacks.add(callback);
    state.max_steps = schedule.max_steps;
    state.logging_steps =
        TrainingArguments::resolve_steps(args.logging_steps(), schedule.max_steps);
    state.eval_steps =
        TrainingArguments::resolve_steps(args.resolved_eval_steps(), schedule.max_steps);
    state.save_steps = TrainingArguments::resolve_steps(args.save_steps(), schedule.max_steps);
  }

  /// Runs the loop; `with_eval`: the Trainer has an eval dataset, whose evaluation reports an
  /// improved best metric when `improves`.
  mantissa::detail::LoopResult run(bool with_eval = false, bool improves = false) {
    mantissa::detail::LoopActions actions;
    actions.log = [this](const LogEntry& logs) {
      events.push_back(logs.count("train_loss") != 0 ? "log train metrics"
                                                     : "log " + std::to_string(state.global_step));
      logged.push_back(logs);
    };
    if (with_eval) {
      actions.evaluate = [this, improves] {
        events.push_back("evaluate " + std::to_string(state.global_step));
        return improves;
      };
    }
    actions.save_checkpoint = [this] {
      events.push_back("save " + std::to_string(state.global_step));
    };
    actions.add_optimizer_values = [](LogEntry& logs) { logs["learning_rate"] = 0.5; };
    actions.finish = [this] { events.push_back("finish"); };
    mantissa::detail::TrainingLoop loop({args, schedule, intervals, train, c10::Device(c10::kCPU),
                                         strategy, engine, callbacks, state, control, loss_window,
                                         progress, std::move(actions)});
    return loop.run();
  }

  /// The events that match `prefix`, in order.
  Events only(const std::string& prefix) const {
    Events out;
    for (const auto& e : events) {
      if (e.rfind(prefix, 0) == 0) out.push_back(e);
    }
    return out;
  }

  Events events;
  std::vector<LogEntry> logged;
  TrainingArguments args;
  mantissa::BatchSource train;
  mantissa::detail::RunSchedule schedule;
  mantissa::detail::IntervalPolicy intervals;
  RecordingStrategy strategy;
  TrainerState state;
  TrainerControl control;
  mantissa::TrainerCallbackContext context;
  std::shared_ptr<RecordingCallback> callback;
  mantissa::detail::CallbackHandler callbacks;
  mantissa::detail::LossWindow loss_window{c10::Device(c10::kCPU), true};
  mantissa::detail::Progress progress{0, false};
  FakeEngine engine;
};

TrainingArguments loop_args() {
  return TrainingArguments()
      .output_dir("unused")
      .per_device_train_batch_size(1)
      .num_train_epochs(1)
      .logging_steps(1)
      .save_strategy("no")
      .disable_tqdm(true);
}

TEST(TrainingLoopTest, FiresHfEventsInOrderAroundAccumulationGroups) {
  LoopHarness h(
      loop_args().gradient_accumulation_steps(2).logging_steps(2).save_strategy("steps").save_steps(
          2),
      4);
  const auto result = h.run();
  EXPECT_THAT(h.events,
              ElementsAre("on_train_begin", "order epoch 0", "on_epoch_begin", "on_step_begin",
                          "batch 0 2", "batch 1 2B", "on_step_end 1", "on_step_begin", "batch 2 2",
                          "batch 3 2B", "on_step_end 2", "log 2", "save 2", "on_epoch_end",
                          "log train metrics", "finish", "on_train_end"));
  EXPECT_EQ(h.state.global_step, 2);
  EXPECT_EQ(h.strategy.steps, 4);  // every micro-batch runs through the strategy
  // The fake engine adds a loss of 1 per micro-batch: 4 over 2 updates.
  EXPECT_DOUBLE_EQ(result.training_loss, 2.0);
  EXPECT_DOUBLE_EQ(h.logged.front().at("learning_rate"), 0.5);
}

TEST(TrainingLoopTest, AShortLastGroupEndsTheEpochAtItsOwnSize) {
  LoopHarness h(loop_args().gradient_accumulation_steps(2).num_train_epochs(2), 5);
  h.run();
  EXPECT_THAT(h.only("batch"),
              ElementsAre("batch 0 2", "batch 1 2B", "batch 2 2", "batch 3 2B", "batch 4 1B",
                          "batch 0 2", "batch 1 2B", "batch 2 2", "batch 3 2B", "batch 4 1B"));
  EXPECT_THAT(h.only("order"), ElementsAre("order epoch 0", "order epoch 1"));
  EXPECT_EQ(h.state.global_step, 6);
}

TEST(TrainingLoopTest, ResumesInsideAnEpochWithoutRepeatingItsBatches) {
  LoopHarness h(loop_args().gradient_accumulation_steps(2).num_train_epochs(2), 6);
  // A checkpoint after two updates of the first epoch: its first four micro-batches are done.
  h.state.global_step = 2;
  h.state.steps_in_epoch = 4;
  h.run();
  EXPECT_THAT(h.only("batch"), ElementsAre("batch 4 2", "batch 5 2B", "batch 0 2", "batch 1 2B",
                                           "batch 2 2", "batch 3 2B", "batch 4 2", "batch 5 2B"));
  EXPECT_EQ(h.state.global_step, 6);
  // Logging starts from the resumed step: the first line is that of step 3.
  EXPECT_EQ(h.only("log").front(), "log 3");
}

TEST(TrainingLoopTest, ACheckpointAtMaxStepsTrainsNothingButEndsTheRun) {
  LoopHarness h(loop_args(), 3);
  // Saved at the end of the only epoch.
  h.state.global_step = 3;
  h.state.steps_in_epoch = 3;
  h.state.epoch = 1.0;
  const auto result = h.run();
  EXPECT_TRUE(h.only("batch").empty());
  EXPECT_THAT(h.events,
              ElementsAre("on_train_begin", "log train metrics", "finish", "on_train_end"));
  EXPECT_EQ(result.training_loss, 0.0);
}

TEST(TrainingLoopTest, EvaluatesAndSavesAtTheirIntervals) {
  LoopHarness h(loop_args()
                    .logging_steps(100)
                    .eval_strategy("steps")
                    .eval_steps(2)
                    .save_strategy("steps")
                    .save_steps(3),
                6);
  h.run(/*with_eval=*/true);
  EXPECT_THAT(h.only("evaluate"), ElementsAre("evaluate 2", "evaluate 4", "evaluate 6"));
  EXPECT_THAT(h.only("save"), ElementsAre("save 3", "save 6"));
  // logging_steps beyond the run: only the run's metrics are logged.
  EXPECT_THAT(h.only("log"), ElementsAre("log train metrics"));
}

TEST(TrainingLoopTest, WithoutAnEvalDatasetNoEvaluationRuns) {
  LoopHarness h(loop_args().eval_strategy("steps").eval_steps(1), 3);
  h.run(/*with_eval=*/false);
  EXPECT_TRUE(h.only("evaluate").empty());
  EXPECT_EQ(h.state.global_step, 3);
}

TEST(TrainingLoopTest, ACallbackStopsTrainingAfterItsStep) {
  LoopHarness h(loop_args().save_strategy("steps").save_steps(1), 10);
  h.callback->stop_after = 4;
  h.run();
  EXPECT_EQ(h.state.global_step, 4);
  EXPECT_EQ(h.only("batch").size(), 4u);
  // The step that stops still logs and saves what is due, and the run ends with its events.
  EXPECT_EQ(h.only("save").back(), "save 4");
  EXPECT_EQ(h.events.back(), "on_train_end");
}

TEST(TrainingLoopTest, TokenCountsReachTheStateAtEachLogLine) {
  LoopHarness h(loop_args().logging_steps(2), 4);
  h.train.get_batch = [](c10::ArrayRef<std::size_t> indices) {
    mantissa::Batch batch;
    batch.set("input", torch::tensor(static_cast<std::int64_t>(indices.front())));
    batch.set("input_ids", torch::zeros({1, 5}, torch::kLong));
    return batch;
  };
  h.run();
  EXPECT_EQ(h.state.num_input_tokens_seen, 4 * 5);
  EXPECT_GT(h.logged.front().count("tokens_per_second"), 0u);
}

}  // namespace
