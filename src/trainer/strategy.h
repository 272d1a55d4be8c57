#pragma once
// What spans processes, behind one interface: where this process sits in the job, the few
// collectives the loop needs, the data order, the evaluation gather, the gradient sync around
// the engine's forward and backward, and the checkpoint. The loop, the engines and the
// evaluation call a Strategy; none of them asks which one it is. Lightning's strategies
// (SingleDeviceStrategy, DDPStrategy, FSDPStrategy) divide the work the same way.
//
// Chosen once, by `make_strategy`, when the Trainer is built:
//   SingleProcess  a lone process (a null object: every collective is the value itself)
//   DataParallel   several processes, c10d::Reducer averaging the gradients during backward
//   ShardedDataParallel  several processes, gradients reduce-scattered and the optimizer state
//                  sharded across them (ZeRO-2, `--fsdp shard_grad_op`; parameters too with
//                  full sharding)
//   StateShardedDataParallel  data parallel with the optimizer state sharded by whole
//                  tensors (`--fsdp shard_grad_op` with Adafactor, Muon, 8-bit AdamW)
//   WholeTensorShardedDataParallel  full sharding with each tensor whole in one process's
//                  shard (a bare `--fsdp` with those optimizers)
//
// The methods that take or return data are collectives in a job of several processes: every
// process calls them, in the same order. One process runs them without communicating.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/io/state_dict.h>
#include <mantissa/precision_plan.h>
#include <mantissa/trainer_hooks.h>
#include <mantissa/training_arguments.h>

#include "trainer/checkpoint.h"
#include "trainer/checkpoint_io.h"
#include "trainer/optimizer_factory.h"

namespace mantissa::detail {

/// What an optimizer update steps, as the strategy builds it for the Trainer.
struct OptimizerSetup {
  /// The fp32 masters the engine copies gradients into and weights out of; null when the
  /// optimizer needs none from the engine (an fp32 model, pure low precision, or a strategy
  /// whose optimizer keeps masters of its own).
  std::unique_ptr<amp::MasterWeights> masters;
  /// The optimizer, its FusedAdamW view and the tensors it updates.
  TrainerOptimizer optimizer;
};

/// The optimizer (and fp32 masters, when `plan` asks for them) a data-parallel run of `args`
/// holds: the masters over `params` (the module's parameters in its order, or stand-ins of
/// them), the optimizer over `groups` (HF's weight-decay groups of those tensors), each group's
/// options (the learning rate the schedule has set, betas, eps, weight decay) taken from
/// `options_of` (a sharded process's optimizer of the same kind and groups). What a sharded
/// run's whole-state checkpoints are written from and read into. No sync.
OptimizerSetup data_parallel_optimizer(const TrainingArguments& args, const PrecisionPlan& plan,
                                       const std::vector<torch::Tensor>& params,
                                       const OptimizerParams& groups,
                                       const torch::optim::Optimizer& options_of);

/// What a forward pass is run for, as `Strategy::forward_context` is told.
struct ForwardPass {
  /// A training micro-batch, whose backward follows; else an evaluation or prediction batch.
  bool training = false;
  /// Training only: the backward must leave the gradients agreed across the processes (the
  /// last micro-batch of an accumulation group).
  bool sync = false;
};

/// Held by the caller for the length of a forward pass; ends, when it goes out of scope, what
/// `Strategy::forward_context` began (nothing for the strategies that keep whole parameters).
/// Move-only.
class ForwardScope {
 public:
  ForwardScope() = default;
  /// Runs `on_exit` when the scope ends.
  explicit ForwardScope(std::function<void()> on_exit) : on_exit_(std::move(on_exit)) {}
  ForwardScope(ForwardScope&& other) noexcept : on_exit_(std::move(other.on_exit_)) {
    other.on_exit_ = nullptr;
  }
  ForwardScope& operator=(ForwardScope&&) = delete;
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;
  ~ForwardScope() {
    if (on_exit_) on_exit_();
  }

 private:
  std::function<void()> on_exit_;
};

/// What spans processes, for the Trainer, its loop and its engines. Python: what HF's Trainer
/// asks accelerate (`is_main_process`, `gather_for_metrics`, `reduce`, the DDP wrapper).
class Strategy {
 public:
  virtual ~Strategy() = default;

  // ---- where this process sits -------------------------------------------------------------

  /// Processes in the job (1 alone).
  virtual std::int64_t world_size() const = 0;
  /// This process's rank (0 alone).
  virtual std::int64_t rank() const = 0;
  /// Rank 0. Python: `TrainerState.is_world_process_zero`.
  virtual bool is_main_process() const = 0;
  /// The first process of its node. Python: `TrainerState.is_local_process_zero`.
  virtual bool is_local_main_process() const = 0;
  /// Processes on this node (1 alone): how many share its cores. Python: the launcher's
  /// `LOCAL_WORLD_SIZE`.
  virtual std::int64_t local_world_size() const = 0;
  /// Whether this process writes checkpoints, trainer_log.jsonl and saved models: rank 0, and
  /// with `save_on_each_node` the first process of every node. Python: `args.should_save`.
  virtual bool should_save() const = 0;
  /// Whether this process prints log lines and the progress bar: the first process of every
  /// node with `log_on_each_node`, else rank 0 alone. Python: `args.should_log`.
  virtual bool should_log() const = 0;
  /// What the run's first line adds about the processes: " x 2 processes (gloo, rank 0)", or
  /// nothing alone.
  virtual std::string describe() const = 0;

  // ---- collectives -------------------------------------------------------------------------

  /// The sum over the processes of each element of `values`. Syncs (a host read).
  virtual std::vector<double> sum(std::vector<double> values) const = 0;
  /// The mean over the processes of each element of `values`: `sum` over `world_size`.
  std::vector<double> mean(std::vector<double> values) const;
  /// Runs `check` here and returns whether it passed on every process. Where it raised, the
  /// error is raised again once every process has been told, so no process waits for one that
  /// stopped; the others get false and say why themselves.
  virtual bool passed_everywhere(const std::function<void()>& check) const = 0;
  /// Rank 0's `bytes` on every process.
  virtual std::string broadcast(const std::string& bytes) const = 0;
  /// Stops every process, naming the ranks, when `value` is not the same everywhere; `what`
  /// names it in the error.
  virtual void check_same_text(const std::string& value, const std::string& what) const = 0;
  /// Replaces each element of `tensor` (dense, contiguous), in place, by its maximum over the
  /// processes: one collective (what a saved-state piece agrees on after a step, such as
  /// amaxes). Alone: nothing.
  /// Python: `torch.distributed.all_reduce(tensor, op=ReduceOp.MAX)`. Waits for it: on NCCL
  /// that orders the current stream and does not block the host; on Gloo it blocks.
  virtual void max_all_reduce_(torch::Tensor& tensor) const = 0;

  // ---- data ----------------------------------------------------------------------------------

  /// Training examples this process visits per epoch of a dataset of `num_examples`.
  virtual std::int64_t examples_per_process(std::int64_t num_examples, bool drop_last) const = 0;
  /// This process's examples of `epoch`, in training order, as a CPU int64 tensor: a shuffle
  /// seeded by `seed + epoch` alone (Python: `RandomSampler` with that generator), this
  /// rank's share of `DistributedSampler`'s order among several.
  virtual torch::Tensor epoch_order(std::int64_t num_examples, std::uint64_t seed,
                                    std::int64_t epoch, bool drop_last) const = 0;
  /// Every process's evaluation `rows` in the order of the examples they came from (row k of
  /// rank r is example `r + k * world_size`), `num_examples` rows in all, dimension 1 padded
  /// with `padding_value` where it differs. Alone: `rows` itself. Python: accelerate's
  /// `gather_for_metrics`.
  virtual torch::Tensor gather_rows(const torch::Tensor& rows, std::int64_t num_examples,
                                    double padding_value) const = 0;

  // ---- the model and its steps ---------------------------------------------------------------

  /// Makes `module` (cast and on its device) ready to train here, before the optimizer and any
  /// fp32 master copy are made from it: among several processes, checks that every process
  /// built the same model, copies rank 0's weights everywhere and sets up gradient averaging.
  /// Python: what `DistributedDataParallel.__init__` does.
  virtual void prepare_model(torch::nn::Module& module) = 0;
  /// Begins a forward pass of the model, for training or evaluation alike; the caller keeps
  /// the returned scope until the forward's outputs exist. Data parallel readies its gradient
  /// averaging for a training pass; a strategy that shards parameters gathers them here and
  /// lets them go when the scope ends. Python: what DDP's and FSDP's `forward` do before and
  /// after the module's own. A collective where it communicates.
  virtual ForwardScope forward_context(const ForwardPass& pass) = 0;
  /// Between the forward and the backward of a training micro-batch (`sync` as in
  /// `ForwardPass`).
  virtual void before_backward(const torch::Tensor& loss, bool sync) = 0;
  /// Runs one training step (the engine's `train_batch`) and returns its result; a failure of
  /// the collectives inside it becomes an error that names this process and the likely cause.
  virtual bool run_step(const std::function<bool()>& step) const = 0;
  /// Why a CUDA graph cannot capture this strategy's step, or nullopt when it can.
  virtual std::optional<std::string> cuda_graph_blocker() const = 0;
  /// Why this strategy's gradient sync cannot run with `--gradient_checkpointing` as the
  /// arguments stand (completing "--gradient_checkpointing ..."), or nullopt when it can.
  virtual std::optional<std::string> gradient_checkpointing_blocker() const = 0;
  /// Copies rank 0's loss-scaler state to every process, so that every process skips the same
  /// steps. Nothing alone.
  virtual void copy_scaler_from_rank0(amp::GradScaler& scaler) const = 0;

  /// Clears the model's gradients after an update. Python: `model.zero_grad()` (FSDP's clears
  /// this process's sharded gradients). No sync.
  virtual void zero_grad(torch::nn::Module& module) { module.zero_grad(); }

  // ---- the model's state ---------------------------------------------------------------------

  /// The model's whole state, parameters then buffers under HF's names, as full tensors on the
  /// processes that save (`should_save`); other processes may get an empty list. What
  /// model.safetensors holds, in checkpoints and from `save_model`. By default the module's own
  /// tensors. Python: `module.state_dict()`, or FSDP's `get_model_state_dict` with
  /// `full_state_dict=True`. A collective where parameters are sharded: every process calls it.
  /// No sync here (the tensors stay where they are).
  virtual io::NamedTensors model_state_dict(const torch::nn::Module& module) const;
  /// Loads `state` (full tensors, as `model_state_dict` gives them; every process passes the
  /// whole state) into the model, strictly, checking everything before it copies anything;
  /// `origin` (" from '<file>'") names the source in errors. Python:
  /// `module.load_state_dict(state)`, or FSDP's `set_model_state_dict`. Syncs (host-to-device
  /// copies).
  virtual void load_model_state_dict(torch::nn::Module& module, const io::NamedTensors& state,
                                     const std::string& origin);
  /// Loads the model.safetensors at `path` (whole tensors, as `model_state_dict` writes them)
  /// into the model, as `load_model_state_dict` does, naming the file in errors. By default the
  /// file is read whole; a strategy that shards parameters reads only its shards' elements.
  /// Syncs.
  virtual void load_model_file(torch::nn::Module& module, const std::string& path);

  // ---- the optimizer and its update ---------------------------------------------------------

  /// The tensors the optimizer is to update, in HF's weight-decay groups (after
  /// `prepare_model`): by default the model's trainable parameters with their names. A
  /// strategy that shards the optimizer state flattens the parameters into its buckets here and
  /// gives this process's shard of each bucket. The Trainer makes the fp32 masters and the
  /// optimizer over them (the registry's entry, or the user's factory) and hands both to
  /// `setup_optimizer`. Python: `model.parameters()`, or the sharded parameters after FSDP2's
  /// `fully_shard`. No sync.
  virtual OptimizerParams optimizer_params(torch::nn::Module& module);
  /// Takes the optimizer built over `optimizer_params` (and the masters the Trainer made for
  /// `plan`) before the first step. Nothing by default. A strategy that shards the optimizer
  /// state wraps it: the reduced gradient shards go into its tensors, its updated shards are
  /// gathered back into the model, `scaler` agrees on inf/nan across the processes, and the
  /// masters move into the wrapper (`built.masters` is null after). Throws `c10::ValueError`
  /// for an optimizer it cannot shard, naming it. Python: Lightning's
  /// `Strategy.setup_optimizers`, DeepSpeed's wrapping of the client optimizer. No sync.
  virtual void setup_optimizer(OptimizerSetup& built, const PrecisionPlan& plan,
                               amp::GradScaler& scaler);
  /// Why this strategy cannot train with an optimizer from `set_optimizer_factory`
  /// (completing "set_optimizer_factory: ..."), or nullopt when it can.
  virtual std::optional<std::string> optimizer_factory_blocker() const { return std::nullopt; }
  /// After the last backward of an update, before anything reads the gradients: a strategy
  /// whose gradients are still travelling waits for them here and puts them where the
  /// optimizer reads them. Nothing by default. A collective where it communicates.
  virtual void finish_gradients() {}
  /// Whether `GradScaler::unscale_` must run before every `step` (not only to clip): the
  /// inf/nan flag is then agreed across processes before any of them updates. False by default.
  virtual bool unscales_before_step() const { return false; }
  /// Clips the gradients of `params` (the optimizer's tensors) to a global 2-norm of
  /// `max_norm` and returns the norm before clipping (0-d, on the device). By default
  /// `mantissa::clip_grad_norm_`; a sharded strategy sums the squared norm over the processes.
  /// No sync.
  virtual torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm);
  /// After the optimizer's step (taken or skipped): a strategy that updated only its shard
  /// gathers the new weights into every process's model here. Nothing by default. A
  /// collective where it communicates.
  virtual void after_optimizer_step() {}
  /// A line for the run's start about the optimizer state this process holds, or nothing.
  virtual std::string describe_optimizer_state() const { return {}; }
  /// Whether that line already gives the state's bytes (known from a layout before the first
  /// step), so that the Trainer does not count them again after the first update.
  virtual bool reports_optimizer_state_bytes() const { return false; }

  // ---- checkpoints ---------------------------------------------------------------------------

  /// Writes `output_dir/checkpoint-<state.global_step>` atomically through `checkpoint_io()`,
  /// model.safetensors from `model_state_dict` (taken on every process first); among several
  /// processes all return only once it is published, or raise once it is abandoned everywhere.
  /// A strategy that holds state in pieces gathers it first. A collective.
  virtual void save_checkpoint(const std::string& output_dir, const CheckpointParts& parts);
  /// Restores `parts` from the checkpoint folder `dir`, the model through
  /// `load_model_file`; every process learns whether all loaded. A checkpoint of per-process
  /// shard files (fsdp SHARDED_STATE_DICT) is refused by name by the strategies that do not
  /// shard. A collective.
  virtual void load_checkpoint(const std::string& dir, const CheckpointParts& parts);
  /// Loads only the weights of the checkpoint `dir` into `module`, and into `masters` (the
  /// engine's fp32 masters, or null) or the strategy's own masters: exactly from the saved
  /// masters where the checkpoint has them, else from the loaded weights. What
  /// `load_best_model_at_end` does. Python: HF's `Trainer._load_best_model`. A collective where
  /// parameters are sharded; syncs.
  virtual void load_checkpoint_weights(torch::nn::Module& module, const std::string& dir,
                                       amp::MasterWeights* masters);

 protected:
  /// How this strategy's checkpoint folders come to exist.
  virtual CheckpointIO& checkpoint_io() = 0;
  /// `parts` with the model loaded through `load_model_file`.
  CheckpointParts loading_through_strategy(const CheckpointParts& parts);
  /// Refuses `dir` by name when it holds shard files, which this strategy cannot read.
  static void check_not_sharded(const std::string& dir);
};

/// The strategy the environment and `args` ask for: when a launcher started this process as
/// one of several (`WORLD_SIZE` > 1; the process joins the job here, a collective),
/// `ShardedDataParallel` with `--fsdp` (for an optimizer the registry shards by whole
/// tensors, `StateShardedDataParallel` under shard_grad_op and `WholeTensorShardedDataParallel`
/// under full sharding) and `DataParallel` without; else
/// `SingleProcess`. The only place that tells them apart.
std::unique_ptr<Strategy> make_strategy(const TrainingArguments& args, const c10::Device& device);

}  // namespace mantissa::detail
