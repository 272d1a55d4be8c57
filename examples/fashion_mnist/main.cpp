// Fashion-MNIST with a small CNN (or, with --model mlp, an MLP), in bf16 autocast by default:
// what `make demo` runs (with the CNN).
//
//   fashion_mnist --bf16 --num_train_epochs 1 --learning_rate 2e-3
//   fashion_mnist --bf16 --model mlp --max_steps 200
//
// Flags are Hugging Face TrainingArguments flags (--help lists them) plus --data_dir, --model
// and --model_dtype. The program names its model, the Trainer prints its precision plan, logs
// every --logging_steps, writes checkpoints and trainer_state.json into --output_dir, and the
// program ends with the test accuracy. Started by torchrun, every rank runs this program; only
// rank 0 prints the model line and the accuracy, as HF's scripts do with is_world_process_zero.
#include <cstdio>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include <mantissa/argument_parser.h>
#include <mantissa/distributed.h>
#include <mantissa/trainer.h>
#include <mantissa/training_arguments.h>

#include "../common/example_flags.h"
#include "../common/fashion_models.h"
#include "../common/idx_dataset.h"

namespace {

using mantissa::examples::FashionCnn;
using mantissa::examples::FashionMlp;
using mantissa::examples::FashionMnist;
using mantissa::examples::FashionModelKind;

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& p : module.parameters()) count += p.numel();
  return count;
}

}  // namespace

int main(int argc, char** argv) try {
  mantissa::ArgumentParser parser(
      "Trains a small CNN or MLP on Fashion-MNIST with mantissa's Trainer.", "fashion_mnist");
  auto& app = parser.app();
  std::string data_dir = mantissa::examples::kFashionMnistDir;
  app.add_option("--data_dir", data_dir, "Folder holding the four Fashion-MNIST *-ubyte.gz files")
      ->capture_default_str();
  std::string model_name = "cnn";
  mantissa::examples::add_fashion_model_option(app, model_name);
  std::string model_dtype = "fp32";
  mantissa::examples::add_model_dtype_option(app, model_dtype);
  const auto args = parser.parse(argc, argv);
  const bool main_process =
      mantissa::distributed::DistributedEnvironment::from_env().is_main_process();

  FashionMnist train(data_dir, FashionMnist::Split::kTrain);
  FashionMnist test(data_dir, FashionMnist::Split::kTest);
  torch::manual_seed(static_cast<uint64_t>(args.seed()));
  // Both branches build the same type, the Trainer; the model's own type ends here.
  const auto make_trainer = [&](auto model, const char* description) {
    model->to(mantissa::examples::model_dtype_of(model_dtype));
    if (main_process) {
      std::printf("fashion_mnist: model %s (%s, %lld parameters)\n", model_name.c_str(),
                  description, static_cast<long long>(parameter_count(*model)));
    }
    return mantissa::Trainer(model, args, std::move(train), std::move(test));
  };
  mantissa::Trainer trainer =
      mantissa::examples::fashion_model_of(model_name) == FashionModelKind::mlp
          ? make_trainer(FashionMlp(), "784-256-256-10 MLP")
          : make_trainer(FashionCnn(), "two conv blocks, dropout 0.25 in the head");

  const auto result = trainer.train();
  const auto metrics = trainer.evaluate();
  if (main_process) {
    std::printf(
        "fashion_mnist: %lld steps in %.1f s (%.0f samples/s); test loss %.4f, test accuracy "
        "%.2f%%\n",
        static_cast<long long>(result.global_step), result.metrics.at("train_runtime"),
        result.metrics.at("train_samples_per_second"), metrics.at("eval_loss"),
        100.0 * metrics.at("eval_accuracy"));
  }
  return 0;
} catch (const c10::Error& e) {  // the message without LibTorch's C++ backtrace
  std::cerr << "fashion_mnist: error: " << e.what_without_backtrace() << "\n";
  return 1;
} catch (const std::exception& e) {
  std::cerr << "fashion_mnist: error: " << e.what() << "\n";
  return 1;
}
