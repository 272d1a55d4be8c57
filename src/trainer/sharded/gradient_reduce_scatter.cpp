#include "trainer/sharded/gradient_reduce_scatter.h"

#include "trainer/sharded/wait_all.h"

#include <memory>

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

namespace mantissa::detail::sharded {

/// Tells its owner that autograd finished accumulating one parameter's gradient. Python:
/// `param.register_post_accumulate_grad_hook(...)`.
struct GradReadyHook final : torch::autograd::PostAccumulateGradHook {
  GradReadyHook(GradientReduceScatter* owner, std::size_t param) : owner_(owner), param_(param) {}
  void operator()(const torch::autograd::Variable& /*param*/) override {
    owner_->on_grad_ready(param_);
  }

 private:
  GradientReduceScatter* owner_;
  std::size_t param_;
};

GradientReduceScatter::GradientReduceScatter(FlatParameters& flat,
                                             c10::intrusive_ptr<c10d::ProcessGroup> group,
                                             std::size_t max_in_flight)
    : flat_(flat), group_(std::move(group)), max_in_flight_(max_in_flight) {
  TORCH_CHECK_VALUE(group_ && group_->getSize() == flat_.world_size(),
                    "GradientReduceScatter: the process group has ", group_ ? group_->getSize() : 0,
                    " ranks, the layout was planned for ", flat_.world_size());
  const auto& layout = flat_.layout();
  expected_.assign(layout.buckets.size(), 0);
  ready_.assign(layout.buckets.size(), 0);
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    const auto& bucket = layout.buckets[b];
    shards_.push_back(at::zeros({bucket.shard_numel}, flat_.buffer(b).options()));
    for (const auto& slot : bucket.slots) {
      if (flat_.params()[slot.param].requires_grad()) ++expected_[b];
    }
  }
  for (std::size_t i = 0; i < flat_.params().size(); ++i) {
    const auto& p = flat_.params()[i];
    if (!p.requires_grad()) continue;
    TORCH_CHECK_VALUE(torch::autograd::impl::post_acc_grad_hooks(p) == nullptr,
                      "GradientReduceScatter: parameter ", i,
                      " already has a post-accumulate-grad hook; a sharded run needs that slot");
    torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<GradReadyHook>(this, i));
  }
}

GradientReduceScatter::~GradientReduceScatter() {
  for (const auto& p : flat_.params()) {
    if (p.requires_grad()) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

void GradientReduceScatter::prepare_for_backward(bool sync) {
  armed_ = sync;
  next_bucket_ = 0;
  launched_in_backward_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
}

void GradientReduceScatter::on_grad_ready(std::size_t param) {
  if (!armed_) return;
  const auto bucket = flat_.layout().where[param].first;
  ++ready_[bucket];
  launch_ready_buckets();
}

void GradientReduceScatter::launch_ready_buckets() {
  while (next_bucket_ < ready_.size() && ready_[next_bucket_] == expected_[next_bucket_]) {
    launch(next_bucket_);
    ++launched_in_backward_;  // only the hooks come here
    ++next_bucket_;
  }
}

void GradientReduceScatter::launch(std::size_t b) {
  const auto& bucket = flat_.layout().buckets[b];
  at::NoGradGuard no_grad;
  auto flat = at::zeros({bucket.padded_numel}, shards_[b].options());
  const auto inverse_world_size =
      at::native::wrapped_scalar_tensor(1.0 / static_cast<double>(flat_.world_size()));
  for (const auto& slot : bucket.slots) {
    auto& p = flat_.params()[slot.param];
    auto& grad = p.mutable_grad();
    if (!grad.defined()) continue;  // no gradient this step: zeros, as DDP reduces it
    // Divided while copied, by the op and the scalar DDP's Reducer uses.
    auto into = flat.narrow(0, slot.offset, slot.numel);
    at::mul_out(into, grad.reshape({-1}), inverse_world_size);
    grad.reset();  // the whole gradient is freed: only the shard stays (ZeRO-2)
  }
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  if (max_in_flight_ > 0 && pending_.size() >= max_in_flight_) {
    // The oldest finished first, so that its input is freed before this one's lives on.
    pending_.front()->wait();
    pending_.erase(pending_.begin());
    in_flight_.erase(in_flight_.begin());
  }
  pending_.push_back(group_->_reduce_scatter_base(shards_[b], flat, options));
  in_flight_.push_back(std::move(flat));
}

void GradientReduceScatter::finish_backward() {
  if (!armed_) return;
  armed_ = false;
  // Buckets whose gradients did not all come (unused parameters) go now, still in order.
  while (next_bucket_ < ready_.size()) launch(next_bucket_++);
  auto pending = std::move(pending_);
  pending_.clear();
  try {
    wait_all(pending);
  } catch (...) {
    in_flight_.clear();
    throw;
  }
  in_flight_.clear();
}

}  // namespace mantissa::detail::sharded
