#pragma once
// The models trained on Fashion-MNIST by the examples and the benchmarks, defined once.
// bench/python/common.py defines the same models in PyTorch for the Python anchors. Their
// linear layers are `Float8Linear`s: `torch::nn::Linear` (same initialization, names and
// forward) until `--fp8` switches the inner ones to FP8 (docs/fp8.md).

#include <torch/torch.h>

#include <mantissa/fp8/float8_linear.h>
#include <mantissa/nn/supports_gradient_checkpointing.h>

namespace mantissa::examples {

/// Two conv blocks and a two-layer head: ~0.42M parameters, ~91-92% after a few epochs.
/// Input [N, 1, 28, 28], output logits [N, 10].
struct FashionCnnImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 32, 3).padding(1)};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(32, 64, 3).padding(1)};
  fp8::Float8Linear fc1{64 * 7 * 7, 128};
  fp8::Float8Linear fc2{128, 10};
  torch::nn::Dropout dropout{0.25};

  FashionCnnImpl() {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("dropout", dropout);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    x = dropout(torch::relu(fc1(x.flatten(1))));
    return fc2(x);
  }
};
TORCH_MODULE(FashionCnn);

/// An MLP on the flattened image, 784-hidden-hidden-10. The default, 784-256-256-10 (~0.27M
/// parameters), does so little arithmetic per step that the time goes to dispatching ops,
/// which is what it is for; `FashionWideMlp()` (hidden 4096, ~20.0M parameters) is large enough
/// that weights, gradients and optimizer state dominate a process's memory, which is what the
/// benchmarks of sharded optimizer state (bench/sharded_memory) need.
struct FashionMlpImpl : torch::nn::Module {
  explicit FashionMlpImpl(int64_t hidden = 256)
      : fc1(28 * 28, hidden), fc2(hidden, hidden), fc3(hidden, 10) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x.flatten(1)));
    x = torch::relu(fc2(x));
    return fc3(x);
  }

  fp8::Float8Linear fc1;
  fp8::Float8Linear fc2;
  fp8::Float8Linear fc3;
};
TORCH_MODULE(FashionMlp);

/// The 784-4096-4096-10 FashionMlp.
inline FashionMlp FashionWideMlp() { return FashionMlp(4096); }

/// One block of FashionWideBlocks: h + relu(fc(h)), fc width -> width.
struct FashionResidualBlockImpl : torch::nn::Module {
  explicit FashionResidualBlockImpl(int64_t width)
      : fc(register_module("fc", torch::nn::Linear(width, width))) {}
  torch::Tensor forward(const torch::Tensor& h) { return h + torch::relu(fc(h)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(FashionResidualBlock);

/// 784 -> width (fc_in), `num_blocks` residual blocks (blocks.<k>.fc), width -> 10 (fc_out):
/// a model whose parameters sit in blocks, declared for full sharding (`--fsdp` gathers one
/// block at a time). The default, width 2048 and 12 blocks, has ~52M parameters
/// (bench/sharded_memory --model wide_blocks).
struct FashionWideBlocksImpl : torch::nn::Module, nn::SupportsGradientCheckpointing {
  explicit FashionWideBlocksImpl(int64_t width = 2048, int64_t num_blocks = 12)
      : fc_in(register_module("fc_in", torch::nn::Linear(28 * 28, width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        fc_out(register_module("fc_out", torch::nn::Linear(width, 10))) {
    for (int64_t k = 0; k < num_blocks; ++k) blocks->push_back(FashionResidualBlock(width));
  }
  std::vector<std::string> no_split_modules() const override {
    return {"FashionResidualBlockImpl"};
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(fc_in(x.flatten(1)));
    for (const auto& module : *blocks) {
      auto* block = module->as<FashionResidualBlock>();
      h = run_block(*block, [block](const torch::Tensor& in) { return block->forward(in); }, h);
    }
    return fc_out(h);
  }
  torch::nn::Linear fc_in;
  torch::nn::ModuleList blocks;
  torch::nn::Linear fc_out;
};
TORCH_MODULE(FashionWideBlocks);

}  // namespace mantissa::examples
