#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/data/example.h>
#include <torch/types.h>

namespace mantissa {

/// A batch as the Trainer sees it: tensors by name, all with the examples along dimension 0.
/// Python: the dict a `DataLoader` with a collator yields (`input_ids`, `attention_mask`,
/// `labels`, `pixel_values`, ... any names), which HF's Trainer passes as `model(**batch)`.
///
///     mantissa::Batch batch{{"input_ids", ids}, {"attention_mask", mask}, {"labels", labels}};
///     batch["input_ids"];                  // throws, naming the entries, when absent
///     mantissa::Batch pair(images, targets);   // LibTorch's Example<>: entries data and target
///
/// LibTorch's `torch::data::Example<>` converts to a batch whose entries are `data` and
/// `target`; those two entries are kept in the public members of the same names, so code
/// written for `Example<>` (`batch.data`, `batch.target`) reads them unchanged. Every other
/// entry is kept in the order it was added. Entries are ordered `data`, `target`, then the
/// rest: a model whose forward takes N tensors receives the first N. Host object; the tensors
/// may live on any device. Copying copies tensor handles, not data.
class Batch {
 public:
  /// The entry named `data`; undefined when the batch has none.
  torch::Tensor data;
  /// The entry named `target`; undefined when the batch has none.
  torch::Tensor target;

  Batch() = default;
  /// The entries `data` and `target`, as LibTorch's `Example<>`.
  Batch(torch::Tensor data, torch::Tensor target)
      : data(std::move(data)), target(std::move(target)) {}
  /// LibTorch's `Example<>`: its `data` and `target`.
  Batch(torch::data::Example<> example)  // NOLINT(google-explicit-constructor): as Example<>
      : data(std::move(example.data)), target(std::move(example.target)) {}
  /// Named entries in order: `Batch{{"input_ids", ids}, {"labels", labels}}`. A name given twice
  /// throws `c10::ValueError`.
  Batch(std::initializer_list<std::pair<std::string, torch::Tensor>> entries) {
    for (const auto& [name, tensor] : entries) add(name, tensor);
  }

  /// Whether the batch has a (defined) entry `name`. Python: `name in batch`.
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  /// The entry `name`. Python: `batch[name]`. Throws `c10::ValueError` naming the entries the
  /// batch has when there is none.
  const torch::Tensor& at(std::string_view name) const {
    const torch::Tensor* tensor = find(name);
    TORCH_CHECK_VALUE(tensor != nullptr, "the batch has no tensor named '", name, "'; it has ",
                      describe_names());
    return *tensor;
  }
  /// The same as `at(name)`.
  const torch::Tensor& operator[](std::string_view name) const { return at(name); }

  /// Sets entry `name` (replacing one of that name, else appending). Python: `batch[name] = t`.
  Batch& set(const std::string& name, torch::Tensor tensor) {
    if (name == "data") {
      data = std::move(tensor);
    } else if (name == "target") {
      target = std::move(tensor);
    } else if (auto* slot = find_other(name)) {
      *slot = std::move(tensor);
    } else {
      others_.emplace_back(name, std::move(tensor));
    }
    return *this;
  }
  /// Appends entry `name`; throws `c10::ValueError` when the batch has one already.
  Batch& add(const std::string& name, torch::Tensor tensor) {
    TORCH_CHECK_VALUE(!contains(name), "the batch already has a tensor named '", name, "'");
    return set(name, std::move(tensor));
  }

  /// The names of the defined entries, in order. Python: `list(batch.keys())`.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for_each([&](const std::string& name, const torch::Tensor&) { out.push_back(name); });
    return out;
  }
  /// The defined entries, in order. Python: `list(batch.items())`.
  std::vector<std::pair<std::string, torch::Tensor>> items() const {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for_each([&](const std::string& name, const torch::Tensor& t) { out.emplace_back(name, t); });
    return out;
  }
  /// How many entries are defined.
  std::size_t size() const { return names().size(); }
  bool empty() const { return size() == 0; }
  /// Examples in the batch: dimension 0 of its first entry (0 for an empty batch or a scalar).
  std::int64_t num_examples() const {
    const auto entries = items();
    if (entries.empty()) return 0;
    const auto& first = entries.front().second;
    return first.dim() > 0 ? first.size(0) : 0;
  }

  /// A batch with `fn(tensor)` in place of each entry, under the same names (to move a batch to
  /// a device, or clone it).
  template <typename Fn>
  Batch map(Fn&& fn) const {
    Batch out;
    for_each([&](const std::string& name, const torch::Tensor& t) { out.set(name, fn(t)); });
    return out;
  }

  /// Calls `fn(name, tensor)` for each defined entry, in order.
  template <typename Fn>
  void for_each(Fn&& fn) const {
    if (data.defined()) fn(std::string("data"), data);
    if (target.defined()) fn(std::string("target"), target);
    for (const auto& [name, tensor] : others_) {
      if (tensor.defined()) fn(name, tensor);
    }
  }

 private:
  const torch::Tensor* find(std::string_view name) const {
    const torch::Tensor* t = nullptr;
    if (name == "data") {
      t = &data;
    } else if (name == "target") {
      t = &target;
    } else {
      for (const auto& entry : others_) {
        if (entry.first == name) t = &entry.second;
      }
    }
    return t != nullptr && t->defined() ? t : nullptr;
  }
  torch::Tensor* find_other(std::string_view name) {
    for (auto& entry : others_) {
      if (entry.first == name) return &entry.second;
    }
    return nullptr;
  }
  std::string describe_names() const {
    const auto all = names();
    return all.empty() ? std::string("none") : c10::Join(", ", all);
  }

  std::vector<std::pair<std::string, torch::Tensor>> others_;
};

/// Stacks examples into one batch: each entry is `torch::stack` of that entry over the
/// examples, which must all have the same names and, per name, the same shape. Python:
/// `transformers.default_data_collator` (for tensors). Throws `c10::ValueError` for no examples
/// or examples with different names; a shape mismatch is LibTorch's error from `stack`.
inline Batch stack_examples(const std::vector<Batch>& examples) {
  TORCH_CHECK_VALUE(!examples.empty(), "stack_examples: no examples to stack");
  const auto names = examples.front().names();
  Batch out;
  for (const auto& name : names) {
    std::vector<torch::Tensor> column;
    column.reserve(examples.size());
    for (const auto& example : examples) column.push_back(example.at(name));
    out.set(name, torch::stack(column));
  }
  for (std::size_t i = 1; i < examples.size(); ++i) {
    TORCH_CHECK_VALUE(examples[i].names() == names, "stack_examples: example ", i,
                      " has other tensors than example 0");
  }
  return out;
}

/// Stacks LibTorch examples (`data`, `target`), as `torch::data::transforms::Stack<>`.
inline Batch stack_examples(const std::vector<torch::data::Example<>>& examples) {
  std::vector<Batch> batches(examples.begin(), examples.end());
  return stack_examples(batches);
}

/// The Trainer's view of a dataset: how many examples, and how to gather a batch of them by
/// index. Built from any LibTorch dataset by the Trainer's constructors (or by
/// `make_batch_source`, to give a collator); build one by hand for data that is not a
/// `torch::data` dataset. Python: what `Trainer` asks of a `Dataset` plus its `DataLoader`'s
/// collate function (`data_collator`).
struct BatchSource {
  /// Examples in the dataset.
  std::size_t size = 0;
  /// The batch of the examples at `indices`, on the host (the Trainer moves it to the device).
  std::function<Batch(c10::ArrayRef<std::size_t> indices)> get_batch;
};

namespace detail {
template <typename T>
constexpr bool is_batch_like_v =
    std::is_same_v<T, Batch> || std::is_same_v<T, torch::data::Example<>>;
template <typename T>
constexpr bool is_example_list_v = false;
template <typename T>
constexpr bool is_example_list_v<std::vector<T>> = is_batch_like_v<T>;

template <typename Dataset>
std::size_t known_size(const Dataset& dataset) {
  const auto size = dataset.size();
  TORCH_CHECK_VALUE(size.has_value(), "the Trainer needs a dataset of known size");
  return *size;
}
}  // namespace detail

/// A `BatchSource` as it is: what the Trainer's constructors take, so that they accept one too.
inline BatchSource make_batch_source(BatchSource source) { return source; }

/// Builds a `BatchSource` from a `torch::data` dataset: a batch dataset whose `get_batch`
/// returns a `Batch` or an `Example<>` (e.g. `dataset.map(Stack<>())`, or a custom
/// `BatchDataset`), or an example dataset whose `get` returns a `Batch` (one example's named
/// tensors) or an `Example<>`; its examples are stacked by `stack_examples`. The dataset is
/// moved into the source. Throws `c10::ValueError` for a dataset of unknown size.
template <typename Dataset>
BatchSource make_batch_source(Dataset dataset) {
  auto shared = std::make_shared<Dataset>(std::move(dataset));
  BatchSource source;
  source.size = detail::known_size(*shared);
  source.get_batch = [shared](c10::ArrayRef<std::size_t> indices) -> Batch {
    auto batch = shared->get_batch(indices);
    using Got = decltype(batch);
    static_assert(detail::is_batch_like_v<Got> || detail::is_example_list_v<Got>,
                  "the dataset's get_batch must return a mantissa::Batch, a "
                  "torch::data::Example<>, or a std::vector of either (give a collator to "
                  "make_batch_source for other example types)");
    if constexpr (detail::is_batch_like_v<Got>) {
      return Batch(std::move(batch));
    } else {
      return stack_examples(batch);
    }
  };
  return source;
}

/// Builds a `BatchSource` whose batches are `collate(dataset.get_batch(indices))`: the
/// dataset's examples (of any type) turned into a `Batch` by the caller's function (to pad
/// sequences, build attention masks, tokenize). Python: `Trainer(data_collator=collate)`.
template <typename Dataset, typename Collate>
BatchSource make_batch_source(Dataset dataset, Collate collate) {
  auto shared = std::make_shared<Dataset>(std::move(dataset));
  BatchSource source;
  source.size = detail::known_size(*shared);
  source.get_batch = [shared,
                      collate = std::move(collate)](c10::ArrayRef<std::size_t> indices) -> Batch {
    return collate(shared->get_batch(indices));
  };
  return source;
}

}  // namespace mantissa
