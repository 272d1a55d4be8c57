#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include <mantissa/fp8/recipe.h>
#include <mantissa/fp8/scaling_state.h>

namespace mantissa::fp8 {

/// One linear layer of a model, as a conversion filter sees it.
struct LinearLayerInfo {
  std::string name;          ///< qualified name, as in `named_modules()` ("blocks.0.fc")
  int64_t in_features = 0;   ///< K
  int64_t out_features = 0;  ///< N
  int64_t index = 0;  ///< position among the model's linear layers, in `named_modules()` order
  int64_t count = 0;  ///< how many linear layers the model has
};

/// Decides whether a linear layer runs in FP8. Python: torchao's `module_filter_fn(mod, fqn)`.
using Float8Filter = std::function<bool(const LinearLayerInfo& layer)>;

/// The default filter: both dimensions multiples of 16 (what cuBLASLt's FP8 GEMM requires) and
/// neither the first nor the last linear layer of the model (the embedding-side projection and
/// the output head are the most sensitive to rounding and usually too small to gain).
bool default_float8_filter(const LinearLayerInfo& layer);

/// What `convert_to_float8_training` did: the FP8 part of the precision plan.
struct Float8Conversion {
  Float8Recipe recipe;
  /// Layers that now run in FP8, in model order.
  std::vector<std::string> float8_layers;
  /// Linear layers the filter kept in high precision.
  std::vector<std::string> filtered_out;
  /// Plain `torch::nn::Linear` layers the filter chose but which cannot run in FP8: a C++ model
  /// calls them through its own typed members, so they must be declared as `Float8Linear`.
  std::vector<std::string> not_convertible;
  /// The scaling state of the delayed recipe (null for current scaling): update it after each
  /// optimizer step, all-reduce its amaxes under data parallelism, save it in checkpoints.
  std::shared_ptr<Float8ScalingState> state;

  /// One line for the precision plan: "fp8 delayed (HYBRID, amax history 1024, max, margin
  /// 0): 4 of 6 linear layers (blocks.0.attn.qkv, ...); high precision: head, ...".
  std::string describe() const;
};

/// Switches the `Float8Linear` layers of `module` that pass `filter` to FP8 with `recipe`
/// (validated), and reports every linear layer. Parameters keep their names and identities,
/// so optimizers, checkpoints and `named_parameters()` are unaffected. For the delayed recipe
/// the state is created on the device of the module's first parameter (it follows the input's
/// device at the first forward otherwise). Python: torchao's
/// `convert_to_float8_training(module, config=..., module_filter_fn=...)`.
Float8Conversion convert_to_float8_training(torch::nn::Module& module,
                                            const Float8Recipe& recipe = {},
                                            const Float8Filter& filter = default_float8_filter);

}  // namespace mantissa::fp8
