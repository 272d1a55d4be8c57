#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <torch/data/example.h>
#include <torch/data/transforms/stack.h>

namespace mantissa {

/// A batch as the Trainer sees it: LibTorch's `Example<>` (`data`, `target`).
using Batch = torch::data::Example<>;

/// The Trainer's view of a dataset: how many examples, and how to gather a batch of them by
/// index. Built from any LibTorch dataset by the Trainer's constructors; build one by hand for
/// data that is not a `torch::data` dataset. Python: what `Trainer` asks of a `Dataset` plus
/// its `DataLoader`'s collate function.
struct BatchSource {
  /// Examples in the dataset.
  std::size_t size = 0;
  /// The batch of the examples at `indices`, on the host (the Trainer moves it to the device).
  std::function<Batch(c10::ArrayRef<std::size_t> indices)> get_batch;
};

/// Builds a `BatchSource` from a `torch::data` dataset: a batch dataset whose `get_batch`
/// returns an `Example<>` (e.g. `dataset.map(Stack<>())`, or a custom `BatchDataset`), or an
/// example dataset whose batches are stacked here. The dataset is moved into the source.
/// Throws `c10::ValueError` for a dataset of unknown size.
template <typename Dataset>
BatchSource make_batch_source(Dataset dataset) {
  auto shared = std::make_shared<Dataset>(std::move(dataset));
  const auto size = shared->size();
  TORCH_CHECK_VALUE(size.has_value(), "the Trainer needs a dataset of known size");
  BatchSource source;
  source.size = *size;
  source.get_batch = [shared](c10::ArrayRef<std::size_t> indices) -> Batch {
    auto batch = shared->get_batch(indices);
    if constexpr (std::is_same_v<decltype(batch), Batch>) {
      return batch;
    } else {
      return torch::data::transforms::Stack<Batch>().apply_batch(std::move(batch));
    }
  };
  return source;
}

}  // namespace mantissa
