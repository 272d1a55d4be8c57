#include <ATen/ATen.h>
#include <mantissa/clip_grad.h>

#include <cmath>
#include <optional>
#include <string>
// The same grouping function Python's torch._C._group_tensors_by_device_and_dtype calls, so the
// groups (and with them the order of the norms summed below) are the same as in Python.
#include <ATen/native/ForeachUtils.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

namespace mantissa {
namespace {

// Python's str(float): "2.0", "inf", "0.5", "1e-06".
std::string python_float(double value) {
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (std::isnan(value)) return "nan";
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

// The gradients of `tensors` grouped by (device, dtype), in Python's group order.
std::vector<std::vector<at::Tensor>> group_by_device_and_dtype(
    const std::vector<at::Tensor>& tensors) {
  std::vector<std::vector<std::optional<at::Tensor>>> nested(1);
  nested[0].reserve(tensors.size());
  for (const auto& tensor : tensors) nested[0].emplace_back(tensor);
  const auto grouped =
      at::native::_group_tensors_by_first_tensors_device_and_dtype(nested, /*with_indices=*/false);
  std::vector<std::vector<at::Tensor>> groups;
  groups.reserve(grouped.size());
  for (const auto& item : grouped) {
    std::vector<at::Tensor> group;
    group.reserve(item.second.first[0].size());
    for (const auto& tensor : item.second.first[0]) group.push_back(*tensor);
    groups.push_back(std::move(group));
  }
  return groups;
}

std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  grads.reserve(parameters.size());
  for (const auto& parameter : parameters) {
    const auto& grad = parameter.grad();
    if (grad.defined()) grads.push_back(grad);
  }
  return grads;
}

}  // namespace

std::vector<at::Tensor> per_tensor_norms(const std::vector<at::Tensor>& tensors, double norm_type) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> norms(tensors.size());
  if (tensors.empty()) return norms;
  std::vector<std::vector<std::optional<at::Tensor>>> nested(1);
  nested[0].assign(tensors.begin(), tensors.end());
  // One _foreach_norm per (device, dtype) group, as Python calls it: on CUDA a group takes the
  // fused multi-tensor kernel, whose per-tensor results do not depend on the group's other
  // tensors, so a caller may compute any subset of a list's norms and get the same bits.
  for (const auto& item : at::native::_group_tensors_by_first_tensors_device_and_dtype(
           nested, /*with_indices=*/true)) {
    std::vector<at::Tensor> group;
    group.reserve(item.second.first[0].size());
    for (const auto& tensor : item.second.first[0]) group.push_back(*tensor);
    auto group_norms = at::_foreach_norm(group, norm_type);
    const auto& indices = item.second.second;
    for (std::size_t k = 0; k < indices.size(); ++k) norms[indices[k]] = std::move(group_norms[k]);
  }
  return norms;
}

at::Tensor total_norm_of_norms(const std::vector<at::Tensor>& norms, double norm_type,
                               bool error_if_nonfinite) {
  c10::NoGradGuard no_grad;
  if (norms.empty()) return at::scalar_tensor(0.0, at::kFloat);
  const auto first_device = norms.front().device();
  // Stacked group by group, in the order Python's grouping gives the gradients' (device,
  // dtype) keys; the norms carry the same keys in the same first-appearance order, so they
  // group the same way.
  std::vector<at::Tensor> stacked;
  stacked.reserve(norms.size());
  for (const auto& group : group_by_device_and_dtype(norms)) {
    for (const auto& norm : group) stacked.push_back(norm.to(first_device));
  }
  at::Tensor total_norm = at::linalg_vector_norm(at::stack(stacked), norm_type);
  if (error_if_nonfinite) {
    // The one host sync, as in Python.
    TORCH_CHECK(!at::logical_or(total_norm.isnan(), total_norm.isinf()).item<bool>(),
                "The total norm of order ", python_float(norm_type),
                " for gradients from `parameters` is non-finite, so it cannot be clipped. To "
                "disable this error and scale the gradients by the non-finite norm anyway, set "
                "`error_if_nonfinite=False`");
  }
  return total_norm;
}

at::Tensor get_total_norm(const std::vector<at::Tensor>& tensors, double norm_type,
                          bool error_if_nonfinite) {
  return total_norm_of_norms(per_tensor_norms(tensors, norm_type), norm_type, error_if_nonfinite);
}

void clip_grads_with_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                           const at::Tensor& total_norm) {
  c10::NoGradGuard no_grad;
  const auto grads = defined_grads(parameters);
  if (grads.empty()) return;
  TORCH_CHECK_VALUE(total_norm.defined(), "clip_grads_with_norm_: total_norm is undefined");
  // Python evaluates `max_norm / (total_norm + 1e-6)` as Tensor.__rtruediv__, which is
  // `reciprocal() * max_norm`; dividing directly could differ in the last bit.
  const at::Tensor clip_coef = (total_norm + 1e-6).reciprocal() * max_norm;
  // Multiplying by a coefficient clamped to 1 is redundant when nothing needs clipping, but it
  // avoids a host-side `if`, which would sync.
  const at::Tensor clip_coef_clamped = at::clamp(clip_coef, std::nullopt, 1.0);
  for (const auto& group : group_by_device_and_dtype(grads)) {
    at::_foreach_mul_(group, clip_coef_clamped.to(group.front().device()));
  }
}

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                           double norm_type, bool error_if_nonfinite) {
  const at::Tensor total_norm =
      get_total_norm(defined_grads(parameters), norm_type, error_if_nonfinite);
  clip_grads_with_norm_(parameters, max_norm, total_norm);
  return total_norm;
}

}  // namespace mantissa
