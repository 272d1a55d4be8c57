#pragma once
// The data-parallel strategy: every process holds the whole model and optimizer, trains on its
// share of each batch, and c10d::Reducer averages the gradients during backward. Where the
// process sits, the collectives, the data order and the checkpoint protocol are
// `ProcessGroupStrategy`'s; this class adds the gradient averaging. Python:
// `DistributedDataParallel` as HF's Trainer drives it through accelerate.

#include <memory>

#include "trainer/gradient_sync.h"
#include "trainer/process_group_strategy.h"

namespace mantissa::detail {

/// Several processes, each with the whole state; gradients averaged during backward.
/// `StateShardedDataParallel` derives from it to shard the optimizer state by whole tensors.
class DataParallel : public ProcessGroupStrategy {
 public:
  /// A strategy over the job `collectives` joined, for a Trainer of `args` (see
  /// `ProcessGroupStrategy`).
  DataParallel(std::shared_ptr<Collectives> collectives, const TrainingArguments& args);
  ~DataParallel() override;

  std::string describe() const override;

  /// DDP's constructor: the same parameters everywhere, rank 0's weights (and buffers with
  /// `ddp_broadcast_buffers`) copied to every process, then the Reducer's buckets.
  void prepare_model(torch::nn::Module& module) override;
  /// A training pass: the Reducer readied for this backward (and, with `ddp_broadcast_buffers`,
  /// rank 0's buffers copied everywhere). Nothing for an evaluation pass.
  ForwardScope forward_context(const ForwardPass& pass) override;
  void before_backward(const torch::Tensor& loss, bool sync) override;
  bool run_step(const std::function<bool()>& step) const override;
  std::optional<std::string> cuda_graph_blocker() const override;

 private:
  std::unique_ptr<GradientSync> gradient_sync_;  ///< made by prepare_model
};

}  // namespace mantissa::detail
