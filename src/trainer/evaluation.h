#pragma once
// The evaluation loop: the eval dataset in order, under no_grad, its loss and accuracy.

#include <cstdint>
#include <optional>

#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <mantissa/batch.h>
#include <mantissa/precision_plan.h>
#include <mantissa/trainer_hooks.h>

namespace mantissa::detail {

/// What one evaluation runs on. References to the Trainer's objects.
struct EvaluationParts {
  const TrainingArguments& args;
  const PrecisionPlan& plan;
  c10::Device device;
  torch::nn::Module& module;
  const ForwardFn& forward;
  /// The user's loss; empty for cross-entropy of `forward(batch.data)` on `batch.target`.
  const LossFn& compute_loss;
  /// Empty for none.
  const MetricsFn& compute_metrics;
  const std::optional<BatchSource>& eval;
};

/// Runs the evaluation dataset in batches of `per_device_eval_batch_size` and returns
/// `eval_loss` (the example-weighted mean), `eval_accuracy` (when every batch looks like
/// classification: 2-d logits, 1-d integer targets, the default loss), the user's metrics
/// (prefixed `eval_`), `eval_runtime` and `eval_samples_per_second`. Outside training
/// (`during_train` false) `bf16_full_eval` / `fp16_full_eval` cast the model first, as HF.
/// The model's train/eval mode is restored. Python: `Trainer.evaluation_loop`. Syncs.
/// Throws `c10::ValueError` without an eval dataset or with an empty one.
LogEntry run_evaluation(const EvaluationParts& parts, bool during_train);

}  // namespace mantissa::detail
