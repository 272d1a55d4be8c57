// Fashion-MNIST with a small CNN, in bf16 autocast by default: what `make demo` runs.
//
//   fashion_mnist --bf16 --num_train_epochs 1 --learning_rate 2e-3
//
// Flags are Hugging Face TrainingArguments flags (--help lists them) plus --data_dir. The
// Trainer prints its precision plan, logs every --logging_steps, writes checkpoints and
// trainer_state.json into --output_dir, and the program ends with the test accuracy.
#include <cstdio>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include <mantissa/trainer.h>
#include <mantissa/training_arguments.h>

#include "../common/example_flags.h"
#include "../common/idx_dataset.h"

namespace {

using mantissa::examples::FashionMnist;

// Two conv blocks and a two-layer head: ~0.42M parameters, ~91-92% after a few epochs.
struct FashionCnnImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 32, 3).padding(1)};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(32, 64, 3).padding(1)};
  torch::nn::Linear fc1{64 * 7 * 7, 128};
  torch::nn::Linear fc2{128, 10};
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

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"Trains a small CNN on Fashion-MNIST with mantissa's Trainer.", "fashion_mnist"};
  std::string data_dir = mantissa::examples::kFashionMnistDir;
  app.add_option("--data_dir", data_dir, "Folder holding the four Fashion-MNIST *-ubyte.gz files")
      ->capture_default_str();
  const auto args = mantissa::examples::parse_example_flags(app, argc, argv);

  FashionMnist train(data_dir, FashionMnist::Split::kTrain);
  FashionMnist test(data_dir, FashionMnist::Split::kTest);
  torch::manual_seed(static_cast<uint64_t>(args.seed()));
  FashionCnn model;

  mantissa::Trainer trainer(model, args, std::move(train), std::move(test));
  const auto result = trainer.train();
  const auto metrics = trainer.evaluate();
  std::printf("fashion_mnist: %lld steps in %.1f s (%.0f samples/s); test loss %.4f, test accuracy %.2f%%\n",
              static_cast<long long>(result.global_step), result.metrics.at("train_runtime"),
              result.metrics.at("train_samples_per_second"), metrics.at("eval_loss"),
              100.0 * metrics.at("eval_accuracy"));
  return 0;
} catch (const c10::Error& e) {  // the message without LibTorch's C++ backtrace
  std::cerr << "fashion_mnist: error: " << e.what_without_backtrace() << "\n";
  return 1;
} catch (const std::exception& e) {
  std::cerr << "fashion_mnist: error: " << e.what() << "\n";
  return 1;
}
