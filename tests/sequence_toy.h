#pragma once
// A two-input toy for the Trainer: padded token sequences with an attention mask, classified
// by a model whose forward takes (input_ids, attention_mask, labels) by name and returns its
// own loss, as a Hugging Face sequence-classification model does.

#include <algorithm>
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include <mantissa/batch.h>
#include <mantissa/model_output.h>

namespace mantissa_test {

/// One sequence of token ids (1..vocab-1; 0 is padding) and its class: whether token 1 occurs
/// more often than token 2.
struct Sequence {
  std::vector<std::int64_t> ids;
  std::int64_t label = 0;
};

/// `n` sequences of length 2..12, fixed by `seed`.
class SequenceDataset : public torch::data::datasets::Dataset<SequenceDataset, Sequence> {
 public:
  explicit SequenceDataset(std::int64_t n, std::uint64_t seed = 0, std::int64_t vocab = 6) {
    auto gen = at::detail::createCPUGenerator(seed);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto length = torch::randint(2, 13, {1}, gen).item<std::int64_t>();
      const auto ids = torch::randint(1, vocab, {length}, gen);
      Sequence s;
      s.ids.assign(ids.data_ptr<std::int64_t>(), ids.data_ptr<std::int64_t>() + length);
      const auto ones = std::count(s.ids.begin(), s.ids.end(), 1);
      const auto twos = std::count(s.ids.begin(), s.ids.end(), 2);
      s.label = ones > twos ? 1 : 0;
      sequences_.push_back(std::move(s));
    }
  }
  Sequence get(size_t index) override { return sequences_.at(index); }
  torch::optional<size_t> size() const override { return sequences_.size(); }

 private:
  std::vector<Sequence> sequences_;
};

/// HF's DataCollatorWithPadding: pads `input_ids` with 0 to the longest sequence of the batch
/// (at least `min_length`), `attention_mask` 1 on real tokens, `labels` the classes.
inline mantissa::Batch pad_sequences(const std::vector<Sequence>& batch,
                                     std::int64_t min_length = 0) {
  std::int64_t longest = min_length;
  for (const auto& s : batch) longest = std::max<std::int64_t>(longest, s.ids.size());
  const auto n = static_cast<std::int64_t>(batch.size());
  auto ids = torch::zeros({n, longest}, torch::kLong);
  auto mask = torch::zeros({n, longest}, torch::kLong);
  auto labels = torch::empty({n}, torch::kLong);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& s = batch[static_cast<size_t>(i)];
    const auto length = static_cast<std::int64_t>(s.ids.size());
    ids[i].narrow(0, 0, length).copy_(torch::tensor(s.ids, torch::kLong));
    mask[i].narrow(0, 0, length).fill_(1);
    labels[i] = s.label;
  }
  return {{"input_ids", ids}, {"attention_mask", mask}, {"labels", labels}};
}

/// Embedding, mean over the unmasked positions, linear to 2 classes. Its forward reads the batch
/// by name and returns the cross-entropy against `labels` when the batch has them.
struct SequenceClassifierImpl : torch::nn::Module {
  explicit SequenceClassifierImpl(std::int64_t vocab = 6)
      : embed(register_module("embed", torch::nn::Embedding(vocab, 16))),
        head(register_module("head", torch::nn::Linear(16, 2))) {}

  mantissa::ModelOutput forward(const mantissa::Batch& batch) {
    ++forward_calls;
    const auto mask = batch["attention_mask"].unsqueeze(-1).to(embed->weight.dtype());
    const auto summed = (embed(batch["input_ids"]) * mask).sum(1);
    const auto logits = head(summed / mask.sum(1).clamp_min(1));
    if (!batch.contains("labels")) return logits;
    return {torch::nn::functional::cross_entropy(logits, batch["labels"]), logits};
  }

  torch::nn::Embedding embed;
  torch::nn::Linear head;
  std::int64_t forward_calls = 0;
};
TORCH_MODULE(SequenceClassifier);

/// The same model with a positional forward (input_ids, attention_mask) returning logits only.
struct PositionalClassifierImpl : torch::nn::Module {
  PositionalClassifierImpl()
      : embed(register_module("embed", torch::nn::Embedding(6, 16))),
        head(register_module("head", torch::nn::Linear(16, 2))) {}

  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
    const auto mask = attention_mask.unsqueeze(-1).to(embed->weight.dtype());
    return head((embed(input_ids) * mask).sum(1) / mask.sum(1).clamp_min(1));
  }

  torch::nn::Embedding embed;
  torch::nn::Linear head;
};
TORCH_MODULE(PositionalClassifier);

}  // namespace mantissa_test
