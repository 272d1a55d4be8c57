// Trainer::train(): the run set up (resume, precision guards, the start line), a step engine
// and the training loop wired together over this Trainer's objects.
#include <algorithm>
#include <optional>
#include <utility>

#include <fmt/core.h>
#include <fmt/format.h>
#include <torch/utils.h>

#include <ATen/Parallel.h>

#include <mantissa/amp/tf32_guard.h>
#include <mantissa/distributed.h>
#include <mantissa/memory/cpu_caching_allocator.h>

#include "address_sanitizer.h"
#include "device_info.h"
#include "scoped_value.h"
#include "trainer/eager_engine.h"
#include "trainer/graph_engine.h"
#include "trainer/interval_policy.h"
#include "trainer/optimizer_state_report.h"
#include "trainer/thread_check.h"
#include "trainer/trainer_impl.h"
#include "trainer/training_loop.h"

namespace mantissa {

TrainOutput Trainer::Impl::train(std::optional<std::string> resume) {
  if (!resume && args_.resume_from_checkpoint()) resume = *args_.resume_from_checkpoint();
  check_output_dir(resume.has_value());
  // An AddressSanitizer build keeps LibTorch's allocator: reused blocks would hide a use after
  // free.
  if (device_.is_cpu() && args_.cpu_caching_allocator() && !detail::kAddressSanitizer &&
      !memory::enable_cpu_caching_allocator()) {
    TORCH_WARN_ONCE(
        "cpu_caching_allocator: another CPU allocator of higher priority is "
        "registered with LibTorch, so the Trainer leaves it in place");
  }
  prepare();
  std::optional<amp::Tf32Guard> tf32;
  if (plan_.tf32) tf32.emplace(*plan_.tf32);

  torch::manual_seed(static_cast<std::uint64_t>(args_.seed()));
  start_state();
  if (!resume && strategy_->should_save()) metrics_log_->start_fresh();
  if (const auto dir = checkpoint_to_resume(resume)) load_for_resume(*dir);
  strategy_->copy_scaler_from_rank0(objects_.scaler);
  const auto max_steps = objects_.schedule.max_steps;
  if (device_.is_cpu() && strategy_->is_local_main_process()) {
    if (const auto warning = detail::thread_oversubscription(
            at::get_num_threads(), std::max<std::int64_t>(1, strategy_->local_world_size()),
            detail::usable_cores())) {
      TORCH_WARN_ONCE(*warning);
    }
  }
  if (args_.load_best_model_at_end() && strategy_->is_main_process() &&
      !detail::evaluates_within(detail::make_interval_policy(args_), state_.eval_steps,
                                state_.global_step, max_steps)) {
    TORCH_WARN(
        "load_best_model_at_end is set, but no evaluation falls within this run (eval_strategy ",
        args_.eval_strategy().name(), ", eval_steps ", state_.eval_steps, ", steps ",
        state_.global_step, " to ", max_steps,
        "): there will be no best model to load at the end. Evaluate more often "
        "(--eval_steps) or train longer.");
  }
  detail::Progress progress(max_steps, detail::Progress::wanted(args_.disable_tqdm()),
                            /*prints=*/strategy_->should_log());
  const detail::ScopedValue<detail::Progress*> use_progress(progress_, &progress);
  progress.print(fmt::format(
      "mantissa: {} on {}; {} examples, {} epochs, {} optimizer steps of batch {}{} x {} "
      "accumulation{}{}",
      plan_.describe(), device_.str(), train_.size, objects_.schedule.num_epochs, max_steps,
      args_.per_device_train_batch_size(), strategy_->describe(),
      args_.gradient_accumulation_steps(),
      resume ? fmt::format(", resuming at step {}", state_.global_step) : "",
      detail::emulated_bf16_note(device_.is_cpu(), plan_.compute_dtype,
                                 detail::query_device_info().cpu_native_bf16)));
  // Every process says what it holds: under sharding the ranks' shares differ by padding.
  if (const auto held = strategy_->describe_optimizer_state(); !held.empty()) {
    if (strategy_->should_log()) {
      progress.print(held);
    } else {
      fmt::print(stderr, "{}\n", held);
    }
  }

  detail::LossWindow loss_window(device_, args_.logging_nan_inf_filter());
  detail::EagerEngine eager(step_parts(loss_window));
  // cuda_graph: the only place the graph engine is made; null when not asked for or blocked.
  const auto graph =
      detail::make_graph_engine(eager, step_parts(loss_window),
                                /*optimizer_from_factory=*/hooks_.optimizer_factory != nullptr);
  detail::StepEngine& engine = graph ? static_cast<detail::StepEngine&>(*graph) : eager;

  detail::LoopActions actions;
  actions.log = [this](LogEntry logs) { log(std::move(logs)); };
  if (eval_) {
    actions.evaluate = [this] {
      evaluate(nullptr, "eval", /*during_train=*/true);
      return best_unsaved_;
    };
  }
  actions.save_checkpoint = [this] { save_checkpoint(); };
  actions.add_optimizer_values = [this](LogEntry& logs) { add_optimizer_values(logs); };
  actions.after_update = [this] { report_optimizer_state_once(); };
  actions.finish = [this] { finish_training(); };
  module_->train();
  detail::TrainingLoop loop({args_, objects_.schedule, intervals_, train_, device_, *strategy_,
                             engine, callbacks_, state_, control_, loss_window, progress,
                             std::move(actions)});
  const auto result = loop.run();
  return TrainOutput{state_.global_step, result.training_loss, result.metrics};
}

void Trainer::Impl::report_optimizer_state_once() {
  if (optimizer_state_reported_) return;
  optimizer_state_reported_ = true;
  // A strategy that counted its shards' bytes said so when training started.
  if (strategy_->reports_optimizer_state_bytes()) return;
  // Where the processes hold different shares (the state sharded by tensors), each says its own.
  const bool per_process = !strategy_->describe_optimizer_state().empty();
  if (!per_process && !strategy_->should_log()) return;
  const auto size =
      detail::measure_optimizer_state(*objects_.optimizer.optimizer, objects_.masters.get());
  if (!size) return;
  auto line = detail::describe_optimizer_state_size(*size);
  if (per_process) line += fmt::format(" on rank {}", strategy_->rank());
  if (strategy_->should_log()) {
    progress_->print(line);
  } else {
    fmt::print(stderr, "{}\n", line);
  }
}

}  // namespace mantissa
