#include "trainer/batch_roles.h"

#include <c10/util/StringUtil.h>
#include <torch/nn/functional/loss.h>

namespace mantissa::detail {

std::vector<std::string> label_names_of(const TrainingArguments& args, const Batch& batch) {
  if (const auto& names = args.label_names()) return *names;
  for (const char* name : {"labels", "target"}) {
    if (batch.contains(name)) return {name};
  }
  return {};
}

torch::Tensor labels_of(const TrainingArguments& args, const Batch& batch) {
  const auto names = label_names_of(args, batch);
  if (names.empty() || !batch.contains(names.front())) return {};
  return batch.at(names.front());
}

torch::Tensor token_ids_of(const Batch& batch) {
  if (batch.contains("input_ids")) return batch.at("input_ids");
  const auto entries = batch.items();
  if (entries.empty()) return {};
  const auto& first = entries.front().second;
  return c10::isIntegralType(first.scalar_type(), /*includeBool=*/false) ? first : torch::Tensor();
}

torch::Tensor default_loss(const TrainingArguments& args, const ModelOutput& outputs,
                           const Batch& batch) {
  if (outputs.loss.defined()) return outputs.loss;
  const auto labels = labels_of(args, batch);
  if (!labels.defined()) return {};
  TORCH_CHECK_VALUE(outputs.logits.defined(),
                    "the model returned neither a loss nor logits; return a mantissa::ModelOutput "
                    "with one of them from its forward");
  const auto name = label_names_of(args, batch).front();
  TORCH_CHECK_VALUE(
      !c10::isFloatingType(labels.scalar_type()) && !c10::isComplexType(labels.scalar_type()),
      "the default loss is cross-entropy, which takes integer class labels, but the "
      "batch's '",
      name, "' holds ", labels.scalar_type(),
      " values. For another loss (e.g. mse_loss for regression), return it from the "
      "model's forward as ModelOutput(loss, logits), or give "
      "Trainer::set_compute_loss_func / set_compute_loss");
  return torch::nn::functional::cross_entropy(outputs.logits, labels);
}

torch::Tensor required_default_loss(const TrainingArguments& args, const ModelOutput& outputs,
                                    const Batch& batch) {
  auto loss = default_loss(args, outputs, batch);
  if (loss.defined()) return loss;
  const auto looked_for =
      args.label_names() ? c10::Join(", ", *args.label_names()) : std::string("labels or target");
  TORCH_CHECK_VALUE(false,
                    "the model returned no loss, and the batch has no labels to compute one from "
                    "(looked for ",
                    looked_for, "; the batch has ", c10::Join(", ", batch.names()),
                    "). Return ModelOutput(loss, logits) from the model's forward, set "
                    "label_names, or give Trainer::set_compute_loss");
}

}  // namespace mantissa::detail
