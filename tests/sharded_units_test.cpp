// The pieces of full sharding on their own, in one process (a Gloo group of one): which blocks
// become units, the flat layout's unit boundaries, shard-only storage that frees and restores
// the parameters' memory, and ParameterUnits gathering blocks around their forward and backward.
// The multi-process runs are fsdp.full_* (tests/fsdp_trainer_check.cpp).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/distributed.h>
#include <mantissa/nn/supports_gradient_checkpointing.h>

#include "toy_training.h"
#include "trainer/sharded/block_units.h"
#include "trainer/sharded/flat_parameters.h"
#include "trainer/sharded/parameter_units.h"
#include "trainer/strategy.h"

namespace {

namespace sh = mantissa::detail::sharded;
using mantissa::detail::FsdpAutoWrap;
using mantissa::detail::FsdpSettings;
using ::testing::HasSubstr;

struct TinyBlockImpl : torch::nn::Module {
  explicit TinyBlockImpl(std::int64_t width) : fc(register_module("fc", torch::nn::Linear(width, width))) {}
  torch::nn::Linear fc;
};
TORCH_MODULE(TinyBlock);

/// in -> blocks (h + tanh(fc(h))) -> out; the blocks run through run_block unless `skip_runner`.
struct TinyModelImpl : torch::nn::Module, mantissa::nn::SupportsGradientCheckpointing {
  TinyModelImpl(std::int64_t width, int num_blocks)
      : in(register_module("in", torch::nn::Linear(3, width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        out(register_module("out", torch::nn::Linear(width, 2))) {
    for (int k = 0; k < num_blocks; ++k) blocks->push_back(TinyBlock(width));
  }
  std::vector<std::string> no_split_modules() const override { return {"TinyBlockImpl"}; }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = in(x);
    for (std::size_t k = 0; k < blocks->size(); ++k) {
      if (skip_last_block && k + 1 == blocks->size()) break;
      auto block = std::dynamic_pointer_cast<TinyBlockImpl>((*blocks)[k]);
      const auto fn = [block](const torch::Tensor& t) { return torch::tanh(block->fc(t)); };
      h = h + (bypass_runner ? fn(h) : run_block(*block, fn, h));
    }
    return out(h);
  }
  torch::nn::Linear in;
  torch::nn::ModuleList blocks;
  torch::nn::Linear out;
  bool bypass_runner = false;
  bool skip_last_block = false;
};
TORCH_MODULE(TinyModel);

std::vector<std::string> names_of(const std::vector<sh::BlockUnit>& blocks) {
  std::vector<std::string> names;
  for (const auto& b : blocks) names.push_back(b.name);
  return names;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "<no exception>";
}

TEST(ShardedUnits, BlockClassesMatchWithOrWithoutNamespace) {
  EXPECT_TRUE(sh::is_block_class("TinyBlockImpl", "TinyBlockImpl"));
  EXPECT_TRUE(sh::is_block_class("a::b::TinyBlockImpl", "TinyBlockImpl"));
  EXPECT_TRUE(sh::is_block_class("a::b::TinyBlockImpl", "a::b::TinyBlockImpl"));
  EXPECT_FALSE(sh::is_block_class("a::b::TinyBlockImpl", "BlockImpl"));
  EXPECT_FALSE(sh::is_block_class("TinyBlockImplX", "TinyBlockImpl"));
}

TEST(ShardedUnits, AutoWrapPoliciesPickTheBlocks) {
  TinyModel model(4, 3);
  FsdpSettings settings;
  const std::vector<std::string> declared = model->no_split_modules();
  EXPECT_THAT(names_of(sh::find_block_units(*model, settings, declared)),
              ::testing::ElementsAre("blocks.0", "blocks.1", "blocks.2"));
  // A block's own Linear is not searched once the block is taken; named alone, Linears are.
  settings.transformer_layer_cls_to_wrap = std::vector<std::string>{"LinearImpl"};
  EXPECT_THAT(names_of(sh::find_block_units(*model, settings, declared)),
              ::testing::ElementsAre("in", "blocks.0.fc", "blocks.1.fc", "blocks.2.fc", "out"));
  settings.transformer_layer_cls_to_wrap = std::vector<std::string>{"DecoderLayer"};
  EXPECT_THAT(error_of([&] { sh::find_block_units(*model, settings, declared); }),
              HasSubstr("transformer_layer_cls_to_wrap names 'DecoderLayer', but no module of"));
  settings.transformer_layer_cls_to_wrap.reset();
  settings.auto_wrap_policy = FsdpAutoWrap::kSizeBased;
  settings.min_num_params = 0;  // accelerate wraps nothing at 0
  EXPECT_TRUE(sh::find_block_units(*model, settings, declared).empty());
  settings.min_num_params = 20;  // a block holds 4 * 4 + 4
  EXPECT_EQ(sh::find_block_units(*model, settings, declared).size(), 3u);
  settings.min_num_params = 21;
  EXPECT_TRUE(sh::find_block_units(*model, settings, declared).empty());
  settings.auto_wrap_policy = FsdpAutoWrap::kNoWrap;
  EXPECT_TRUE(sh::find_block_units(*model, settings, declared).empty());
  // No declared blocks and no list: nothing to wrap.
  settings.auto_wrap_policy = FsdpAutoWrap::kTransformerBased;
  EXPECT_TRUE(sh::find_block_units(*model, settings, {}).empty());
}

TEST(ShardedUnits, BlocksThatShareAParameterAreRefused) {
  TinyModel model(4, 1);
  model->blocks->push_back((*model->blocks)[0]);  // one block, listed twice
  EXPECT_THAT(error_of([&] { sh::find_block_units(*model, FsdpSettings{}, {"TinyBlockImpl"}); }),
              HasSubstr("the blocks blocks.0 and blocks.1 share a parameter"));
}

TEST(ShardedUnits, LayoutStartsABucketAtEachUnit) {
  // Forward order: unit 0 (two groups), unit 1, unit 2; the layout goes backwards.
  const std::vector<sh::ParamSpec> specs = {{4, torch::kFloat, 0, 0}, {2, torch::kFloat, 1, 0},
                                            {8, torch::kFloat, 0, 1}, {3, torch::kFloat, 1, 1},
                                            {8, torch::kFloat, 0, 2}};
  const auto layout = sh::plan_flat_layout(specs, 2, std::numeric_limits<std::int64_t>::max());
  ASSERT_EQ(layout.buckets.size(), 5u);
  const std::vector<std::pair<std::size_t, std::size_t>> unit_group = {
      {2, 0}, {1, 1}, {1, 0}, {0, 1}, {0, 0}};
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    EXPECT_EQ(layout.buckets[b].unit, unit_group[b].first) << b;
    EXPECT_EQ(layout.buckets[b].group, unit_group[b].second) << b;
  }
}

TEST(ShardedUnits, ShardOnlyStorageFreesAndRestoresTheParameters) {
  auto a = torch::arange(10, torch::kFloat).reshape({2, 5}).requires_grad_();
  auto b = torch::arange(3, torch::kFloat).add(100).requires_grad_();
  const auto a0 = a.detach().clone();
  const auto b0 = b.detach().clone();
  sh::FlatParameters flat({{a, 0, 0}, {b, 0, 1}}, /*rank=*/1, /*world_size=*/2,
                          std::numeric_limits<std::int64_t>::max(), sh::FlatStorage::kShardsOnly);
  ASSERT_EQ(flat.layout().buckets.size(), 2u);
  // Unit 1 (b) comes first. Rank 1 holds the second half of each padded buffer.
  EXPECT_EQ(flat.layout().buckets[0].unit, 1u);
  EXPECT_FALSE(flat.is_allocated(0));
  EXPECT_FALSE(flat.is_allocated(1));
  // Freed: no elements, so a stray read sees an empty tensor, never freed memory.
  EXPECT_EQ(a.numel(), 0);
  EXPECT_EQ((a + 1).numel(), 0);
  EXPECT_NE(error_of([&] { (void)torch::mm(a, torch::ones({5, 2})); }), "<no exception>");
  const auto& bucket = flat.layout().buckets[1];
  EXPECT_TRUE(torch::equal(flat.shard(1).narrow(0, 0, 10 - bucket.shard_numel),
                           a0.reshape({-1}).narrow(0, bucket.shard_numel, 10 - bucket.shard_numel)));
  // What a gather does with one rank's piece: the memory comes back under the same tensor.
  flat.allocate_buffer(1);
  flat.buffer(1).zero_();
  flat.buffer(1).narrow(0, bucket.shard_numel, bucket.shard_numel).copy_(flat.shard(1));
  EXPECT_EQ(a.sizes(), a0.sizes());
  EXPECT_TRUE(torch::equal(a.detach().reshape({-1}).narrow(0, bucket.shard_numel, 10 - bucket.shard_numel),
                           a0.reshape({-1}).narrow(0, bucket.shard_numel, 10 - bucket.shard_numel)));
  flat.free_buffer(1);
  EXPECT_FALSE(flat.is_allocated(1));
  EXPECT_EQ(a.numel(), 0);
  EXPECT_TRUE(a.requires_grad());
  EXPECT_EQ(flat.shape(0), a0.sizes().vec());
  (void)b0;
}

c10::intrusive_ptr<c10d::ProcessGroup> group_of_one() {
  mantissa::distributed::DistributedEnvironment env;
  env.gloo_socket_ifname = "lo";
  return mantissa::distributed::init_process_group(env, mantissa::distributed::Backend::kGloo,
                                                   std::chrono::seconds(30));
}

/// A model and its units over a group of one: what a rank of a fully sharded run holds.
struct ShardedTiny {
  explicit ShardedTiny(int num_blocks) : model(5, num_blocks) {
    torch::manual_seed(0);
    for (auto& p : model->parameters()) {
      torch::NoGradGuard no_grad;
      p.normal_();
    }
    const auto blocks = sh::find_block_units(*model, FsdpSettings{}, model->no_split_modules());
    std::vector<sh::FlatInput> inputs;
    std::vector<std::string> names{"the root"};
    for (const auto& p : model->in->parameters()) inputs.push_back({p, 0, 0});
    for (const auto& p : model->out->parameters()) inputs.push_back({p, 0, 0});
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      for (const auto& p : blocks[k].module->parameters()) inputs.push_back({p, 0, k + 1});
      names.push_back(blocks[k].name);
    }
    reference = TinyModel(5, num_blocks);
    torch::NoGradGuard no_grad;
    const auto from = model->parameters();
    const auto to = reference->parameters();
    for (std::size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    flat = std::make_unique<sh::FlatParameters>(inputs, 0, 1, std::numeric_limits<std::int64_t>::max(),
                                                sh::FlatStorage::kShardsOnly);
    units = std::make_unique<sh::ParameterUnits>(*flat, group_of_one(), names);
    struct Runner : mantissa::nn::BlockRunner {
      Runner(sh::ParameterUnits& u, std::vector<sh::BlockUnit> b) : units(u), blocks(std::move(b)) {}
      at::Tensor run(const torch::nn::Module& block, const mantissa::nn::BlockFunction& fn,
                     const at::Tensor& x) override {
        for (std::size_t k = 0; k < blocks.size(); ++k) {
          if (blocks[k].module == &block) {
            ++calls;
            return units.run_block(k + 1, fn, x);
          }
        }
        return fn(x);
      }
      sh::ParameterUnits& units;
      std::vector<sh::BlockUnit> blocks;
      int calls = 0;
    };
    runner = std::make_shared<Runner>(*units, blocks);
    model->set_block_runner(runner);
  }
  TinyModel model;
  TinyModel reference{nullptr};
  std::unique_ptr<sh::FlatParameters> flat;
  std::unique_ptr<sh::ParameterUnits> units;
  std::shared_ptr<mantissa::nn::BlockRunner> runner;
};

TEST(ShardedUnits, BlocksAreGatheredForForwardAndBackwardAndFreedAfter) {
  ShardedTiny tiny(3);
  const auto x = torch::randn({4, 3});
  for (int pass = 0; pass < 3; ++pass) {
    tiny.units->begin_forward();
    const auto y = tiny.model->forward(x);
    tiny.units->end_forward(/*training=*/true);
    for (std::size_t u = 1; u < tiny.units->size(); ++u) {
      EXPECT_FALSE(tiny.units->is_gathered(u)) << "block unit " << u << " after forward";
    }
    EXPECT_TRUE(tiny.units->is_gathered(0));
    y.square().sum().backward();
    for (std::size_t u = 1; u < tiny.units->size(); ++u) {
      EXPECT_FALSE(tiny.units->is_gathered(u)) << "block unit " << u << " after backward";
    }
    tiny.units->finish();
    EXPECT_FALSE(tiny.units->is_gathered(0));
    tiny.units->check_blocks_ran();
  }
  // Three passes of gradients, as the whole model computes them.
  for (int pass = 0; pass < 3; ++pass) tiny.reference->forward(x).square().sum().backward();
  const auto sharded = tiny.model->parameters();
  const auto whole = tiny.reference->parameters();
  for (std::size_t i = 0; i < whole.size(); ++i) {
    EXPECT_TRUE(torch::equal(sharded[i].grad(), whole[i].grad())) << "parameter " << i;
  }
}

TEST(ShardedUnits, EvaluationFreesEverythingAndPinningKeepsItWhole) {
  ShardedTiny tiny(2);
  const auto x = torch::randn({4, 3});
  torch::Tensor expected;
  {
    torch::NoGradGuard no_grad;
    expected = tiny.reference->forward(x);
    tiny.units->begin_forward();
    EXPECT_TRUE(torch::equal(tiny.model->forward(x), expected));
    tiny.units->end_forward(/*training=*/false);
  }
  for (std::size_t u = 0; u < tiny.units->size(); ++u) EXPECT_FALSE(tiny.units->is_gathered(u));
  {
    sh::ParameterUnits::Pin pin(*tiny.units);
    tiny.units->release_all();
    for (std::size_t u = 0; u < tiny.units->size(); ++u) EXPECT_TRUE(tiny.units->is_gathered(u));
    EXPECT_TRUE(torch::equal(tiny.model->out->weight, tiny.reference->out->weight));
  }
  for (std::size_t u = 0; u < tiny.units->size(); ++u) EXPECT_FALSE(tiny.units->is_gathered(u));
}

TEST(ShardedUnits, ABlockUsedOutsideRunBlockFailsAndOneNeverRunIsNamed) {
  ShardedTiny tiny(2);
  // Used outside run_block: its parameters are empty there, so the op fails (no freed read).
  tiny.model->bypass_runner = true;
  tiny.units->begin_forward();
  EXPECT_NE(error_of([&] { (void)tiny.model->forward(torch::randn({2, 3})); }), "<no exception>");
  tiny.units->end_forward(/*training=*/false);
  // Never run at all: named once a forward has ended (not before).
  ShardedTiny fresh(2);
  fresh.units->check_blocks_ran();
  fresh.model->skip_last_block = true;
  fresh.units->begin_forward();
  (void)fresh.model->forward(torch::randn({2, 3}));
  fresh.units->end_forward(/*training=*/true);
  EXPECT_THAT(error_of([&] { fresh.units->check_blocks_ran(); }),
              HasSubstr("the block blocks.1 is a sharding unit, but the model's forward did not "
                        "run it through run_block"));
}

TEST(ShardedUnits, FsdpInALoneProcessTrainsUnshardedAndSaysSo) {
  mantissa_test::WarningCapture warnings;
  const auto strategy = mantissa::detail::make_strategy(
      mantissa::TrainingArguments().fsdp("true"), c10::Device(c10::kCPU));
  EXPECT_EQ(strategy->world_size(), 1);
  EXPECT_THAT(warnings.messages,
              ::testing::Contains(HasSubstr("fsdp: this process runs alone")));
}

}  // namespace
