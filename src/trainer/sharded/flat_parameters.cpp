#include "trainer/sharded/flat_parameters.h"

#include <algorithm>
#include <string>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace mantissa::detail::sharded {
namespace {

std::vector<FlatInput> inputs_of(const std::vector<std::vector<at::Tensor>>& groups) {
  std::vector<FlatInput> inputs;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g]) inputs.push_back(FlatInput{p, g, 0});
  }
  return inputs;
}

// Gives the storage under `tensor` `nbytes` of fresh memory from its own allocator, or none.
// By hand: ATen exports a resize for CPU storages and another for CUDA ones; this is the part
// of both the buffers need (no copy of old contents), for any device.
void set_storage_bytes(const at::Tensor& tensor, std::size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (nbytes == 0) {
    storage->set_data_ptr_noswap(c10::DataPtr(nullptr, tensor.device()));
  } else {
    TORCH_INTERNAL_ASSERT(storage->allocator() != nullptr, "FlatParameters: no allocator");
    storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  }
  storage->set_nbytes(nbytes);
}

}  // namespace

FlatParameters::FlatParameters(const std::vector<std::vector<at::Tensor>>& groups,
                               std::int64_t rank, std::int64_t world_size,
                               std::int64_t bucket_cap_bytes)
    : FlatParameters(inputs_of(groups), rank, world_size, bucket_cap_bytes,
                     FlatStorage::kWholeBuffers) {
  num_groups_ = std::max(num_groups_, groups.size());
}

FlatParameters::FlatParameters(const std::vector<FlatInput>& params, std::int64_t rank,
                               std::int64_t world_size, std::int64_t bucket_cap_bytes,
                               FlatStorage storage, bool whole_tensors)
    : rank_(rank), storage_(storage) {
  TORCH_CHECK_VALUE(world_size >= 1 && rank >= 0 && rank < world_size,
                    "FlatParameters: rank must be in [0, world_size), but it is ", rank,
                    " of world_size ", world_size);
  std::vector<ParamSpec> specs;
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<std::size_t> index_in_group;
  for (const auto& input : params) {
    const auto& p = input.tensor;
    const auto g = input.group;
    if (index_in_group.size() <= g) index_in_group.resize(g + 1, 0);
    const auto i = index_in_group[g]++;
    TORCH_CHECK_VALUE(p.defined() && at::isFloatingType(p.scalar_type()) && p.numel() > 0,
                      "FlatParameters: parameter ", i, " of group ", g,
                      " must be a floating tensor with elements (it is ",
                      p.defined() ? std::string(c10::toString(p.scalar_type())) + " with " +
                                        std::to_string(p.numel()) + " elements"
                                  : std::string("undefined"),
                      ")");
    TORCH_CHECK_VALUE(seen.insert(p.unsafeGetTensorImpl()).second, "FlatParameters: parameter ", i,
                      " of group ", g, " is listed twice (a tied weight must be listed once)");
    TORCH_CHECK_VALUE(params_.empty() || p.device() == params_.front().device(),
                      "FlatParameters: parameter ", i, " of group ", g, " is on ", p.device(),
                      ", the others on ", params_.front().device(),
                      "; every sharded parameter must be on this rank's device");
    specs.push_back(ParamSpec{p.numel(), p.scalar_type(), g, input.unit});
    params_.push_back(p);
    shapes_.push_back(p.sizes().vec());
  }
  num_groups_ = index_in_group.size();
  layout_ = plan_flat_layout(specs, world_size, bucket_cap_bytes);
  if (whole_tensors) layout_ = place_whole_tensors(std::move(layout_));
  for (std::size_t i = 0; i < params_.size(); ++i) norm_order_.push_back(i);

  at::NoGradGuard no_grad;
  for (std::size_t b = 0; b < layout_.buckets.size(); ++b) {
    const auto& bucket = layout_.buckets[b];
    const auto& first = params_[bucket.slots.front().param];
    auto buffer = at::zeros({bucket.padded_numel}, first.options().requires_grad(false));
    for (const auto& slot : bucket.slots) {
      auto& p = params_[slot.param];
      auto view = buffer.narrow(0, slot.offset, slot.numel);
      view.copy_(p.detach().reshape({-1}));
      p.set_data(view.view(p.sizes()));
    }
    buffers_.push_back(std::move(buffer));
    // Shards only: this bucket's whole buffer freed before the next one is made, so that the
    // model is never held twice (a whole-tensor layout's buffers hold world_size times a
    // bucket's largest share).
    if (storage_ == FlatStorage::kShardsOnly) {
      shards_.push_back(
          buffers_[b].narrow(0, bucket.shard_begin(rank_), bucket.shard_numel).clone());
      free_buffer(b);
    }
  }
}

at::Tensor FlatParameters::shard(std::size_t b) const {
  if (storage_ == FlatStorage::kShardsOnly) return shards_.at(b);
  const auto& bucket = layout_.buckets.at(b);
  return buffers_.at(b).narrow(0, bucket.shard_begin(rank_), bucket.shard_numel);
}

void FlatParameters::set_norm_order(std::vector<std::size_t> order) {
  std::vector<bool> seen(params_.size(), false);
  TORCH_CHECK_VALUE(order.size() == params_.size(), "FlatParameters: a norm order of ",
                    order.size(), " indices for ", params_.size(), " parameters");
  for (const auto i : order) {
    TORCH_CHECK_VALUE(i < params_.size() && !seen[i], "FlatParameters: the norm order lists ", i,
                      " twice or out of range");
    seen[i] = true;
  }
  norm_order_ = std::move(order);
}

bool FlatParameters::is_allocated(std::size_t b) const {
  return buffers_.at(b).storage().nbytes() > 0;
}

void FlatParameters::allocate_buffer(std::size_t b) {
  TORCH_INTERNAL_ASSERT(storage_ == FlatStorage::kShardsOnly);
  const auto& buffer = buffers_.at(b);
  if (is_allocated(b)) return;
  set_storage_bytes(buffer, static_cast<std::size_t>(buffer.numel()) * buffer.element_size());
  for (const auto& slot : layout_.buckets[b].slots) {
    params_[slot.param].set_data(
        buffer.narrow(0, slot.offset, slot.numel).view(shapes_[slot.param]));
  }
}

void FlatParameters::free_buffer(std::size_t b) {
  TORCH_INTERNAL_ASSERT(storage_ == FlatStorage::kShardsOnly);
  const auto& buffer = buffers_.at(b);
  set_storage_bytes(buffer, 0);
  // Freed parameters have no elements, so that an op that reads one by mistake sees an empty
  // tensor instead of reading freed memory (elementwise kernels do not check); views autograd
  // saved keep their shapes and see the memory again once it is allocated.
  for (const auto& slot : layout_.buckets[b].slots) {
    params_[slot.param].set_data(buffer.narrow(0, 0, 0));
  }
}

}  // namespace mantissa::detail::sharded
