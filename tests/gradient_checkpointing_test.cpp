// mantissa::nn::checkpoint and --gradient_checkpointing: the same numbers as without
// checkpointing, bit for bit in float32, dropout included.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/autocast.h>
#include <mantissa/nn/checkpoint.h>
#include <mantissa/nn/supports_gradient_checkpointing.h>
#include <mantissa/trainer.h>

#include "toy_training.h"
#include "value_error.h"

namespace {

using ::testing::HasSubstr;

// x + fc2(dropout(gelu(fc1(x)))): a residual block whose dropout draws from the CPU generator.
struct DropoutBlockImpl : torch::nn::Module {
  DropoutBlockImpl(int64_t width, double p) : p(p) {
    fc1 = register_module("fc1", torch::nn::Linear(width, 2 * width));
    fc2 = register_module("fc2", torch::nn::Linear(2 * width, width));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return x + fc2(torch::dropout(torch::gelu(fc1(x)), p, is_training()));
  }
  double p;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DropoutBlock);

// Three blocks, checkpointed when enabled.
struct BlocksImpl : torch::nn::Module, mantissa::nn::SupportsGradientCheckpointing {
  BlocksImpl(int64_t width, double p) {
    for (int i = 0; i < 3; ++i)
      blocks.push_back(register_module("b" + std::to_string(i), DropoutBlock(width, p)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) {
      auto* impl = block.get();
      x = maybe_checkpoint(
          is_training(), [impl](const torch::Tensor& h) { return impl->forward(h); }, x);
    }
    return x;
  }
  std::vector<DropoutBlock> blocks;
};
TORCH_MODULE(Blocks);

struct RunResult {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;  // the input's, then every parameter's
  torch::Tensor random_after;        // torch::rand after the backward: the generator's state
};

// One forward and backward of a freshly seeded model on a fixed input.
RunResult run_blocks(bool checkpointing, double p, bool input_requires_grad, bool bf16) {
  torch::manual_seed(11);
  Blocks model(16, p);
  if (checkpointing) model->gradient_checkpointing_enable();
  auto x = torch::randn({6, 16});
  if (input_requires_grad) x.requires_grad_(true);
  torch::manual_seed(5);  // the dropout masks
  RunResult out;
  {
    std::optional<mantissa::amp::Autocast> autocast;
    if (bf16) autocast.emplace(c10::kCPU, c10::kBFloat16);
    out.loss = model->forward(x).to(torch::kFloat).pow(2).mean();
  }
  out.loss.backward();
  if (input_requires_grad) out.grads.push_back(x.grad());
  for (const auto& param : model->parameters()) out.grads.push_back(param.grad());
  out.random_after = torch::rand({8});
  return out;
}

void expect_bitwise_equal(const RunResult& a, const RunResult& b) {
  EXPECT_TRUE(torch::equal(a.loss, b.loss))
      << a.loss.item<double>() << " vs " << b.loss.item<double>();
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_TRUE(a.grads[i].defined() && b.grads[i].defined()) << "gradient " << i;
    EXPECT_TRUE(torch::equal(a.grads[i], b.grads[i]))
        << "gradient " << i << ": max |diff| "
        << (a.grads[i] - b.grads[i]).abs().max().item<double>();
  }
  EXPECT_TRUE(torch::equal(a.random_after, b.random_after))
      << "the generator is not where it would be without the recompute";
}

TEST(GradientCheckpointingTest, SameLossAndGradientsBitwiseInFp32) {
  expect_bitwise_equal(run_blocks(false, 0.0, true, false), run_blocks(true, 0.0, true, false));
}

TEST(GradientCheckpointingTest, DropoutDrawsTheSameMaskInTheRecompute) {
  const auto plain = run_blocks(false, 0.3, true, false);
  expect_bitwise_equal(plain, run_blocks(true, 0.3, true, false));
  // Without the replay the masks differ, and so do the gradients: the test above can fail.
  torch::manual_seed(11);
  Blocks model(16, 0.3);
  model->gradient_checkpointing_enable(mantissa::GradientCheckpointingKwargs{
      /*use_reentrant=*/std::nullopt, /*preserve_rng_state=*/false});
  auto x = torch::randn({6, 16}).requires_grad_(true);
  torch::manual_seed(5);
  model->forward(x).pow(2).mean().backward();
  EXPECT_FALSE(torch::equal(x.grad(), plain.grads[0]));
}

TEST(GradientCheckpointingTest, SameLossAndGradientsUnderBf16Autocast) {
  const auto plain = run_blocks(false, 0.3, true, true);
  const auto checkpointed = run_blocks(true, 0.3, true, true);
  expect_bitwise_equal(plain, checkpointed);
}

TEST(GradientCheckpointingTest, ParametersGetGradientsWhenNoInputRequiresGrad) {
  expect_bitwise_equal(run_blocks(false, 0.3, false, false), run_blocks(true, 0.3, false, false));
}

TEST(GradientCheckpointingTest, SeveralOutputsAndAnUnusedOne) {
  torch::manual_seed(2);
  auto w = torch::randn({4, 4}).requires_grad_(true);
  auto a = torch::randn({3, 4}).requires_grad_(true);
  auto b = torch::randn({3, 4});  // no grad: gets none
  auto fn = [w](const std::vector<torch::Tensor>& in) {
    auto h = torch::tanh(in[0].matmul(w)) * in[1];
    return std::vector<torch::Tensor>{h.sum(1), h.exp(), h * 2};  // the last one is unused
  };
  auto loss_of = [](const std::vector<torch::Tensor>& out) {
    return out[0].pow(2).sum() + out[1].mean();
  };
  loss_of(fn({a, b})).backward();
  const auto grad_w = w.grad().clone(), grad_a = a.grad().clone();
  w.mutable_grad().reset();
  a.mutable_grad().reset();
  const auto outputs = mantissa::nn::checkpoint(fn, {a, b});
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_TRUE(outputs[0].requires_grad());
  loss_of(outputs).backward();
  EXPECT_TRUE(torch::equal(w.grad(), grad_w));
  EXPECT_TRUE(torch::equal(a.grad(), grad_a));
  EXPECT_FALSE(b.grad().defined());
}

TEST(GradientCheckpointingTest, WithoutGradModeItIsThePlainCall) {
  torch::NoGradGuard no_grad;
  auto w = torch::randn({4, 4}).requires_grad_(true);
  const auto out = mantissa::nn::checkpoint([w](const torch::Tensor& x) { return x.matmul(w); },
                                            torch::ones({2, 4}));
  EXPECT_FALSE(out.requires_grad());
}

TEST(GradientCheckpointingTest, AnIntegerOutputAndAnUndefinedInputAreRefused) {
  const auto error = mantissa_test::value_error_of;
  auto x = torch::randn({3}).requires_grad_(true);
  EXPECT_THAT(error([&] {
                mantissa::nn::checkpoint([](const torch::Tensor& t) { return t.argmax(); }, x);
              }),
              HasSubstr("every output must be floating point"));
  EXPECT_THAT(error([&] {
                mantissa::nn::checkpoint(
                    [](const std::vector<torch::Tensor>& in) { return std::vector{in[0] * 2}; },
                    {x, torch::Tensor()});
              }),
              HasSubstr("checkpoint: input 1 is an undefined tensor"));
}

// ---- the Trainer -----------------------------------------------------------------------------

// 8 -> 32, two checkpointed residual blocks with dropout, -> 4. The first block's input is the
// batch itself, which requires no grad.
struct CheckpointedMlpImpl : torch::nn::Module, mantissa::nn::SupportsGradientCheckpointing {
  CheckpointedMlpImpl() {
    fc_in = register_module("fc_in", torch::nn::Linear(8, 32));
    block = register_module("block", DropoutBlock(32, 0.2));
    fc_out = register_module("fc_out", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = maybe_checkpoint(
        is_training(), [this](const torch::Tensor& t) { return fc_in(t); }, x);
    h = maybe_checkpoint(
        is_training(), [this](const torch::Tensor& t) { return block(t); }, h);
    return fc_out(h);
  }
  torch::nn::Linear fc_in{nullptr}, fc_out{nullptr};
  DropoutBlock block{nullptr};
};
TORCH_MODULE(CheckpointedMlp);

struct TrainerRun {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;
};

TrainerRun train_checkpointed_mlp(bool checkpointing) {
  torch::manual_seed(4);
  CheckpointedMlp model;
  auto args = mantissa_test::toy_args(mantissa_test::toy_output_dir())
                  .max_steps(12)
                  .logging_steps(1)
                  .gradient_checkpointing(checkpointing);
  mantissa::Trainer trainer(model, args, mantissa_test::ToyDataset(96));
  trainer.train();
  EXPECT_EQ(model->is_gradient_checkpointing(), checkpointing);
  TrainerRun out;
  for (const auto& entry : trainer.state().log_history) {
    if (const auto it = entry.find("loss"); it != entry.end()) out.losses.push_back(it->second);
  }
  out.params = model->parameters();
  return out;
}

TEST(GradientCheckpointingTest, TrainerTrainsToTheSameLosses) {
  const auto plain = train_checkpointed_mlp(false);
  const auto checkpointed = train_checkpointed_mlp(true);
  ASSERT_EQ(plain.losses.size(), 12u);
  EXPECT_EQ(plain.losses, checkpointed.losses);
  ASSERT_EQ(plain.params.size(), checkpointed.params.size());
  for (std::size_t i = 0; i < plain.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain.params[i], checkpointed.params[i])) << "parameter " << i;
  }
}

TEST(GradientCheckpointingTest, TrainerRefusesAModelThatCannotCheckpoint) {
  auto args = mantissa_test::toy_args(mantissa_test::toy_output_dir())
                  .max_steps(1)
                  .gradient_checkpointing(true);
  mantissa::Trainer trainer(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(16));
  try {
    trainer.train();
    FAIL() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("--gradient_checkpointing: "));
    EXPECT_THAT(e.what_without_backtrace(),
                HasSubstr("ToyMlpImpl does not support gradient checkpointing"));
  }
}

}  // namespace
