#pragma once
// How the Trainer calls a model: its forward pass on a Batch, type-erased.

#include <cstddef>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/types.h>

#include <mantissa/batch.h>
#include <mantissa/model_output.h>

namespace mantissa {

/// The model's forward pass on one batch, type-erased. Python: `model(**batch)`.
using ForwardFn = std::function<ModelOutput(const Batch& batch)>;

namespace detail {

template <typename Model, typename Args, typename = void>
struct forward_takes : std::false_type {};
template <typename Model, typename... Args>
struct forward_takes<
    Model, std::tuple<Args...>,
    std::void_t<decltype(std::declval<Model&>()->forward(std::declval<Args>()...))>>
    : std::true_type {};

/// An argument no real forward takes: a forward that accepts it is a catch-all template
/// (`torch::nn::Sequential`'s), which is called with tensors.
struct NotAModelInput {};

template <typename Model>
constexpr bool forward_takes_batch_v =
    forward_takes<Model, std::tuple<const Batch&>>::value &&
    !forward_takes<Model, std::tuple<const NotAModelInput&>>::value;

template <std::size_t>
using TensorArg = const torch::Tensor&;

template <typename Model, std::size_t... I>
constexpr bool forward_takes_tensors(std::index_sequence<I...> /*unused*/) {
  return forward_takes<Model, std::tuple<TensorArg<I>...>>::value;
}

/// The smallest N in 1..6 for which `model->forward` takes N tensors; 0 when there is none.
template <typename Model, std::size_t N = 1>
constexpr std::size_t forward_tensor_count() {
  if constexpr (N > 6) {
    return 0;
  } else if constexpr (forward_takes_tensors<Model>(std::make_index_sequence<N>{})) {
    return N;
  } else {
    return forward_tensor_count<Model, N + 1>();
  }
}

template <typename Result>
ModelOutput to_model_output(Result&& result) {
  static_assert(std::is_convertible_v<Result, ModelOutput>,
                "the model's forward must return a torch::Tensor (logits) or a "
                "mantissa::ModelOutput (loss and logits), or a type that converts to one");
  return ModelOutput(std::forward<Result>(result));
}

template <typename Model, std::size_t... I>
ModelOutput forward_entries(Model& model, const Batch& batch,
                            std::index_sequence<I...> /*unused*/) {
  const auto entries = batch.items();
  constexpr std::size_t kCount = sizeof...(I);
  if (entries.size() < kCount) {
    const auto names = batch.names();
    TORCH_CHECK_VALUE(false, "the model's forward takes ", kCount, " tensors, but the batch has ",
                      entries.size(), " (",
                      names.empty() ? std::string("none") : c10::Join(", ", names),
                      "); give it a forward(const mantissa::Batch&) to choose its inputs by name");
  }
  return to_model_output(model->forward(entries[I].second...));
}

}  // namespace detail

/// The `ForwardFn` of a LibTorch model (a module holder such as `torch::nn::Linear`, or a
/// `std::shared_ptr` to a module), chosen by what its `forward` takes:
///
/// - `forward(const mantissa::Batch&)`: the whole batch, entries by name (HF's
///   `model(**batch)`);
/// - `forward(Tensor)`, `forward(Tensor, Tensor)`, ... up to six tensors: the batch's first
///   entries, in the batch's order (`data` and `target` first for an `Example<>` batch; for a
///   named batch, the order its entries were added, e.g. `input_ids, attention_mask, labels`).
///   A forward that is a template taking anything (`torch::nn::Sequential`) gets one tensor.
///
/// The forward returns logits (a tensor) or a `ModelOutput` with the model's own loss. A
/// forward of another shape fails to compile with a message that says what is accepted.
/// The model is held by the returned function (a shared handle). No sync.
template <typename Model>
ForwardFn make_forward(Model model) {
  if constexpr (detail::forward_takes_batch_v<Model>) {
    return [model](const Batch& batch) mutable {
      return detail::to_model_output(model->forward(batch));
    };
  } else {
    constexpr std::size_t kTensors = detail::forward_tensor_count<Model>();
    static_assert(kTensors > 0,
                  "the model's forward must take a const mantissa::Batch& or one to six "
                  "torch::Tensor arguments");
    return [model](const Batch& batch) mutable {
      return detail::forward_entries(model, batch, std::make_index_sequence<kTensors>{});
    };
  }
}

/// The `ForwardFn` of a function from one tensor to logits: it receives the batch's first
/// entry (`data` for an `Example<>` batch, e.g. `input_ids` for a named one).
inline ForwardFn forward_of_first_entry(std::function<torch::Tensor(const torch::Tensor&)> fn) {
  TORCH_CHECK_VALUE(fn != nullptr, "forward_of_first_entry: the function is empty");
  return [fn = std::move(fn)](const Batch& batch) {
    const auto entries = batch.items();
    TORCH_CHECK_VALUE(!entries.empty(), "the forward pass got an empty batch");
    return ModelOutput(fn(entries.front().second));
  };
}

}  // namespace mantissa
