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

#include "../common/fashion_models.h"
#include "../common/idx_dataset.h"

namespace {

using mantissa::examples::FashionCnn;
using mantissa::examples::FashionMnist;

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

}  // namespace

int main(int argc, char** argv) try {
  auto [args, rest] = mantissa::TrainingArguments::parse_known(argc, argv);
  const std::string data_dir = take_flag(rest, "--data_dir", mantissa::examples::kFashionMnistDir);
  TORCH_CHECK_VALUE(rest.empty(), "unrecognized arguments: ", c10::Join(" ", rest));

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
} catch (const std::exception& e) {
  std::cerr << "fashion_mnist: error: " << e.what() << "\n";
  return 1;
}
