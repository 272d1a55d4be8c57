// Trainer::train(): HF's inner training loop. It walks epochs and micro-batches, resumes at a
// saved position, fires the events in HF's order, and asks the interval policy what is due
// after each update; how a micro-batch and an update execute is the step engine's business.
#include <chrono>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/utils.h>

#include <mantissa/amp/tf32_guard.h>
#include <mantissa/distributed.h>

#include "trainer/batch_roles.h"
#include "trainer/checkpoint.h"
#include "trainer/device_batch.h"
#include "trainer/eager_engine.h"
#include "trainer/graph_engine.h"
#include "trainer/prefetch.h"
#include "trainer/resume_check.h"
#include "trainer/trainer_impl.h"

namespace mantissa {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Sets `slot` to `value` for the guard's lifetime and puts the old value back at its end,
/// also when an exception passes.
template <typename T>
class ScopedValue {
 public:
  ScopedValue(T& slot, T value) : slot_(slot), saved_(std::exchange(slot, std::move(value))) {}
  ~ScopedValue() { slot_ = std::move(saved_); }
  ScopedValue(const ScopedValue&) = delete;
  ScopedValue& operator=(const ScopedValue&) = delete;

 private:
  T& slot_;
  T saved_;
};

}  // namespace

/// The state of one `train()` call that the loop's logging reads: the loss window, the engine
/// (for the gradient norm) and what the throughput of a log line counts.
struct Trainer::Impl::Run {
  Run(const c10::Device& device, bool nan_inf_filter) : loss_window(device, nan_inf_filter) {}

  detail::LossWindow loss_window;
  detail::StepEngine* engine = nullptr;
  std::int64_t samples_seen = 0;  // examples trained on by this call, on every process
  std::int64_t samples_since_log = 0;
  std::int64_t tokens_since_log = 0;
  // Tokens this process saw that the other processes have not been told of yet (several
  // processes only: they are summed when a log line or a checkpoint needs the total).
  std::int64_t tokens_unshared = 0;
  Clock::time_point log_window_start;
};

std::uint64_t Trainer::Impl::data_seed() const {
  return static_cast<std::uint64_t>(args_.data_seed().value_or(args_.seed()));
}

TrainOutput Trainer::Impl::train(std::optional<std::string> resume) {
  if (!resume && args_.resume_from_checkpoint()) resume = *args_.resume_from_checkpoint();
  check_output_dir_on_all(resume.has_value());
  prepare();
  std::optional<amp::Tf32Guard> tf32;
  if (plan_.tf32) tf32.emplace(*plan_.tf32);

  torch::manual_seed(static_cast<std::uint64_t>(args_.seed()));
  start_state();
  if (const auto dir = checkpoint_to_resume(resume)) load_for_resume(*dir);
  broadcast_scaler_state();
  const auto max_steps = schedule_.max_steps;
  detail::Progress progress(max_steps, detail::Progress::wanted(args_.disable_tqdm()),
                            /*prints=*/should_log());
  const ScopedValue<detail::Progress*> use_progress(progress_, &progress);
  const auto processes = data_parallel_
                             ? fmt::format(" x {} processes ({}, rank {})", world_size(),
                                           data_parallel_->backend(), data_parallel_->rank())
                             : std::string();
  progress.print(fmt::format(
      "mantissa: {} on {}; {} examples, {} epochs, {} optimizer steps of batch {}{} x {} "
      "accumulation{}",
      plan_.describe(), device_.str(), train_.size, schedule_.num_epochs, max_steps,
      args_.per_device_train_batch_size(), processes, args_.gradient_accumulation_steps(),
      resume ? fmt::format(", resuming at step {}", state_.global_step) : ""));

  Run run(device_, args_.logging_nan_inf_filter());
  detail::EagerEngine eager(step_parts(run.loss_window));
  // cuda_graph: the only place the graph engine is made; null when not asked for or blocked.
  const auto graph =
      detail::make_graph_engine(eager, step_parts(run.loss_window),
                                /*optimizer_from_factory=*/optimizer_factory_ != nullptr);
  run.engine = graph ? static_cast<detail::StepEngine*>(graph.get()) : &eager;

  module_->train();
  run.loss_window.start(state_.global_step);
  const auto start = Clock::now();
  run.log_window_start = start;
  const auto start_step = state_.global_step;
  control_ = TrainerControl{};
  callbacks_.fire(&TrainerCallback::on_train_begin);

  // Where a resumed run picks up: inside an epoch, or at the start of the next one.
  const auto position = detail::resume_position(state_, schedule_.run_shape());
  if (state_.global_step >= max_steps) {
    // HF trains no step then; the loop below is skipped, the end-of-training events still run.
    progress.print(fmt::format(
        "mantissa: the checkpoint is at step {}, and max_steps is {}: nothing left to train",
        state_.global_step, max_steps));
    control_.should_training_stop = true;
  }

  for (std::int64_t epoch = position.epoch;
       epoch < schedule_.num_epochs && !control_.should_training_stop; ++epoch) {
    train_epoch(run, epoch, epoch == position.epoch ? position.batches_done : 0);
  }
  progress.close();
  check_nonfinite_on_all(run);
  share_token_counts(run);

  const double runtime = seconds_since(start);
  const double total_loss =
      sum_over_processes({run.loss_window.run_total()}).front() / static_cast<double>(world_size());
  const auto steps_done = state_.global_step - start_step;
  const double train_loss = steps_done > 0 ? total_loss / static_cast<double>(steps_done) : 0.0;
  LogEntry metrics{
      {"train_runtime", runtime},
      {"train_samples_per_second",
       runtime > 0 ? static_cast<double>(run.samples_seen) / runtime : 0.0},
      {"train_steps_per_second", runtime > 0 ? static_cast<double>(steps_done) / runtime : 0.0},
      {"train_loss", train_loss}};
  log(metrics);
  if (args_.load_best_model_at_end() && state_.best_model_checkpoint) load_best_model();
  if (state_.best_model_checkpoint && args_.save_total_limit() == 1 && should_save()) {
    // HF: with a limit of one, the run ends with the best checkpoint alone.
    detail::rotate_checkpoints(args_.output_dir(), 1, state_.best_model_checkpoint,
                               /*keep_latest=*/false);
  }
  callbacks_.fire(&TrainerCallback::on_train_end);
  return TrainOutput{state_.global_step, train_loss, metrics};
}

void Trainer::Impl::train_epoch(Run& run, std::int64_t epoch, std::int64_t skip) {
  // The data order of an epoch depends only on (data_seed, epoch), so a resumed run sees
  // exactly the batches the uninterrupted run would have seen.
  // Several processes: this rank's share, as torch.utils.data.DistributedSampler deals it.
  const auto order =
      data_parallel_
          ? torch::tensor(
                distributed::distributed_sampler_indices(
                    static_cast<std::int64_t>(train_.size), world_size(), data_parallel_->rank(),
                    data_seed(), static_cast<std::uint64_t>(epoch), /*shuffle=*/true,
                    args_.dataloader_drop_last()),
                torch::kLong)
          : torch::randperm(
                schedule_.num_examples,
                at::detail::createCPUGenerator(data_seed() + static_cast<std::uint64_t>(epoch)),
                torch::kLong);
  const auto* order_ptr = order.data_ptr<std::int64_t>();
  state_.steps_in_epoch = skip;
  control_.should_epoch_stop = false;
  callbacks_.fire(&TrainerCallback::on_epoch_begin);
  detail::BatchPrefetcher batches(
      train_, [this, order_ptr](std::int64_t b) { return schedule_.batch_indices(order_ptr, b); },
      schedule_.batches_per_epoch, args_.dataloader_num_workers());

  for (std::int64_t b = skip; b < schedule_.batches_per_epoch; ++b) {
    const auto group = schedule_.group_of(b);
    if (b == group.group_start) callbacks_.fire(&TrainerCallback::on_step_begin);
    const auto batch = detail::to_device(batches.get(b), device_, args_.dataloader_pin_memory());
    // Every process's batch has this many examples (the sampler pads the shares evenly).
    const auto batch_examples = batch.num_examples() * world_size();
    run.samples_since_log += batch_examples;
    run.samples_seen += batch_examples;
    if (const auto tokens = detail::token_ids_of(batch); tokens.defined()) {
      if (data_parallel_) {
        run.tokens_unshared += tokens.numel();
      } else {
        run.tokens_since_log += tokens.numel();
        state_.num_input_tokens_seen += tokens.numel();
      }
    }

    ++state_.steps_in_epoch;
    const auto step = [&] {
      return run.engine->train_batch(batch, group.in_group, group.boundary);
    };
    const bool updated =
        data_parallel_ ? data_parallel_->guarded("averaging the gradients", step) : step();
    if (!updated) continue;
    ++state_.global_step;
    state_.epoch = schedule_.fractional_epoch(epoch, b);
    callbacks_.fire(&TrainerCallback::on_step_end);
    progress_->update(state_.global_step);
    maybe_log_save_evaluate(run, /*epoch_end=*/false);
    if (state_.global_step >= schedule_.max_steps) control_.should_training_stop = true;
    if (control_.should_training_stop || control_.should_epoch_stop) break;
  }
  callbacks_.fire(&TrainerCallback::on_epoch_end);
  maybe_log_save_evaluate(run, /*epoch_end=*/true);
}

void Trainer::Impl::maybe_log_save_evaluate(Run& run, bool epoch_end) {
  // The callbacks may have asked already (on_step_end, on_epoch_end): what is due adds to it.
  const auto due = detail::decide_intervals(intervals_, state_, epoch_end);
  if (due.log) control_.should_log = true;
  if (due.evaluate) control_.should_evaluate = true;
  if (due.save) control_.should_save = true;
  if (control_.should_log && state_.global_step > run.loss_window.start_step()) {
    log_training_progress(run);
  }
  control_.should_log = false;
  if (control_.should_evaluate && eval_) {
    evaluate(nullptr, "eval", /*during_train=*/true);
    if (detail::save_after_evaluation(intervals_, best_unsaved_)) control_.should_save = true;
  }
  control_.should_evaluate = false;
  if (control_.should_save) {
    share_token_counts(run);  // the saved state counts every process's tokens
    save_checkpoint();
  }
  control_.should_save = false;
}

std::optional<std::string> Trainer::Impl::checkpoint_to_resume(
    const std::optional<std::string>& resume) const {
  if (!data_parallel_) {
    if (!resume) return std::nullopt;
    return detail::resolve_checkpoint(*resume, args_.output_dir());
  }
  // Every process resolves its own ("latest" looks at its output_dir), then all agree, before
  // any of them starts the collectives of a resume that the others would not run.
  std::optional<std::string> dir;
  const bool found = data_parallel_->passed_everywhere([&] {
    if (resume) dir = detail::resolve_checkpoint(*resume, args_.output_dir());
  });
  TORCH_CHECK_VALUE(found, "rank ", data_parallel_->rank(),
                    ": another process cannot find the checkpoint to resume from (see its error)");
  data_parallel_->check_same_text(dir.value_or("(none: a fresh start)"),
                                  "the checkpoint to resume from");
  return dir;
}

void Trainer::Impl::check_nonfinite_on_all(Run& run) const {
  if (!data_parallel_) return run.loss_window.check_nonfinite(args_.max_consecutive_nonfinite());
  // Each process counts its own losses; all stop together, or the others would wait for it.
  const bool finite = data_parallel_->passed_everywhere(
      [&] { run.loss_window.check_nonfinite(args_.max_consecutive_nonfinite()); });
  TORCH_CHECK(finite, "rank ", data_parallel_->rank(),
              ": training stopped because another process saw ", args_.max_consecutive_nonfinite(),
              " inf/nan losses in a row (see its error)");
}

void Trainer::Impl::share_token_counts(Run& run) {
  if (!data_parallel_) return;
  const auto total = static_cast<std::int64_t>(
      data_parallel_->sum({static_cast<double>(run.tokens_unshared)}).front());
  run.tokens_unshared = 0;
  run.tokens_since_log += total;
  state_.num_input_tokens_seen += total;
}

void Trainer::Impl::log_training_progress(Run& run) {
  // HF logs the mean over the processes of each one's mean loss.
  const double loss = sum_over_processes({run.loss_window.close(state_.global_step)}).front() /
                      static_cast<double>(world_size());
  share_token_counts(run);
  const double elapsed = seconds_since(run.log_window_start);
  LogEntry logs{{"loss", loss}, {"learning_rate", scheduler_->get_last_lr().at(0)}};
  if (const auto grad_norm = run.engine->last_grad_norm(); grad_norm.defined()) {
    logs["grad_norm"] = grad_norm.item<double>();
  }
  if (plan_.loss_scaling) {
    logs["loss_scale"] = scaler_.get_scale();
    logs["skipped_steps"] = static_cast<double>(state_.skipped_steps);
  }
  if (elapsed > 0) {
    logs["samples_per_second"] = static_cast<double>(run.samples_since_log) / elapsed;
    if (run.tokens_since_log > 0) {
      logs["tokens_per_second"] = static_cast<double>(run.tokens_since_log) / elapsed;
    }
  }
  run.samples_since_log = 0;
  run.tokens_since_log = 0;
  run.log_window_start = Clock::now();
  check_nonfinite_on_all(run);
  log(std::move(logs));
}

}  // namespace mantissa
