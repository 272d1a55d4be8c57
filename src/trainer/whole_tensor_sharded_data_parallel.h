#pragma once
// Full sharding (ZeRO-3, a bare `--fsdp`) for the optimizers whose update needs whole tensors
// (the registry's `shards_whole_tensors`: Adafactor's factored moments and Muon's
// orthogonalisation need the whole matrix, 8-bit AdamW keeps per-block scales of the whole
// tensor). The parameters live as flat shards, gathered per unit for the forward and the
// backward as `ShardedDataParallel` gathers them, but laid out so that each parameter lies whole
// in one process's shard (`sharded::place_whole_tensors`): the reduce-scatter of the gradients
// hands each owner the whole averaged gradients of its tensors, the owner updates them in place
// in its shard with the registry's optimizer, and the next forward's gather spreads the new
// values. Nothing is broadcast after a step; the cost is padding, each shard of a bucket being
// as long as the largest owner's share of it.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/sharded/summed_norms.h"
#include "trainer/sharded_data_parallel.h"

namespace mantissa::detail {

/// Full sharding with each parameter whole in one process's shard, for the optimizers sharded by
/// whole tensors. Checkpoints hold the whole state (FULL_STATE_DICT) in the files a DDP run
/// writes, put together on rank 0 as under `StateShardedDataParallel`, so a single process, a
/// DDP run and the sharded strategies resume them at any world size, and this one resumes
/// theirs; or with SHARDED_STATE_DICT each process's own files (its weights, its optimizer's
/// archive), which this strategy and `StateShardedDataParallel` resume at any world size.
/// Python: FSDP2's `fully_shard` with a distributed Muon that orthogonalises each rank's share
/// of the matrices, DeepSpeed ZeRO-3 with whole-tensor partitions.
class WholeTensorShardedDataParallel final : public ShardedDataParallel {
 public:
  /// A strategy over the job `collectives` joined, `settings` asking for full sharding.
  WholeTensorShardedDataParallel(std::shared_ptr<Collectives> collectives,
                                 const TrainingArguments& args, const FsdpSettings& settings);
  ~WholeTensorShardedDataParallel() override;

  std::string describe() const override;

  /// Moves the parameters into flat shards, each one whole in its owner's shard, and gives
  /// HF's weight-decay groups of the whole model holding this process's tensors as views of
  /// its shards, named as the model names them, empty groups kept (so that every process's
  /// optimizer has the groups of the whole one).
  OptimizerParams optimizer_params(torch::nn::Module& module) override;
  /// Installs the reduce-scatter of the gradients and keeps the optimizer built over this
  /// process's tensors (the masters stay the engine's); learns where each of its tensors sits
  /// in the whole optimizer's order (for the gradient norm and stochastic rounding's draws) and
  /// makes `scaler` agree on inf/nan across the processes. No sync.
  void setup_optimizer(OptimizerSetup& built, const PrecisionPlan& plan,
                       amp::GradScaler& scaler) override;
  /// Always a reason: a checkpoint builds the registry's optimizer for other processes' tensors.
  std::optional<std::string> optimizer_factory_blocker() const override;
  /// Waits for the reduce-scatters, gives each of this process's tensors its averaged gradient
  /// (a view of its reduced shard), and frees every unit still gathered. A collective.
  void finish_gradients() override;
  /// The global norm from each owner's per-tensor norms (one allreduce of one fp64 value per
  /// tensor), bit for bit data parallel's, then this process's gradients clipped with it. A
  /// collective; no host sync.
  torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm) override;
  /// Nothing: the owners updated their shards in place, and the next forward gathers them.
  void after_optimizer_step() override {}
  /// "rank r holds parameters ..., gradients ... (its shards: N of M tensors, whole) ..."
  std::string describe_optimizer_state() const override;
  bool reports_optimizer_state_bytes() const override { return false; }

  /// FULL_STATE_DICT: rank 0 gathers every owner's optimizer state and masters into the
  /// optimizer (and masters) a DDP run of these arguments holds, over zero stand-ins of the
  /// parameters, and writes the files that run writes; the weights are gathered unit by unit.
  /// SHARDED_STATE_DICT: every process writes its weights' shard file and its optimizer's
  /// archive (`ProcessGroupStrategy::save_owned_checkpoint`). A collective.
  void save_checkpoint(const std::string& output_dir, const CheckpointParts& parts) override;
  /// Every process reads its shards' elements of model.safetensors and loads the scheduler,
  /// scaler and its random state; rank 0 reads optimizer.pt (and master_weights.pt) and sends
  /// each owner its tensors' state. A checkpoint of per-process files: every process reads its
  /// weights and its tensors' state from the files that hold them. A collective.
  void load_checkpoint(const std::string& dir, const CheckpointParts& parts) override;
  /// The weights into the shards, and this process's masters from master_weights.pt (read on
  /// the CPU, only its own copied to the device) or the optimizer shards, or from the weights
  /// when the checkpoint has none. Syncs.
  void load_checkpoint_weights(torch::nn::Module& module, const std::string& dir,
                               amp::MasterWeights* masters) override;

 private:
  /// One trainable parameter, in the order of HF's weight-decay groups.
  struct Entry {
    std::size_t flat = 0;      ///< its index in `FlatParameters::params()`
    std::size_t position = 0;  ///< its index in `module_->parameters()`
    std::size_t group = 0;     ///< its weight-decay group
    std::int64_t owner = 0;    ///< the rank whose shard holds it whole
    std::string name;          ///< the model's name of it
  };
  /// The groups of `by_position` (indexed as `module_->parameters()`: stand-ins, or this
  /// process's views) holding rank `owner`'s tensors (every one for
  /// `OwnedState::kEveryOwner`), named, empty groups kept.
  OptimizerParams owned_by(std::int64_t owner, const std::vector<torch::Tensor>& by_position) const;
  /// What `ProcessGroupStrategy::save_owned_checkpoint` needs.
  OwnedState owned_state();

  std::vector<Entry> entries_;
  std::size_t num_groups_ = 0;
  bool first_group_decays_ = false;
  /// Indexed as `module_->parameters()`: this process's tensors as views of its shards, with
  /// their shapes; undefined for the others' tensors and frozen parameters.
  std::vector<torch::Tensor> views_;
  /// Indexed as `module_->parameters()`: meta-device tensors of the trainable parameters'
  /// shapes and dtypes (what a data-parallel run's optimizer order is found from); undefined
  /// for frozen ones.
  std::vector<torch::Tensor> meta_params_;
  /// Where this process's tensors live: the device of the stand-ins a checkpoint load builds.
  c10::Device stand_in_device_{c10::kCPU};
  std::shared_ptr<torch::optim::Optimizer> optimizer_;  ///< over `views_` (or their masters)
  sharded::OwnedTensorNorms norms_;
};

}  // namespace mantissa::detail
