#pragma once
// The model's mode during an evaluation, restored whatever way the evaluation ends.

#include <torch/nn/module.h>

namespace mantissa::detail {

/// Puts `module` in eval mode for its lifetime and back in train mode afterwards when it was
/// training, also when an exception passes. Python: the `model.eval()` at the start of HF's
/// `evaluation_loop` and the `model.train()` of the next training step, as one guard. The
/// full-evaluation dtype cast (`bf16_full_eval`) is done before and not undone, as in HF:
/// casting back would not give the fp32 weights back. No device sync.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(torch::nn::Module& module)
      : module_(module), was_training_(module.is_training()) {
    module_.eval();
  }
  ~EvalModeGuard() {
    if (was_training_) module_.train();
  }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
};

}  // namespace mantissa::detail
