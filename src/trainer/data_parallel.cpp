#include "trainer/data_parallel.h"

#include <fmt/format.h>

#include <mantissa/distributed.h>

namespace mantissa::detail {

DataParallel::DataParallel(std::shared_ptr<Collectives> collectives, const TrainingArguments& args)
    : ProcessGroupStrategy(std::move(collectives), args) {}

DataParallel::~DataParallel() = default;

std::string DataParallel::describe() const {
  return fmt::format(" x {} processes ({}, rank {})", world_size(),
                     distributed::backend_name(collectives().backend()), rank());
}

void DataParallel::prepare_model(torch::nn::Module& module) {
  agree_on_model(module, args().resolved_ddp_broadcast_buffers());
  gradient_sync_ = std::make_unique<GradientSync>(collectives(), module, args());
}

ForwardScope DataParallel::forward_context(const ForwardPass& pass) {
  if (!pass.training) return {};
  TORCH_INTERNAL_ASSERT(gradient_sync_ != nullptr, "DataParallel: prepare_model was not called");
  gradient_sync_->before_forward(pass.sync);
  return {};
}

void DataParallel::before_backward(const torch::Tensor& loss, bool sync) {
  gradient_sync_->before_backward(loss, sync);
}

bool DataParallel::run_step(const std::function<bool()>& step) const {
  return collectives().guarded("averaging the gradients", step);
}

std::optional<std::string> DataParallel::cuda_graph_blocker() const {
  return std::string(
      "this run averages gradients across processes, and c10d::Reducer does that from autograd "
      "hooks and host-side bucket bookkeeping on every backward, which a captured graph would "
      "not replay");
}

}  // namespace mantissa::detail
