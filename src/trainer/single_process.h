#pragma once
// The strategy of a lone process: every collective is the value itself, the data order is one
// shuffle, and the checkpoint is written by this process alone (LocalCheckpointIO).

#include "trainer/strategy.h"

namespace mantissa::detail {

/// A lone process (a null object: no code path asks whether the run is distributed).
/// Python: accelerate's single-device state. Not final: tests record calls on top of it.
class SingleProcess : public Strategy {
 public:
  std::int64_t world_size() const override { return 1; }
  std::int64_t rank() const override { return 0; }
  bool is_main_process() const override { return true; }
  bool is_local_main_process() const override { return true; }
  std::int64_t local_world_size() const override { return 1; }
  std::optional<std::string> gradient_checkpointing_blocker() const override {
    return std::nullopt;
  }
  bool should_save() const override { return true; }
  bool should_log() const override { return true; }
  std::string describe() const override { return {}; }

  std::vector<double> sum(std::vector<double> values) const override { return values; }
  /// Runs `check`; its error passes unchanged.
  bool passed_everywhere(const std::function<void()>& check) const override;
  std::string broadcast(const std::string& bytes) const override { return bytes; }
  void check_same_text(const std::string&, const std::string&) const override {}
  void max_all_reduce_(torch::Tensor&) const override {}

  std::int64_t examples_per_process(std::int64_t num_examples, bool) const override {
    return num_examples;
  }
  /// `torch::randperm(num_examples)` from a CPU generator seeded with `seed + epoch`.
  torch::Tensor epoch_order(std::int64_t num_examples, std::uint64_t seed, std::int64_t epoch,
                            bool drop_last) const override;
  torch::Tensor gather_rows(const torch::Tensor& rows, std::int64_t, double) const override {
    return rows;
  }

  void prepare_model(torch::nn::Module&) override {}
  ForwardScope forward_context(const ForwardPass&) override { return {}; }
  void before_backward(const torch::Tensor&, bool) override {}
  bool run_step(const std::function<bool()>& step) const override { return step(); }
  std::optional<std::string> cuda_graph_blocker() const override { return std::nullopt; }
  void copy_scaler_from_rank0(amp::GradScaler&) const override {}

 protected:
  CheckpointIO& checkpoint_io() override { return checkpoint_io_; }

 private:
  LocalCheckpointIO checkpoint_io_;
};

}  // namespace mantissa::detail
