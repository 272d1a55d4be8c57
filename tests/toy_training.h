#pragma once
// A small classification problem and model for the tests that train end to end on the CPU.

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/trainer.h>
#include "io/filesystem.h"

namespace mantissa_test {

/// A fixed 4-class problem: y = argmax(x W) for a fixed W.
class ToyDataset : public torch::data::datasets::BatchDataset<ToyDataset, mantissa::Batch> {
 public:
  explicit ToyDataset(std::int64_t n, std::uint64_t seed = 0) {
    auto gen = at::detail::createCPUGenerator(seed);
    x_ = torch::randn({n, 8}, gen);
    const auto w = torch::randn({8, 4}, gen);
    y_ = x_.matmul(w).argmax(1);
  }
  mantissa::Batch get_batch(c10::ArrayRef<size_t> indices) override {
    auto index =
        torch::tensor(std::vector<std::int64_t>(indices.begin(), indices.end()), torch::kLong);
    return {x_.index_select(0, index), y_.index_select(0, index)};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(x_.size(0)); }

 private:
  torch::Tensor x_;
  torch::Tensor y_;
};

/// 8 -> 16 -> 4 with a ReLU; parameters fc1.weight [16, 8], fc1.bias, fc2.weight [4, 16], fc2.bias.
struct ToyMlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{8, 16};
  torch::nn::Linear fc2{16, 4};
  ToyMlpImpl() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
};
TORCH_MODULE(ToyMlp);

inline ToyMlp make_toy_model(std::uint64_t seed = 1) {
  torch::manual_seed(seed);
  return ToyMlp();
}

/// A new folder under the test's temporary directory, kept after the test for a look.
inline std::string toy_output_dir() {
  return mantissa::io::make_temp_directory(::testing::TempDir(), "mantissa-toy-");
}

/// CPU, quiet, no saving unless a test asks; batch 8, so 100 examples make 13 batches.
inline mantissa::TrainingArguments toy_args(const std::string& output_dir) {
  return mantissa::TrainingArguments()
      .output_dir(output_dir)
      .per_device_train_batch_size(8)
      .per_device_eval_batch_size(16)
      .learning_rate(1e-2)
      .logging_steps(5)
      .save_strategy("no")
      .seed(7)
      .use_cpu(true)
      .disable_tqdm(true);
}

/// Collects the warnings raised while it lives (TORCH_WARN).
class WarningCapture : public c10::WarningHandler {
 public:
  WarningCapture() : guard_(this) {}
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;

 private:
  c10::WarningUtils::WarningHandlerGuard guard_;
};

}  // namespace mantissa_test
