#include "trainer/eager_engine.h"

#include <fmt/format.h>

#include <mantissa/amp/autocast.h>

namespace mantissa::detail {

EagerEngine::EagerEngine(StepParts parts)
    : parts_(std::move(parts)),
      fused_writes_back_(parts_.fused != nullptr && parts_.fused->writes_back_to_model()) {}

bool EagerEngine::train_batch(const Batch& batch, std::int64_t in_group, bool boundary) {
  forward_backward(batch, in_group, /*sync_gradients=*/boundary);
  if (!boundary) return false;
  update();
  return true;
}

void EagerEngine::forward_backward(const Batch& batch, std::int64_t in_group, bool sync_gradients) {
  const auto& plan = parts_.plan;
  torch::Tensor loss;
  {
    const auto scope = parts_.strategy.forward_context({/*training=*/true, sync_gradients});
    amp::Autocast autocast(parts_.device.type(),
                           plan.autocast ? plan.compute_dtype : c10::kBFloat16, plan.autocast,
                           autocast_cache_);
    loss = parts_.compute_loss(batch);
  }
  // Dividing by 1 changes nothing but costs an op forward and one backward.
  if (in_group > 1) loss = loss / static_cast<double>(in_group);
  parts_.strategy.before_backward(loss, sync_gradients);
  parts_.scaler.scale(loss).backward();
  parts_.loss_window.add(loss.detach().to(torch::kFloat), parts_.state.global_step);
}

void EagerEngine::update_on_device(bool with_callbacks) {
  const auto& args = parts_.args;
  auto& scaler = parts_.scaler;
  auto& strategy = parts_.strategy;
  strategy.finish_gradients();
  if (parts_.masters != nullptr) parts_.masters->copy_grads_to_masters();
  const bool clip = args.max_grad_norm() > 0;
  // As HF (accelerator.clip_grad_norm_): unscale only to clip, unless the strategy must agree
  // on inf/nan first. Otherwise the scaler's step unscales, inside FusedAdamW's single pass
  // when that is the optimizer.
  if (clip || strategy.unscales_before_step()) scaler.unscale_(parts_.optimizer);
  if (clip) grad_norm_ = strategy.clip_grad_norm_(parts_.optimized_params, args.max_grad_norm());
  if (with_callbacks) parts_.callbacks.fire(&TrainerCallback::on_pre_optimizer_step);
  scaler.step(parts_.optimizer);
  if (parts_.masters != nullptr && !fused_writes_back_) parts_.masters->copy_masters_to_model();
  strategy.after_optimizer_step();
  // A device copy: read on the host only if the step turns out skipped (for the log line).
  scale_before_ = parts_.plan.loss_scaling ? scaler.scale_tensor().clone() : torch::Tensor();
  if (args.dynamic_loss_scale()) {
    scaler.update();
  } else {
    scaler.update(args.loss_scale());
  }
  run_after_step_hooks();
  parts_.loss_window.count_update();
}

void EagerEngine::run_after_step_hooks() {
  if (parts_.saved_states == nullptr) return;
  const StepServices services{[this](at::Tensor& t) { parts_.strategy.max_all_reduce_(t); }};
  for (const auto& piece : *parts_.saved_states) {
    if (piece.after_optimizer_step) piece.after_optimizer_step(services);
  }
}

bool EagerEngine::update_on_host(const torch::Tensor& scale_before, bool zero_grads) {
  const auto& args = parts_.args;
  auto& state = parts_.state;
  auto& scaler = parts_.scaler;
  const bool skipped = parts_.plan.loss_scaling && scaler.last_step_skipped();
  parts_.callbacks.fire(&TrainerCallback::on_optimizer_step);
  if (skipped) {
    ++state.skipped_steps;
    ++consecutive_skips_;
    parts_.progress.print(fmt::format(
        "step {}: gradients overflowed (inf/nan) at loss scale {:g}; optimizer step skipped, "
        "loss scale now {:g}",
        state.global_step + 1, scale_before.item<double>(), scaler.get_scale()));
    TORCH_CHECK(args.max_consecutive_nonfinite() == 0 ||
                    consecutive_skips_ < args.max_consecutive_nonfinite(),
                "training stopped: ", consecutive_skips_,
                " optimizer steps in a row were skipped because the fp16 gradients overflowed "
                "(loss scale now ",
                scaler.get_scale(),
                "). The run is diverging: try --bf16 instead of --fp16, a lower --learning_rate, "
                "or a smaller --max_grad_norm.");
  } else {
    consecutive_skips_ = 0;
    parts_.scheduler.step();  // HF: only when the optimizer step was not skipped
  }
  if (zero_grads) clear_grads();
  return skipped;
}

bool EagerEngine::update() {
  update_on_device(/*with_callbacks=*/true);
  return update_on_host(scale_before_, /*zero_grads=*/true);
}

void EagerEngine::clear_grads() {
  parts_.optimizer.zero_grad();
  parts_.strategy.zero_grad(parts_.module);
  if (parts_.masters != nullptr) parts_.masters->zero_grad();
}

}  // namespace mantissa::detail
