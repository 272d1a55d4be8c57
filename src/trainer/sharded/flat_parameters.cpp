#include "trainer/sharded/flat_parameters.h"

#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace mantissa::detail::sharded {

FlatParameters::FlatParameters(const std::vector<std::vector<at::Tensor>>& groups,
                               std::int64_t rank, std::int64_t world_size,
                               std::int64_t bucket_cap_bytes)
    : rank_(rank), num_groups_(groups.size()) {
  TORCH_CHECK_VALUE(world_size >= 1 && rank >= 0 && rank < world_size,
                    "FlatParameters: rank must be in [0, world_size), but it is ", rank,
                    " of world_size ", world_size);
  std::vector<ParamSpec> specs;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t i = 0; i < groups[g].size(); ++i) {
      const auto& p = groups[g][i];
      TORCH_CHECK_VALUE(p.defined() && at::isFloatingType(p.scalar_type()) && p.numel() > 0,
                        "FlatParameters: parameter ", i, " of group ", g,
                        " must be a floating tensor with elements (it is ",
                        p.defined() ? std::string(c10::toString(p.scalar_type())) + " with " +
                                          std::to_string(p.numel()) + " elements"
                                    : std::string("undefined"),
                        ")");
      TORCH_CHECK_VALUE(seen.insert(p.unsafeGetTensorImpl()).second, "FlatParameters: parameter ",
                        i, " of group ", g, " is listed twice (a tied weight must be listed once)");
      TORCH_CHECK_VALUE(params_.empty() || p.device() == params_.front().device(),
                        "FlatParameters: parameter ", i, " of group ", g, " is on ", p.device(),
                        ", the others on ", params_.front().device(),
                        "; every sharded parameter must be on this rank's device");
      specs.push_back(ParamSpec{p.numel(), p.scalar_type(), g});
      params_.push_back(p);
    }
  }
  layout_ = plan_flat_layout(specs, world_size, bucket_cap_bytes);

  at::NoGradGuard no_grad;
  for (const auto& bucket : layout_.buckets) {
    const auto& first = params_[bucket.slots.front().param];
    auto buffer = at::zeros({bucket.padded_numel}, first.options().requires_grad(false));
    for (const auto& slot : bucket.slots) {
      auto& p = params_[slot.param];
      auto view = buffer.narrow(0, slot.offset, slot.numel);
      view.copy_(p.detach().reshape({-1}));
      p.set_data(view.view(p.sizes()));
    }
    buffers_.push_back(std::move(buffer));
  }
}

at::Tensor FlatParameters::shard(std::size_t b) const {
  const auto& bucket = layout_.buckets.at(b);
  return buffers_.at(b).narrow(0, bucket.shard_begin(rank_), bucket.shard_numel);
}

}  // namespace mantissa::detail::sharded
