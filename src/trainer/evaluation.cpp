#include "trainer/evaluation.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <torch/utils.h>

#include <mantissa/amp/autocast.h>

#include "trainer/batch_roles.h"
#include "trainer/device_batch.h"

namespace mantissa::detail {
namespace {

/// A batch's loss and outputs: the user's function, else the model's forward and the default
/// loss (undefined without labels).
std::pair<torch::Tensor, ModelOutput> loss_and_outputs(const EvaluationParts& parts,
                                                       const Batch& batch, bool need_logits) {
  if (!parts.compute_loss) {
    auto outputs = parts.forward(batch);
    auto loss = default_loss(parts.args, outputs, batch);
    return {std::move(loss), std::move(outputs)};
  }
  auto result = parts.compute_loss(batch);
  // A loss function that returns no outputs: the forward runs again for the predictions.
  if (need_logits && !result.second.logits.defined()) result.second = parts.forward(batch);
  return result;
}

torch::Tensor host_copy(const torch::Tensor& t) {
  auto out = t.detach();
  if (c10::isFloatingType(out.scalar_type())) out = out.to(torch::kFloat);
  return out.cpu();
}

}  // namespace

torch::Tensor concat_padded(const std::vector<torch::Tensor>& tensors, double padding_value) {
  TORCH_CHECK_VALUE(!tensors.empty(), "concat_padded: nothing to concatenate");
  const auto& first = tensors.front();
  bool same = true;
  std::int64_t longest = 0;
  for (const auto& t : tensors) {
    TORCH_CHECK_VALUE(t.dim() == first.dim() && t.dim() >= 1,
                      "the predictions of two evaluation batches have different ranks (",
                      first.sizes(), " and ", t.sizes(), ")");
    for (std::int64_t d = 2; d < t.dim(); ++d) {
      TORCH_CHECK_VALUE(t.size(d) == first.size(d),
                        "the predictions of two evaluation batches differ in dimension ", d, " (",
                        first.sizes(), " and ", t.sizes(), "); only dimension 1 may differ");
    }
    if (t.dim() >= 2) {
      same = same && t.size(1) == first.size(1);
      longest = std::max(longest, t.size(1));
    }
  }
  if (same) return torch::cat(tensors);
  std::vector<torch::Tensor> padded;
  padded.reserve(tensors.size());
  for (const auto& t : tensors) {
    auto shape = t.sizes().vec();
    shape[1] = longest;
    auto out = torch::full(shape, padding_value, t.options());
    out.narrow(1, 0, t.size(1)).copy_(t);
    padded.push_back(std::move(out));
  }
  return torch::cat(padded);
}

EvaluationResult run_evaluation(const EvaluationParts& parts, const BatchSource& dataset,
                                const std::string& prefix, bool during_train,
                                bool keep_predictions) {
  const auto& args = parts.args;
  const auto& device = parts.device;
  auto& module = parts.module;
  TORCH_CHECK_VALUE(dataset.size > 0, "the dataset to evaluate (", prefix, ") is empty");
  TORCH_CHECK_VALUE(dataset.get_batch != nullptr, "the dataset to evaluate (", prefix,
                    ") has no get_batch function");
  const auto start = std::chrono::steady_clock::now();
  const bool full_eval = !during_train && (args.bf16_full_eval() || args.fp16_full_eval());
  // HF casts the model for a full bf16/fp16 evaluation only outside training.
  if (full_eval) module.to(args.bf16_full_eval() ? c10::kBFloat16 : c10::kHalf);
  module.to(device);
  const bool was_training = module.is_training();
  module.eval();
  torch::NoGradGuard no_grad;
  amp::Autocast autocast(device.type(),
                         parts.plan.autocast ? parts.plan.compute_dtype : c10::kBFloat16,
                         parts.plan.autocast && !full_eval);

  const auto n = static_cast<std::int64_t>(dataset.size);
  const auto& strategy = parts.strategy;
  const auto world = strategy.world_size();
  const auto rank = strategy.rank();
  // This process's examples: every world-th from its rank on, as DistributedSampler deals them
  // without shuffling, but without its padding: evaluation needs no collective per batch, so
  // the shares may differ by one, and no repeated example distorts a batch's mean loss.
  TORCH_CHECK_VALUE(n >= world, "the dataset to evaluate (", prefix, ") has ", n,
                    " examples, fewer than the ", world, " processes that share it");
  const auto local_n = (n - rank + world - 1) / world;
  const auto batch_size = args.per_device_eval_batch_size();
  const auto on_device = torch::TensorOptions().device(device);
  auto loss_sum = torch::zeros({}, on_device.dtype(torch::kDouble));
  auto correct = torch::zeros({}, on_device.dtype(torch::kLong));
  double loss_examples = 0;
  std::int64_t steps = 0;
  const bool gather = keep_predictions || static_cast<bool>(parts.compute_metrics);
  bool classification = !parts.compute_loss;
  std::vector<torch::Tensor> predictions;
  std::vector<torch::Tensor> labels_seen;
  for (std::int64_t begin = 0; begin < local_n; begin += batch_size) {
    const auto end = std::min(local_n, begin + batch_size);
    std::vector<std::size_t> indices;
    for (auto i = begin; i < end; ++i)
      indices.push_back(static_cast<std::size_t>(rank + i * world));
    const auto batch = to_device(dataset.get_batch(indices), device, args.dataloader_pin_memory());
    ++steps;
    const auto [loss, outputs] = loss_and_outputs(parts, batch, gather);
    const auto labels = labels_of(args, batch);
    const auto& logits = outputs.logits;
    const auto count = static_cast<double>(indices.size());
    if (loss.defined()) {
      loss_sum += loss.detach().to(torch::kDouble) * count;
      loss_examples += count;
    }
    if (classification && logits.defined() && logits.dim() == 2 && labels.defined() &&
        labels.dim() == 1 && !c10::isFloatingType(labels.scalar_type())) {
      correct += logits.argmax(1).eq(labels).sum();
    } else {
      classification = false;
    }
    if (gather) {
      TORCH_CHECK_VALUE(logits.defined(),
                        "the model returned no logits, which compute_metrics and predict() need; "
                        "return ModelOutput(loss, logits) from its forward");
      const auto kept = parts.preprocess_logits ? parts.preprocess_logits(logits, labels) : logits;
      predictions.push_back(host_copy(kept));
      if (labels.defined()) labels_seen.push_back(labels.detach().cpu());
    }
  }
  EvaluationResult result;
  auto& metrics = result.metrics;
  double loss_total = loss_examples > 0 ? loss_sum.item<double>() : 0.0;
  double correct_total = static_cast<double>(correct.item<std::int64_t>());
  {
    // Every process must learn the same answers, including whether all could classify.
    const auto sums =
        strategy.sum({loss_total, loss_examples, correct_total, classification ? 0.0 : 1.0});
    loss_total = sums[0];
    loss_examples = sums[1];
    correct_total = sums[2];
    classification = sums[3] == 0.0;
  }
  if (loss_examples > 0) metrics[prefix + "_loss"] = loss_total / loss_examples;
  if (classification) metrics[prefix + "_accuracy"] = correct_total / static_cast<double>(n);
  if (gather) {
    result.predictions = concat_padded(predictions, -100);
    // Labels count only when every batch had them.
    const bool have_labels = !labels_seen.empty() && labels_seen.size() == predictions.size();
    if (have_labels) result.label_ids = concat_padded(labels_seen, -100);
    result.predictions = strategy.gather_rows(result.predictions, n, -100);
    if (strategy.all_ok(have_labels)) {
      result.label_ids = strategy.gather_rows(result.label_ids, n, -100);
    } else {
      result.label_ids = torch::Tensor();
    }
  }
  if (parts.compute_metrics) {
    const auto user_metrics = parts.compute_metrics(result.predictions, result.label_ids);
    for (const auto& [key, value] : user_metrics) {
      metrics[key.rfind(prefix + "_", 0) == 0 ? key : prefix + "_" + key] = value;
    }
  }
  const double runtime =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics[prefix + "_runtime"] = runtime;
  metrics[prefix + "_samples_per_second"] = runtime > 0 ? static_cast<double>(n) / runtime : 0.0;
  metrics[prefix + "_steps_per_second"] = runtime > 0 ? static_cast<double>(steps) / runtime : 0.0;
  if (was_training) module.train();
  if (!keep_predictions) {
    result.predictions = torch::Tensor();
    result.label_ids = torch::Tensor();
  }
  return result;
}

}  // namespace mantissa::detail
