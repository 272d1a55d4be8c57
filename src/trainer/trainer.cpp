// mantissa::Trainer: the facade. Every method forwards to Trainer::Impl (trainer_impl.h), which
// owns the pieces and wires them together.
#include <mantissa/trainer.h>

#include "fp8/trainer_fp8.h"
#include "trainer/trainer_impl.h"

namespace mantissa {

Trainer::Trainer(std::shared_ptr<torch::nn::Module> module, ForwardFn forward,
                 TrainingArguments args, BatchSource train, std::optional<BatchSource> eval)
    : impl_(std::make_unique<Impl>(std::move(module), std::move(forward), std::move(args),
                                   std::move(train), std::move(eval))) {}

Trainer::Trainer(std::shared_ptr<torch::nn::Module> module,
                 std::function<torch::Tensor(const torch::Tensor&)> forward, TrainingArguments args,
                 BatchSource train, std::optional<BatchSource> eval)
    : Trainer(std::move(module), forward_of_first_entry(std::move(forward)), std::move(args),
              std::move(train), std::move(eval)) {}

Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;
Trainer::~Trainer() = default;

Trainer& Trainer::set_compute_loss(LossFn fn) {
  TORCH_CHECK_VALUE(fn != nullptr, "set_compute_loss: the function is empty");
  impl_->hooks().compute_loss = [fn = std::move(fn)](const Batch& batch) {
    return std::pair<torch::Tensor, ModelOutput>(fn(batch), ModelOutput());
  };
  return *this;
}
Trainer& Trainer::set_compute_loss(LossWithOutputsFn fn) {
  TORCH_CHECK_VALUE(fn != nullptr, "set_compute_loss: the function is empty");
  impl_->hooks().compute_loss = std::move(fn);
  return *this;
}
Trainer& Trainer::set_compute_loss_func(LossFromOutputsFn fn) {
  TORCH_CHECK_VALUE(fn != nullptr, "set_compute_loss_func: the function is empty");
  impl_->hooks().compute_loss = [fn = std::move(fn),
                                 forward = impl_->forward()](const Batch& batch) {
    auto outputs = forward(batch);
    auto loss = fn(outputs, batch);
    return std::pair<torch::Tensor, ModelOutput>(std::move(loss), std::move(outputs));
  };
  return *this;
}
Trainer& Trainer::set_compute_metrics(MetricsFn fn) {
  impl_->hooks().compute_metrics = std::move(fn);
  return *this;
}
Trainer& Trainer::set_preprocess_logits_for_metrics(PreprocessLogitsFn fn) {
  impl_->hooks().preprocess_logits = std::move(fn);
  return *this;
}
Trainer& Trainer::set_optimizer_factory(OptimizerFactory factory) {
  TORCH_CHECK_VALUE(!impl_->prepared(),
                    "set_optimizer_factory must be called before the optimizer is created");
  impl_->hooks().optimizer_factory = std::move(factory);
  return *this;
}
Trainer& Trainer::set_float8_filter(fp8::Float8Filter filter) {
  TORCH_CHECK_VALUE(!impl_->prepared(),
                    "set_float8_filter must be called before the model is converted (before "
                    "the first train() or evaluate())");
  TORCH_CHECK_VALUE(static_cast<bool>(filter), "set_float8_filter: the filter is empty");
  // Without --fp8 there is nothing to filter.
  if (auto* fp8 = impl_->model_converter<fp8::TrainerFloat8Converter>()) {
    fp8->set_filter(std::move(filter));
  }
  return *this;
}
Trainer& Trainer::set_lr_scheduler_factory(SchedulerFactory factory) {
  TORCH_CHECK_VALUE(!impl_->prepared(),
                    "set_lr_scheduler_factory must be called before training starts");
  impl_->hooks().scheduler_factory = std::move(factory);
  return *this;
}
Trainer& Trainer::add_callback(std::shared_ptr<TrainerCallback> callback) {
  TORCH_CHECK_VALUE(callback != nullptr, "add_callback: the callback is null");
  impl_->add_callback(std::move(callback));
  return *this;
}

TrainOutput Trainer::train() { return impl_->train(std::nullopt); }
TrainOutput Trainer::train(const std::string& checkpoint) { return impl_->train(checkpoint); }

LogEntry Trainer::evaluate() { return evaluate(std::string("eval")); }

LogEntry Trainer::evaluate(const std::string& metric_key_prefix) {
  impl_->prepare();
  return impl_->evaluate(nullptr, metric_key_prefix, /*during_train=*/false);
}

LogEntry Trainer::evaluate(BatchSource dataset, const std::string& metric_key_prefix) {
  impl_->prepare();
  return impl_->evaluate(&dataset, metric_key_prefix, /*during_train=*/false);
}

PredictionOutput Trainer::predict(BatchSource dataset, const std::string& metric_key_prefix) {
  impl_->prepare();
  return impl_->predict(dataset, metric_key_prefix);
}

void Trainer::save_model(const std::string& dir) const { impl_->save_model(dir); }
io::NamedTensors Trainer::model_state_dict() const { return impl_->model_state_dict(); }

const TrainerState& Trainer::state() const { return impl_->state(); }
const TrainingArguments& Trainer::args() const { return impl_->args(); }
const PrecisionPlan& Trainer::precision_plan() const { return impl_->plan(); }
const amp::GradScaler& Trainer::scaler() const { return impl_->scaler(); }
torch::optim::Optimizer& Trainer::optimizer() {
  impl_->prepare();
  return impl_->optimizer();
}
LrScheduler& Trainer::lr_scheduler() {
  impl_->prepare();
  return impl_->lr_scheduler();
}
const fp8::Float8ScalingState* Trainer::fp8_scaling_state() const {
  const auto* fp8 = impl_->model_converter<fp8::TrainerFloat8Converter>();
  return fp8 != nullptr ? fp8->scaling_state() : nullptr;
}

}  // namespace mantissa
