// src/trainer/optimizer_family.h: an optimizer.pt of another optimizer family is refused with
// both optimizers named, before LibTorch's loader reaches its internal assertion.
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <mantissa/optim/adafactor.h>
#include <mantissa/optim/adamw_8bit.h>
#include <mantissa/optim/fused_adamw.h>
#include <mantissa/optim/muon.h>
#include "trainer/optimizer_family.h"

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// `saver`'s state after one step, read back as optimizer.pt is.
torch::serialize::InputArchive saved_state(torch::optim::Optimizer& saver,
                                           torch::nn::Linear& model) {
  model->forward(torch::randn({4, 3})).sum().backward();
  saver.step();
  torch::serialize::OutputArchive out;
  saver.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  const auto text = bytes.str();
  torch::serialize::InputArchive in;
  in.load_from(text.data(), text.size());
  return in;
}

std::string family_error(torch::optim::Optimizer& loader, torch::serialize::InputArchive& archive) {
  try {
    mantissa::detail::check_optimizer_family(loader, archive);
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

TEST(OptimizerFamilyTest, RefusesSgdStateForAdamW) {
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto archive = saved_state(sgd, model);
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
  EXPECT_THAT(family_error(adamw, archive),
              AllOf(HasSubstr("optimizer.pt holds the state of an SGD optimizer (options "
                              "dampening, lr, momentum, nesterov, weight_decay)"),
                    HasSubstr("but this run's optimizer is torch::optim::AdamW (options amsgrad, betas, eps")));
}

TEST(OptimizerFamilyTest, RefusesAdamWStateForSgd) {
  torch::nn::Linear model(3, 2);
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
  auto archive = saved_state(adamw, model);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THAT(family_error(sgd, archive), AllOf(HasSubstr("the state of an Adam/AdamW optimizer"),
                                                HasSubstr("this run's optimizer is torch::optim::SGD")));
}

TEST(OptimizerFamilyTest, TellsAdafactorAdamW8bitMuonAndAdamWApart) {
  torch::nn::Linear model(3, 2);
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>()>;
  const std::vector<std::pair<std::string, Make>> optimizers = {
      {"Adafactor",
       [&] { return std::make_unique<mantissa::optim::Adafactor>(model->parameters()); }},
      {"AdamW8bit",
       [&] { return std::make_unique<mantissa::optim::AdamW8bit>(model->parameters()); }},
      {"Muon",
       [&] {
         return std::make_unique<mantissa::optim::Muon>(
             std::vector<torch::optim::OptimizerParamGroup>{
                 torch::optim::OptimizerParamGroup(model->parameters())},
             mantissa::optim::MuonOptions(1e-3).use_muon(false));
       }},
      {"Adam/AdamW", [&] { return std::make_unique<torch::optim::AdamW>(model->parameters()); }}};
  for (const auto& [saved_family, make_saver] : optimizers) {
    auto saver = make_saver();
    auto archive = saved_state(*saver, model);
    for (const auto& [family, make_loader] : optimizers) {
      SCOPED_TRACE(saved_family + " loaded by " + family);
      auto loader = make_loader();
      const auto error = family_error(*loader, archive);
      if (family == saved_family) {
        EXPECT_EQ(error, "(no error)");
      } else {
        EXPECT_THAT(error, HasSubstr("the state of an " + saved_family + " optimizer"));
      }
    }
  }
}

TEST(OptimizerFamilyTest, AcceptsAdamWStateForFusedAdamWAndLoadsIt) {
  torch::nn::Linear model(3, 2);
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
  auto archive = saved_state(adamw, model);
  mantissa::optim::FusedAdamW fused(model->parameters(), mantissa::optim::FusedAdamWOptions(1e-3));
  EXPECT_EQ(family_error(fused, archive), "(no error)");
  fused.load(archive);
  EXPECT_EQ(fused.state().size(), 2u);
}

}  // namespace
