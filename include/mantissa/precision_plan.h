#pragma once

#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

#include <mantissa/fp8/recipe.h>
#include <mantissa/optim/low_precision_update.h>

namespace mantissa {

/// Which tensors the optimizer updates.
enum class WeightsMode {
  /// The model's own parameters (fp32 models, with or without autocast).
  kModelWeights,
  /// fp32 master copies of bf16/fp16 parameters (`amp::MasterWeights`), cast back after each
  /// step.
  kFp32Masters,
  /// bf16 parameters updated in place, without a master copy (`--master_weights off`).
  kPureLowPrecision,
};

/// How one run computes: decided from the arguments and the model's parameter dtype, logged
/// once when training starts. See docs/trainer.md for the table of cases. Python: what
/// `Trainer` derives from `bf16` / `fp16` / `tf32` and the model's `dtype`; plain host values.
struct PrecisionPlan {
  /// dtype of the model's floating-point parameters when training starts.
  c10::ScalarType param_dtype = c10::kFloat;
  /// dtype matmuls and convs run in (fp32 when neither bf16 nor fp16 is in play).
  c10::ScalarType compute_dtype = c10::kFloat;
  /// Forward and loss under `amp::Autocast(device, compute_dtype)`.
  bool autocast = false;
  /// Dynamic (or static) loss scaling with `amp::GradScaler`: fp16 only.
  bool loss_scaling = false;
  /// With `loss_scaling`: the fixed scale of `--loss_scale`, or unset for dynamic scaling.
  std::optional<double> static_loss_scale;
  /// Which tensors the optimizer updates.
  WeightsMode weights = WeightsMode::kModelWeights;
  /// With `kPureLowPrecision`: how the optimizer writes each update into the bf16/fp16
  /// weights (`FusedAdamWOptions::low_precision_update`); `kNearest` otherwise.
  optim::LowPrecisionUpdate low_precision_update = optim::LowPrecisionUpdate::kNearest;
  /// TF32 for fp32 matmuls/convs: set by `--tf32`, unset leaves LibTorch's setting alone.
  std::optional<bool> tf32;
  /// `--fp8`: the recipe the model's `Float8Linear` layers run with (docs/fp8.md); unset
  /// without FP8.
  std::optional<fp8::Float8Recipe> fp8;
  /// With `fp8`, once the Trainer has converted the model (its first `train()`, `optimizer()`
  /// or `lr_scheduler()`): which layers run in FP8, `fp8::Float8Conversion::describe()`.
  /// Empty before.
  std::string fp8_layers;

  /// One line for the log: "bf16 autocast, fp32 weights, no loss scaling", with FP8 followed
  /// by "; fp8 delayed (HYBRID, ...): 1 of 3 linear layers (1); high precision: 0, 2".
  std::string describe() const;
};

}  // namespace mantissa
