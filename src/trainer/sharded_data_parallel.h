#pragma once
// The sharded data-parallel strategy (ZeRO-2, `--fsdp shard_grad_op`): every process holds the
// whole model, but the gradients are reduce-scattered so that each process receives the
// averaged gradient of its shard only, and the optimizer state (Adam moments, fp32 masters)
// exists for that shard only. Each process updates its shard, and the updated weights are
// all-gathered into every process's model. The pieces are in src/trainer/sharded/; this class
// wires them into the Trainer. Python: HF's `--fsdp shard_grad_op`, FSDP2's
// `fully_shard(module, reshard_after_forward=False)`, DeepSpeed ZeRO stage 2.

#include <memory>

#include "trainer/process_group_strategy.h"
#include "trainer/sharded/flat_parameters.h"
#include "trainer/sharded/full_state.h"
#include "trainer/sharded/gradient_reduce_scatter.h"
#include "trainer/sharded/sharded_adamw.h"

namespace mantissa::detail {

/// Several processes, each with the whole model and 1/world_size of the gradients and of the
/// optimizer state. Checkpoints hold the whole state (HF's FULL_STATE_DICT), gathered on rank 0,
/// in the files an unsharded run writes: a single process and a DDP run resume them, and a
/// sharded run resumes theirs, at any world size.
class ShardedDataParallel final : public ProcessGroupStrategy {
 public:
  /// A strategy over the job `collectives` joined (see `ProcessGroupStrategy`).
  ShardedDataParallel(std::shared_ptr<Collectives> collectives, const TrainingArguments& args);
  ~ShardedDataParallel() override;

  std::string describe() const override;

  /// The same parameters everywhere and rank 0's weights and buffers copied to every process
  /// (FSDP's `sync_module_states`), once; buffers are not broadcast before each forward.
  void prepare_model(torch::nn::Module& module) override;
  ForwardScope forward_context(const ForwardPass& pass) override;
  /// Arms the reduce-scatter hooks for a synced backward, else lets gradients accumulate.
  void before_backward(const torch::Tensor& loss, bool sync) override;
  bool run_step(const std::function<bool()>& step) const override;
  std::optional<std::string> cuda_graph_blocker() const override;

  /// Flattens the parameters of HF's weight-decay groups into buckets, installs the
  /// reduce-scatter hooks and builds FusedAdamW over this process's shards (fp32 masters of the
  /// shards when `plan` asks for masters), and makes `scaler` agree on inf/nan across the
  /// processes. Refuses an optimizer factory (`set_optimizer_factory`): the sharded optimizer
  /// is mantissa's FusedAdamW.
  OptimizerSetup make_optimizer(const TrainingArguments& args, torch::nn::Module& module,
                                const PrecisionPlan& plan, const OptimizerFactory& factory,
                                amp::GradScaler& scaler) override;
  /// Waits for the reduce-scatters and puts each averaged shard gradient into the optimizer's
  /// tensors. A collective.
  void finish_gradients() override;
  bool unscales_before_step() const override { return true; }
  /// The global norm from every process's shards (one allreduce).
  torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& params,
                                double max_norm) override;
  /// All-gathers the updated shards into every process's parameters. A collective.
  void after_optimizer_step() override;
  /// Copies the model's (just loaded) weights into the fp32 master shards.
  void after_weights_loaded() override;
  /// "optimizer state per process: ... MiB (1/2 of the ... MiB data parallel holds)".
  std::string describe_optimizer_state() const override;

  /// Gathers the whole optimizer state (and the masters) on rank 0, which writes them as an
  /// unsharded run would; then the shared protocol. A collective.
  void save_checkpoint(const std::string& output_dir, const CheckpointParts& parts) override;
  /// Every process loads the model, scheduler, scaler, state and its random state; rank 0 reads
  /// the optimizer state (and masters) and cuts it into this run's shards. A collective.
  void load_checkpoint(const std::string& dir, const CheckpointParts& parts) override;

  /// Optimizer-state bytes one process holds, and the bytes an unsharded process would hold
  /// (same dtypes, no padding): moments, Kahan buffers, fp32 masters and their gradients. From
  /// the layout and options, so known before the first step. Pure host arithmetic.
  std::pair<std::int64_t, std::int64_t> optimizer_state_bytes() const;

 private:
  /// A fresh unsharded optimizer (and masters) over the model, as a DDP run of this plan
  /// builds it: what optimizer.pt and master_weights.pt are written from and read into.
  OptimizerSetup unsharded_optimizer() const;
  /// The tensors `whole`'s optimizer updates, in the order of `FlatParameters::params()`.
  std::vector<torch::Tensor> optimized_tensors(const OptimizerSetup& whole) const;

  torch::nn::Module* module_ = nullptr;  ///< set by prepare_model
  PrecisionPlan plan_;                   ///< set by make_optimizer
  std::unique_ptr<sharded::FlatParameters> flat_;
  std::unique_ptr<sharded::GradientReduceScatter> grads_;
  std::unique_ptr<sharded::ShardedAdamW> shards_;
};

}  // namespace mantissa::detail
