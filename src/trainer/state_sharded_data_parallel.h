#pragma once
// `--fsdp shard_grad_op` for the optimizers whose update needs whole tensors (the registry's
// `shards_whole_tensors`: Adafactor's factored moments and Muon's orthogonalisation need the
// whole matrix, 8-bit AdamW keeps per-block scales of the whole tensor). Every process keeps
// the whole model and averages the whole gradients as data parallel does; each trainable tensor
// has one owner (sharded/tensor_owners.h), which alone keeps its optimizer state and fp32
// master and updates it, then broadcasts the new weights to the others. The optimizer state and
// the masters are sharded (ZeRO stage 1); the gradients are not, unlike FusedAdamW's flat
// ZeRO-2 (`ShardedDataParallel`).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/data_parallel.h"
#include "trainer/sharded/summed_norms.h"
#include "training_arguments/fsdp_checks.h"

namespace mantissa::detail {

/// Data parallel with the optimizer state sharded by whole tensors. Checkpoints hold the whole
/// state (FULL_STATE_DICT), put together on rank 0 in the files a DDP run writes, so a single
/// process and a DDP run resume them, and this strategy resumes theirs at any world size; or
/// with SHARDED_STATE_DICT each process's own files (its weights, its optimizer's archive),
/// which this strategy and `WholeTensorShardedDataParallel` resume at any world size.
/// Python: `ZeroRedundancyOptimizer` over DDP; the distributed Muon step that orthogonalises
/// each rank's share of the matrices and gathers the updates.
class StateShardedDataParallel final : public DataParallel {
 public:
  /// A strategy over the job `collectives` joined (see `ProcessGroupStrategy`), `settings`
  /// saying how checkpoints are written (state_dict_type).
  StateShardedDataParallel(std::shared_ptr<Collectives> collectives, const TrainingArguments& args,
                           const FsdpSettings& settings);
  ~StateShardedDataParallel() override;

  std::string describe() const override;
  /// DataParallel's, and each trainable parameter's owner.
  void prepare_model(torch::nn::Module& module) override;

  /// HF's weight-decay groups of the whole model (with their names) holding only the tensors
  /// this process owns; a group may be empty, so that every process's optimizer has the same
  /// groups as the whole one.
  OptimizerParams optimizer_params(torch::nn::Module& module) override;
  /// Keeps the optimizer built over this process's tensors (the masters stay the engine's),
  /// learns where each of its tensors sits in the whole optimizer's order (for the gradient
  /// norm) and makes `scaler` agree on inf/nan across the processes. No sync.
  void setup_optimizer(OptimizerSetup& built, const PrecisionPlan& plan,
                       amp::GradScaler& scaler) override;
  /// Always a reason: a checkpoint builds the registry's optimizer for other processes' tensors.
  std::optional<std::string> optimizer_factory_blocker() const override;
  /// Drops the averaged gradients of the tensors other processes own (they update them).
  void finish_gradients() override;
  bool unscales_before_step() const override { return true; }
  /// The global norm from each owner's per-tensor norms (one allreduce of one fp64 value per
  /// tensor), bit for bit data parallel's, then this process's gradients clipped with it. A
  /// collective; no host sync.
  torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm) override;
  /// Every owner broadcasts its updated tensors to the others. A collective.
  void after_optimizer_step() override;
  /// "optimizer state per process: rank r owns N of M tensors ..."
  std::string describe_optimizer_state() const override;

  /// Rank 0 gathers every owner's optimizer state and masters into the optimizer (and masters)
  /// a DDP run of these arguments holds and writes the files that run writes; with
  /// SHARDED_STATE_DICT every process writes the weights it owns and its optimizer's archive
  /// (`ProcessGroupStrategy::save_owned_checkpoint`). A collective.
  void save_checkpoint(const std::string& output_dir, const CheckpointParts& parts) override;
  /// Every process loads the model, scheduler, scaler and its random state; rank 0 reads
  /// optimizer.pt (and master_weights.pt) into the whole optimizer and sends each owner its
  /// tensors' state. A checkpoint of per-process files: every process reads the whole model
  /// from the weights' shard files and its tensors' state from the files that hold them. A
  /// collective.
  void load_checkpoint(const std::string& dir, const CheckpointParts& parts) override;
  /// The weights, and this process's masters from master_weights.pt (read on the CPU, only its
  /// own copied to the device), or from the weights when the checkpoint has none. Syncs.
  void load_checkpoint_weights(torch::nn::Module& module, const std::string& dir,
                               amp::MasterWeights* masters) override;

 private:
  /// HF's weight-decay groups of the module's parameters holding the tensors rank `owner`
  /// owns (every trainable one for `OwnedState::kEveryOwner`), named, empty groups kept;
  /// `in_order` its tensors in the module's order.
  OptimizerParams owned_by(std::int64_t owner) const;
  /// What the checkpoints of `ProcessGroupStrategy::save_owned_checkpoint` need.
  OwnedState owned_state();
  /// Writes the weights this process owns (rank 0: also buffers and frozen parameters) as its
  /// shard file of `folder`/model_shards.
  void write_model_shards(const std::string& folder) const;
  /// Loads the whole model from the weights' shard files of checkpoint `dir`, strictly. Syncs.
  void load_model_shards(const std::string& dir);

  /// fsdp_config state_dict_type SHARDED_STATE_DICT: checkpoints of per-process files.
  bool sharded_state_dict_ = false;

  torch::nn::Module* module_ = nullptr;   ///< set by prepare_model
  std::vector<torch::Tensor> trainable_;  ///< the module's trainable parameters, in its order
  std::vector<std::int64_t> owners_;      ///< per trainable parameter
  /// Per rank, the tensors it owns (detached views of `trainable_`): what it broadcasts.
  std::vector<std::vector<torch::Tensor>> owned_tensors_;
  PrecisionPlan plan_;                                  ///< set by setup_optimizer
  std::shared_ptr<torch::optim::Optimizer> optimizer_;  ///< over this process's tensors
  /// The global norm from the owners' per-tensor norms, in the whole optimizer's order.
  sharded::OwnedTensorNorms norms_;
  /// Per position of the whole optimizer: the module's parameter there, and whether it had a
  /// gradient at the last `finish_gradients` (the same on every process: the averaging gives
  /// every process the same gradients).
  std::vector<torch::Tensor> slot_params_;
  std::vector<bool> slot_has_grad_;
};

}  // namespace mantissa::detail
