#pragma once

#include <utility>

#include <torch/types.h>

namespace mantissa {

/// What a model's forward pass returns to the Trainer: its logits and, when the model
/// computes it from the labels in the batch, its loss. Python: a `transformers.ModelOutput`
/// (`outputs.loss`, `outputs.logits`).
///
/// A forward that returns a plain tensor returns logits (the implicit conversion below); one
/// that computes its own loss returns `ModelOutput(loss, logits)`, and the Trainer then uses
/// that loss as HF's does. Host object holding tensor handles.
struct ModelOutput {
  /// The loss of the batch, a scalar; undefined when the model does not compute one.
  torch::Tensor loss;
  /// The predictions ([batch, classes], [batch, classes, time], ...); may be undefined when
  /// only the loss is of interest.
  torch::Tensor logits;

  ModelOutput() = default;
  /// Logits only: what a forward returning a tensor gives.
  ModelOutput(torch::Tensor logits)  // NOLINT(google-explicit-constructor): a forward's tensor
      : logits(std::move(logits)) {}
  /// A loss and logits, in the order of HF's `ModelOutput` fields.
  ModelOutput(torch::Tensor loss, torch::Tensor logits)
      : loss(std::move(loss)), logits(std::move(logits)) {}
};

}  // namespace mantissa
