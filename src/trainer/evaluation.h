#pragma once
// The evaluation loop: a dataset in order, under no_grad, its loss, accuracy, predictions and
// the user's metrics.

#include <cstdint>
#include <set>
#include <string>

#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <mantissa/batch.h>
#include <mantissa/precision_plan.h>
#include <mantissa/trainer_hooks.h>

#include "trainer/evaluation_accumulator.h"
#include "trainer/strategy.h"

namespace mantissa::detail {

/// What one evaluation runs on. References to the Trainer's objects.
struct EvaluationParts {
  const TrainingArguments& args;
  const PrecisionPlan& plan;
  c10::Device device;
  torch::nn::Module& module;
  const ForwardFn& forward;
  /// The user's loss (with the outputs when it has them); empty for the default loss.
  const LossWithOutputsFn& compute_loss;
  /// Empty for none.
  const MetricsFn& compute_metrics;
  /// Empty to keep the logits as they are.
  const PreprocessLogitsFn& preprocess_logits;
  /// Each process evaluates its share, and the results are gathered.
  Strategy& strategy;
  /// The built-in metrics a user metric has replaced and that were warned about (once each
  /// per Trainer).
  std::set<std::string>& warned_replacements;
};

/// What `run_evaluation` returns: the metrics, and the predictions and labels when asked for.
struct EvaluationResult {
  LogEntry metrics;
  /// Concatenated (padded) logits, on the CPU; undefined unless kept.
  torch::Tensor predictions;
  /// Concatenated (padded) labels, on the CPU; undefined unless kept or without labels.
  torch::Tensor label_ids;
};

/// Runs `dataset` in batches of `per_device_eval_batch_size` and returns `<prefix>_loss` (the
/// example-weighted mean; absent when no batch had a loss), `<prefix>_accuracy` (when every
/// batch looks like classification: 2-d logits, 1-d integer labels, the default loss), the
/// user's metrics (prefixed), `<prefix>_runtime`, `<prefix>_samples_per_second` and
/// `<prefix>_steps_per_second`. The logits and labels are gathered when `keep_predictions` or
/// when `compute_metrics` needs them. Outside training (`during_train` false)
/// `bf16_full_eval` / `fp16_full_eval` cast the model first, as HF. The model's train/eval
/// mode is restored, also when an exception passes (EvalModeGuard). Python:
/// `Trainer.evaluation_loop`. Syncs. Throws `c10::ValueError` for an empty dataset.
///
/// With several processes each takes every world_size-th example from its rank on
/// (`EvaluationShard`); the sums behind the loss and
/// accuracy and the kept rows are gathered back into the dataset's order, so every process
/// returns the metrics of one process that evaluated the whole set (what accelerate's
/// `gather_for_metrics` aims at; HF's padded batches also count a repeated example in the last
/// batch's mean loss, which this does not).
EvaluationResult run_evaluation(const EvaluationParts& parts, const BatchSource& dataset,
                                const std::string& prefix, bool during_train,
                                bool keep_predictions);

}  // namespace mantissa::detail
