#include "example_flags.h"

#include <string>

#include <c10/util/Exception.h>

namespace mantissa::examples {

void add_model_dtype_option(CLI::App& app, std::string& model_dtype) {
  app.add_option("--model_dtype", model_dtype,
                 "dtype of the model's parameters: fp32, or bf16/fp16 (with --bf16/--fp16; "
                 "--master_weights off then trains them without fp32 copies)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
}

c10::ScalarType model_dtype_of(const std::string& model_dtype) {
  if (model_dtype == "bf16") return c10::kBFloat16;
  if (model_dtype == "fp16") return c10::kHalf;
  TORCH_CHECK_VALUE(model_dtype == "fp32", "--model_dtype must be fp32, bf16 or fp16, got '",
                    model_dtype, "'");
  return c10::kFloat;
}

void add_fashion_model_option(CLI::App& app, std::string& model) {
  app.add_option("--model", model,
                 "Model to train: cnn (two conv blocks, dropout in the head) or mlp "
                 "(784-256-256-10, no dropout: runs of different world sizes compare)")
      ->check(CLI::IsMember({"cnn", "mlp"}))
      ->capture_default_str();
}

FashionModelKind fashion_model_of(const std::string& model) {
  if (model == "mlp") return FashionModelKind::mlp;
  TORCH_CHECK_VALUE(model == "cnn", "--model must be cnn or mlp, got '", model, "'");
  return FashionModelKind::cnn;
}

}  // namespace mantissa::examples
