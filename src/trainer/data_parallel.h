#pragma once
// The data-parallel strategy: every process holds the whole model and optimizer, trains on its
// share of each batch, and c10d::Reducer averages the gradients during backward. The process
// group and its collectives are `Collectives`; this class decides what the Trainer does with
// them. Python: `DistributedDataParallel` as HF's Trainer drives it through accelerate.

#include <memory>

#include "trainer/collectives.h"
#include "trainer/gradient_sync.h"
#include "trainer/strategy.h"

namespace mantissa::detail {

/// Several processes, each with the whole state; gradients averaged during backward. The base
/// of `ShardedDataParallel`, which keeps its place in the job, collectives, data order and
/// checkpoint protocol and replaces the gradient path and the optimizer.
class DataParallel : public Strategy {
 public:
  /// A strategy over the job `collectives` joined, for a Trainer of `args`. Checks that every
  /// process was given the same arguments (a collective; `is_execution_detail` fields may
  /// differ).
  DataParallel(std::shared_ptr<Collectives> collectives, const TrainingArguments& args);
  ~DataParallel() override;

  std::int64_t world_size() const override { return collectives_->world_size(); }
  std::int64_t rank() const override { return collectives_->rank(); }
  bool is_main_process() const override { return collectives_->env().is_main_process(); }
  bool is_local_main_process() const override {
    return collectives_->env().is_local_main_process();
  }
  std::int64_t local_world_size() const override { return collectives_->env().local_world_size; }
  bool should_save() const override;
  bool should_log() const override;
  std::string describe() const override;

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

  /// DDP's constructor: the same parameters everywhere, rank 0's weights (and buffers with
  /// `ddp_broadcast_buffers`) copied to every process, then the Reducer's buckets.
  void prepare_model(torch::nn::Module& module) override;
  void before_forward(bool sync) override;
  void before_backward(const torch::Tensor& loss, bool sync) override;
  bool run_step(const std::function<bool()>& step) const override;
  std::optional<std::string> cuda_graph_blocker() const override;
  /// With `ddp_find_unused_parameters` (the default): the search for unused parameters walks
  /// the forward's graph, where the recomputed blocks' parameters do not appear, so it would
  /// count them unused and then see their gradients arrive (HF turns the search off for such a
  /// model).
  std::optional<std::string> gradient_checkpointing_blocker() const override;
  void copy_scaler_from_rank0(amp::GradScaler& scaler) const override;

  /// Written together: rank 0 (and each node's first process with `save_on_each_node`) writes
  /// the files into a shared temporary folder, every process adds `rng_state_<rank>.pth`, the
  /// writers publish it; they agree after each stage, and a failure anywhere abandons the
  /// folder and raises on every process.
  void save_checkpoint(const std::string& output_dir, const CheckpointParts& parts) override;
  void load_checkpoint(const std::string& dir, const CheckpointParts& parts) override;

 protected:
  /// The job's process group and collectives.
  const Collectives& collectives() const noexcept { return *collectives_; }
  /// The Trainer's arguments, as given.
  const TrainingArguments& args() const noexcept { return args_; }
  /// The first half of `prepare_model`: the same parameters everywhere, rank 0's weights (and
  /// buffers when `with_buffers`) copied to every process. A collective.
  void agree_on_model(torch::nn::Module& module, bool with_buffers) const;

 private:
  std::shared_ptr<Collectives> collectives_;
  TrainingArguments args_;
  std::unique_ptr<GradientSync> gradient_sync_;  ///< made by prepare_model
};

}  // namespace mantissa::detail
