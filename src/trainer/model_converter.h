#pragma once
// Model converters: changes the Trainer makes to the model once, on its training device,
// after the cast and before the strategy takes it, each bringing its own pieces of saved
// state (torchtitan's `ModelConverter`s, which `float8` is one of). The Trainer walks the
// list that `make_model_converters` gives and names none of them; `--fp8` is the first
// (src/fp8/trainer_fp8.h).

#include <memory>
#include <vector>

#include <torch/nn/module.h>

#include <mantissa/precision_plan.h>

#include "trainer/saved_state.h"

namespace mantissa::detail {

/// One conversion of the model that the precision plan asked for.
class ModelConverter {
 public:
  virtual ~ModelConverter() = default;
  /// Converts `module` in place (its parameters keep their names and identities, so the
  /// optimizer and checkpoints see the same tensors), records what it did in `plan` for the
  /// log, and returns the state it keeps across steps and checkpoints (entries that refer to
  /// this converter, which must outlive them). Throws `c10::ValueError` naming the flag when
  /// the model cannot be converted. Called once. No sync.
  virtual SavedStates convert(torch::nn::Module& module, PrecisionPlan& plan) = 0;
};

/// The converters `plan` asks for, in the order they apply (none for most runs). The one
/// place that knows them all. No sync.
std::vector<std::unique_ptr<ModelConverter>> make_model_converters(const PrecisionPlan& plan);

/// The converter of type `T` among `converters`, or null.
template <typename T>
T* find_model_converter(const std::vector<std::unique_ptr<ModelConverter>>& converters) {
  for (const auto& converter : converters) {
    if (auto* found = dynamic_cast<T*>(converter.get())) return found;
  }
  return nullptr;
}

}  // namespace mantissa::detail
