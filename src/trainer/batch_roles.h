#pragma once
// What the Trainer reads from a batch besides handing it to the model: its labels, its main
// input (for token counts), and the default loss.

#include <string>
#include <vector>

#include <torch/types.h>

#include <mantissa/batch.h>
#include <mantissa/model_output.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// The entries of `batch` that hold labels: `args.label_names` when set, else `labels` when the
/// batch has one, else `target` (an `Example<>` batch), else none. Python: HF's `label_names`,
/// which defaults to the model's label arguments (`["labels"]` for most).
std::vector<std::string> label_names_of(const TrainingArguments& args, const Batch& batch);

/// The first label entry of `batch` (see `label_names_of`); undefined when there is none or
/// the batch lacks it.
torch::Tensor labels_of(const TrainingArguments& args, const Batch& batch);

/// The entry whose elements count as input tokens: `input_ids` when the batch has it (HF's
/// `main_input_name`), else the first entry when it holds integers (token ids of an
/// `Example<>` batch); undefined otherwise (images, features).
torch::Tensor token_ids_of(const Batch& batch);

/// The loss HF's Trainer takes by default: the model's own (`outputs.loss`), else
/// cross-entropy of `outputs.logits` against the labels (mantissa's default for models that
/// return logits). Undefined when the model returned no loss and the batch has no labels (an
/// evaluation of unlabelled data); float labels or missing logits throw `c10::ValueError`
/// saying how to give another loss. No sync.
torch::Tensor default_loss(const TrainingArguments& args, const ModelOutput& outputs,
                           const Batch& batch);

/// `default_loss` for training, where a loss must exist: throws `c10::ValueError` naming the
/// batch's entries and the label names looked for when it is undefined.
torch::Tensor required_default_loss(const TrainingArguments& args, const ModelOutput& outputs,
                                    const Batch& batch);

}  // namespace mantissa::detail
