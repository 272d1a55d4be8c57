#include "trainer/evaluation_accumulator.h"

#include <algorithm>
#include <utility>

namespace mantissa::detail {
namespace {

torch::Tensor host_copy(const torch::Tensor& t) {
  auto out = t.detach();
  if (c10::isFloatingType(out.scalar_type())) out = out.to(torch::kFloat);
  return out.cpu();
}

}  // namespace

std::vector<std::size_t> EvaluationShard::indices(std::int64_t begin, std::int64_t end) const {
  std::vector<std::size_t> out;
  for (auto i = begin; i < end; ++i) out.push_back(static_cast<std::size_t>(rank + i * world_size));
  return out;
}

EvaluationShard evaluation_shard(std::int64_t num_examples, const Strategy& strategy,
                                 const std::string& prefix) {
  EvaluationShard shard;
  shard.num_examples = num_examples;
  shard.rank = strategy.rank();
  shard.world_size = strategy.world_size();
  TORCH_CHECK_VALUE(num_examples >= shard.world_size, "the dataset to evaluate (", prefix, ") has ",
                    num_examples, " examples, fewer than the ", shard.world_size,
                    " processes that share it");
  return shard;
}

EvaluationAccumulator::EvaluationAccumulator(c10::Device device, bool keep_rows,
                                             bool classification,
                                             const PreprocessLogitsFn& preprocess_logits)
    : keep_rows_(keep_rows),
      classification_(classification),
      preprocess_logits_(preprocess_logits) {
  const auto on_device = torch::TensorOptions().device(device);
  loss_sum_ = torch::zeros({}, on_device.dtype(torch::kDouble));
  correct_ = torch::zeros({}, on_device.dtype(torch::kLong));
}

void EvaluationAccumulator::add(const torch::Tensor& loss, const torch::Tensor& logits,
                                const torch::Tensor& labels, std::size_t count) {
  ++steps_;
  const auto examples = static_cast<double>(count);
  if (loss.defined()) {
    loss_sum_ += loss.detach().to(torch::kDouble) * examples;
    loss_examples_ += examples;
  }
  if (classification_ && logits.defined() && logits.dim() == 2 && labels.defined() &&
      labels.dim() == 1 && !c10::isFloatingType(labels.scalar_type())) {
    correct_ += logits.argmax(1).eq(labels).sum();
  } else {
    classification_ = false;
  }
  if (!keep_rows_) return;
  TORCH_CHECK_VALUE(logits.defined(),
                    "the model returned no logits, which compute_metrics and predict() need; "
                    "return ModelOutput(loss, logits) from its forward");
  const auto kept = preprocess_logits_ ? preprocess_logits_(logits, labels) : logits;
  predictions_.push_back(host_copy(kept));
  if (labels.defined()) labels_.push_back(labels.detach().cpu());
}

EvaluationTotals EvaluationAccumulator::totals() const {
  EvaluationTotals totals;
  totals.loss_sum = loss_examples_ > 0 ? loss_sum_.item<double>() : 0.0;
  totals.loss_examples = loss_examples_;
  totals.correct = static_cast<double>(correct_.item<std::int64_t>());
  totals.classification = classification_;
  // Labels count only when every batch had them.
  totals.have_labels = keep_rows_ && !labels_.empty() && labels_.size() == predictions_.size();
  return totals;
}

EvaluationRows EvaluationAccumulator::rows() const {
  EvaluationRows rows;
  if (!keep_rows_) return rows;
  rows.predictions = concat_padded(predictions_, -100);
  if (!labels_.empty() && labels_.size() == predictions_.size()) {
    rows.label_ids = concat_padded(labels_, -100);
  }
  return rows;
}

void combine_processes(const Strategy& strategy, std::int64_t num_examples,
                       EvaluationTotals& totals, EvaluationRows& rows) {
  // A flag is summed as 0 where it holds and 1 where not: it holds everywhere when the sum is 0.
  const auto sums =
      strategy.sum({totals.loss_sum, totals.loss_examples, totals.correct,
                    totals.classification ? 0.0 : 1.0, totals.have_labels ? 0.0 : 1.0});
  totals.loss_sum = sums[0];
  totals.loss_examples = sums[1];
  totals.correct = sums[2];
  totals.classification = sums[3] == 0.0;
  totals.have_labels = sums[4] == 0.0;
  if (!rows.predictions.defined()) return;
  rows.predictions = strategy.gather_rows(rows.predictions, num_examples, -100);
  rows.label_ids = totals.have_labels ? strategy.gather_rows(rows.label_ids, num_examples, -100)
                                      : torch::Tensor();
}

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

}  // namespace mantissa::detail
