#include "trainer/gradient_sync.h"

#include <limits>
#include <unordered_set>

#include <torch/csrc/distributed/c10d/reducer.hpp>

namespace mantissa::detail {
namespace {

constexpr std::int64_t kMiB = 1024 * 1024;

/// The bf16 twin of c10d's FP16CompressCommHook (Python: `bf16_compress_hook`): each bucket is
/// divided by the world size, cast to bf16, summed across the processes and cast back into the
/// bucket. bf16 keeps fp32's range, so unlike fp16 it cannot overflow where fp32 did not.
/// Written here because c10d ships only the fp16 hook in C++.
class Bf16CompressHook final
    : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  explicit Bf16CompressHook(const c10::intrusive_ptr<c10d::ProcessGroup>& group)
      : CppCommHookInterface(group) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    auto buffer = bucket.getBufferRef();
    std::vector<at::Tensor> compressed{
        buffer.to(at::kBFloat16).div_(static_cast<double>(state_->getSize()))};
    auto reduced = state_->allreduce(compressed)->getFuture();
    return reduced->then(
        [buffer](c10::ivalue::Future& done) {
          buffer.copy_(done.value().toTensorVector().at(0));
          return c10::IValue(buffer);
        },
        c10::TensorType::get());
  }
};

}  // namespace

GradientSync::GradientSync(const Collectives& group, torch::nn::Module& module,
                           const TrainingArguments& args)
    : group_(group),
      module_(module),
      find_unused_parameters_(args.resolved_ddp_find_unused_parameters()),
      broadcast_buffers_(args.resolved_ddp_broadcast_buffers()) {
  // Each tensor once: a tied weight (registered under two names) has one gradient, and DDP
  // (`_build_params_for_reducer`) averages it once.
  std::vector<torch::Tensor> params;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : module.parameters()) {
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  }
  TORCH_CHECK_VALUE(!params.empty(),
                    "the model has no parameter that requires a gradient, so "
                    "there is nothing to average across the processes");

  // DDP's sizes: unset bucket_cap_mb gives 25 MiB buckets after a first one of 1 MiB; a set one
  // caps every bucket. Without find_unused_parameters the first iteration runs with a single
  // bucket, and the buckets are then rebuilt in the order the gradients arrived.
  const bool default_cap = !args.ddp_bucket_cap_mb().has_value();
  const std::int64_t cap = args.resolved_ddp_bucket_cap_mb() * kMiB;
  const std::int64_t first_cap = default_cap ? c10d::kDefaultFirstBucketBytes : cap;
  std::vector<std::size_t> limits;
  if (!find_unused_parameters_) {
    limits = {std::numeric_limits<std::size_t>::max()};
  } else if (default_cap) {
    limits = {static_cast<std::size_t>(first_cap), static_cast<std::size_t>(cap)};
  } else {
    limits = {static_cast<std::size_t>(cap)};
  }
  const std::vector<bool> sparse(params.size(), false);
  auto buckets = std::get<0>(c10d::compute_bucket_assignment_by_size(params, limits, sparse));
  std::reverse(buckets.begin(), buckets.end());
  reducer_ = std::make_shared<c10d::Reducer>(
      params, std::move(buckets), group.group(), sparse, cap, find_unused_parameters_,
      /*gradient_as_bucket_view=*/false, std::unordered_map<std::size_t, std::string>{}, first_cap,
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      /*bucket_bytes_cap_list=*/std::vector<std::int64_t>{});
  if (args.ddp_comm_hook() == DdpCommHook::kFp16Compress) {
    reducer_->register_builtin_comm_hook(c10d::BuiltinCommHookType::FP16_COMPRESS);
  } else if (args.ddp_comm_hook() == DdpCommHook::kBf16Compress) {
    reducer_->register_comm_hook(std::make_unique<Bf16CompressHook>(group.group()));
  }
}

GradientSync::~GradientSync() = default;

void GradientSync::before_forward(bool sync) {
  if (sync) reducer_->prepare_for_forward();
  // Every rank reaches its first synced forward together, so the rebuild's broadcast matches.
  if (sync) {
    group_.guarded("rebuilding the gradient buckets", [&] { reducer_->rebuild_buckets(); });
  }
  if (broadcast_buffers_ && last_forward_synced_) {
    // Read anew each time, as DDP does: a cast of the module replaces its buffers' storage.
    std::vector<torch::Tensor> buffers;
    for (const auto& b : module_.buffers()) buffers.push_back(b.detach());
    group_.broadcast_tensors(buffers);
  }
}

void GradientSync::before_backward(const torch::Tensor& loss, bool sync) {
  last_forward_synced_ = sync;
  if (!sync) return;
  if (find_unused_parameters_) {
    reducer_->prepare_for_backward({loss});
  } else {
    reducer_->prepare_for_backward({});
  }
}

}  // namespace mantissa::detail
