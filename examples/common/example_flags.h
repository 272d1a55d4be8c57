#pragma once
// The flags the example trainers share, declared with CLI11 on the app of a
// mantissa::ArgumentParser (which reads them beside Hugging Face's TrainingArguments flags).

#include <string>

#include <c10/core/ScalarType.h>
#include <CLI/CLI.hpp>

namespace mantissa::examples {

/// Adds `--model_dtype fp32|bf16|fp16` to `app`, stored in `model_dtype` ("fp32" unless given):
/// the dtype the model's parameters are cast to before training. Python: the `dtype` of HF's
/// `from_pretrained(..., dtype=torch.bfloat16)`.
void add_model_dtype_option(CLI::App& app, std::string& model_dtype);

/// The dtype a `--model_dtype` spelling names (`add_model_dtype_option` checked it).
c10::ScalarType model_dtype_of(const std::string& model_dtype);

/// The Fashion-MNIST models of fashion_models.h an example can train.
enum class FashionModelKind {
  cnn,  ///< `FashionCnn`: two conv blocks, a two-layer head with dropout
  mlp,  ///< `FashionMlp`: 784-256-256-10, no dropout
};

/// Adds `--model cnn|mlp` to `app`, stored in `model` (kept as it is unless given; fashion_mnist
/// starts it at "cnn"): which of
/// fashion_models.h's models to train. The MLP draws no random numbers while it trains (no
/// dropout), so the runs of different world sizes can be compared without dropout masks
/// telling them apart. Python: bench/python/common.py's `--model`.
void add_fashion_model_option(CLI::App& app, std::string& model);

/// The model a `--model` spelling names (`add_fashion_model_option` checked it).
FashionModelKind fashion_model_of(const std::string& model);

}  // namespace mantissa::examples
