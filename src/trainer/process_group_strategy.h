#pragma once
// What the strategies of several processes share: where this process sits in the job, the
// collectives the loop needs, `DistributedSampler`'s data order, the evaluation gather, rank
// 0's loss-scaler state and the collective checkpoint protocol, all over one `Collectives`.
// `DataParallel` and `ShardedDataParallel` each derive from it and add their own gradient path
// and optimizer; neither derives from the other.

#include <memory>
#include <optional>
#include <string>

#include "trainer/checkpoint_io.h"
#include "trainer/collectives.h"
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

 private:
  std::shared_ptr<Collectives> collectives_;
  TrainingArguments args_;
  std::unique_ptr<CollectiveCheckpointIO> checkpoint_io_;
};

}  // namespace mantissa::detail
