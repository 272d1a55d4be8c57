#pragma once
// How the loop runs a micro-batch and an optimizer update: a step engine. The loop decides
// which batch runs and when to log, evaluate and save; an engine decides how the step
// executes (eagerly, replayed from a CUDA graph) and owns the state that this needs. New
// precision modes plug in here, as further engines (or engines composing the eager one, as the
// CUDA-graph engine does); what spans processes is the strategy's, which the engine calls.

#include <cstdint>
#include <functional>
#include <vector>

#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/batch.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/optim/fused_adamw.h>
#include <mantissa/precision_plan.h>

#include "trainer/callback_handler.h"
#include "trainer/loss_window.h"
#include "trainer/progress.h"
#include "trainer/saved_state.h"
#include "trainer/strategy.h"

namespace mantissa::detail {

/// What an engine works on: the Trainer's objects, owned by the Trainer, alive for the whole
/// `train()` call an engine is made for. References only; copying the struct is cheap.
struct StepParts {
  const TrainingArguments& args;
  const PrecisionPlan& plan;
  c10::Device device;
  torch::nn::Module& module;
  /// The loss of one batch, to be called under autocast (the Trainer's compute_loss).
  std::function<torch::Tensor(const Batch&)> compute_loss;
  /// Null when the model trains without fp32 masters.
  amp::MasterWeights* masters;
  torch::optim::Optimizer& optimizer;
  /// `optimizer` when it is mantissa's FusedAdamW, else null.
  optim::FusedAdamW* fused;
  /// Every param group's tensors: what is clipped.
  const std::vector<torch::Tensor>& optimized_params;
  LrScheduler& scheduler;
  amp::GradScaler& scaler;
  const CallbackHandler& callbacks;
  /// Read for the step number of log lines; an engine counts skipped updates here.
  TrainerState& state;
  LossWindow& loss_window;
  Progress& progress;
  /// What spans processes: called around each micro-batch's forward and backward.
  Strategy& strategy;
  /// The run's registered pieces of state, whose `after_optimizer_step` runs after each
  /// optimizer update; null for none.
  const SavedStates* saved_states = nullptr;
};

/// Runs micro-batches and optimizer updates for the training loop. Python: the body of
/// `Trainer._inner_training_loop`'s batch loop (`training_step`, then at the accumulation
/// boundary `optimizer.step()`, `lr_scheduler.step()`, `model.zero_grad()`).
class StepEngine {
 public:
  virtual ~StepEngine() = default;

  /// Runs micro-batch `batch` (already on the device), whose loss counts 1/`in_group` of the
  /// update's; when `boundary` (the group's last micro-batch) it runs the optimizer update
  /// too, with the callbacks `on_pre_optimizer_step` and `on_optimizer_step`. Returns whether
  /// an update completed (the loop then counts a global step). Syncs only to learn whether an
  /// fp16 update was skipped (loss scaling on) or to report one.
  virtual bool train_batch(const Batch& batch, std::int64_t in_group, bool boundary) = 0;

  /// The gradient norm measured by the last update (before clipping), on the device; undefined
  /// when `max_grad_norm` is 0 (no clipping) or before the first update. No sync.
  virtual torch::Tensor last_grad_norm() const = 0;
};

}  // namespace mantissa::detail
