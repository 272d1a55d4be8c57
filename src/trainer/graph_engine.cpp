#include "trainer/graph_engine.h"

#include "trainer/device_batch.h"

#include <exception>

#include <fmt/format.h>

namespace mantissa::detail {

std::optional<std::string> cuda_graph_blocker(const TrainingArguments& args,
                                              const PrecisionPlan& plan, const c10::Device& device,
                                              const optim::FusedAdamW* fused, bool from_factory) {
  if (auto why = cuda_graph_unavailable(device)) return why;
  if (fused == nullptr) {
    return fmt::format(
        "the optimizer ({}) is not mantissa's FusedAdamW, whose step reads the learning rate "
        "and the loss scale on the device; use --optim adamw_torch_fused",
        from_factory ? std::string("from set_optimizer_factory")
                     : std::string(args.optim().name()));
  }
  if (args.gradient_accumulation_steps() > 1) {
    return fmt::format(
        "gradient_accumulation_steps is {}; a captured step is one micro-batch and one update",
        args.gradient_accumulation_steps());
  }
  if (plan.loss_scaling && args.dynamic_loss_scale() && args.min_loss_scale() > 0) {
    return std::string("min_loss_scale > 0 checks the loss scale on the host after every overflow");
  }
  return std::nullopt;
}

std::unique_ptr<GraphEngine> make_graph_engine(EagerEngine& eager, const StepParts& parts,
                                               bool optimizer_from_factory) {
  if (!parts.args.cuda_graph()) return nullptr;
  if (auto why = parts.strategy.cuda_graph_blocker()) {
    parts.progress.print(fmt::format("cuda_graph: off, training eagerly: {}", *why));
    return nullptr;
  }
  if (auto why = cuda_graph_blocker(parts.args, parts.plan, parts.device, parts.fused,
                                    optimizer_from_factory)) {
    parts.progress.print(fmt::format("cuda_graph: off, training eagerly: {}", *why));
    return nullptr;
  }
  return std::make_unique<GraphEngine>(eager, parts);
}

GraphEngine::GraphEngine(EagerEngine& eager, StepParts parts)
    : eager_(eager), parts_(std::move(parts)), fused_(*parts_.fused) {
  // The whole run goes on the graph's own stream (see StepGraph), until this engine ends.
  graph_ = std::make_unique<StepGraph>(parts_.device);
  // A constructor that throws runs no destructor: undo what was set here before rethrowing.
  try {
    fused_.set_capturable(true);
    eager_.disable_autocast_cache();
    parts_.loss_window.count_updates_on_device();
  } catch (...) {
    fused_.set_capturable(false);
    throw;
  }
  parts_.progress.print(fmt::format("cuda_graph: the step is captured after {} eager warm-up steps",
                                    parts_.args.cuda_graph_warmup_steps()));
}

GraphEngine::~GraphEngine() {
  // Gradients are None after train(), as after an eager step, and nothing outside the graph
  // keeps its memory.
  try {
    eager_.clear_grads();
  } catch (const std::exception& e) {
    TORCH_WARN("cuda_graph: clearing the gradients after training failed: ", e.what());
  }
  captured_grads_.clear();
  captured_grad_norm_.reset();
  captured_scale_before_.reset();
  fused_.set_capturable(false);
  graph_.reset();
}

bool GraphEngine::train_batch(const Batch& batch, std::int64_t in_group, bool boundary) {
  if (updates_ < parts_.args.cuda_graph_warmup_steps()) {
    last_replayed_ = false;
    const bool updated = eager_.train_batch(batch, in_group, boundary);
    if (updated) ++updates_;
    return updated;
  }
  graphed_step(batch);
  ++updates_;
  return true;
}

torch::Tensor GraphEngine::last_grad_norm() const {
  return last_replayed_ ? captured_grad_norm_ : eager_.last_grad_norm();
}

void GraphEngine::graphed_step(const Batch& batch) {
  last_replayed_ = false;
  if (graph_->captured() && !graph_->fits(batch)) {
    const auto shape = describe_shapes(batch);
    if (eager_shapes_logged_.insert(shape).second) {
      parts_.progress.print(fmt::format(
          "cuda_graph: a batch of shape {} does not fit the captured step ({}); it runs eagerly",
          shape, graph_->describe_captured()));
    }
    eager_.clear_grads();  // the captured gradients must not be accumulated into
    eager_.forward_backward(batch, 1);
    eager_.update();
    // Show the graph's gradient tensors again (it keeps writing them on each replay).
    for (auto& [param, grad] : captured_grads_) param.mutable_grad() = grad;
    return;
  }
  if (!graph_->captured() && batch.num_examples() != parts_.args.per_device_train_batch_size()) {
    eager_.forward_backward(batch, 1);  // a short batch: capture the next full one instead
    eager_.update();
    return;
  }
  if (!graph_->captured()) capture(batch);
  parts_.callbacks.fire(&TrainerCallback::on_pre_optimizer_step);
  fused_.refresh_lr_tensors();
  graph_->replay(batch);
  last_replayed_ = true;
  eager_.update_on_host(captured_scale_before_, /*zero_grads=*/false);
}

void GraphEngine::capture(const Batch& batch) {
  eager_.clear_grads();  // captured from None, the backward writes the gradients, never adds
  graph_->capture(batch, [this](const Batch& inputs) {
    eager_.forward_backward(inputs, 1);
    eager_.update_on_device(/*with_callbacks=*/false);
  });
  captured_grad_norm_ = eager_.last_grad_norm();
  captured_scale_before_ = eager_.scale_before();
  captured_grads_.clear();
  auto keep = [&](const std::vector<torch::Tensor>& params) {
    for (const auto& p : params) {
      if (p.grad().defined()) captured_grads_.emplace_back(p, p.grad());
    }
  };
  keep(parts_.module.parameters());
  if (parts_.masters != nullptr) keep(parts_.masters->master_params());
  parts_.progress.print(fmt::format("cuda_graph: step {} captured ({}); replaying it from now on",
                                    parts_.state.global_step + 1, graph_->describe_captured()));
}

}  // namespace mantissa::detail
