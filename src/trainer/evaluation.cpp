#include "trainer/evaluation.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <mantissa/amp/autocast.h>

#include "trainer/device_batch.h"

namespace mantissa::detail {

LogEntry run_evaluation(const EvaluationParts& parts, bool during_train) {
  const auto& args = parts.args;
  const auto& device = parts.device;
  auto& module = parts.module;
  TORCH_CHECK_VALUE(parts.eval.has_value(), "Trainer: evaluation requires an eval_dataset");
  const auto& eval = *parts.eval;
  TORCH_CHECK_VALUE(eval.size > 0, "the evaluation dataset is empty");
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

  const auto n = static_cast<std::int64_t>(eval.size);
  const auto batch_size = args.per_device_eval_batch_size();
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto& compute_loss = parts.compute_loss;
  const auto& compute_metrics = parts.compute_metrics;
  bool classification = !compute_loss;
  std::vector<torch::Tensor> predictions;
  std::vector<torch::Tensor> targets;
  for (std::int64_t begin = 0; begin < n; begin += batch_size) {
    std::vector<std::size_t> indices;
    for (auto i = begin; i < std::min(n, begin + batch_size); ++i) {
      indices.push_back(static_cast<std::size_t>(i));
    }
    const auto batch = to_device(eval.get_batch(indices), device, args.dataloader_pin_memory());
    torch::Tensor loss;
    torch::Tensor logits;
    if (compute_loss) {
      loss = compute_loss(batch);
      if (compute_metrics) logits = parts.forward(batch.data);
    } else {
      logits = parts.forward(batch.data);
      loss = torch::nn::functional::cross_entropy(logits, batch.target);
    }
    const auto count = static_cast<double>(indices.size());
    loss_sum += loss.detach().to(torch::kDouble) * count;
    if (classification && logits.dim() == 2 && batch.target.dim() == 1 &&
        !c10::isFloatingType(batch.target.scalar_type())) {
      correct += logits.argmax(1).eq(batch.target).sum();
    } else {
      classification = false;
    }
    if (compute_metrics) {
      predictions.push_back(logits.detach().to(torch::kFloat).cpu());
      targets.push_back(batch.target.cpu());
    }
  }
  LogEntry metrics{{"eval_loss", loss_sum.item<double>() / static_cast<double>(n)}};
  if (classification) {
    metrics["eval_accuracy"] =
        static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(n);
  }
  if (compute_metrics) {
    for (const auto& [key, value] : compute_metrics(torch::cat(predictions), torch::cat(targets))) {
      metrics[key.rfind("eval_", 0) == 0 ? key : "eval_" + key] = value;
    }
  }
  const double runtime =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics["eval_runtime"] = runtime;
  metrics["eval_samples_per_second"] = runtime > 0 ? static_cast<double>(n) / runtime : 0.0;
  if (was_training) module.train();
  return metrics;
}

}  // namespace mantissa::detail
