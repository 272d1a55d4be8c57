#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <mantissa/batch.h>
#include <mantissa/precision_plan.h>
#include <mantissa/trainer_callback.h>
#include <mantissa/trainer_hooks.h>
#include <mantissa/training_arguments.h>

namespace mantissa {

namespace amp {
class GradScaler;
}

/// What `Trainer::train()` returns. Python: `transformers.trainer_utils.TrainOutput`.
struct TrainOutput {
  std::int64_t global_step = 0;
  /// Mean training loss over the whole run (non-finite losses filtered as in the logs).
  double training_loss = 0.0;
  /// train_runtime, train_samples_per_second, train_steps_per_second, train_loss, epoch.
  LogEntry metrics;
};

/// The training loop of Hugging Face `Trainer`, in C++, with mantissa's precision mechanics:
/// autocast, a dynamic GradScaler for fp16, fp32 master weights for low-precision models, TF32.
///
///     auto args = mantissa::TrainingArguments::parse(argc, argv);   // --bf16 --learning_rate 3e-4
///     mantissa::Trainer trainer(model, args, train_dataset, eval_dataset);
///     trainer.train();
///     trainer.evaluate();
///
/// Python: `Trainer(model=model, args=args, train_dataset=..., eval_dataset=...).train()`.
///
/// The model is a LibTorch module holder (or `shared_ptr`) whose `forward(Tensor)` returns
/// logits; the default loss is cross-entropy on `batch.target`, and evaluation reports
/// `eval_loss` and, for classification, `eval_accuracy`. Give `set_compute_loss` for anything
/// else. Each step: forward and loss under autocast, loss / accumulation, scaled backward; at
/// the accumulation boundary master grads, `unscale_`, `clip_grad_norm_`, `step` (skipped on
/// overflow), cast back, scale update, and the scheduler only if the step ran. Steps sync with
/// the device only to log (every `logging_steps`), to decide an fp16 skip, or to save.
/// Move-only.
class Trainer {
 public:
  /// The functions a Trainer takes (include/mantissa/trainer_hooks.h), also spelled as
  /// members: `Trainer::LossFn` is `mantissa::LossFn`.
  using LossFn = mantissa::LossFn;
  using MetricsFn = mantissa::MetricsFn;
  using ForwardFn = mantissa::ForwardFn;
  using OptimizerFactory = mantissa::OptimizerFactory;
  using SchedulerFactory = mantissa::SchedulerFactory;

  /// A model, the arguments (validated here) and a training dataset.
  template <typename Model, typename TrainDataset>
  Trainer(Model model, TrainingArguments args, TrainDataset train_dataset)
      : Trainer(module_of(model), forward_of(model), std::move(args),
                make_batch_source(std::move(train_dataset)), std::nullopt) {}

  /// The same with an evaluation dataset, used by `evaluate()` and `eval_strategy`.
  template <typename Model, typename TrainDataset, typename EvalDataset>
  Trainer(Model model, TrainingArguments args, TrainDataset train_dataset, EvalDataset eval_dataset)
      : Trainer(module_of(model), forward_of(model), std::move(args),
                make_batch_source(std::move(train_dataset)),
                make_batch_source(std::move(eval_dataset))) {}

  /// The type-erased form the templates call.
  Trainer(std::shared_ptr<torch::nn::Module> module, ForwardFn forward, TrainingArguments args,
          BatchSource train, std::optional<BatchSource> eval);

  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer();

  /// Replaces the default loss (cross-entropy of `forward(batch.data)` against `batch.target`).
  Trainer& set_compute_loss(LossFn fn);
  /// Adds metrics to `evaluate()` from the concatenated logits and targets.
  Trainer& set_compute_metrics(MetricsFn fn);
  /// Replaces the optimizer chosen by `args.optim`.
  Trainer& set_optimizer_factory(OptimizerFactory factory);
  /// Replaces the schedule chosen by `args.lr_scheduler_type` (e.g. an `LrScheduler` built
  /// from a lambda). It is stepped only after optimizer steps that ran, as HF does.
  Trainer& set_lr_scheduler_factory(SchedulerFactory factory);
  /// Adds a callback. Python: `trainer.add_callback(cb)`.
  Trainer& add_callback(std::shared_ptr<TrainerCallback> callback);

  /// Trains for `max_steps` or `num_train_epochs`, resuming from `args.resume_from_checkpoint`
  /// when set. Python: `trainer.train()`. Throws with a message saying what to change on bad
  /// input (empty dataset, existing output_dir, ...) before any work, and when training
  /// diverges (fp16 overflow that does not stop, consecutive non-finite losses).
  TrainOutput train();
  /// Trains resuming from `checkpoint` (a `checkpoint-<step>` folder, or "latest").
  /// Python: `trainer.train(resume_from_checkpoint=checkpoint)`.
  TrainOutput train(const std::string& checkpoint);

  /// Runs the evaluation dataset (no grad, autocast as in training, or the model cast to
  /// bf16/fp16 for `bf16_full_eval`/`fp16_full_eval` outside training) and returns eval_loss,
  /// eval_accuracy (classification), user metrics, eval_runtime, eval_samples_per_second.
  /// Python: `trainer.evaluate()`. Syncs.
  LogEntry evaluate();

  /// Writes `model.safetensors` and `training_args.json` into `dir`. Python:
  /// `trainer.save_model(dir)`.
  void save_model(const std::string& dir) const;

  const TrainerState& state() const;
  const TrainingArguments& args() const;
  /// The precision plan for this model and these arguments.
  const PrecisionPlan& precision_plan() const;
  /// The loss scaler (disabled unless fp16).
  const amp::GradScaler& scaler() const;
  /// The optimizer; created on first use (by `train()` or here).
  torch::optim::Optimizer& optimizer();

 private:
  template <typename T>
  static std::shared_ptr<torch::nn::Module> module_of(const torch::nn::ModuleHolder<T>& model) {
    return model.ptr();
  }
  template <typename T>
  static std::shared_ptr<torch::nn::Module> module_of(const std::shared_ptr<T>& model) {
    return model;
  }
  template <typename Model>
  static ForwardFn forward_of(Model model) {
    return [model](const torch::Tensor& input) mutable { return model->forward(input); };
  }

  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mantissa
