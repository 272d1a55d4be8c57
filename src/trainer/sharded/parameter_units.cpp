#include "trainer/sharded/parameter_units.h"

#include "trainer/sharded/wait_all.h"

#include <algorithm>
#include <exception>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace mantissa::detail::sharded {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

ParameterUnits* units_of(AutogradContext* ctx) {
  return reinterpret_cast<ParameterUnits*>(ctx->saved_data["units"].toInt());
}

void remember(AutogradContext* ctx, ParameterUnits* units, std::size_t u) {
  ctx->saved_data["units"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(units));
  ctx->saved_data["unit"] = static_cast<std::int64_t>(u);
}

std::size_t unit_of(AutogradContext* ctx) {
  return static_cast<std::size_t>(ctx->saved_data["unit"].toInt());
}

// Where a boundary node sits on a block, and so what its backward does.
enum class Boundary : std::int64_t {
  kInput,   // its backward runs once the block's backward is done: frees the block
  kOutput,  // its backward runs before the block's: gathers the block again
};

// The identity on a block's input or output, whose backward frees or gathers the block. Python:
// FSDP2's RegisterPostBackwardFunction and its pre-backward hook on the forward's outputs.
struct BlockBoundary : torch::autograd::Function<BlockBoundary> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, ParameterUnits* units,
                            std::size_t u, Boundary where) {
    remember(ctx, units, u);
    ctx->saved_data["where"] = static_cast<std::int64_t>(where);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto where = static_cast<Boundary>(ctx->saved_data["where"].toInt());
    if (where == Boundary::kInput) {
      units_of(ctx)->after_block_backward(unit_of(ctx));
    } else {
      units_of(ctx)->before_block_backward(unit_of(ctx));
    }
    return {grads.at(0), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

ParameterUnits::ParameterUnits(FlatParameters& flat, c10::intrusive_ptr<c10d::ProcessGroup> group,
                               std::vector<std::string> names)
    : flat_(flat), group_(std::move(group)), names_(std::move(names)) {
  TORCH_CHECK_VALUE(flat_.storage() == FlatStorage::kShardsOnly,
                    "ParameterUnits: the flat parameters keep whole buffers");
  TORCH_CHECK_VALUE(group_ && group_->getSize() == flat_.world_size(),
                    "ParameterUnits: the process group has ", group_ ? group_->getSize() : 0,
                    " ranks, the layout was planned for ", flat_.world_size());
  buckets_.resize(names_.size());
  const auto& buckets = flat_.layout().buckets;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    TORCH_CHECK_VALUE(buckets[b].unit < names_.size(), "ParameterUnits: bucket ", b,
                      " belongs to unit ", buckets[b].unit, " of ", names_.size());
    buckets_[buckets[b].unit].push_back(b);
  }
  state_.assign(names_.size(), State::kFree);
  works_.resize(names_.size());
  ran_.assign(names_.size(), false);
}

ParameterUnits::~ParameterUnits() {
  // Nothing may still write into a buffer: wait for gathers in flight (errors were or will be
  // reported by the step that started them).
  for (auto& works : works_) {
    for (auto& work : works) {
      try {
        work->wait();
      } catch (...) {
      }
    }
  }
}

std::int64_t ParameterUnits::gathered_numel(std::size_t u) const {
  std::int64_t numel = 0;
  for (const auto b : buckets_.at(u)) numel += flat_.layout().buckets[b].padded_numel;
  return numel;
}

std::int64_t ParameterUnits::gathered_bytes(std::size_t u) const {
  std::int64_t bytes = 0;
  for (const auto b : buckets_.at(u)) {
    const auto& bucket = flat_.layout().buckets[b];
    bytes += bucket.padded_numel * static_cast<std::int64_t>(c10::elementSize(bucket.dtype));
  }
  return bytes;
}

std::vector<at::Tensor> ParameterUnits::params(std::size_t u) const {
  std::vector<at::Tensor> params;
  for (const auto b : buckets_.at(u)) {
    for (const auto& slot : flat_.layout().buckets[b].slots) params.push_back(flat_.params()[slot.param]);
  }
  return params;
}

void ParameterUnits::start_gather(std::size_t u) {
  if (state_.at(u) != State::kFree) return;
  at::NoGradGuard no_grad;
  for (const auto b : buckets_[u]) {
    flat_.allocate_buffer(b);
    auto output = flat_.buffer(b);
    auto input = flat_.shard(b);
    works_[u].push_back(group_->_allgather_base(output, input));
  }
  state_[u] = State::kGathering;
}

void ParameterUnits::wait(std::size_t u) {
  if (state_.at(u) != State::kGathering) return;
  auto works = std::move(works_[u]);
  works_[u].clear();
  state_[u] = State::kGathered;
  wait_all(works);
}

void ParameterUnits::gather(std::size_t u) {
  start_gather(u);
  wait(u);
}

void ParameterUnits::release(std::size_t u) {
  if (pins_ > 0 || state_.at(u) == State::kFree) return;
  wait(u);
  for (const auto b : buckets_[u]) flat_.free_buffer(b);
  state_[u] = State::kFree;
}

void ParameterUnits::gather_all() {
  for (std::size_t u = 0; u < size(); ++u) start_gather(u);
  for (std::size_t u = 0; u < size(); ++u) wait(u);
}

void ParameterUnits::release_all() {
  for (std::size_t u = 0; u < size(); ++u) release(u);
}

ParameterUnits::Pin::Pin(ParameterUnits& units) : units_(units) {
  units_.gather_all();
  ++units_.pins_;
}

ParameterUnits::Pin::~Pin() {
  if (--units_.pins_ == 0) units_.release_all();
}

void ParameterUnits::begin_forward() {
  if (deferred_ != nullptr) std::rethrow_exception(std::exchange(deferred_, nullptr));
  if (!order_.empty()) last_order_ = order_;
  order_.clear();
  gather(0);
}

void ParameterUnits::end_forward(bool training) noexcept {
  forward_ended_ = true;
  if (training) return;
  try {
    release_all();
  } catch (...) {
    if (deferred_ == nullptr) deferred_ = std::current_exception();
  }
}

void ParameterUnits::finish() {
  release_all();
  if (deferred_ != nullptr) std::rethrow_exception(std::exchange(deferred_, nullptr));
}

void ParameterUnits::check_blocks_ran() const {
  if (!forward_ended_) return;
  for (std::size_t u = 1; u < size(); ++u) {
    TORCH_CHECK_VALUE(ran_[u], "fsdp: the block ", names_[u],
                      " is a sharding unit, but the model's forward did not run it through "
                      "run_block, so its parameters would be read while freed; run each block "
                      "through mantissa::nn::SupportsGradientCheckpointing::run_block (docs/"
                      "distributed.md, \"Declaring blocks\"), or leave its class out of "
                      "transformer_layer_cls_to_wrap");
  }
}

std::optional<std::size_t> ParameterUnits::neighbour(const std::vector<std::size_t>& order,
                                                     std::size_t u, int step) {
  const auto at = std::find(order.begin(), order.end(), u);
  if (at == order.end()) return std::nullopt;
  if (step > 0) {
    const auto next = std::next(at);
    if (next == order.end()) return std::nullopt;
    return *next;
  }
  if (at == order.begin()) return std::nullopt;
  return *std::prev(at);
}

at::Tensor ParameterUnits::run_block(std::size_t u,
                                     const std::function<at::Tensor(const at::Tensor&)>& fn,
                                     const at::Tensor& x) {
  TORCH_INTERNAL_ASSERT(u > 0 && u < size(), "ParameterUnits: run_block of unit ", u);
  ran_[u] = true;
  order_.push_back(u);
  gather(u);
  if (const auto next = neighbour(last_order_, u, +1)) start_gather(*next);
  const bool recorded = at::GradMode::is_enabled();
  const auto input =
      recorded && x.requires_grad() ? BlockBoundary::apply(x, this, u, Boundary::kInput) : x;
  auto y = fn(input);
  if (recorded && y.requires_grad()) y = BlockBoundary::apply(y, this, u, Boundary::kOutput);
  release(u);
  return y;
}

void ParameterUnits::before_block_backward(std::size_t u) {
  gather(u);
  if (const auto previous = neighbour(order_, u, -1)) start_gather(*previous);
}

void ParameterUnits::after_block_backward(std::size_t u) { release(u); }

}  // namespace mantissa::detail::sharded
