#pragma once
// The pieces of one evaluation: which examples this process evaluates, what it adds up batch by
// batch, and how the processes' sums and rows become one result.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <torch/types.h>

#include <mantissa/trainer_hooks.h>

#include "trainer/strategy.h"

namespace mantissa::detail {

/// The examples one process evaluates: every `world_size`-th of the dataset from its `rank` on,
/// as `DistributedSampler` deals them without shuffling, but without its padding (evaluation
/// needs no collective per batch, so the shares may differ by one, and no repeated example
/// distorts a batch's mean loss).
struct EvaluationShard {
  /// The examples of the whole dataset.
  std::int64_t num_examples = 0;
  /// This process's rank and the number of processes (0 and 1 alone).
  std::int64_t rank = 0;
  std::int64_t world_size = 1;

  /// How many examples this process evaluates.
  std::int64_t size() const { return (num_examples - rank + world_size - 1) / world_size; }
  /// The dataset indices of this process's examples `begin` to `end` (exclusive), counted in
  /// its own share. No device sync.
  std::vector<std::size_t> indices(std::int64_t begin, std::int64_t end) const;
};

/// The share of this process in a dataset of `num_examples` examples: all of them without
/// one process. Throws a c10::ValueError naming `prefix` when there are fewer examples
/// than processes. No device sync.
EvaluationShard evaluation_shard(std::int64_t num_examples, const Strategy& strategy,
                                 const std::string& prefix);

/// One process's sums, read back from the device: what `finish` adds over the processes.
struct EvaluationTotals {
  /// The sum of each batch's loss times its number of examples, and that number's sum.
  double loss_sum = 0;
  double loss_examples = 0;
  /// The examples whose argmax matched the label.
  double correct = 0;
  /// Every batch looked like classification (2-d logits, 1-d integer labels, default loss).
  bool classification = true;
  /// Every batch had labels (only meaningful when rows were kept).
  bool have_labels = false;
};

/// The kept logits and labels, concatenated (padded with -100) on the CPU.
struct EvaluationRows {
  /// Undefined unless rows are kept.
  torch::Tensor predictions;
  /// Undefined unless every batch had labels.
  torch::Tensor label_ids;
};

/// Adds up the batches of one evaluation on this process: the example-weighted loss and the
/// correct predictions on the device (no sync per batch), and, when rows are kept, each batch's
/// (preprocessed) logits and labels on the CPU. Python: the per-step part of HF's
/// `evaluation_loop`.
class EvaluationAccumulator {
 public:
  /// `keep_rows`: keep the logits and labels (for `compute_metrics` or `predict`).
  /// `classification`: whether accuracy may be counted (false with a user's loss).
  /// `preprocess_logits`: applied to each batch's logits before they are kept; may be empty.
  EvaluationAccumulator(c10::Device device, bool keep_rows, bool classification,
                        const PreprocessLogitsFn& preprocess_logits);

  /// Adds one batch of `count` examples. `loss` and `labels` may be undefined; `logits` may be
  /// too unless rows are kept (a c10::ValueError then). Copies kept rows to the host (syncs
  /// only then).
  void add(const torch::Tensor& loss, const torch::Tensor& logits, const torch::Tensor& labels,
           std::size_t count);

  /// Whether the logits and labels are kept (the forward must then return logits).
  bool keeps_rows() const { return keep_rows_; }
  /// The number of batches added.
  std::int64_t steps() const { return steps_; }
  /// This process's sums. Syncs.
  EvaluationTotals totals() const;
  /// This process's kept rows, concatenated; both undefined unless rows are kept. No device
  /// sync (the rows are on the host).
  EvaluationRows rows() const;

 private:
  bool keep_rows_;
  bool classification_;
  PreprocessLogitsFn preprocess_logits_;
  torch::Tensor loss_sum_;
  torch::Tensor correct_;
  double loss_examples_ = 0;
  std::int64_t steps_ = 0;
  std::vector<torch::Tensor> predictions_;
  std::vector<torch::Tensor> labels_;
};

/// Turns the processes' totals and rows into those of one process that evaluated the whole
/// set: sums the totals (so that every process learns the same answers, the classification and
/// label flags included) and gathers the rows back into the dataset's order. Alone
/// it changes nothing. Python: accelerate's `gather_for_metrics`.
/// Syncs (collectives).
void combine_processes(const Strategy& strategy, std::int64_t num_examples,
                       EvaluationTotals& totals, EvaluationRows& rows);

/// Concatenates per-batch tensors along dimension 0; when their dimension 1 differs (sequences
/// of different lengths) each is first padded there with `padding_value`. Python: HF's
/// `nested_concat(..., padding_index=-100)`. Throws `c10::ValueError` when the tensors differ
/// in another dimension or in rank. No device sync.
torch::Tensor concat_padded(const std::vector<torch::Tensor>& tensors, double padding_value);

}  // namespace mantissa::detail
