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
#include "../common/fashion_models.h"
#include "../common/idx_dataset.h"

namespace {

using mantissa::examples::FashionCnn;
using mantissa::examples::FashionMnist;

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"Trains a small CNN on Fashion-MNIST with mantissa's Trainer.", "fashion_mnist"};
  std::string data_dir = mantissa::examples::kFashionMnistDir;
  app.add_option("--data_dir", data_dir, "Folder holding the four Fashion-MNIST *-ubyte.gz files")
      ->capture_default_str();
  std::string model_dtype = "fp32";
  mantissa::examples::add_model_dtype_option(app, model_dtype);
  const auto args = mantissa::examples::parse_example_flags(app, argc, argv);

  FashionMnist train(data_dir, FashionMnist::Split::kTrain);
  FashionMnist test(data_dir, FashionMnist::Split::kTest);
  torch::manual_seed(static_cast<uint64_t>(args.seed()));
  FashionCnn model;
  model->to(mantissa::examples::model_dtype_of(model_dtype));

  mantissa::Trainer trainer(model, args, std::move(train), std::move(test));
  const auto result = trainer.train();
  const auto metrics = trainer.evaluate();
  std::printf(
      "fashion_mnist: %lld steps in %.1f s (%.0f samples/s); test loss %.4f, test accuracy "
      "%.2f%%\n",
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
