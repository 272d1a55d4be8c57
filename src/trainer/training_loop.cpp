#include "trainer/training_loop.h"

#include <fmt/format.h>

#include "trainer/batch_roles.h"
#include "trainer/device_batch.h"
#include "trainer/prefetch.h"
#include "trainer/resume_check.h"

namespace mantissa::detail {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TrainingLoop::TrainingLoop(LoopParts parts) : parts_(std::move(parts)) {}

std::uint64_t TrainingLoop::data_seed() const {
  const auto& args = parts_.args;
  return static_cast<std::uint64_t>(args.data_seed().value_or(args.seed()));
}

LoopResult TrainingLoop::run() {
  auto& state = parts_.state;
  auto& control = parts_.control;
  const auto& schedule = parts_.schedule;
  parts_.loss_window.start(state.global_step);
  const auto start = Clock::now();
  log_window_start_ = start;
  const auto start_step = state.global_step;
  control = TrainerControl{};
  parts_.callbacks.fire(&TrainerCallback::on_train_begin);

  // Where a resumed run picks up: inside an epoch, or at the start of the next one.
  const auto position = resume_position(state, schedule.run_shape());
  if (state.global_step >= schedule.max_steps) {
    // HF trains no step then; the loop below is skipped, the end-of-training events still run.
    parts_.progress.print(fmt::format(
        "mantissa: the checkpoint is at step {}, and max_steps is {}: nothing left to train",
        state.global_step, schedule.max_steps));
    control.should_training_stop = true;
  }
  for (std::int64_t epoch = position.epoch;
       epoch < schedule.num_epochs && !control.should_training_stop; ++epoch) {
    train_epoch(epoch, epoch == position.epoch ? position.batches_done : 0);
  }
  parts_.progress.close();
  check_nonfinite();
  share_token_counts();

  const double runtime = seconds_since(start);
  // HF reports the mean over the processes of each one's loss total.
  const double total_loss = parts_.strategy.mean({parts_.loss_window.run_total()}).front();
  const auto steps_done = state.global_step - start_step;
  LoopResult result;
  result.training_loss = steps_done > 0 ? total_loss / static_cast<double>(steps_done) : 0.0;
  result.metrics = {
      {"train_runtime", runtime},
      {"train_samples_per_second",
       runtime > 0 ? static_cast<double>(samples_seen_) / runtime : 0.0},
      {"train_steps_per_second", runtime > 0 ? static_cast<double>(steps_done) / runtime : 0.0},
      {"train_loss", result.training_loss}};
  parts_.actions.log(result.metrics);
  if (parts_.actions.finish) parts_.actions.finish();
  parts_.callbacks.fire(&TrainerCallback::on_train_end);
  return result;
}

void TrainingLoop::train_epoch(std::int64_t epoch, std::int64_t skip) {
  auto& state = parts_.state;
  auto& control = parts_.control;
  const auto& schedule = parts_.schedule;
  const auto& args = parts_.args;
  const auto& strategy = parts_.strategy;
  // The data order of an epoch depends only on (data_seed, epoch), so a resumed run sees
  // exactly the batches the uninterrupted run would have seen.
  const auto order = strategy.epoch_order(static_cast<std::int64_t>(parts_.train.size), data_seed(),
                                          epoch, args.dataloader_drop_last());
  const auto* order_ptr = order.data_ptr<std::int64_t>();
  state.steps_in_epoch = skip;
  control.should_epoch_stop = false;
  parts_.callbacks.fire(&TrainerCallback::on_epoch_begin);
  BatchPrefetcher batches(
      parts_.train,
      [&schedule, order_ptr](std::int64_t b) { return schedule.batch_indices(order_ptr, b); },
      schedule.batches_per_epoch, args.dataloader_num_workers());

  for (std::int64_t b = skip; b < schedule.batches_per_epoch; ++b) {
    const auto group = schedule.group_of(b);
    if (b == group.group_start) parts_.callbacks.fire(&TrainerCallback::on_step_begin);
    const auto batch = to_device(batches.get(b), parts_.device, args.dataloader_pin_memory());
    // Every process's batch has this many examples (the sampler pads the shares evenly).
    const auto batch_examples = batch.num_examples() * strategy.world_size();
    samples_since_log_ += batch_examples;
    samples_seen_ += batch_examples;
    if (const auto tokens = token_ids_of(batch); tokens.defined()) {
      tokens_unshared_ += tokens.numel();
    }

    ++state.steps_in_epoch;
    const bool updated = strategy.run_step(
        [&] { return parts_.engine.train_batch(batch, group.in_group, group.boundary); });
    if (!updated) continue;
    ++state.global_step;
    state.epoch = schedule.fractional_epoch(epoch, b);
    if (parts_.actions.after_update) parts_.actions.after_update();
    parts_.callbacks.fire(&TrainerCallback::on_step_end);
    parts_.progress.update(state.global_step);
    maybe_log_save_evaluate(/*epoch_end=*/false);
    if (state.global_step >= schedule.max_steps) control.should_training_stop = true;
    if (control.should_training_stop || control.should_epoch_stop) break;
  }
  parts_.callbacks.fire(&TrainerCallback::on_epoch_end);
  maybe_log_save_evaluate(/*epoch_end=*/true);
}

void TrainingLoop::maybe_log_save_evaluate(bool epoch_end) {
  auto& control = parts_.control;
  // The callbacks may have asked already (on_step_end, on_epoch_end): what is due adds to it.
  const auto due = decide_intervals(parts_.intervals, parts_.state, epoch_end);
  if (due.log) control.should_log = true;
  if (due.evaluate) control.should_evaluate = true;
  if (due.save) control.should_save = true;
  if (control.should_log && parts_.state.global_step > parts_.loss_window.start_step()) {
    log_training_progress();
  }
  control.should_log = false;
  if (control.should_evaluate && parts_.actions.evaluate) {
    const bool best_unsaved = parts_.actions.evaluate();
    if (save_after_evaluation(parts_.intervals, best_unsaved)) control.should_save = true;
  }
  control.should_evaluate = false;
  if (control.should_save) {
    share_token_counts();  // the saved state counts every process's tokens
    parts_.actions.save_checkpoint();
  }
  control.should_save = false;
}

void TrainingLoop::share_token_counts() {
  const auto total = static_cast<std::int64_t>(
      parts_.strategy.sum({static_cast<double>(tokens_unshared_)}).front());
  tokens_unshared_ = 0;
  tokens_since_log_ += total;
  parts_.state.num_input_tokens_seen += total;
}

void TrainingLoop::check_nonfinite() {
  const auto& strategy = parts_.strategy;
  const auto limit = parts_.args.max_consecutive_nonfinite();
  // Each process counts its own losses; all stop together, or the others would wait for it.
  const bool finite =
      strategy.passed_everywhere([&] { parts_.loss_window.check_nonfinite(limit); });
  TORCH_CHECK(finite, "rank ", strategy.rank(), ": training stopped because another process saw ",
              limit, " inf/nan losses in a row (see its error)");
}

void TrainingLoop::log_training_progress() {
  auto& state = parts_.state;
  // HF logs the mean over the processes of each one's mean loss.
  const double loss = parts_.strategy.mean({parts_.loss_window.close(state.global_step)}).front();
  share_token_counts();
  const double elapsed = seconds_since(log_window_start_);
  LogEntry logs{{"loss", loss}};
  parts_.actions.add_optimizer_values(logs);
  if (const auto grad_norm = parts_.engine.last_grad_norm(); grad_norm.defined()) {
    logs["grad_norm"] = grad_norm.item<double>();
  }
  if (elapsed > 0) {
    logs["samples_per_second"] = static_cast<double>(samples_since_log_) / elapsed;
    if (tokens_since_log_ > 0) {
      logs["tokens_per_second"] = static_cast<double>(tokens_since_log_) / elapsed;
    }
  }
  samples_since_log_ = 0;
  tokens_since_log_ = 0;
  log_window_start_ = Clock::now();
  check_nonfinite();
  parts_.actions.log(std::move(logs));
}

}  // namespace mantissa::detail
