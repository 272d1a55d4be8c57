// Fashion-MNIST with a small CNN, in bf16 autocast by default: what `make demo` runs.
//
//   fashion_mnist --bf16 --num_train_epochs 1 --learning_rate 2e-3
//
// Flags are Hugging Face TrainingArguments flags (--help lists them) plus --data_dir.
// Until mantissa::Trainer lands this program drives the mixed-precision step by hand with
// mantissa's Autocast and GradScaler, in the order the Trainer will use.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include <mantissa/amp/autocast.h>
#include <mantissa/amp/grad_scaler.h>
#include <mantissa/training_arguments.h>

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

std::string take_flag(std::vector<std::string>& rest, const std::string& name, std::string fallback) {
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == name && i + 1 < rest.size()) {
      auto value = rest[i + 1];
      rest.erase(rest.begin() + static_cast<long>(i), rest.begin() + static_cast<long>(i) + 2);
      return value;
    }
    if (rest[i].rfind(name + "=", 0) == 0) {
      auto value = rest[i].substr(name.size() + 1);
      rest.erase(rest.begin() + static_cast<long>(i));
      return value;
    }
  }
  return fallback;
}

double evaluate(FashionCnn& model, const FashionMnist& test, torch::ScalarType dtype, bool autocast) {
  torch::NoGradGuard no_grad;
  model->eval();
  mantissa::amp::Autocast guard(torch::kCPU, dtype, autocast);
  int64_t correct = 0;
  const int64_t n = test.images().size(0);
  for (int64_t start = 0; start < n; start += 1000) {
    const auto end = std::min(n, start + 1000);
    auto logits = model->forward(test.images().slice(0, start, end));
    correct += logits.argmax(1).eq(test.targets().slice(0, start, end)).sum().item<int64_t>();
  }
  model->train();
  return 100.0 * static_cast<double>(correct) / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) try {
  auto [args, rest] = mantissa::TrainingArguments::parse_known(argc, argv);
  const std::string data_dir = take_flag(rest, "--data_dir", mantissa::examples::kFashionMnistDir);
  TORCH_CHECK_VALUE(rest.empty(), "unrecognized arguments: ", c10::Join(" ", rest));

  torch::manual_seed(static_cast<uint64_t>(args.seed()));
  FashionMnist train(data_dir, FashionMnist::Split::kTrain);
  const FashionMnist test(data_dir, FashionMnist::Split::kTest);
  const int64_t train_size = static_cast<int64_t>(*train.size());

  const bool amp = args.bf16() || args.fp16();
  const auto dtype = args.fp16() ? torch::kHalf : torch::kBFloat16;
  const int64_t batch_size = args.per_device_train_batch_size();
  const int64_t steps_per_epoch = train_size / batch_size + (args.dataloader_drop_last() ? 0 : (train_size % batch_size != 0));
  const int64_t epochs = static_cast<int64_t>(std::ceil(args.num_train_epochs()));
  const int64_t total_steps = args.max_steps() > 0 ? args.max_steps() : steps_per_epoch * epochs;
  std::printf("fashion_mnist: precision plan: %s autocast on %s, loss scaling %s, fp32 weights; "
              "%lld train / %lld test images, %lld steps of batch %lld\n",
              amp ? (args.fp16() ? "fp16" : "bf16") : "no", "cpu", args.fp16() ? "on" : "off",
              static_cast<long long>(train_size), static_cast<long long>(test.images().size(0)),
              static_cast<long long>(total_steps), static_cast<long long>(batch_size));

  FashionCnn model;
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(args.learning_rate())
                                                         .betas({args.adam_beta1(), args.adam_beta2()})
                                                         .eps(args.adam_epsilon())
                                                         .weight_decay(args.weight_decay()));
  mantissa::amp::GradScaler scaler(mantissa::amp::GradScalerOptions().enabled(args.fp16()));
  auto loader = torch::data::make_data_loader(
      std::move(train), torch::data::samplers::RandomSampler(static_cast<size_t>(train_size)),
      torch::data::DataLoaderOptions(static_cast<size_t>(batch_size)).drop_last(args.dataloader_drop_last()));

  const auto start = std::chrono::steady_clock::now();
  int64_t step = 0;
  double running_loss = 0;
  int64_t running_count = 0;
  const auto logging_steps = static_cast<int64_t>(args.logging_steps() >= 1 ? args.logging_steps() : 100);
  for (int64_t epoch = 0; epoch < epochs && step < total_steps; ++epoch) {
    for (auto& batch : *loader) {
      if (step >= total_steps) break;
      // Linear decay to zero (HF's default "linear" schedule without warmup).
      const double lr = args.learning_rate() * (1.0 - static_cast<double>(step) / static_cast<double>(total_steps));
      for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);

      optimizer.zero_grad();
      torch::Tensor loss;
      {
        mantissa::amp::Autocast guard(torch::kCPU, dtype, amp);
        loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
      }
      scaler.scale(loss).backward();
      scaler.unscale_(optimizer);
      torch::nn::utils::clip_grad_norm_(model->parameters(), args.max_grad_norm());
      scaler.step(optimizer);
      scaler.update();
      ++step;
      running_loss += loss.item<double>();
      ++running_count;
      if (step % logging_steps == 0 || step == total_steps) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("step %lld/%lld  epoch %.2f  loss %.4f  lr %.2e  %.0f samples/s\n",
                    static_cast<long long>(step), static_cast<long long>(total_steps),
                    static_cast<double>(step) / static_cast<double>(steps_per_epoch),
                    running_loss / static_cast<double>(running_count), lr,
                    static_cast<double>(step * batch_size) / seconds);
        std::fflush(stdout);
        running_loss = 0;
        running_count = 0;
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double accuracy = evaluate(model, test, dtype, amp);
  std::printf("fashion_mnist: trained %lld steps in %.1f s; test accuracy %.2f%%\n",
              static_cast<long long>(step), seconds, accuracy);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "fashion_mnist: error: " << e.what() << "\n";
  return 1;
}
