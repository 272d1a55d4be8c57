// mantissa/distributed.h without a second process: the launcher's variables and their errors,
// DistributedSampler's index lists (tests/golden/make_distributed_sampler_golden.py), and a
// process group of one. The two-process runs are tests/distributed_check.cpp.
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/distributed.h>

#include "golden_util.h"

namespace {

using mantissa::distributed::Backend;
using mantissa::distributed::distributed_sampler_indices;
using mantissa::distributed::DistributedEnvironment;
using ::testing::HasSubstr;

using Vars = std::map<std::string, std::string>;

DistributedEnvironment parse(const Vars& vars) {
  return DistributedEnvironment::from_lookup(
      [&](const std::string& name) -> std::optional<std::string> {
        auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
      });
}

std::string parse_error(const Vars& vars) {
  try {
    parse(vars);
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

TEST(DistributedEnvironmentTest, NoVariablesIsOneProcess) {
  const auto env = parse({});
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_FALSE(env.is_distributed());
  EXPECT_TRUE(env.is_main_process());
  EXPECT_TRUE(env.is_local_main_process());
  EXPECT_FALSE(env.use_agent_store);
}

TEST(DistributedEnvironmentTest, ReadsWhatTorchrunSets) {
  const auto env = parse({{"RANK", "5"},
                          {"WORLD_SIZE", "8"},
                          {"LOCAL_RANK", "1"},
                          {"LOCAL_WORLD_SIZE", "4"},
                          {"MASTER_ADDR", "node0.example"},
                          {"MASTER_PORT", "29500"},
                          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                          {"TORCHELASTIC_RESTART_COUNT", "2"},
                          {"GLOO_SOCKET_IFNAME", "eth0,eth1"}});
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "node0.example");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(env.use_agent_store);
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_EQ(env.gloo_socket_ifname, "eth0,eth1");
  EXPECT_TRUE(env.is_distributed());
  EXPECT_FALSE(env.is_main_process());
  EXPECT_FALSE(env.is_local_main_process());
}

TEST(DistributedEnvironmentTest, LocalDefaultsToGlobalOnOneNode) {
  const auto env = parse(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_FALSE(env.use_agent_store);
  EXPECT_EQ(env.restart_count, 0);
}

TEST(DistributedEnvironmentTest, AgentStoreOnlyForTheExactTextTrue) {
  // Python: os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True).
  for (const char* text : {"true", "1", "False", ""}) {
    EXPECT_FALSE(parse({{"TORCHELASTIC_USE_AGENT_STORE", text}}).use_agent_store) << text;
  }
}

TEST(DistributedEnvironmentTest, WorldSizeOneNeedsNoStoreAddress) {
  const auto env = parse({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_FALSE(env.is_distributed());
  EXPECT_TRUE(env.master_addr.empty());
}

TEST(DistributedEnvironmentTest, ErrorsNameTheVariable) {
  const Vars store{{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto with = [&](Vars extra) {
    Vars all = store;
    for (auto& [k, v] : extra) all[k] = v;
    return all;
  };
  EXPECT_THAT(parse_error({{"WORLD_SIZE", "2"}}),
              HasSubstr("WORLD_SIZE is set (2) but RANK is not"));
  EXPECT_THAT(parse_error({{"RANK", "0"}}), HasSubstr("RANK is set (0) but WORLD_SIZE is not"));
  EXPECT_THAT(parse_error(with({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
              HasSubstr("RANK (2) must be in [0, WORLD_SIZE - 1] = [0, 1]"));
  EXPECT_THAT(parse_error(with({{"RANK", "-1"}, {"WORLD_SIZE", "2"}})), HasSubstr("RANK (-1)"));
  EXPECT_THAT(parse_error(with({{"RANK", "0"}, {"WORLD_SIZE", "0"}})),
              HasSubstr("WORLD_SIZE must be at least 1, but it is 0"));
  EXPECT_THAT(parse_error(with({{"RANK", "0"}, {"WORLD_SIZE", "two"}})),
              HasSubstr("WORLD_SIZE must be an integer, but it is 'two'"));
  EXPECT_THAT(parse_error(with({{"RANK", "0 "}, {"WORLD_SIZE", "2"}})),
              HasSubstr("RANK must be an integer, but it is '0 '"));
  EXPECT_THAT(parse_error(with({{"RANK", ""}, {"WORLD_SIZE", "2"}})),
              HasSubstr("RANK must be an integer, but it is ''"));
  EXPECT_THAT(parse_error(with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}})),
              HasSubstr("MASTER_PORT must be an integer, but it is 'http'"));
  EXPECT_THAT(parse_error(with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "65536"}})),
              HasSubstr("MASTER_PORT must be a port in [1, 65535], but it is 65536"));
  EXPECT_THAT(parse_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}),
              HasSubstr("MASTER_ADDR is not set"));
  EXPECT_THAT(parse_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
              HasSubstr("MASTER_PORT is not set"));
  EXPECT_THAT(
      parse_error(with(
          {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"LOCAL_RANK", "3"}})),
      HasSubstr("LOCAL_RANK (3) must be in [0, LOCAL_WORLD_SIZE - 1] = [0, 1]"));
  EXPECT_THAT(parse_error(with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}})),
              HasSubstr("LOCAL_WORLD_SIZE (3) must be in [1, WORLD_SIZE] = [1, 2]"));
  EXPECT_THAT(
      parse_error(with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RESTART_COUNT", "x"}})),
      HasSubstr("TORCHELASTIC_RESTART_COUNT must be an integer"));
}

TEST(DistributedEnvironmentTest, FromEnvReadsTheProcessEnvironment) {
  // CTest runs each test in its own process; a launcher's variables would make this one a rank.
  if (std::getenv("WORLD_SIZE") != nullptr) GTEST_SKIP() << "WORLD_SIZE is set";
  EXPECT_EQ(DistributedEnvironment::from_env().world_size, 1);
}

TEST(DistributedEnvironmentTest, BackendNames) {
  EXPECT_STREQ(mantissa::distributed::backend_name(Backend::kGloo), "gloo");
  EXPECT_STREQ(mantissa::distributed::backend_name(Backend::kNccl), "nccl");
}

TEST(DistributedSamplerTest, MatchesPyTorchsDistributedSampler) {
  const auto& doc = mantissa_test::golden_file("distributed_sampler.json");
  ASSERT_GE(doc["cases"].size(), 10u);
  for (const auto& c : doc["cases"]) {
    const int64_t world_size = c["world_size"];
    for (int64_t rank = 0; rank < world_size; ++rank) {
      const auto expected = c["indices"][rank].get<std::vector<int64_t>>();
      EXPECT_EQ(distributed_sampler_indices(c["num_examples"], world_size, rank, c["seed"],
                                            c["epoch"], c["shuffle"], c["drop_last"]),
                expected)
          << c["num_examples"] << " examples, rank " << rank << " of " << world_size << ", seed "
          << c["seed"] << ", epoch " << c["epoch"] << ", shuffle " << c["shuffle"] << ", drop_last "
          << c["drop_last"];
    }
  }
}

TEST(DistributedSamplerTest, RanksSplitTheEpochEvenly) {
  // Without drop_last: the ranks together cover every example, and all get the same count.
  std::multiset<int64_t> seen;
  for (int64_t rank = 0; rank < 3; ++rank) {
    const auto indices = distributed_sampler_indices(100, 3, rank, 42, 1);
    EXPECT_EQ(indices.size(), 34u);
    seen.insert(indices.begin(), indices.end());
  }
  EXPECT_EQ(seen.size(), 102u);
  for (int64_t i = 0; i < 100; ++i) EXPECT_GE(seen.count(i), 1u) << i;
  // With drop_last: 99 distinct examples, no repeats.
  std::set<int64_t> kept;
  for (int64_t rank = 0; rank < 3; ++rank) {
    const auto indices = distributed_sampler_indices(100, 3, rank, 42, 1, true, true);
    EXPECT_EQ(indices.size(), 33u);
    kept.insert(indices.begin(), indices.end());
  }
  EXPECT_EQ(kept.size(), 99u);
}

TEST(DistributedSamplerTest, EpochChangesTheOrderAndLeavesTheGlobalGeneratorAlone) {
  torch::manual_seed(7);
  const auto before = torch::rand({4});
  torch::manual_seed(7);
  const auto epoch0 = distributed_sampler_indices(50, 2, 0, 0, 0);
  const auto epoch1 = distributed_sampler_indices(50, 2, 0, 0, 1);
  EXPECT_NE(epoch0, epoch1);
  EXPECT_EQ(distributed_sampler_indices(50, 2, 0, 0, 0), epoch0);
  EXPECT_TRUE(torch::equal(torch::rand({4}), before));
}

TEST(DistributedSamplerTest, WithoutShuffleRanksInterleave) {
  EXPECT_EQ(distributed_sampler_indices(7, 3, 1, 0, 0, false), (std::vector<int64_t>{1, 4, 0}));
  EXPECT_EQ(distributed_sampler_indices(7, 3, 2, 0, 0, false, true), (std::vector<int64_t>{2, 5}));
}

TEST(DistributedSamplerTest, RejectsBadArguments) {
  auto error = [](int64_t n, int64_t world, int64_t rank) -> std::string {
    try {
      distributed_sampler_indices(n, world, rank);
    } catch (const c10::ValueError& e) {
      return e.what_without_backtrace();
    }
    return "(no error)";
  };
  EXPECT_THAT(error(10, 2, 2), HasSubstr("Invalid rank 2, rank should be in the interval [0, 1]"));
  EXPECT_THAT(error(10, 2, -1), HasSubstr("Invalid rank -1"));
  EXPECT_THAT(error(10, 0, 0), HasSubstr("world_size must be at least 1, but it is 0"));
  EXPECT_THAT(error(-1, 2, 0), HasSubstr("num_examples must not be negative, but it is -1"));
}

TEST(ProcessGroupTest, LoneProcessGetsAGroupOfOne) {
  // No MASTER_ADDR: an in-process store, and Gloo's collectives work on one rank.
  const auto env = parse({});
  auto group =
      mantissa::distributed::init_process_group(env, Backend::kGloo, std::chrono::seconds(30));
  EXPECT_EQ(group->getRank(), 0);
  EXPECT_EQ(group->getSize(), 1);
  EXPECT_EQ(group->getBackendName(), "gloo");
  std::vector<at::Tensor> tensors{torch::tensor({1.5f, -2.0f})};
  group->allreduce(tensors)->wait();
  EXPECT_TRUE(torch::equal(tensors[0], torch::tensor({1.5f, -2.0f})));
}

TEST(ProcessGroupTest, RejectsANonPositiveTimeout) {
  try {
    mantissa::distributed::init_process_group(parse({}), Backend::kGloo,
                                              std::chrono::milliseconds(0));
    FAIL() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("timeout must be positive"));
  }
}

}  // namespace
