// include/mantissa/optim/optimizer_registry.h: the built-in entries, the checks of a new one,
// and an optimizer added through the registry alone that trains, saves and resumes.
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/optim/optimizer_registry.h>
#include <mantissa/trainer.h>
#include "io/filesystem.h"
#include "toy_training.h"

namespace {

using mantissa::Trainer;
using mantissa::TrainingArguments;
using mantissa::optim::OptimizerBuildInputs;
using mantissa::optim::OptimizerSpec;
using mantissa_test::make_toy_model;
using mantissa_test::toy_args;
using mantissa_test::ToyDataset;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// A sign-descent optimizer with momentum (signum): buf = momentum * buf + grad, then
// p -= lr * sign(buf). Written as a user would write one for LibTorch.
struct SignumOptions : torch::optim::OptimizerCloneableOptions<SignumOptions> {
  explicit SignumOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0.9;
  TORCH_ARG(double, weight_decay) = 0;

 public:
  void serialize(torch::serialize::OutputArchive& archive) const override {
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  }
  void serialize(torch::serialize::InputArchive& archive) override {
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  }
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct SignumState : torch::optim::OptimizerCloneableParamState<SignumState> {
  TORCH_ARG(torch::Tensor, momentum_buffer);

 public:
  void serialize(torch::serialize::OutputArchive& archive) const override {
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
  }
  void serialize(torch::serialize::InputArchive& archive) override {
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
  }
};

class Signum : public torch::optim::Optimizer {
 public:
  Signum(std::vector<torch::optim::OptimizerParamGroup> groups, SignumOptions defaults)
      : Optimizer(std::move(groups), std::make_unique<SignumOptions>(defaults)) {}

  torch::Tensor step(LossClosure /*closure*/ = nullptr) override {
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups()) {
      const auto& options = static_cast<const SignumOptions&>(group.options());
      for (auto& param : group.params()) {
        if (!param.grad().defined()) continue;
        auto& slot = state()[param.unsafeGetTensorImpl()];
        if (!slot) {
          auto fresh = std::make_unique<SignumState>();
          fresh->momentum_buffer(torch::zeros_like(param));
          slot = std::move(fresh);
        }
        auto& buffer = static_cast<SignumState&>(*slot).momentum_buffer();
        buffer.mul_(options.momentum()).add_(param.grad());
        if (options.weight_decay() != 0) param.mul_(1 - options.lr() * options.weight_decay());
        param.sub_(buffer.sign() * options.lr());
      }
    }
    return {};
  }
  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<SignumState, SignumOptions>(archive, *this);
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<SignumState, SignumOptions>(archive, *this);
  }
};

constexpr const char* kSignum = "signum_test";

// The entry, registered once per process (the registry lives as long as the process).
void register_signum() {
  static const bool registered = [] {
    OptimizerSpec spec;
    spec.name = kSignum;
    spec.type = typeid(Signum);
    spec.family = "Signum";
    spec.family_marks = {"momentum", "weight_decay", "lr"};
    spec.build = [](OptimizerBuildInputs inputs) -> std::unique_ptr<torch::optim::Optimizer> {
      return mantissa::optim::build_in_decay_groups<Signum>(
          inputs,
          SignumOptions(inputs.args.learning_rate()).weight_decay(inputs.args.weight_decay()));
    };
    spec.state_tensors = [](const torch::optim::OptimizerParamState& base) {
      mantissa::optim::StateTensors tensors;
      if (const auto* state = dynamic_cast<const SignumState*>(&base)) {
        tensors.push_back({"momentum_buffer", state->momentum_buffer()});
      }
      return tensors;
    };
    spec.steps = [](const torch::optim::OptimizerParamState&) -> std::optional<double> {
      return std::nullopt;
    };
    spec.group_options = [](const torch::optim::OptimizerOptions& base) {
      const auto& options = static_cast<const SignumOptions&>(base);
      return std::vector<mantissa::optim::GroupOption>{{"lr", options.lr()},
                                                       {"momentum", options.momentum()},
                                                       {"weight_decay", options.weight_decay()}};
    };
    mantissa::optim::register_optimizer(std::move(spec));
    return true;
  }();
  (void)registered;
}

TEST(OptimizerRegistryTest, TheBuiltInNamesComeFirstInHfOrder) {
  auto names = mantissa::optim::optimizer_names();
  ASSERT_GE(names.size(), 4u);
  names.resize(4);
  EXPECT_THAT(names,
              ElementsAre("adamw_torch", "adamw_torch_fused", "adamw_mantissa_fused", "sgd"));
  // Every OptimizerNames spelling has its entry.
  using Names = mantissa::Choice<mantissa::OptimizerNames>;
  for (std::size_t i = 0; i < Names::size(); ++i) {
    EXPECT_NE(mantissa::optim::find_optimizer(Names::name_at(i)), nullptr) << Names::name_at(i);
  }
  EXPECT_EQ(mantissa::optim::find_optimizer("adam"), nullptr);
  EXPECT_EQ(mantissa::optim::find_optimizer(""), nullptr)
      << "the unnamed entries are not --optim names";
  const auto* fused = mantissa::optim::find_optimizer("adamw_torch_fused");
  EXPECT_TRUE(fused->low_precision_rules && fused->shardable);
  EXPECT_FALSE(mantissa::optim::find_optimizer("adamw_torch")->low_precision_rules);
}

TEST(OptimizerRegistryTest, RefusesAnEntryItCannotUse) {
  auto entry = [](std::string name) {
    OptimizerSpec spec;
    spec.name = std::move(name);
    spec.type = typeid(Signum);
    spec.build = [](OptimizerBuildInputs) -> std::unique_ptr<torch::optim::Optimizer> {
      return nullptr;
    };
    return spec;
  };
  using mantissa::optim::register_optimizer;
  EXPECT_THAT([&] { register_optimizer(entry("sgd")); },
              ThrowsMessage<c10::ValueError>(
                  HasSubstr("the name 'sgd' is taken already (by torch::optim::SGD)")));
  EXPECT_THAT([&] { register_optimizer(entry("a,b")); },
              ThrowsMessage<c10::ValueError>(HasSubstr("the name 'a,b' of")));
  auto no_build = entry("no_build_test");
  no_build.build = nullptr;
  EXPECT_THAT([&] { register_optimizer(no_build); },
              ThrowsMessage<c10::ValueError>(HasSubstr("has a name but no build function")));
  auto no_type = entry("no_type_test");
  no_type.type = typeid(void);
  EXPECT_THAT([&] { register_optimizer(no_type); },
              ThrowsMessage<c10::ValueError>(HasSubstr("'no_type_test' has no type")));
  EXPECT_EQ(mantissa::optim::find_optimizer("no_build_test"), nullptr);
}

TEST(OptimizerRegistryTest, ARegisteredOptimizerStepsAsItsBuildSays) {
  register_signum();
  const auto* spec = mantissa::optim::find_optimizer(kSignum);
  ASSERT_NE(spec, nullptr);
  auto weight = torch::tensor({1.0, -2.0, 3.0}).requires_grad_();
  auto bias = torch::tensor({0.5}).requires_grad_();
  const auto args = TrainingArguments().learning_rate(0.25).weight_decay(0.5);
  OptimizerBuildInputs inputs{args, {}, /*first_group_decays=*/true};
  inputs.groups.emplace_back(std::vector<torch::Tensor>{weight});
  inputs.groups.emplace_back(std::vector<torch::Tensor>{bias});
  auto optimizer = spec->build(std::move(inputs));
  weight.mutable_grad() = torch::tensor({0.1, -0.1, 0.0});
  bias.mutable_grad() = torch::tensor({-3.0});
  optimizer->step();
  // Group 0 decays (x (1 - 0.25 * 0.5)), group 1 does not; both move by lr * sign(grad).
  EXPECT_TRUE(torch::equal(weight, torch::tensor({0.875 - 0.25, -1.75 + 0.25, 2.625})));
  EXPECT_TRUE(torch::equal(bias, torch::tensor({0.75})));
}

TEST(OptimizerRegistryTest, ARegisteredOptimizerTrainsSavesAndResumesLikeAnUninterruptedRun) {
  register_signum();
  const auto dir = mantissa_test::toy_output_dir();
  // A constant learning rate, so that the 4-step run's schedule is the 8-step runs' too.
  auto args = toy_args(dir)
                  .optim(kSignum)
                  .learning_rate(1e-3)
                  .lr_scheduler_type("constant")
                  .max_steps(4)
                  .save_strategy("steps")
                  .save_steps(4);
  Trainer first(make_toy_model(), args, ToyDataset(100));
  first.train();
  ASSERT_NE(dynamic_cast<Signum*>(&first.optimizer()), nullptr);
  EXPECT_FALSE(first.optimizer().state().empty()) << "the optimizer keeps its momentum buffers";
  const auto checkpoint = mantissa::io::join_path(dir, "checkpoint-4");
  EXPECT_TRUE(mantissa::io::path_exists(mantissa::io::join_path(checkpoint, "optimizer.pt")));

  auto resumed_model = make_toy_model();
  Trainer resumed(resumed_model, TrainingArguments(args).max_steps(8).save_strategy("no"),
                  ToyDataset(100));
  resumed.train(checkpoint);
  EXPECT_EQ(resumed.state().global_step, 8);

  auto straight_model = make_toy_model();
  Trainer straight(straight_model,
                   TrainingArguments(args)
                       .output_dir(mantissa_test::toy_output_dir())
                       .max_steps(8)
                       .save_strategy("no"),
                   ToyDataset(100));
  straight.train();
  const auto resumed_params = resumed_model->parameters();
  const auto straight_params = straight_model->parameters();
  ASSERT_EQ(resumed_params.size(), straight_params.size());
  for (std::size_t i = 0; i < resumed_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(resumed_params[i], straight_params[i])) << "parameter " << i;
  }
}

TEST(OptimizerRegistryTest, TheArgumentsCheckARegisteredOptimizerByItsEntry) {
  register_signum();
  const auto args = toy_args(mantissa_test::toy_output_dir());
  EXPECT_NO_THROW(TrainingArguments(args).optim(kSignum).validate());
  EXPECT_THAT(
      [&] { TrainingArguments(args).optim(kSignum).low_precision_update("kahan").validate(); },
      ThrowsMessage<c10::ValueError>(
          HasSubstr("low_precision_update kahan is not a rule optim signum_test has")));
  EXPECT_THAT([&] { TrainingArguments(args).optim("signum_typo").validate(); },
              ThrowsMessage<c10::ValueError>(HasSubstr(
                  "optim: signum_typo is not a valid OptimizerNames, please select one of "
                  "['adamw_torch', 'adamw_torch_fused', 'adamw_mantissa_fused', 'sgd', ")));
  EXPECT_THAT([&] { TrainingArguments(args).optim("signum_typo").validate(); },
              ThrowsMessage<c10::ValueError>(HasSubstr("'signum_test'")));
  // The command line takes the name too.
  const char* argv[] = {"prog",     "--optim", kSignum, "--output_dir", args.output_dir().c_str(),
                        "--use_cpu"};
  const auto parsed = TrainingArguments::parse(6, argv);
  EXPECT_EQ(parsed.optim().name(), kSignum);
}

}  // namespace
