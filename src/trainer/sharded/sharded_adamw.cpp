#include "trainer/sharded/sharded_adamw.h"

#include "trainer/sharded/summed_norms.h"
#include "trainer/sharded/wait_all.h"

#include <algorithm>
#include <cstdint>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <mantissa/amp/master_weights.h>
#include <mantissa/clip_grad.h>

namespace mantissa::detail::sharded {
namespace {

std::int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0;
}

}  // namespace

ShardedAdamW::ShardedAdamW(FlatParameters& flat, GradientReduceScatter& grads,
                           std::shared_ptr<optim::FusedAdamW> optimizer,
                           const amp::MasterWeights* masters,
                           c10::intrusive_ptr<c10d::ProcessGroup> group)
    : flat_(flat), grads_(grads), group_(std::move(group)), optimizer_(std::move(optimizer)) {
  TORCH_CHECK_VALUE(optimizer_ != nullptr, "ShardedAdamW: the optimizer is null");
  TORCH_CHECK_VALUE(group_ && group_->getSize() == flat_.world_size(),
                    "ShardedAdamW: the process group has ", group_ ? group_->getSize() : 0,
                    " ranks, the layout was planned for ", flat_.world_size());
  const auto& buckets = flat_.layout().buckets;
  TORCH_CHECK_VALUE(masters == nullptr || masters->model_params().size() == buckets.size(),
                    "ShardedAdamW: masters of ", masters ? masters->model_params().size() : 0,
                    " tensors given for ", buckets.size(), " buckets");
  // The optimizer's tensors, group by group in bucket order: bucket b is the next tensor of
  // its group.
  const auto& groups = optimizer_->param_groups();
  std::vector<std::size_t> taken(groups.size(), 0);
  at::NoGradGuard no_grad;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const auto g = buckets[b].group;
    TORCH_CHECK_VALUE(g < groups.size() && taken[g] < groups[g].params().size(),
                      "ShardedAdamW: the optimizer's param groups must hold this process's shards "
                      "(or their masters) group by group in bucket order, as optimizer_params "
                      "gave them; it has ",
                      groups.size(), " groups, and none left for bucket ", b, " of group ", g);
    const auto& param = groups[g].params()[taken[g]++];
    const auto shard = flat_.shard(b);
    // Where the optimizer's tensor writes: the shard itself, or the master's model tensor.
    const bool master = masters != nullptr && !param.is_same(masters->model_params()[b]);
    const auto& written = master ? masters->model_params()[b] : param;
    TORCH_CHECK_VALUE(written.data_ptr() == shard.data_ptr() && written.numel() == shard.numel() &&
                          (!master || param.is_same(masters->master_params()[b])),
                      "ShardedAdamW: tensor ", taken[g] - 1, " of param group ", g,
                      " is not this process's shard of bucket ", b, " (nor its master)");
    has_master_.push_back(master);
    master_grads_.push_back(master ? at::zeros_like(param) : at::Tensor());
    shard_params_.push_back(param);
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    TORCH_CHECK_VALUE(taken[g] == groups[g].params().size(), "ShardedAdamW: param group ", g,
                      " holds ", groups[g].params().size(), " tensors for ", taken[g], " buckets");
  }
  for (const auto& bucket : buckets) splits_.push_back(split_slots(bucket, flat_.world_size()));
  if (masters != nullptr && masters->has_low_precision() && !optimizer_->writes_back_to_model()) {
    optimizer_->link_model_params(*masters);
  }
}

void ShardedAdamW::prepare_grads() {
  at::NoGradGuard no_grad;
  for (std::size_t b = 0; b < shard_params_.size(); ++b) {
    auto averaged = grads_.averaged_shard(b);
    if (has_master_[b]) {
      master_grads_[b].copy_(averaged);
      shard_params_[b].mutable_grad() = master_grads_[b];
    } else {
      // The reduced shard is this rank's gradient storage (the ZeRO-2 1/N).
      shard_params_[b].mutable_grad() = averaged;
    }
  }
}

at::Tensor ShardedAdamW::global_grad_norm() {
  at::NoGradGuard no_grad;
  const auto& layout = flat_.layout();
  const auto& buckets = layout.buckets;
  const auto rank = flat_.rank();
  const auto world = flat_.world_size();
  std::vector<at::Tensor> grads;
  for (const auto& p : shard_params_) {
    TORCH_INTERNAL_ASSERT(p.grad().defined(), "ShardedAdamW: clipping before prepare_grads");
    grads.push_back(p.grad());
  }
  // The pieces of the parameters that straddle a shard boundary, gathered by every rank.
  std::vector<at::Tensor> gathered(buckets.size());
  std::vector<at::Tensor> packed;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const auto& split = splits_[b];
    if (split.slots.empty()) continue;
    packed.push_back(at::zeros({split.packed_numel}, grads[b].options()));
    for (const auto& slot : split.slots) {
      for (const auto& part : slot.pieces) {
        if (part.rank != rank) continue;
        packed.back()
            .narrow(0, part.packed_offset, part.piece.numel)
            .copy_(grads[b].narrow(0, part.piece.shard_offset, part.piece.numel));
      }
    }
    gathered[b] = at::empty({world * split.packed_numel}, grads[b].options());
    works.push_back(group_->_allgather_base(gathered[b], packed.back()));
  }
  wait_all(works);

  // Each parameter's whole gradient, on the rank that holds its first element: a view of the
  // shard, or its gathered pieces put together.
  const auto& params = flat_.params();
  std::vector<at::Tensor> whole;
  std::vector<std::size_t> mine;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto [b, s] = layout.where[i];
    const auto& bucket = buckets[b];
    const auto& slot = bucket.slots[s];
    if (bucket.first_rank(slot) != rank) continue;
    at::Tensor grad;
    if (!bucket.is_split(slot)) {
      grad = grads[b].narrow(0, bucket.piece(slot, rank)->shard_offset, slot.numel);
      // A fresh gradient starts aligned; CUDA's fused norm sums unaligned data in another
      // order, so a view that starts off 16 bytes is copied.
      if (reinterpret_cast<std::uintptr_t>(grad.data_ptr()) % 16 != 0) grad = grad.clone();
    } else {
      const auto& split = splits_[b];
      const auto found = std::find_if(split.slots.begin(), split.slots.end(),
                                      [s = s](const SplitSlot& entry) { return entry.slot == s; });
      TORCH_INTERNAL_ASSERT(found != split.slots.end());
      std::vector<at::Tensor> parts;
      for (const auto& part : found->pieces) {
        parts.push_back(gathered[b].narrow(0, part.rank * split.packed_numel + part.packed_offset,
                                           part.piece.numel));
      }
      grad = at::cat(parts);
    }
    whole.push_back(grad.view(flat_.shape(i)));
    mine.push_back(i);
  }
  const auto my_norms = per_tensor_norms(whole, 2.0);

  // Every norm to every rank: each rank fills the norms it computed and zeros elsewhere, and
  // one allreduce sums them (x + 0 is exact), in fp64, which holds every float dtype exactly.
  const auto norm_options = grads.front().options().dtype(at::kDouble);
  const auto zero = at::zeros({}, norm_options);
  std::vector<at::Tensor> slots(params.size(), zero);
  for (std::size_t k = 0; k < mine.size(); ++k) slots[mine[k]] = my_norms[k].to(at::kDouble);
  std::vector<at::Tensor> tensors{at::stack(slots)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  group_->allreduce(tensors, options)->wait();

  // Back in each gradient's dtype, then stacked and normed as clip_grad_norm_ does it over
  // whole tensors.
  std::vector<c10::ScalarType> dtypes;
  dtypes.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    dtypes.push_back(grads[layout.where[i].first].scalar_type());
  }
  return total_norm_of_summed_norms(tensors.front(), flat_.norm_order(), dtypes);
}

at::Tensor ShardedAdamW::clip_grad_norm_(double max_norm) {
  auto norm = global_grad_norm();
  clip_grads_with_norm_(shard_params_, max_norm, norm);
  return norm;
}

void ShardedAdamW::agree_found_inf_(at::Tensor& found_inf) {
  std::vector<at::Tensor> tensors{found_inf.view({1})};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  group_->allreduce(tensors, options)->wait();
}

void ShardedAdamW::all_gather_params() {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<at::Tensor> inputs;
  at::NoGradGuard no_grad;
  for (std::size_t b = 0; b < shard_params_.size(); ++b) {
    // A copy: the shard is part of the output buffer, and not every backend gathers in place.
    inputs.push_back(flat_.shard(b).clone());
    auto output = flat_.buffer(b);
    works.push_back(group_->_allgather_base(output, inputs.back()));
  }
  wait_all(works);
}

std::int64_t ShardedAdamW::state_bytes() const {
  std::int64_t total = fused_adamw_state_bytes(*optimizer_);
  for (std::size_t b = 0; b < shard_params_.size(); ++b) {
    if (has_master_[b]) total += bytes_of(shard_params_[b]) + bytes_of(master_grads_[b]);
  }
  return total;
}

void ShardedAdamW::copy_model_to_masters() {
  at::NoGradGuard no_grad;
  for (std::size_t b = 0; b < shard_params_.size(); ++b) {
    if (has_master_[b]) shard_params_[b].copy_(flat_.shard(b));
  }
}

void ShardedAdamW::zero_grad() { optimizer_->zero_grad(); }

std::int64_t fused_adamw_state_bytes(const optim::FusedAdamW& optimizer) {
  std::int64_t total = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& s = static_cast<const optim::FusedAdamWParamState&>(*state);
    total += bytes_of(s.step()) + bytes_of(s.exp_avg()) + bytes_of(s.exp_avg_sq()) +
             bytes_of(s.max_exp_avg_sq()) + bytes_of(s.kahan_comp());
  }
  return total;
}

}  // namespace mantissa::detail::sharded
