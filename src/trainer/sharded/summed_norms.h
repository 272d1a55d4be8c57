#pragma once
// The last half of a sharded run's global gradient norm: per-tensor norms that the processes
// computed where each tensor lies whole, summed into one fp64 tensor by an allreduce, turned
// into the norm data parallel computes over the whole gradients. Shared by ZeRO-2's flat shards
// (sharded_adamw.h) and the sharding by whole tensors (state_sharded_data_parallel.h).

#include <cstddef>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace mantissa::detail::sharded {

/// The total 2-norm from `norms` (fp64, `norms[i]` the norm of tensor i): the tensors `order`
/// lists, in that order, each norm first converted to `dtypes[i]` (its gradient's dtype, as
/// data parallel computes it), then `total_norm_of_norms`. Bit for bit `get_total_norm` over
/// those whole gradients in that order. A 0-d zero on `norms`' device when `order` is empty.
/// No sync.
at::Tensor total_norm_of_summed_norms(const at::Tensor& norms,
                                      const std::vector<std::size_t>& order,
                                      const std::vector<c10::ScalarType>& dtypes);

/// The global gradient norm of a run whose processes each update whole tensors of their own
/// (the sharding by whole tensors, under shard_grad_op and under full sharding): each process
/// takes the norms of its own tensors' gradients, puts them in those tensors' places of the
/// whole optimizer's order (zeros elsewhere), one allreduce sums them in fp64 (x + 0 is exact,
/// and fp64 holds every float dtype's norm exactly), and `total_norm_of_summed_norms` turns them
/// into data parallel's norm, bit for bit.
class OwnedTensorNorms {
 public:
  OwnedTensorNorms() = default;
  /// `slots[k]`: where this process's k-th optimizer tensor sits in the whole optimizer's
  /// order; `dtypes[j]`: the gradient dtype of the whole optimizer's j-th tensor; `device`: the
  /// parameters' device, where the norms are taken. No sync (the slots are copied there once).
  OwnedTensorNorms(std::vector<std::size_t> slots, std::vector<c10::ScalarType> dtypes,
                   c10::Device device);

  /// Clips the gradients of `params` (this process's optimizer tensors, in its order) with the
  /// global norm and returns that norm (0-d, the same on every process). `has_grad[j]`: whether
  /// the whole optimizer's j-th tensor has a gradient (the same on every process; data parallel
  /// leaves the others out of its norm); empty when every one has. `sum_across` sums a 1-d fp64 tensor over the processes
  /// in place (an allreduce). A collective through `sum_across`; no host sync.
  at::Tensor clip_(const std::vector<at::Tensor>& params, double max_norm,
                   const std::vector<bool>& has_grad,
                   const std::function<void(at::Tensor&)>& sum_across) const;

  /// The number of tensors of the whole optimizer.
  std::size_t whole_size() const noexcept { return dtypes_.size(); }

 private:
  std::vector<std::size_t> slots_;
  std::vector<c10::ScalarType> dtypes_;
  c10::Device device_ = c10::kCPU;
  at::Tensor all_slots_;  // slots_ on device_
};

}  // namespace mantissa::detail::sharded
