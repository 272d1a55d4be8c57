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
#include <mantissa/fp8/convert.h>
#include <mantissa/io/state_dict.h>
#include <mantissa/model_forward.h>
#include <mantissa/model_output.h>
#include <mantissa/precision_plan.h>
#include <mantissa/trainer_callback.h>
#include <mantissa/trainer_hooks.h>
#include <mantissa/training_arguments.h>

namespace mantissa {

namespace fp8 {
class Float8ScalingState;
}  // namespace fp8
namespace amp {
class GradScaler;
}
class LrScheduler;

/// What `Trainer::train()` returns. Python: `transformers.trainer_utils.TrainOutput`.
struct TrainOutput {
  std::int64_t global_step = 0;
  /// Mean training loss over the whole run (non-finite losses filtered as in the logs).
  double training_loss = 0.0;
  /// train_runtime, train_samples_per_second, train_steps_per_second, train_loss, epoch.
  LogEntry metrics;
};

/// What `Trainer::predict()` returns. Python: `transformers.trainer_utils.PredictionOutput`.
struct PredictionOutput {
  /// The logits of every example (or what `preprocess_logits_for_metrics` made of them),
  /// concatenated along dimension 0, on the CPU, in fp32 for floating logits. Batches whose
  /// dimension 1 differs (sequences of different lengths) are padded with -100, as HF does.
  torch::Tensor predictions;
  /// The labels of every example (the first of `label_names`), concatenated and padded the
  /// same way; undefined when the dataset has no labels.
  torch::Tensor label_ids;
  /// `<prefix>_loss` (when a loss was computed), the user's metrics, `<prefix>_runtime`,
  /// `<prefix>_samples_per_second`, `<prefix>_steps_per_second`.
  LogEntry metrics;
};

/// The training loop of Hugging Face `Trainer`, in C++, with mantissa's precision mechanics:
/// autocast, a dynamic GradScaler for fp16, fp32 master weights for low-precision models, TF32.
///
///     auto args = mantissa::TrainingArguments::parse(argc, argv);   // --bf16 --learning_rate 3e-4
///     mantissa::Trainer trainer(model, args, train_dataset, eval_dataset);
///     trainer.train();
///     trainer.evaluate();
///     auto predictions = trainer.predict(test_dataset);
///
/// Python: `Trainer(model=model, args=args, train_dataset=..., eval_dataset=...).train()`.
///
/// The model is a LibTorch module holder (or `shared_ptr`) whose `forward` takes the batch
/// (`const mantissa::Batch&`, entries by name) or its first tensors, and returns logits or a
/// `ModelOutput` (see `make_forward`). A loss the model returns is the training loss, as in
/// HF; else the loss is cross-entropy of the logits against the labels (`label_names`; by
/// default the entry `labels`, else `target`). Give `set_compute_loss` for anything else.
/// Evaluation reports `eval_loss` and, for classification, `eval_accuracy`.
///
/// Each step: forward and loss under autocast, loss / accumulation, scaled backward; at the
/// accumulation boundary master grads, `unscale_`, `clip_grad_norm_`, `step` (skipped on
/// overflow), cast back, scale update, and the scheduler only if the step ran. Steps sync with
/// the device only to log (every `logging_steps`), to decide an fp16 skip, or to save.
/// Move-only.
///
/// Started as several processes (torchrun, or `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`),
/// the constructor joins the job, and the Trainer trains data parallel (docs/distributed.md).
/// Every process must then make the same calls in the same order: the constructor, `train`,
/// `evaluate`, `predict` and the first `optimizer()` / `lr_scheduler()` talk to the other
/// processes, and one process calling them alone waits for the others until `ddp_timeout`.
/// `save_model` writes on the saving process only (rank 0), as HF's.
class Trainer {
 public:
  /// The functions a Trainer takes (include/mantissa/trainer_hooks.h), also spelled as
  /// members: `Trainer::LossFn` is `mantissa::LossFn`.
  using LossFn = mantissa::LossFn;
  using LossWithOutputsFn = mantissa::LossWithOutputsFn;
  using LossFromOutputsFn = mantissa::LossFromOutputsFn;
  using MetricsFn = mantissa::MetricsFn;
  using PreprocessLogitsFn = mantissa::PreprocessLogitsFn;
  using ForwardFn = mantissa::ForwardFn;
  using OptimizerFactory = mantissa::OptimizerFactory;
  using SchedulerFactory = mantissa::SchedulerFactory;

  /// A model, the arguments (validated here) and a training dataset: a `torch::data` dataset
  /// (see `make_batch_source`) or a `BatchSource`.
  template <typename Model, typename TrainDataset>
  Trainer(Model model, TrainingArguments args, TrainDataset train_dataset)
      : Trainer(module_of(model), make_forward(model), std::move(args),
                make_batch_source(std::move(train_dataset)), std::nullopt) {}

  /// The same with an evaluation dataset, used by `evaluate()` and `eval_strategy`.
  template <typename Model, typename TrainDataset, typename EvalDataset>
  Trainer(Model model, TrainingArguments args, TrainDataset train_dataset, EvalDataset eval_dataset)
      : Trainer(module_of(model), make_forward(model), std::move(args),
                make_batch_source(std::move(train_dataset)),
                make_batch_source(std::move(eval_dataset))) {}

  /// The type-erased form the templates call: the module (whose parameters train) and its
  /// forward pass on a batch.
  Trainer(std::shared_ptr<torch::nn::Module> module, ForwardFn forward, TrainingArguments args,
          BatchSource train, std::optional<BatchSource> eval);
  /// The same with a forward from one tensor to logits, which receives the batch's first
  /// entry (`forward_of_first_entry`).
  Trainer(std::shared_ptr<torch::nn::Module> module,
          std::function<torch::Tensor(const torch::Tensor&)> forward, TrainingArguments args,
          BatchSource train, std::optional<BatchSource> eval);

  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer();

  /// Replaces the default loss (the model's own, else cross-entropy against the labels).
  Trainer& set_compute_loss(LossFn fn);
  /// Replaces the default loss with one that also returns the model's outputs, which
  /// evaluation and `predict()` then use instead of running the forward again.
  Trainer& set_compute_loss(LossWithOutputsFn fn);
  /// Replaces the default loss with a function of the model's outputs and the batch; the
  /// Trainer runs the forward once. Python: `Trainer(compute_loss_func=fn)`.
  Trainer& set_compute_loss_func(LossFromOutputsFn fn);
  /// Adds metrics to `evaluate()` and `predict()` from the concatenated logits and labels.
  /// Python: `Trainer(compute_metrics=fn)`.
  Trainer& set_compute_metrics(MetricsFn fn);
  /// Reduces each evaluation batch's logits before they are kept for `compute_metrics` and
  /// `predict()`. Python: `Trainer(preprocess_logits_for_metrics=fn)`.
  Trainer& set_preprocess_logits_for_metrics(PreprocessLogitsFn fn);
  /// Replaces the optimizer chosen by `args.optim`.
  Trainer& set_optimizer_factory(OptimizerFactory factory);
  /// With `--fp8`, picks which of the model's `Float8Linear` layers run in FP8, instead of
  /// `fp8::default_float8_filter` (dimensions multiples of 16, not the first or last linear
  /// layer). Call it before the first `train()` or `evaluate()`, which convert the model.
  /// Python: torchao's `convert_to_float8_training(model, module_filter_fn=fn)`.
  Trainer& set_float8_filter(fp8::Float8Filter filter);
  /// Replaces the schedule chosen by `args.lr_scheduler_type` (e.g. an `LrScheduler` built
  /// from a lambda). It is stepped only after optimizer steps that ran, as HF does.
  Trainer& set_lr_scheduler_factory(SchedulerFactory factory);
  /// Adds a callback. Python: `trainer.add_callback(cb)`.
  Trainer& add_callback(std::shared_ptr<TrainerCallback> callback);

  /// Trains for `max_steps` or `num_train_epochs`, resuming from `args.resume_from_checkpoint`
  /// when set. Python: `trainer.train()`. Throws with a message saying what to change on bad
  /// input (empty dataset, existing output_dir, ...) before any work, and when training
  /// diverges (fp16 overflow that does not stop, consecutive non-finite losses). With
  /// `load_best_model_at_end`, the model ends with the weights of the best checkpoint.
  TrainOutput train();
  /// Trains resuming from `checkpoint` (a `checkpoint-<step>` folder, or "latest").
  /// Python: `trainer.train(resume_from_checkpoint=checkpoint)`.
  TrainOutput train(const std::string& checkpoint);

  /// Runs the evaluation dataset (no grad, autocast as in training, or the model cast to
  /// bf16/fp16 for `bf16_full_eval`/`fp16_full_eval` outside training) and returns eval_loss,
  /// eval_accuracy (classification), user metrics, eval_runtime, eval_samples_per_second,
  /// eval_steps_per_second; logs them and fires `on_evaluate`. Python: `trainer.evaluate()`.
  /// Syncs.
  LogEntry evaluate();
  /// The same with the metrics named `<metric_key_prefix>_loss`, ... . Python:
  /// `trainer.evaluate(metric_key_prefix=...)`.
  LogEntry evaluate(const std::string& metric_key_prefix);
  /// Evaluates another dataset. Python: `trainer.evaluate(eval_dataset, metric_key_prefix=...)`.
  LogEntry evaluate(BatchSource dataset, const std::string& metric_key_prefix = "eval");
  /// The same for a `torch::data` dataset.
  template <typename Dataset,
            typename = std::enable_if_t<!std::is_convertible_v<Dataset, std::string> &&
                                        !std::is_same_v<std::decay_t<Dataset>, BatchSource>>>
  LogEntry evaluate(Dataset dataset, const std::string& metric_key_prefix = "eval") {
    return evaluate(make_batch_source(std::move(dataset)), metric_key_prefix);
  }

  /// Runs `dataset` as an evaluation does and returns its predictions, labels and metrics
  /// (prefixed `test_` by default); fires `on_predict`, logs nothing. Python:
  /// `trainer.predict(test_dataset, metric_key_prefix="test")`. Syncs.
  PredictionOutput predict(BatchSource dataset, const std::string& metric_key_prefix = "test");
  /// The same for a `torch::data` dataset.
  template <typename Dataset,
            typename = std::enable_if_t<!std::is_same_v<std::decay_t<Dataset>, BatchSource>>>
  PredictionOutput predict(Dataset dataset, const std::string& metric_key_prefix = "test") {
    return predict(make_batch_source(std::move(dataset)), metric_key_prefix);
  }

  /// Writes `model.safetensors` (the model's full state, whatever the strategy holds on each
  /// process; above 50 GB, HF's default, shards with their index, as `save_pretrained` does:
  /// `io::save_pretrained_weights`), `config.json` for a model that is an
  /// `nn::HasPretrainedConfig` (so that `from_pretrained(dir)` loads it in Python) and
  /// `training_args.json` into `dir`, on the processes that save. In a job of several
  /// processes every process calls it, as in Python. Python: `trainer.save_model(dir)`.
  void save_model(const std::string& dir) const;
  /// The model's whole state (parameters then buffers, under HF's names) as full tensors on the
  /// processes that save (rank 0); other processes get an empty list. Under full sharding
  /// (`--fsdp`) the parameters live as shards and are empty outside a forward, so this is the
  /// way to read the trained weights: they are gathered one unit at a time and copied to the
  /// CPU. Otherwise the tensors are the model's own. In a job of several processes every
  /// process calls it. Python: `get_model_state_dict(model, options=StateDictOptions(
  /// full_state_dict=True))`, or `model.state_dict()`. No sync beyond the gathers.
  io::NamedTensors model_state_dict() const;

  const TrainerState& state() const;
  const TrainingArguments& args() const;
  /// The precision plan for this model and these arguments.
  const PrecisionPlan& precision_plan() const;
  /// The loss scaler (disabled unless fp16).
  const amp::GradScaler& scaler() const;
  /// The optimizer; created on first use (by `train()` or here). Python: `trainer.optimizer`.
  torch::optim::Optimizer& optimizer();
  /// The learning-rate scheduler; created with the optimizer. Python: `trainer.lr_scheduler`.
  LrScheduler& lr_scheduler();
  /// With `--fp8 --fp8_recipe delayed`: every FP8 layer's amax history and scales (docs/fp8.md),
  /// made with the optimizer; null before that and for other runs. Python: the `fp8_meta` of
  /// TransformerEngine's modules. Reading its tensors does not sync; `state_dict()` does.
  const fp8::Float8ScalingState* fp8_scaling_state() const;

 private:
  template <typename T>
  static std::shared_ptr<torch::nn::Module> module_of(const torch::nn::ModuleHolder<T>& model) {
    return model.ptr();
  }
  template <typename T>
  static std::shared_ptr<torch::nn::Module> module_of(const std::shared_ptr<T>& model) {
    return model;
  }

  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mantissa
