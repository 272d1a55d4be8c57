#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/ArrayRef.h>
#include <torch/data/example.h>
#include <torch/data/transforms/stack.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

namespace mantissa {

namespace amp {
class GradScaler;
}
class LrScheduler;

/// A batch as the Trainer sees it: LibTorch's `Example<>` (`data`, `target`).
using Batch = torch::data::Example<>;

/// The Trainer's view of a dataset: how many examples, and how to gather a batch of them by
/// index. Built from any LibTorch dataset by the Trainer's constructors; build one by hand for
/// data that is not a `torch::data` dataset.
struct BatchSource {
  std::size_t size = 0;
  std::function<Batch(c10::ArrayRef<std::size_t> indices)> get_batch;
};

/// Builds a `BatchSource` from a `torch::data` dataset: a batch dataset whose `get_batch`
/// returns an `Example<>` (e.g. `dataset.map(Stack<>())`, or a custom `BatchDataset`), or an
/// example dataset whose batches are stacked here. The dataset is moved into the source.
template <typename Dataset>
BatchSource make_batch_source(Dataset dataset) {
  auto shared = std::make_shared<Dataset>(std::move(dataset));
  const auto size = shared->size();
  TORCH_CHECK_VALUE(size.has_value(), "the Trainer needs a dataset of known size");
  BatchSource source;
  source.size = *size;
  source.get_batch = [shared](c10::ArrayRef<std::size_t> indices) -> Batch {
    auto batch = shared->get_batch(indices);
    if constexpr (std::is_same_v<decltype(batch), Batch>) {
      return batch;
    } else {
      return torch::data::transforms::Stack<Batch>().apply_batch(std::move(batch));
    }
  };
  return source;
}

/// How one run computes: decided from the arguments and the model's parameter dtype, logged
/// once when training starts. See docs/trainer.md for the table of cases.
struct PrecisionPlan {
  /// dtype of the model's floating-point parameters when training starts.
  c10::ScalarType param_dtype = c10::kFloat;
  /// dtype matmuls and convs run in (fp32 when neither bf16 nor fp16 is in play).
  c10::ScalarType compute_dtype = c10::kFloat;
  /// Forward and loss under `amp::Autocast(device, compute_dtype)`.
  bool autocast = false;
  /// Dynamic (or static) loss scaling with `amp::GradScaler`: fp16 only.
  bool loss_scaling = false;
  /// With `loss_scaling`: the fixed scale of `--loss_scale`, or unset for dynamic scaling.
  std::optional<double> static_loss_scale;
  /// fp32 master copies of low-precision parameters (`amp::MasterWeights`).
  bool master_weights = false;
  /// Low-precision parameters updated in place, without masters.
  bool pure_low_precision = false;
  /// TF32 for fp32 matmuls/convs: set by `--tf32`, unset leaves LibTorch's setting alone.
  std::optional<bool> tf32;
  /// One line for the log: "bf16 autocast, fp32 weights, no loss scaling".
  std::string describe() const;
};

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
  /// Computes the loss of one batch (called under autocast). Python: `Trainer.compute_loss`.
  using LossFn = std::function<torch::Tensor(const Batch& batch)>;
  /// Turns all evaluation predictions (logits, on the CPU) and targets into metrics.
  /// Python: `compute_metrics(EvalPrediction)`. Keys get an `eval_` prefix when they lack one.
  using MetricsFn = std::function<LogEntry(const torch::Tensor& predictions, const torch::Tensor& targets)>;
  /// The model's forward pass, type-erased.
  using ForwardFn = std::function<torch::Tensor(const torch::Tensor& input)>;
  /// Builds the optimizer over the tensors the Trainer wants optimized (the fp32 masters when
  /// the model is low-precision, else the model's parameters), grouped for weight decay.
  /// Python: `Trainer(optimizers=(optimizer, None))` / `create_optimizer`.
  using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<torch::optim::OptimizerParamGroup> param_groups)>;

  /// Builds the LR scheduler over the Trainer's optimizer for a run of `num_training_steps`
  /// optimizer steps. Python: `Trainer(optimizers=(None, scheduler))` / `create_scheduler`.
  using SchedulerFactory = std::function<std::unique_ptr<LrScheduler>(torch::optim::Optimizer& optimizer,
                                                                      std::int64_t num_training_steps)>;

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

  /// Writes `model.safetensors` and `training_args.json` into `dir`. Python: `trainer.save_model(dir)`.
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
