#include "trainer/sharded/summed_norms.h"

#include <map>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <mantissa/clip_grad.h>

namespace mantissa::detail::sharded {

at::Tensor total_norm_of_summed_norms(const at::Tensor& norms,
                                      const std::vector<std::size_t>& order,
                                      const std::vector<c10::ScalarType>& dtypes) {
  if (order.empty()) return at::zeros({}, norms.options().dtype(at::kFloat));
  // Each dtype's conversion made once, for every tensor of that dtype.
  std::map<c10::ScalarType, std::vector<at::Tensor>> by_dtype;
  std::vector<at::Tensor> picked;
  picked.reserve(order.size());
  for (const auto i : order) {
    auto& converted = by_dtype[dtypes.at(i)];
    if (converted.empty()) converted = norms.to(dtypes[i]).unbind(0);
    picked.push_back(converted[i]);
  }
  return total_norm_of_norms(picked, 2.0);
}

OwnedTensorNorms::OwnedTensorNorms(std::vector<std::size_t> slots,
                                   std::vector<c10::ScalarType> dtypes, c10::Device device)
    : slots_(std::move(slots)), dtypes_(std::move(dtypes)), device_(device) {
  const std::vector<std::int64_t> as_long(slots_.begin(), slots_.end());
  // Made once: a host-to-device copy each step would wait for the stream.
  all_slots_ = at::tensor(as_long, at::kLong).to(device_);
}

at::Tensor OwnedTensorNorms::clip_(const std::vector<at::Tensor>& params, double max_norm,
                                   const std::vector<bool>& has_grad,
                                   const std::function<void(at::Tensor&)>& sum_across) const {
  TORCH_INTERNAL_ASSERT(params.size() == slots_.size(),
                        "OwnedTensorNorms: clipping other tensors than the optimizer's");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  std::vector<std::int64_t> slots;
  for (std::size_t k = 0; k < params.size(); ++k) {
    if (!params[k].grad().defined()) continue;
    grads.push_back(params[k].grad());
    slots.push_back(static_cast<std::int64_t>(slots_[k]));
  }
  auto packed = at::zeros({static_cast<std::int64_t>(dtypes_.size())},
                          at::TensorOptions().dtype(at::kDouble).device(device_));
  if (!grads.empty()) {
    const auto norms = per_tensor_norms(grads, 2.0);
    std::vector<at::Tensor> as_double;
    for (const auto& norm : norms) as_double.push_back(norm.to(at::kDouble).to(device_));
    // Usually every tensor has a gradient and the indices made once serve.
    const auto index =
        grads.size() == params.size() ? all_slots_ : at::tensor(slots, at::kLong).to(device_);
    packed.index_copy_(0, index, at::stack(as_double));
  }
  sum_across(packed);
  // In the whole order, the tensors without a gradient left out: as data parallel's
  // clip_grad_norm_ sees them.
  std::vector<std::size_t> order;
  for (std::size_t j = 0; j < dtypes_.size(); ++j) {
    if (has_grad.empty() || has_grad.at(j)) order.push_back(j);
  }
  auto total = total_norm_of_summed_norms(packed, order, dtypes_);
  clip_grads_with_norm_(params, max_norm, total);
  return total;
}

}  // namespace mantissa::detail::sharded
