#pragma once
// What the strategies of several processes share: where this process sits in the job, the
// collectives the loop needs, `DistributedSampler`'s data order, the evaluation gather, rank
// 0's loss-scaler state and the collective checkpoint protocol, all over one `Collectives`.
// `DataParallel` and `ShardedDataParallel` each derive from it and add their own gradient path
// and optimizer (`StateShardedDataParallel` is data parallel with the optimizer state sharded).

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/checkpoint_io.h"
#include "trainer/collectives.h"
#include "trainer/sharded/summed_norms.h"
#include "trainer/strategy.h"

namespace mantissa::detail {

/// Several processes over the job `Collectives` joined. Python: the parts of accelerate's
/// `PartialState` and `DistributedSampler` that HF's Trainer uses for a job of several processes.
class ProcessGroupStrategy : public Strategy {
 public:
  std::int64_t world_size() const override { return collectives_->world_size(); }
  std::int64_t rank() const override { return collectives_->rank(); }
  bool is_main_process() const override { return collectives_->env().is_main_process(); }
  bool is_local_main_process() const override {
    return collectives_->env().is_local_main_process();
  }
  std::int64_t local_world_size() const override { return collectives_->env().local_world_size; }
  bool should_save() const override;
  bool should_log() const override;

  std::vector<double> sum(std::vector<double> values) const override;
  bool passed_everywhere(const std::function<void()>& check) const override;
  std::string broadcast(const std::string& bytes) const override;
  void check_same_text(const std::string& value, const std::string& what) const override;
  /// One `allreduce` with `ReduceOp::MAX` over the job's group (through the backend's device
  /// when `tensor` lives elsewhere, as a CUDA tensor under gloo).
  void max_all_reduce_(torch::Tensor& tensor) const override;

  /// This rank's `DistributedSampler` share.
  std::int64_t examples_per_process(std::int64_t num_examples, bool drop_last) const override;
  /// This rank's share of `DistributedSampler`'s shuffled order (seed + epoch).
  torch::Tensor epoch_order(std::int64_t num_examples, std::uint64_t seed, std::int64_t epoch,
                            bool drop_last) const override;
  torch::Tensor gather_rows(const torch::Tensor& rows, std::int64_t num_examples,
                            double padding_value) const override;

  /// With `ddp_find_unused_parameters` (the default): the search for unused parameters walks
  /// the forward's graph, where the recomputed blocks' parameters do not appear, so it would
  /// count them unused and then see their gradients arrive (HF turns the search off for such a
  /// model).
  std::optional<std::string> gradient_checkpointing_blocker() const override;
  void copy_scaler_from_rank0(amp::GradScaler& scaler) const override;

  /// What the checkpoints of a strategy whose processes each own whole tensors need to know
  /// (`save_owned_checkpoint`, `load_owned_checkpoint`).
  struct OwnedState {
    /// Gives `owned_by` for every owner at once.
    static constexpr std::int64_t kEveryOwner = -1;
    /// This process's optimizer, over the tensors it owns.
    torch::optim::Optimizer* optimizer = nullptr;
    /// The run's precision plan (whether there are fp32 masters, the low-precision rule).
    PrecisionPlan plan;
    /// Rank 0: tensors standing for the model's parameters, in the module's order, frozen ones
    /// too: the module's own, or under full sharding zero stand-ins of the same shapes. What
    /// the whole optimizer (and masters) of a checkpoint are built over.
    std::function<std::vector<torch::Tensor>()> whole_params;
    /// HF's weight-decay groups of `params` (as `whole_params` gives them, or this process's
    /// own tensors in the same places) holding the tensors rank `owner` owns (all of them for
    /// `kEveryOwner`), named, empty groups kept: what that rank's optimizer was built over,
    /// in the same order.
    std::function<OptimizerParams(std::int64_t owner, const std::vector<torch::Tensor>& params)>
        owned_by;
    /// Tensors of the parameters' shapes and dtypes in the module's order that cost no memory
    /// (meta tensors under full sharding, the module's own otherwise): what `owned_by` is given
    /// to learn every owner's names and groups.
    std::function<std::vector<torch::Tensor>()> described_params;
    /// This process's tensors in the module's order (views of its shards, or the module's
    /// parameters): what `owned_by(rank, ...)` is given for the tensors its optimizer updates.
    std::function<std::vector<torch::Tensor>()> own_params;
    /// A zero tensor of `described`'s shape and dtype on this process's device, standing for
    /// another process's tensor while its saved state is read.
    std::function<torch::Tensor(const torch::Tensor& described)> stand_in;
    /// fsdp_config state_dict_type SHARDED_STATE_DICT: checkpoints of per-process files.
    bool sharded_state_dict = false;
    /// Writes this process's weights into `folder`/model_shards (its shard file).
    std::function<void(const std::string& folder)> write_model_shards;
    /// Loads this process's weights from checkpoint `dir`'s model_shards.
    std::function<void(const std::string& dir)> load_model_shards;
  };

 protected:
  /// A strategy over the job `collectives` joined, for a Trainer of `args`. Checks that every
  /// process was given the same arguments (a collective; `is_execution_detail` fields may
  /// differ).
  ProcessGroupStrategy(std::shared_ptr<Collectives> collectives, const TrainingArguments& args);

  /// The job's process group and collectives.
  const Collectives& collectives() const noexcept { return *collectives_; }
  /// The Trainer's arguments, as given.
  const TrainingArguments& args() const noexcept { return args_; }
  /// The same parameters everywhere, rank 0's weights (and buffers when `with_buffers`) copied
  /// to every process in buckets of `bucket_bytes` (DDP's 250 MiB by default): the first half
  /// of preparing the model. A collective.
  void agree_on_model(torch::nn::Module& module, bool with_buffers,
                      std::size_t bucket_bytes = 250 * 1024 * 1024) const;
  /// Written together (`CollectiveCheckpointIO`): rank 0, and each node's first process with
  /// `save_on_each_node`, write the files.
  CheckpointIO& checkpoint_io() override { return *checkpoint_io_; }

  /// A checkpoint from processes that each own whole tensors: FULL_STATE_DICT (the files a
  /// data-parallel run writes, put together on rank 0: src/trainer/owned_state.cpp) or with
  /// `state.sharded_state_dict` each process's own files (src/trainer/owned_shards.cpp). A
  /// collective.
  void save_owned_checkpoint(const std::string& output_dir, const CheckpointParts& parts,
                             const OwnedState& state);
  /// Resumes either kind of checkpoint, as `dir` holds, at whatever number of processes saved
  /// it. `parts.masters` are this process's own. A collective.
  void load_owned_checkpoint(const std::string& dir, const CheckpointParts& parts,
                             const OwnedState& state);
  /// The weights of a checkpoint of per-process files (through `state.load_model_shards`)
  /// and this process's `masters` from the optimizer files that hold them. A collective.
  void load_owned_shard_weights(const std::string& dir, const OwnedState& state,
                                amp::MasterWeights* masters);
  /// Copies this process's masters out of the checkpoint's master_weights.pt (every
  /// parameter's master in the module's order, as a data-parallel run saves them), read on the
  /// CPU so that only its own reach its device, then into the model; from the weights when the
  /// checkpoint has none. `position(p)`: the module position of the model parameter whose
  /// master `masters` holds; `count`: the module's number of parameters. Not a collective.
  static void load_owned_masters(const std::string& dir, amp::MasterWeights& masters,
                                 const std::function<std::size_t(const torch::Tensor&)>& position,
                                 std::size_t count);
  /// The optimizer side of a strategy whose processes own whole tensors, once `built`: where
  /// each of its optimizer's tensors (or the model tensor behind a master) sits in
  /// `whole_order`, the tensors a data-parallel run's optimizer lists in its order, found there
  /// through `in_whole` (the tensor of `whole_order` that stands for a model tensor of this
  /// process); stochastic rounding keyed by those places (a data-parallel run's draws); and
  /// `scaler`'s inf/nan flag agreed across the processes. Returns the global norm's
  /// bookkeeping, its norms taken on `device`. No sync.
  sharded::OwnedTensorNorms own_whole_tensors(
      const OptimizerSetup& built, const PrecisionPlan& plan, amp::GradScaler& scaler,
      const std::vector<torch::Tensor>& whole_order,
      const std::function<const c10::TensorImpl*(const torch::Tensor&)>& in_whole,
      c10::Device device);
  /// Why `set_optimizer_factory` cannot serve a strategy whose processes own whole tensors,
  /// `mode` naming the fsdp mode: its checkpoints build the registry's optimizer for every
  /// process's share.
  static std::string owned_state_factory_blocker(const char* mode);
  /// Replaces `tensor` by its sum over the processes (on its device): one allreduce, through
  /// the backend's device when `tensor` lives elsewhere. A collective.
  void sum_over_processes_(at::Tensor& tensor) const;

 private:
  /// A checkpoint of the whole state (FULL_STATE_DICT) from processes that each own whole
  /// tensors: every process's optimizer state (and masters) reaches rank 0 as the bytes of a
  /// LibTorch archive, rank 0 moves each into the optimizer a data-parallel run holds and
  /// writes the files that run writes. A collective.
  void save_owned_state(const std::string& output_dir, const CheckpointParts& parts,
                        const OwnedState& state);
  /// The reverse: every process loads the model, scheduler, scaler and its random state; rank 0
  /// reads optimizer.pt (and master_weights.pt) into the whole optimizer, checked as a
  /// data-parallel run checks it, and sends each owner its tensors' state, at whatever number
  /// of processes saved it. `parts.masters` are this process's own. A collective.
  void load_owned_state(const std::string& dir, const CheckpointParts& parts,
                        const OwnedState& state);
  /// A checkpoint of per-process files (fsdp_config state_dict_type SHARDED_STATE_DICT) from
  /// processes that each own whole tensors (src/trainer/owned_shards.cpp): rank 0 writes the
  /// run's files (scheduler, scaler, trainer state) and the index of the optimizer shards; every
  /// process writes its weights through `state.write_model_shards` and its optimizer's state and
  /// masters as a LibTorch archive, `optimizer_shards/shard-<rank>-of-<N>.pt`, with the names
  /// of the tensors it holds. A collective.
  void save_owned_shards(const std::string& output_dir, const CheckpointParts& parts,
                         const OwnedState& state);
  /// Resumes such a checkpoint: every process loads the run's files and its random state, its
  /// weights through `state.load_model_shards`, then its tensors' optimizer state and masters from
  /// whichever files hold them (the index says), at whatever number of processes saved them.
  /// `parts.masters` are this process's own. A collective.
  void load_owned_shards(const std::string& dir, const CheckpointParts& parts,
                         const OwnedState& state);
  /// Reads this process's tensors' optimizer state (unless `weights_only`) and masters out of
  /// the optimizer shards of `dir`; the model loaded first (masters the files lack are copied
  /// from it). A missing file, a tensor no file holds or one the model lacks is named. Not a
  /// collective.
  void read_owned_optimizer_shards(const std::string& dir, const OwnedState& state,
                                   amp::MasterWeights* masters, bool weights_only) const;

  std::shared_ptr<Collectives> collectives_;
  TrainingArguments args_;
  std::unique_ptr<CollectiveCheckpointIO> checkpoint_io_;
};

}  // namespace mantissa::detail
