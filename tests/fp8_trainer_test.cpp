// The Trainer with --fp8: the model's Float8Linear layers are converted, the plan line names
// them, training works on the CPU (emulated FP8 GEMMs), the delayed recipe's state advances once
// per optimizer step and travels in checkpoints, and the arguments are checked and round-trip.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/fp8/float8_linear.h>
#include <mantissa/fp8/scaling_state.h>
#include <mantissa/trainer.h>

#include "io/atomic_file.h"
#include "io/filesystem.h"
#include "io/torch_save.h"
#include "test_util.h"
#include "toy_training.h"

namespace {

using mantissa::Trainer;
using mantissa::TrainingArguments;
using mantissa::fp8::Float8Linear;
using mantissa_test::toy_args;
using mantissa_test::ToyDataset;
using ::testing::HasSubstr;

/// 8 -> 32 -> 32 -> 4: under the default filter only the middle layer (fc2) runs in FP8.
struct Fp8MlpImpl : torch::nn::Module {
  Float8Linear fc1{8, 32};
  Float8Linear fc2{32, 32};
  Float8Linear fc3{32, 4};
  Fp8MlpImpl() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
};
TORCH_MODULE(Fp8Mlp);

Fp8Mlp make_fp8_model() {
  torch::manual_seed(1);
  return Fp8Mlp();
}

TrainingArguments fp8_args(const std::string& dir) {
  return toy_args(dir).bf16(true).fp8(true).fp8_amax_history_len(16).max_steps(8).logging_steps(1);
}

std::string validate_error(const TrainingArguments& args) {
  try {
    args.validate();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "<no exception>";
}

std::vector<torch::Tensor> weights_of(const torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

std::vector<double> logged_losses(const mantissa::TrainerState& state) {
  std::vector<double> out;
  for (const auto& entry : state.log_history) {
    if (entry.count("loss") != 0) out.push_back(entry.at("loss"));
  }
  return out;
}

// Rows of the amax history that hold something: one per optimizer update so far (each update
// rolls the history by one row and starts row 0 afresh).
int64_t filled_history_rows(const mantissa::fp8::Float8ScalingState& state) {
  return state.amax_history().ne(0).any(1).sum().item<int64_t>();
}

// ---- arguments -------------------------------------------------------------------------------

TEST(Fp8TrainerTest, Fp8NeedsBf16OrFp16) {
  EXPECT_EQ(validate_error(TrainingArguments().fp8(true)),
            "fp8 needs bf16 or fp16 mixed precision for the layers and outputs that stay in high "
            "precision: add --bf16 (or --fp16) (fp8=True, bf16=False, fp16=False)");
  EXPECT_EQ(validate_error(TrainingArguments().fp8(true).bf16(true)), "<no exception>");
  // The recipe fields are checked with fp8 off too, as every other field is.
  EXPECT_EQ(validate_error(TrainingArguments().fp8_margin(-1)),
            "fp8_margin must be in [0, 64], got -1");
}

TEST(Fp8TrainerTest, BadRecipeValuesAreNamed) {
  const auto args = TrainingArguments().bf16(true).fp8(true);
  EXPECT_EQ(validate_error(TrainingArguments(args).fp8_recipe("lazy")),
            "fp8_recipe: lazy is not a valid ScalingRecipe, please select one of ['current', "
            "'delayed']");
  EXPECT_EQ(validate_error(TrainingArguments(args).fp8_format("E5M2")),
            "fp8_format: E5M2 is not a valid Float8Format, please select one of ['HYBRID', "
            "'E4M3']");
  EXPECT_EQ(validate_error(TrainingArguments(args).fp8_amax_compute_algo("mean")),
            "fp8_amax_compute_algo: mean is not a valid AmaxComputeAlgo, please select one of "
            "['max', 'most_recent']");
  EXPECT_EQ(validate_error(TrainingArguments(args).fp8_amax_history_len(0)),
            "fp8_amax_history_len must be at least 1, got 0");
  EXPECT_EQ(validate_error(TrainingArguments(args).fp8_margin(65)),
            "fp8_margin must be in [0, 64], got 65");
}

TEST(Fp8TrainerTest, FieldsRoundTripThroughTheCommandLineAndJson) {
  const auto args = TrainingArguments::parse(
      {"--bf16", "--fp8", "--fp8_recipe", "current", "--fp8_amax_history_len", "16",
       "--fp8_amax_compute_algo", "most_recent", "--fp8_margin", "3", "--fp8_format", "E4M3"});
  EXPECT_TRUE(args.fp8());
  EXPECT_EQ(args.fp8_recipe(), mantissa::fp8::ScalingRecipe::kCurrent);
  EXPECT_EQ(args.fp8_amax_history_len(), 16);
  EXPECT_EQ(args.fp8_amax_compute_algo(), mantissa::fp8::AmaxComputeAlgo::kMostRecent);
  EXPECT_EQ(args.fp8_margin(), 3);
  EXPECT_EQ(args.fp8_format(), mantissa::fp8::Float8Format::kE4M3);
  const auto json = args.to_json();
  EXPECT_THAT(json, HasSubstr("\"fp8\": true"));
  EXPECT_THAT(json, HasSubstr("\"fp8_recipe\": \"current\""));
  EXPECT_THAT(json, HasSubstr("\"fp8_amax_compute_algo\": \"most_recent\""));
  EXPECT_THAT(json, HasSubstr("\"fp8_format\": \"E4M3\""));
  EXPECT_EQ(TrainingArguments::from_json(json), args);
  // What the Trainer builds from them.
  const auto recipe = args.float8_recipe();
  EXPECT_EQ(recipe.recipe(), mantissa::fp8::ScalingRecipe::kCurrent);
  EXPECT_EQ(recipe.amax_history_len(), 16);
  EXPECT_EQ(recipe.amax_compute_algo(), mantissa::fp8::AmaxComputeAlgo::kMostRecent);
  EXPECT_EQ(recipe.margin(), 3);
  EXPECT_EQ(recipe.fp8_format(), mantissa::fp8::Float8Format::kE4M3);
  EXPECT_THAT(
      [] {
        TrainingArguments::parse({"--bf16", "--fp8", "--fp8_recipe", "tensorwise"});
      },
      ::testing::ThrowsMessage<c10::ValueError>(
          HasSubstr("fp8_recipe: tensorwise is not a valid ScalingRecipe, please select one of "
                    "['current', 'delayed']")));
}

// ---- the Trainer -----------------------------------------------------------------------------

TEST(Fp8TrainerTest, ThePlanLineNamesTheFp8Layers) {
  Trainer trainer(make_fp8_model(), fp8_args(mantissa_test::toy_output_dir()), ToyDataset(100));
  EXPECT_THAT(trainer.precision_plan().describe(),
              HasSubstr("; fp8 delayed (the layers are chosen when training starts)"));
  EXPECT_EQ(trainer.fp8_scaling_state(), nullptr);
  trainer.optimizer();  // converts the model
  EXPECT_EQ(trainer.precision_plan().describe(),
            "bf16 autocast, fp32 weights, no loss scaling; fp8 delayed (HYBRID, amax history 16, "
            "max, margin 0): 1 of 3 linear layers (fc2); high precision: fc1, fc3");
  ASSERT_NE(trainer.fp8_scaling_state(), nullptr);
  EXPECT_EQ(trainer.fp8_scaling_state()->names(),
            (std::vector<std::string>{"fc2.input", "fc2.weight", "fc2.grad_output"}));
}

TEST(Fp8TrainerTest, TrainsAndTheLossGoesDownUnderEitherRecipe) {
  for (const char* recipe : {"delayed", "current"}) {
    SCOPED_TRACE(recipe);
    auto model = make_fp8_model();
    Trainer trainer(model,
                    fp8_args(mantissa_test::toy_output_dir())
                        .fp8_recipe(recipe)
                        .max_steps(-1)
                        .num_train_epochs(6)
                        .logging_steps(13),
                    ToyDataset(100), ToyDataset(100));
    const double before = trainer.evaluate().at("eval_loss");
    trainer.train();
    EXPECT_TRUE(model->fc2->is_float8());
    EXPECT_FALSE(model->fc1->is_float8());
    const auto losses = logged_losses(trainer.state());
    ASSERT_GE(losses.size(), 5u);
    EXPECT_LT(losses.back(), 0.8 * losses.front());
    EXPECT_LT(trainer.evaluate().at("eval_loss"), 0.8 * before);
    EXPECT_EQ(trainer.fp8_scaling_state() != nullptr, std::string(recipe) == "delayed");
  }
}

TEST(Fp8TrainerTest, DelayedScalesMoveOffTheirStart) {
  Trainer trainer(make_fp8_model(), fp8_args(mantissa_test::toy_output_dir()), ToyDataset(100));
  trainer.train();
  const auto* state = trainer.fp8_scaling_state();
  ASSERT_NE(state, nullptr);
  // Scales start at 1.0; after the first update each is 448 (or 57344) over a finite amax.
  EXPECT_TRUE(state->scales().ne(1.0).all().item<bool>()) << state->scales();
  EXPECT_TRUE(torch::isfinite(state->scales()).all().item<bool>());
  EXPECT_EQ(filled_history_rows(*state), 8);
}

TEST(Fp8TrainerTest, AccumulationUpdatesTheHistoryOncePerOptimizerStep) {
  Trainer trainer(
      make_fp8_model(),
      fp8_args(mantissa_test::toy_output_dir()).gradient_accumulation_steps(3).max_steps(4),
      ToyDataset(100));
  trainer.train();
  const auto* state = trainer.fp8_scaling_state();
  ASSERT_NE(state, nullptr);
  // 12 micro-batches, 4 updates: 4 rows, each the largest amax of its group's 3 micro-batches.
  EXPECT_EQ(trainer.state().global_step, 4);
  EXPECT_EQ(filled_history_rows(*state), 4) << state->amax_history();
}

TEST(Fp8TrainerTest, AUserFilterPicksTheFp8Layers) {
  Trainer trainer(make_fp8_model(), fp8_args(mantissa_test::toy_output_dir()), ToyDataset(100));
  std::vector<std::string> seen;
  trainer.set_float8_filter([&](const mantissa::fp8::LinearLayerInfo& layer) {
    seen.push_back(layer.name + "/" + std::to_string(layer.index) + "/" +
                   std::to_string(layer.count) + "/" + std::to_string(layer.in_features));
    return layer.name != "fc3";  // the first layer too, which the default keeps out
  });
  trainer.optimizer();  // converts the model
  EXPECT_EQ(seen, (std::vector<std::string>{"fc1/0/3/8", "fc2/1/3/32", "fc3/2/3/32"}));
  EXPECT_THAT(trainer.precision_plan().describe(),
              HasSubstr("2 of 3 linear layers (fc1, fc2); high precision: fc3"));
  EXPECT_THAT([&] { trainer.set_float8_filter(mantissa::fp8::default_float8_filter); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  HasSubstr("set_float8_filter must be called before the model is converted")));

  Trainer none(make_fp8_model(), fp8_args(mantissa_test::toy_output_dir()), ToyDataset(100));
  none.set_float8_filter([](const mantissa::fp8::LinearLayerInfo&) { return false; });
  EXPECT_THAT([&] { none.train(); }, ::testing::ThrowsMessage<c10::ValueError>(HasSubstr(
                                         "layers that the filter of set_float8_filter accepts")));
}

TEST(Fp8TrainerTest, AModelWithoutFloat8LinearLayersIsRefused) {
  Trainer trainer(mantissa_test::make_toy_model(),
                  toy_args(mantissa_test::toy_output_dir()).bf16(true).fp8(true), ToyDataset(100));
  EXPECT_THAT(
      [&] { trainer.train(); },
      ::testing::ThrowsMessage<c10::ValueError>(HasSubstr(
          "--fp8: no layer of this model can run in FP8 (fp8 delayed (HYBRID, amax "
          "history 1024, max, margin 0): 0 of 2 linear layers; high precision: fc1, fc2)")));
}

// ---- checkpoints -----------------------------------------------------------------------------

TEST(Fp8TrainerTest, ResumeContinuesBitForBitWithTheSameScales) {
  // One run of 8 steps that saves checkpoint-4 on the way, then one that resumes there.
  const auto dir = mantissa_test::toy_output_dir();
  const auto args = fp8_args(dir).save_strategy("steps").save_steps(4);
  auto straight = make_fp8_model();
  Trainer first(straight, args, ToyDataset(100));
  first.train();
  EXPECT_TRUE(mantissa::io::path_exists(dir + "/checkpoint-4/fp8_state.pt"));

  auto resumed = make_fp8_model();
  Trainer second(resumed, TrainingArguments(args).output_dir(mantissa_test::toy_output_dir()),
                 ToyDataset(100));
  second.train(dir + "/checkpoint-4");
  EXPECT_TRUE(same_bits(weights_of(*straight), weights_of(*resumed)));
  ASSERT_NE(second.fp8_scaling_state(), nullptr);
  EXPECT_TRUE(torch::equal(first.fp8_scaling_state()->amax_history(),
                           second.fp8_scaling_state()->amax_history()));
  EXPECT_TRUE(
      torch::equal(first.fp8_scaling_state()->scales(), second.fp8_scaling_state()->scales()));
  EXPECT_EQ(logged_losses(first.state()).back(), logged_losses(second.state()).back());
}

TEST(Fp8TrainerTest, ACheckpointWithoutFp8StateStartsFreshScalesOrIsRefused) {
  // Saved without FP8: a warning, and the scales start afresh.
  const auto plain_dir = mantissa_test::toy_output_dir();
  Trainer(make_fp8_model(),
          fp8_args(plain_dir).fp8(false).save_strategy("steps").save_steps(4).max_steps(4),
          ToyDataset(100))
      .train();
  ASSERT_FALSE(mantissa::io::path_exists(plain_dir + "/checkpoint-4/fp8_state.pt"));
  {
    mantissa_test::WarningCapture warnings;
    Trainer trainer(make_fp8_model(), fp8_args(mantissa_test::toy_output_dir()), ToyDataset(100));
    trainer.train(plain_dir + "/checkpoint-4");
    EXPECT_EQ(trainer.state().global_step, 8);
    bool warned = false;
    for (const auto& m : warnings.messages) {
      warned |= m.find(
                    "has no fp8_state.pt (it was saved without the delayed FP8 recipe), so "
                    "the FP8 scales start afresh") != std::string::npos;
    }
    EXPECT_TRUE(warned) << ::testing::PrintToString(warnings.messages);
  }

  // Saved with the delayed recipe, then the file lost: an error naming it.
  const auto fp8_dir = mantissa_test::toy_output_dir();
  Trainer(make_fp8_model(), fp8_args(fp8_dir).save_strategy("steps").save_steps(4).max_steps(4),
          ToyDataset(100))
      .train();
  ASSERT_EQ(std::remove((fp8_dir + "/checkpoint-4/fp8_state.pt").c_str()), 0);
  Trainer trainer(make_fp8_model(), fp8_args(mantissa_test::toy_output_dir()), ToyDataset(100));
  EXPECT_THAT([&] { trainer.train(fp8_dir + "/checkpoint-4"); },
              ::testing::ThrowsMessage<c10::Error>(
                  HasSubstr("fp8_state.pt' is missing, but the checkpoint's training_args.json "
                            "says its run used --fp8 with the delayed recipe")));
}

TEST(Fp8TrainerTest, AnotherHistoryLengthCannotResume) {
  const auto dir = mantissa_test::toy_output_dir();
  Trainer(make_fp8_model(), fp8_args(dir).save_strategy("steps").save_steps(4).max_steps(4),
          ToyDataset(100))
      .train();
  Trainer trainer(make_fp8_model(),
                  fp8_args(mantissa_test::toy_output_dir()).fp8_amax_history_len(32),
                  ToyDataset(100));
  EXPECT_THAT([&] { trainer.train(dir + "/checkpoint-4"); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  HasSubstr("another model or another fp8_amax_history_len")));
}

TEST(Fp8TrainerTest, ScalesAndAmaxesNoRunRecordsCannotResume) {
  const auto dir = mantissa_test::toy_output_dir();
  Trainer(make_fp8_model(), fp8_args(dir).save_strategy("steps").save_steps(4).max_steps(4),
          ToyDataset(100))
      .train();
  const auto file = dir + "/checkpoint-4/fp8_state.pt";
  const auto original = mantissa::io::read_file(file);
  // Rewrites one entry of fp8_state.pt: `edit` changes the saved tensor.
  const auto rewrite = [&](const char* key, const std::function<void(torch::Tensor&)>& edit) {
    auto dict = torch::pickle_load(original).toGenericDict();
    auto tensor = dict.at(key).toTensor().clone();
    edit(tensor);
    dict.insert_or_assign(key, tensor);
    const auto bytes = mantissa::io::torch_save_bytes(dict);
    mantissa::io::write_file_atomically(file, std::string_view(bytes.data(), bytes.size()));
  };
  const auto resume = [&] {
    Trainer(make_fp8_model(), fp8_args(mantissa_test::toy_output_dir()), ToyDataset(100))
        .train(dir + "/checkpoint-4");
  };
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  // Column 1 is fc2's weight scale.
  for (const double bad : {nan, inf, 0.0, -2.0}) {
    SCOPED_TRACE(bad);
    rewrite("scale", [&](torch::Tensor& t) { t[1] = bad; });
    EXPECT_THAT(resume, ::testing::ThrowsMessage<c10::ValueError>(::testing::AllOf(
                            HasSubstr("cannot load checkpoint file '" + file + "'"),
                            HasSubstr("'scale' of 'fc2.weight' is " + c10::str(bad)),
                            HasSubstr("1 of its 3 scales are not finite numbers > 0"))));
  }
  rewrite("amax_history", [](torch::Tensor& t) { t[2][0] = -1.0; });
  EXPECT_THAT(resume,
              ::testing::ThrowsMessage<c10::ValueError>(::testing::AllOf(
                  HasSubstr(file), HasSubstr("'amax_history' of 'fc2.input' is -1 in row 2"),
                  HasSubstr("an amax is an absolute value"))));
  // NaN and inf amaxes are what an overflowing fp16 step records: they resume.
  rewrite("amax_history", [&](torch::Tensor& t) {
    t[1][0] = nan;
    t[3][2] = inf;
  });
  EXPECT_NO_THROW(resume());
}

// ---- CUDA ------------------------------------------------------------------------------------

// The captured step is the eager step with FP8 too: the amax recording, the scale update and the
// history's roll replay without a host sync, giving the same losses, weights and FP8 state.
TEST(Fp8TrainerCudaTest, CudaGraphReplaysTheEagerFp8Run) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  struct Run {
    std::vector<double> losses;
    std::vector<torch::Tensor> params;
    torch::Tensor history, scales;
    std::string out;
  };
  auto run = [](bool graph) {
    auto model = make_fp8_model();
    auto args = fp8_args(mantissa_test::toy_output_dir())
                    .use_cpu(false)
                    .per_device_train_batch_size(16)
                    .max_steps(12)
                    .optim("adamw_torch_fused")
                    .cuda_graph(graph);
    Trainer trainer(model, args, ToyDataset(192));
    ::testing::internal::CaptureStdout();
    trainer.train();
    Run r{logged_losses(trainer.state()),
          {},
          trainer.fp8_scaling_state()->amax_history().cpu(),
          trainer.fp8_scaling_state()->scales().cpu(),
          ::testing::internal::GetCapturedStdout()};
    for (const auto& p : model->parameters()) r.params.push_back(p.detach().cpu());
    return r;
  };
  const auto eager = run(false);
  const auto graphed = run(true);
  EXPECT_THAT(graphed.out, HasSubstr("cuda_graph: step 4 captured"));
  ASSERT_EQ(graphed.losses.size(), eager.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-6 * std::abs(eager.losses[i]))
        << "step " << i + 1;
  }
  for (size_t i = 0; i < eager.params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(graphed.params[i], eager.params[i], 1e-5, 1e-6)) << "param " << i;
  }
  EXPECT_TRUE(torch::allclose(graphed.history, eager.history, 1e-5, 0)) << graphed.history;
  EXPECT_TRUE(torch::allclose(graphed.scales, eager.scales, 1e-5, 0)) << graphed.scales;
}

}  // namespace
