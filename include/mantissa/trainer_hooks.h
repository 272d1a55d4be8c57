#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <mantissa/batch.h>
#include <mantissa/trainer_callback.h>

namespace mantissa {

class LrScheduler;

/// Computes the loss of one batch (called under autocast). Python: `Trainer.compute_loss`.
using LossFn = std::function<torch::Tensor(const Batch& batch)>;

/// Turns all evaluation predictions (logits, on the CPU) and targets into metrics.
/// Python: `compute_metrics(EvalPrediction)`. Keys get an `eval_` prefix when they lack one.
using MetricsFn =
    std::function<LogEntry(const torch::Tensor& predictions, const torch::Tensor& targets)>;

/// The model's forward pass, type-erased.
using ForwardFn = std::function<torch::Tensor(const torch::Tensor& input)>;

/// Builds the optimizer over the tensors the Trainer wants optimized (the fp32 masters when
/// the model is low-precision, else the model's parameters), grouped for weight decay.
/// Python: `Trainer(optimizers=(optimizer, None))` / `create_optimizer`.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<torch::optim::OptimizerParamGroup> param_groups)>;

/// Builds the LR scheduler over the Trainer's optimizer for a run of `num_training_steps`
/// optimizer steps. Python: `Trainer(optimizers=(None, scheduler))` / `create_scheduler`.
using SchedulerFactory = std::function<std::unique_ptr<LrScheduler>(
    torch::optim::Optimizer& optimizer, std::int64_t num_training_steps)>;

}  // namespace mantissa
