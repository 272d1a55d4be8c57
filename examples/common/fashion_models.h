#pragma once
// The models trained on Fashion-MNIST by the examples and the benchmarks, defined once.
// bench/python/common.py defines the same models in PyTorch for the Python anchors. Their
// linear layers are `Float8Linear`s: `torch::nn::Linear` (same initialization, names and
// forward) until `--fp8` switches the inner ones to FP8 (docs/fp8.md).

#include <torch/torch.h>

#include <mantissa/fp8/float8_linear.h>

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

/// A small MLP on the flattened image, 784-256-256-10 (~0.27M parameters): so little
/// arithmetic per step that the time goes to dispatching ops, which is what it is for.
struct FashionMlpImpl : torch::nn::Module {
  fp8::Float8Linear fc1{28 * 28, 256};
  fp8::Float8Linear fc2{256, 256};
  fp8::Float8Linear fc3{256, 10};

  FashionMlpImpl() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x.flatten(1)));
    x = torch::relu(fc2(x));
    return fc3(x);
  }
};
TORCH_MODULE(FashionMlp);

/// A wide MLP, 784-4096-4096-10 (~20.0M parameters): large enough that the weights, gradients
/// and optimizer state dominate a process's memory, which is what the memory benchmarks of
/// sharded optimizer state (bench/sharded_memory) need.
struct FashionWideMlpImpl : torch::nn::Module {
  fp8::Float8Linear fc1{28 * 28, 4096};
  fp8::Float8Linear fc2{4096, 4096};
  fp8::Float8Linear fc3{4096, 10};

  FashionWideMlpImpl() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x.flatten(1)));
    x = torch::relu(fc2(x));
    return fc3(x);
  }
};
TORCH_MODULE(FashionWideMlp);

}  // namespace mantissa::examples
