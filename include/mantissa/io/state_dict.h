#pragma once
// A module's state as named tensors, the C++ form of Python's `state_dict()`: what
// model.safetensors holds and what a strategy hands over when the model is saved or loaded.

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace mantissa::io {

/// Tensors under their names, in a chosen order (a state_dict, or a file's contents).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// The module's parameters, then its buffers, recursively, each in registration order, under
/// Hugging Face's dotted names ("fc1.weight", "bn.running_mean"). The tensors are the module's
/// own (not copies). Python: `module.state_dict()`. No sync.
NamedTensors module_state_dict(const torch::nn::Module& module);

/// The keys a non-strict load did not match. Python: the `_IncompatibleKeys(missing_keys,
/// unexpected_keys)` that `module.load_state_dict(..., strict=False)` returns.
struct IncompatibleKeys {
  /// Parameters and buffers of the module that the state does not hold (left unchanged).
  std::vector<std::string> missing_keys;
  /// Tensors of the state that the module does not have (ignored).
  std::vector<std::string> unexpected_keys;
};

/// Copies `state` into `module`'s existing parameters and buffers (under `torch::NoGradGuard`,
/// onto their devices). Python: `model.load_state_dict(state, strict=strict)`.
///
/// Everything is checked before anything is copied, so a failed load leaves the module as it
/// was. Errors use PyTorch's wording after "Error(s) in loading state_dict for <module>"
/// and `origin` (such as " from 'model.safetensors'"; may be empty):
/// - `strict` and names that do not match: "Missing key(s) in state_dict: "fc2.bias". " and
///   "Unexpected key(s) in state_dict: "head.weight". " (always checked when `strict`);
/// - a shape that differs (strict or not): "size mismatch for fc1.weight: copying a param with
///   shape [4, 8] from checkpoint, the shape in current model is [16, 8]."
/// - a dtype that differs, unless `allow_dtype_cast` (then the values are converted, as
///   Python's `load_state_dict` always does): "dtype mismatch for fc1.weight: the checkpoint
///   holds BFloat16, the model has Float".
/// Returns the keys that did not match (both lists empty after a successful strict load).
/// Syncs with the device of GPU parameters (host-to-device copies).
IncompatibleKeys load_module_state_dict(torch::nn::Module& module, const NamedTensors& state,
                                        bool strict = true, bool allow_dtype_cast = false,
                                        const std::string& origin = {});

}  // namespace mantissa::io
