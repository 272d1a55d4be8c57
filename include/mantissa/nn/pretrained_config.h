#pragma once

#include <string>

#include <c10/core/ScalarType.h>

namespace mantissa::nn {

/// Mixin for a model that Hugging Face's `from_pretrained` can load: it knows the
/// `config.json` that describes it. Python: a `PreTrainedModel`'s `config`, which
/// `save_pretrained` writes beside the weights.
///
/// Derive the model's module class from it beside `torch::nn::Module`. The Trainer finds it with
/// `dynamic_cast` and then writes `config.json` next to `model.safetensors`: in
/// `Trainer::save_model` (so that `AutoModelForCausalLM.from_pretrained(dir)` loads what a C++
/// run trained) and in each `checkpoint-<step>` folder, as HF's Trainer does. Host state only.
class HasPretrainedConfig {
 public:
  virtual ~HasPretrainedConfig() = default;
  /// The text of `config.json` for this model with its weights saved in `dtype` (the config's
  /// `dtype` key, `torch_dtype` before transformers 5). Python:
  /// `model.config.to_json_string()`. No device work.
  virtual std::string pretrained_config_json(c10::ScalarType dtype) const = 0;
};

}  // namespace mantissa::nn
