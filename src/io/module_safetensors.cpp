// A module's state_dict as named tensors (include/mantissa/io/state_dict.h), and to and from a
// .safetensors file: `save_module_safetensors` and `load_module_safetensors` of
// include/mantissa/io/safetensors.h, on the file format's `save_safetensors` /
// `load_safetensors` (src/io/safetensors.cpp).
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <mantissa/io/safetensors.h>

namespace mantissa::io {
namespace {

// A shape as Python prints a tensor's size: "torch.Size([2, 3])".
std::string python_size(at::IntArrayRef shape) {
  std::ostringstream out;
  out << "torch.Size(" << shape << ")";
  return out.str();
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += ", ";
    out += "\"" + name + "\"";
  }
  return out;
}

}  // namespace

NamedTensors module_state_dict(const torch::nn::Module& module) {
  NamedTensors tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    tensors.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    tensors.emplace_back(item.key(), item.value());
  }
  return tensors;
}

void save_module_safetensors(const std::string& path, const torch::nn::Module& module) {
  save_safetensors(path, module_state_dict(module), {{"format", "pt"}});
}

IncompatibleKeys load_module_safetensors(const std::string& path, torch::nn::Module& module,
                                         bool strict, bool allow_dtype_cast) {
  return load_module_state_dict(module, load_safetensors(path), strict, allow_dtype_cast,
                                " from '" + path + "'");
}

IncompatibleKeys load_module_state_dict(torch::nn::Module& module, const NamedTensors& loaded,
                                        bool strict, bool allow_dtype_cast,
                                        const std::string& origin) {
  std::unordered_map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, tensor] : loaded) by_name.emplace(name, &tensor);

  const auto targets = module_state_dict(module);

  IncompatibleKeys keys;
  std::set<std::string> target_names;
  std::vector<std::string> mismatches;
  std::vector<std::pair<at::Tensor, const at::Tensor*>> copies;
  for (const auto& [name, target] : targets) {
    target_names.insert(name);
    const auto found = by_name.find(name);
    if (found == by_name.end()) {
      keys.missing_keys.push_back(name);
      continue;
    }
    const at::Tensor& source = *found->second;
    if (source.sizes() != target.sizes()) {
      mismatches.push_back("size mismatch for " + name + ": copying a param with shape " +
                           python_size(source.sizes()) +
                           " from checkpoint, the shape in current model is " +
                           python_size(target.sizes()) + ".");
      continue;
    }
    if (source.scalar_type() != target.scalar_type() && !allow_dtype_cast) {
      mismatches.push_back("dtype mismatch for " + name + ": the checkpoint holds " +
                           std::string(c10::toString(source.scalar_type())) + ", the model has " +
                           c10::toString(target.scalar_type()) +
                           " (pass allow_dtype_cast=true to convert)");
      continue;
    }
    copies.emplace_back(target, &source);
  }
  for (const auto& [name, tensor] : loaded) {
    if (target_names.count(name) == 0) keys.unexpected_keys.push_back(name);
  }

  // PyTorch's order: missing keys, unexpected keys, then the per-tensor mismatches.
  std::vector<std::string> errors;
  if (strict && !keys.missing_keys.empty()) {
    errors.push_back("Missing key(s) in state_dict: " + quoted_list(keys.missing_keys) + ". ");
  }
  if (strict && !keys.unexpected_keys.empty()) {
    errors.push_back("Unexpected key(s) in state_dict: " + quoted_list(keys.unexpected_keys) +
                     ". ");
  }
  errors.insert(errors.end(), mismatches.begin(), mismatches.end());
  if (!errors.empty()) {
    std::string joined;
    for (const auto& error : errors) joined += "\n\t" + error;
    TORCH_CHECK(false, "Error(s) in loading state_dict for ", module.name(), origin, ":", joined);
  }

  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(*source);
  return keys;
}

}  // namespace mantissa::io
