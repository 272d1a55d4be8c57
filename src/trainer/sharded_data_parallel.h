#pragma once
// The sharded data-parallel strategy, in HF's two FSDP modes:
//   shard_grad_op (ZeRO-2, `reshard_after_forward` false): every process holds the whole model,
//     the gradients are reduce-scattered so that each process receives the averaged gradient of
//     its shard only, the optimizer state (Adam moments, fp32 masters) exists for that shard
//     only, and after each update the new weights are all-gathered into every process's model.
//   full sharding (ZeRO-3, a bare `--fsdp`): the parameters too live as shards; each block's
//     parameters are all-gathered just before the block runs and freed after, in the forward and
//     again in the backward (sharded/parameter_units.h), so that a process holds 1/world_size of
//     the model plus the blocks in use.
// The pieces are in src/trainer/sharded/; this class wires them into the Trainer. Python: HF's
// `--fsdp`, FSDP2's `fully_shard(block)` per block and on the root, DeepSpeed ZeRO stage 2 / 3.

#include <memory>
#include <optional>
#include <unordered_map>

#include "trainer/process_group_strategy.h"
#include "trainer/sharded/block_units.h"
#include "trainer/sharded/flat_parameters.h"
#include "trainer/sharded/full_state.h"
#include "trainer/sharded/gradient_reduce_scatter.h"
#include "trainer/sharded/parameter_units.h"
#include "trainer/sharded/shard_files.h"
#include "trainer/sharded/sharded_adamw.h"
#include "training_arguments/fsdp_checks.h"

namespace mantissa::detail {

class UnitRunner;

/// Several processes, each with 1/world_size of the gradients and of the optimizer state, and
/// with full sharding of the parameters. Checkpoints hold the whole state (HF's
/// FULL_STATE_DICT), gathered on rank 0, in the files an unsharded run writes: a single process
/// and a DDP run resume them, and a sharded run resumes theirs, at any world size. With
/// SHARDED_STATE_DICT each process writes its own shard files instead, which a sharded run of
/// any size resumes.
class ShardedDataParallel : public ProcessGroupStrategy {
 public:
  /// A strategy over the job `collectives` joined (see `ProcessGroupStrategy`), in the mode
  /// `settings` ask for (`shards_grad_op()` or `shards_parameters()`). With `whole_tensors`
  /// (full sharding only), each parameter lies whole in one process's shard
  /// (`sharded::place_whole_tensors`), for `WholeTensorShardedDataParallel`.
  ShardedDataParallel(std::shared_ptr<Collectives> collectives, const TrainingArguments& args,
                      const FsdpSettings& settings, bool whole_tensors = false);
  ~ShardedDataParallel() override;

  std::string describe() const override;

  /// The same parameters everywhere and rank 0's weights and buffers copied to every process
  /// (FSDP's `sync_module_states`), once; buffers are not broadcast before each forward. With
  /// full sharding, also finds the blocks that become units (`find_block_units`), checks that
  /// every process found the same, and installs the runner that gathers them.
  void prepare_model(torch::nn::Module& module) override;
  /// Full sharding: gathers the root unit (after checking that the previous forward ran every
  /// unit's block through `run_block`); an evaluation pass frees every unit when it ends.
  ForwardScope forward_context(const ForwardPass& pass) override;
  /// Arms the reduce-scatter hooks for a synced backward, else lets gradients accumulate.
  void before_backward(const torch::Tensor& loss, bool sync) override;
  bool run_step(const std::function<bool()>& step) const override;
  std::optional<std::string> cuda_graph_blocker() const override;
  /// None: the reduce-scatter hooks need no search for unused parameters.
  std::optional<std::string> gradient_checkpointing_blocker() const override {
    return std::nullopt;
  }

  /// Flattens the parameters of HF's weight-decay groups into buckets (with full sharding,
  /// one unit per block and the root, the parameters freed to their shards) and gives this
  /// process's shard of each bucket, grouped as the buckets are and unnamed.
  OptimizerParams optimizer_params(torch::nn::Module& module) override;
  /// Installs the reduce-scatter of the gradients and wraps the optimizer built over the shards
  /// (and their fp32 masters when `plan` asks for masters) in `sharded::ShardedAdamW`, and makes
  /// `scaler` agree on inf/nan across the processes. The optimizer must be mantissa's FusedAdamW
  /// (a `set_optimizer_factory` one too, over the flat shards it is given); another is refused
  /// by name.
  void setup_optimizer(OptimizerSetup& built, const PrecisionPlan& plan,
                       amp::GradScaler& scaler) override;
  /// Always a reason: a checkpoint gathers the shards' state into an optimizer built from the
  /// arguments, which a user's factory may not match.
  std::optional<std::string> optimizer_factory_blocker() const override;
  /// Waits for the reduce-scatters and puts each averaged shard gradient into the optimizer's
  /// tensors; with full sharding, frees every unit still gathered. A collective.
  void finish_gradients() override;
  bool unscales_before_step() const override { return true; }
  /// The global norm from every process's shards (one allreduce).
  torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm) override;
  /// shard_grad_op: all-gathers the updated shards into every process's parameters. A
  /// collective. Full sharding: nothing (the next forward gathers).
  void after_optimizer_step() override;
  /// "optimizer state per process: ... MiB (1/2 of the ... MiB data parallel holds)"; with full
  /// sharding the parameters, gradients and a unit's gather too.
  std::string describe_optimizer_state() const override;
  bool reports_optimizer_state_bytes() const override { return true; }

  /// Full sharding: the whole parameters, gathered unit by unit (each freed before the next),
  /// copied to the CPU on rank 0; the other ranks get an empty list. A collective.
  io::NamedTensors model_state_dict(const torch::nn::Module& module) const override;
  /// Full sharding: each process copies its shards' elements of `state` into them, checked
  /// first as `load_state_dict(strict=True)` checks; nothing is gathered. Syncs.
  void load_model_state_dict(torch::nn::Module& module, const io::NamedTensors& state,
                             const std::string& origin) override;
  /// Full sharding: each process reads only its shards' elements of the file. Syncs.
  void load_model_file(torch::nn::Module& module, const std::string& path) override;

  /// FULL_STATE_DICT: gathers the whole optimizer state (and the masters) on rank 0, which
  /// writes them as an unsharded run would; SHARDED_STATE_DICT: rank 0 writes the files of the
  /// whole run (scheduler, scaler, state) and every process its model and optimizer shards.
  /// Then the shared protocol. A collective.
  void save_checkpoint(const std::string& output_dir, const CheckpointParts& parts) override;
  /// Every process loads the scheduler, scaler, state and its random state. A checkpoint of
  /// whole files: every process reads its elements of model.safetensors, rank 0 reads the
  /// optimizer state (and masters) and cuts it into this run's shards. A checkpoint of shard
  /// files: every process reads its elements of the weights and of the optimizer state from
  /// them, whatever number of processes saved them (with a warning when it differs). A
  /// collective.
  void load_checkpoint(const std::string& dir, const CheckpointParts& parts) override;
  /// The weights, and the master shards: from the shard files' masters where the checkpoint
  /// has them, else copied from the loaded weights. A collective.
  void load_checkpoint_weights(torch::nn::Module& module, const std::string& dir,
                               amp::MasterWeights* masters) override;

  /// Optimizer-state bytes one process holds, and the bytes an unsharded process would hold
  /// (same dtypes, no padding): moments, Kahan buffers, fp32 masters and their gradients. From
  /// the layout and options, so known before the first step. Pure host arithmetic.
  std::pair<std::int64_t, std::int64_t> optimizer_state_bytes() const;

 protected:
  /// The module's parameters, or with `stand_ins` zero tensors of the sharded ones' shapes in
  /// their places (full sharding, where the module's own are empty outside a forward).
  std::vector<torch::Tensor> whole_params(bool stand_ins) const;
  /// Each `FlatParameters::params()`'s name in the module (HF's dotted names).
  std::vector<std::string> flat_param_names() const;
  /// Each `FlatParameters::params()`'s index in `module_->parameters()`.
  std::vector<std::size_t> module_positions() const;
  /// Moves the parameters of HF's weight-decay groups into `flat_` (with full sharding, one
  /// unit per block and the root, the parameters freed to their shards, and `units_` made),
  /// and returns those groups as they were before. The first half of `optimizer_params`.
  OptimizerParams flatten_parameters(torch::nn::Module& module);
  /// Whether the parameters are sharded (full sharding) rather than kept whole.
  bool full() const noexcept { return settings_.shards_parameters(); }
  /// Bytes of the parameters under full sharding: this process's shards (its gradients' too),
  /// the whole model's (what data parallel holds of each), and the largest block unit's
  /// gather. From the layout; no sync.
  struct HeldBytes {
    std::int64_t shards = 0;
    std::int64_t whole = 0;
    std::int64_t largest_block_gather = 0;
  };
  HeldBytes held_bytes() const;
  /// Writes this process's shard file of the weights into `folder`/model_shards (rank 0's
  /// also holds the tensors every process keeps whole: buffers, frozen parameters).
  void write_model_shards(const std::string& folder) const;
  /// Reads this process's elements of the weights from the model shards of checkpoint `dir`,
  /// whatever number of processes saved them (with a warning when it differs). Not a
  /// collective.
  void load_model_shards(const std::string& dir);

  FsdpSettings settings_;
  bool whole_tensors_ = false;
  torch::nn::Module* module_ = nullptr;     ///< set by prepare_model
  PrecisionPlan plan_;                      ///< set by setup_optimizer
  std::vector<sharded::BlockUnit> blocks_;  ///< full sharding: units 1.., from prepare_model
  std::unique_ptr<sharded::FlatParameters> flat_;
  std::unique_ptr<sharded::GradientReduceScatter> grads_;
  std::unique_ptr<sharded::ParameterUnits> units_;  ///< full sharding only

 private:
  /// Loads the module's whole state from `source` into this process's shards (and the tensors
  /// every process keeps whole), strictly, checking every name, shape and dtype first.
  void load_model_from(torch::nn::Module& module, const sharded::TensorSource& source);
  /// Writes this process's shard files of the weights and of the optimizer state into
  /// `folder` (`write_model_shards`, then the flat optimizer state).
  void write_shards(const std::string& folder) const;
  /// Reads this process's elements of the shard files of checkpoint `dir`: the weights, and
  /// the optimizer state, or with `weights_only` the masters alone. Not a collective.
  void load_shards(const std::string& dir, bool weights_only);
  /// The FULL_STATE_DICT side of `load_checkpoint`.
  void load_full_checkpoint(const std::string& dir, const CheckpointParts& through_strategy);
  /// A fresh unsharded optimizer (and masters) over `params` (`whole_params`), as a DDP run of
  /// this plan builds it: what optimizer.pt and master_weights.pt are written from and read into.
  OptimizerSetup unsharded_optimizer(const std::vector<torch::Tensor>& params) const;
  /// The tensors `whole`'s optimizer updates, in the order of `FlatParameters::params()`;
  /// `params` as given to `unsharded_optimizer`.
  std::vector<torch::Tensor> optimized_tensors(const OptimizerSetup& whole,
                                               const std::vector<torch::Tensor>& params) const;

  /// The flat parameters in units: the root's first (its buckets come last in backward), then
  /// each block's, each unit's grouped by param group. Full sharding only.
  std::vector<sharded::FlatInput> unit_inputs(
      const std::vector<std::vector<torch::Tensor>>& groups) const;

  std::shared_ptr<UnitRunner> runner_;  ///< full sharding: installed on the model
  std::unique_ptr<sharded::ShardedAdamW> shards_;
};

}  // namespace mantissa::detail
