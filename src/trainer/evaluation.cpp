#include "trainer/evaluation.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <torch/utils.h>

#include <mantissa/amp/autocast.h>

#include "trainer/batch_roles.h"
#include "trainer/device_batch.h"
#include "trainer/eval_mode_guard.h"

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

/// The metrics of the combined totals and rows, the user's among them (prefixed), and the
/// speeds. Python: the end of HF's `evaluation_loop`.
EvaluationResult finish_evaluation(const EvaluationParts& parts, const EvaluationTotals& totals,
                                   EvaluationRows rows, const EvaluationShard& shard,
                                   std::int64_t steps, const std::string& prefix,
                                   std::chrono::steady_clock::time_point start) {
  EvaluationResult result;
  auto& metrics = result.metrics;
  const auto n = static_cast<double>(shard.num_examples);
  if (totals.loss_examples > 0) metrics[prefix + "_loss"] = totals.loss_sum / totals.loss_examples;
  if (totals.classification) metrics[prefix + "_accuracy"] = totals.correct / n;
  result.predictions = std::move(rows.predictions);
  result.label_ids = std::move(rows.label_ids);
  if (parts.compute_metrics) {
    const auto user_metrics = parts.compute_metrics(result.predictions, result.label_ids);
    for (const auto& [key, value] : user_metrics) {
      const auto name = key.rfind(prefix + "_", 0) == 0 ? key : prefix + "_" + key;
      // As in HF, the user's value wins; saying so once keeps a silent replacement visible.
      if (metrics.count(name) != 0 && parts.warned_replacements.insert(name).second &&
          parts.strategy.is_main_process()) {
        TORCH_WARN("compute_metrics returned '", key, "', which replaces the built-in ", name,
                   " with its own value (as in HF's Trainer); return another name to keep both. "
                   "(Said once.)");
      }
      metrics[name] = value;
    }
  }
  const double runtime =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics[prefix + "_runtime"] = runtime;
  metrics[prefix + "_samples_per_second"] = runtime > 0 ? n / runtime : 0.0;
  metrics[prefix + "_steps_per_second"] = runtime > 0 ? static_cast<double>(steps) / runtime : 0.0;
  return result;
}

}  // namespace

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
  const EvalModeGuard eval_mode(module);
  torch::NoGradGuard no_grad;
  amp::Autocast autocast(device.type(),
                         parts.plan.autocast ? parts.plan.compute_dtype : c10::kBFloat16,
                         parts.plan.autocast && !full_eval);

  const auto shard =
      evaluation_shard(static_cast<std::int64_t>(dataset.size), parts.strategy, prefix);
  const auto local_n = shard.size();
  const auto batch_size = args.per_device_eval_batch_size();
  EvaluationAccumulator accumulator(
      device, keep_predictions || static_cast<bool>(parts.compute_metrics),
      /*classification=*/!parts.compute_loss, parts.preprocess_logits);
  for (std::int64_t begin = 0; begin < local_n; begin += batch_size) {
    const auto indices = shard.indices(begin, std::min(local_n, begin + batch_size));
    const auto batch = to_device(dataset.get_batch(indices), device, args.dataloader_pin_memory());
    const auto scope = parts.strategy.forward_context({/*training=*/false, /*sync=*/false});
    const auto [loss, outputs] = loss_and_outputs(parts, batch, accumulator.keeps_rows());
    accumulator.add(loss, outputs.logits, labels_of(args, batch), indices.size());
  }
  auto totals = accumulator.totals();
  auto rows = accumulator.rows();
  combine_processes(parts.strategy, shard.num_examples, totals, rows);
  auto result =
      finish_evaluation(parts, totals, std::move(rows), shard, accumulator.steps(), prefix, start);
  if (!keep_predictions) {
    result.predictions = torch::Tensor();
    result.label_ids = torch::Tensor();
  }
  return result;
}

}  // namespace mantissa::detail
