// The options of an optimizer's param groups apart from its state: what a sharded run restores
// on resume and what its whole-state checkpoints are written with.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/optim/fused_adamw.h>
#include <mantissa/precision_plan.h>
#include <mantissa/training_arguments.h>

#include "trainer/optimizer_factory.h"
#include "trainer/param_group_options.h"
#include "trainer/strategy.h"

namespace mantissa::detail {
namespace {

using optim::FusedAdamW;
using optim::FusedAdamWOptions;

// Two groups (a matrix that decays, a bias that does not), as HF's weight-decay groups.
std::vector<torch::optim::OptimizerParamGroup> two_groups(double decay) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({3, 2}, torch::requires_grad())},
                      std::make_unique<FusedAdamWOptions>(
                          FusedAdamWOptions(1e-3).weight_decay(decay).eps(1e-8)));
  groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({3}, torch::requires_grad())},
                      std::make_unique<FusedAdamWOptions>(FusedAdamWOptions(1e-3).weight_decay(0.0)));
  return groups;
}

const FusedAdamWOptions& options(const torch::optim::Optimizer& optimizer, std::size_t g) {
  return static_cast<const FusedAdamWOptions&>(optimizer.param_groups().at(g).options());
}

TEST(ParamGroupOptionsTest, BytesCarryEveryGroupsOptionsIntoAnotherOptimizer) {
  auto saved_groups = two_groups(0.1);
  static_cast<FusedAdamWOptions&>(saved_groups[0].options())
      .betas(std::make_tuple(0.8, 0.95))
      .lr(3e-4);
  FusedAdamW saved(std::move(saved_groups), FusedAdamWOptions(1e-3));
  FusedAdamW resumed(two_groups(0.25), FusedAdamWOptions(1e-3));

  load_param_group_options(resumed, param_group_options_bytes(saved), "saved");

  EXPECT_EQ(options(resumed, 0).weight_decay(), 0.1);
  EXPECT_EQ(std::get<0>(options(resumed, 0).betas()), 0.8);
  EXPECT_EQ(std::get<1>(options(resumed, 0).betas()), 0.95);
  EXPECT_EQ(options(resumed, 0).get_lr(), 3e-4);
  EXPECT_EQ(options(resumed, 1).weight_decay(), 0.0);
  // The tensors stay the resumed optimizer's own.
  EXPECT_EQ(resumed.param_groups()[0].params()[0].sizes(), (std::vector<std::int64_t>{3, 2}));
}

TEST(ParamGroupOptionsTest, AnotherNumberOfGroupsIsRefusedNamingTheOrigin) {
  FusedAdamW one_group({torch::zeros({2}, torch::requires_grad())}, FusedAdamWOptions(1e-3));
  FusedAdamW two(two_groups(0.1), FusedAdamWOptions(1e-3));
  try {
    load_param_group_options(two, param_group_options_bytes(one_group), "'ckpt/param_groups.pt'");
    FAIL() << "two groups took the options of one";
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what(), testing::HasSubstr("'ckpt/param_groups.pt': the saved options are of 1 "
                                             "param groups, this run's optimizer has 2"));
  }
  try {
    load_param_group_options(two, "not an archive", "'ckpt/param_groups.pt'");
    FAIL() << "garbage was read as options";
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what(), testing::HasSubstr("'ckpt/param_groups.pt': the optimizer's param "
                                             "group options are unreadable"));
  }
}

TEST(ParamGroupOptionsTest, TheWholeOptimizerOfACheckpointTakesTheRunsOptionsNotTheArguments) {
  // A sharded run resumed with another --weight_decay trains with the checkpoint's 0.1; the
  // whole optimizer its next FULL_STATE_DICT checkpoint is written from must say 0.1 too.
  const auto args = TrainingArguments().optim("adamw_torch_fused").weight_decay(0.25);
  FusedAdamW live(two_groups(0.1), FusedAdamWOptions(1e-3));
  live.param_groups()[0].options().set_lr(5e-4);  // the schedule's
  const std::vector<torch::Tensor> params{torch::zeros({3, 2}, torch::requires_grad()),
                                          torch::zeros({3}, torch::requires_grad())};
  const auto whole =
      data_parallel_optimizer(args, PrecisionPlan{}, params, weight_decay_params(params, nullptr), live);
  EXPECT_EQ(options(*whole.optimizer.optimizer, 0).weight_decay(), 0.1);
  EXPECT_EQ(options(*whole.optimizer.optimizer, 0).get_lr(), 5e-4);
  EXPECT_EQ(options(*whole.optimizer.optimizer, 1).weight_decay(), 0.0);
}

}  // namespace
}  // namespace mantissa::detail
