#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <mantissa/batch.h>
#include <mantissa/model_forward.h>
#include <mantissa/model_output.h>
#include <mantissa/trainer_callback.h>

namespace mantissa {

class LrScheduler;

/// Computes the loss of one batch (called under autocast). Python: `Trainer.compute_loss`.
/// An evaluation that needs predictions then runs the model's forward again; a
/// `LossWithOutputsFn` avoids that.
using LossFn = std::function<torch::Tensor(const Batch& batch)>;

/// Computes the loss of one batch and returns it with the model's outputs, so that evaluation
/// and `predict()` take the logits from the same forward pass. Python: `Trainer.compute_loss(
/// model, inputs, return_outputs=True)` returning `(loss, outputs)`.
using LossWithOutputsFn = std::function<std::pair<torch::Tensor, ModelOutput>(const Batch& batch)>;

/// Computes the loss from the model's outputs and the batch (the Trainer runs the forward
/// once). Python: `Trainer(compute_loss_func=fn)`, called as `fn(outputs, labels, ...)`.
using LossFromOutputsFn =
    std::function<torch::Tensor(const ModelOutput& outputs, const Batch& batch)>;

/// Reduces one evaluation batch's logits before they are kept for `compute_metrics` (e.g. to
/// their argmax, so that the logits of the whole dataset need not be held). Runs on the
/// device, per batch. Python: `Trainer(preprocess_logits_for_metrics=fn)`.
using PreprocessLogitsFn =
    std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& labels)>;

/// Turns all evaluation predictions (logits, or what `PreprocessLogitsFn` made of them, on the
/// CPU) and labels into metrics. Python: `compute_metrics(EvalPrediction)`. Keys get the
/// metric prefix (`eval_`, `test_`) when they lack it.
using MetricsFn =
    std::function<LogEntry(const torch::Tensor& predictions, const torch::Tensor& labels)>;

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
