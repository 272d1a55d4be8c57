// Which process owns each whole tensor when fsdp shard_grad_op shards an optimizer's state by
// tensors (src/trainer/sharded/tensor_owners.h). The multi-process runs are fsdp.optim_*.
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "trainer/sharded/flat_layout.h"
#include "trainer/sharded/tensor_owners.h"
#include "value_error.h"

namespace {

namespace sh = mantissa::detail::sharded;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TensorOwners, LargestFirstToTheLeastLoadedRank) {
  // 100 -> rank 0; 60 -> 1; 50 -> 1 (60 < 100); 40 -> 0 (100 < 110); 10 -> 1 (110 < 140).
  const std::vector<std::int64_t> numels{10, 100, 50, 60, 40};
  const auto owners = sh::assign_tensor_owners(numels, 2);
  EXPECT_THAT(owners, ElementsAre(1, 0, 1, 1, 0));
  EXPECT_THAT(sh::owned_elements(numels, owners, 2), ElementsAre(140, 120));
}

TEST(TensorOwners, TiesGoToTheLowerRankInTheGivenOrder) {
  EXPECT_THAT(sh::assign_tensor_owners({8, 8, 8, 8}, 2), ElementsAre(0, 1, 0, 1));
  EXPECT_THAT(sh::assign_tensor_owners({8, 8, 8, 8}, 3), ElementsAre(0, 1, 2, 0));
}

TEST(TensorOwners, OneRankOwnsEverythingAndExtraRanksOwnNothing) {
  EXPECT_THAT(sh::assign_tensor_owners({3, 1, 2}, 1), ElementsAre(0, 0, 0));
  const auto owners = sh::assign_tensor_owners({5, 7}, 4);
  EXPECT_THAT(owners, ElementsAre(1, 0));
  EXPECT_THAT(sh::owned_elements({5, 7}, owners, 4), ElementsAre(7, 5, 0, 0));
  EXPECT_TRUE(sh::assign_tensor_owners({}, 3).empty());
}

TEST(TensorOwners, ABalancedSplitOfAModelsShapes) {
  // A small transformer's tensors: no rank ends with more than the largest tensor above an
  // even share.
  std::vector<std::int64_t> numels{50257 * 64, 1024 * 64};
  for (int block = 0; block < 4; ++block) {
    for (const std::int64_t n :
         {64, 64, 64 * 192, 192, 64 * 64, 64, 64, 64, 64 * 256, 256, 256 * 64, 64}) {
      numels.push_back(n);
    }
  }
  const auto total = std::accumulate(numels.begin(), numels.end(), std::int64_t{0});
  for (const std::int64_t world : {2, 3, 8}) {
    const auto loads = sh::owned_elements(numels, sh::assign_tensor_owners(numels, world), world);
    EXPECT_EQ(std::accumulate(loads.begin(), loads.end(), std::int64_t{0}), total);
    for (const auto load : loads) EXPECT_LE(load, total / world + 50257 * 64) << world;
  }
  // Without the embedding the split is close to even.
  numels.erase(numels.begin());
  const auto rest = std::accumulate(numels.begin(), numels.end(), std::int64_t{0});
  const auto loads = sh::owned_elements(numels, sh::assign_tensor_owners(numels, 2), 2);
  EXPECT_LE(std::abs(loads[0] - loads[1]), 64 * 256) << loads[0] << " vs " << loads[1];
  EXPECT_EQ(loads[0] + loads[1], rest);
}

TEST(TensorOwners, BadInputIsNamed) {
  using mantissa_test::value_error_of;
  EXPECT_THAT(value_error_of([] { sh::assign_tensor_owners({1}, 0); }),
              HasSubstr("world_size must be at least 1, got 0"));
  EXPECT_THAT(value_error_of([] {
                sh::assign_tensor_owners({1, -2}, 2);
              }),
              HasSubstr("tensor 1 has -2 elements"));
  EXPECT_THAT(value_error_of([] {
                sh::owned_elements({1, 2}, {0, 2}, 2);
              }),
              HasSubstr("tensor 1's owner 2 is not a rank of 2"));
}

TEST(WholeTensorLayout, EachParameterLiesWholeInItsOwnersShard) {
  // Two units' buckets (fp32, then bf16), as full sharding plans them (no size cap).
  const std::vector<sh::ParamSpec> specs = {{100, torch::kFloat, 0, 0}, {7, torch::kFloat, 0, 0},
                                            {300, torch::kFloat, 0, 0}, {64, torch::kFloat, 0, 0},
                                            {5, torch::kBFloat16, 0, 1},
                                            {40, torch::kBFloat16, 0, 1}};
  for (const std::int64_t world : {1, 2, 3, 8}) {
    const auto flat = sh::plan_flat_layout(specs, world, std::numeric_limits<std::int64_t>::max());
    const auto layout = sh::place_whole_tensors(flat);
    ASSERT_EQ(layout.buckets.size(), flat.buckets.size());
    std::vector<bool> seen(specs.size(), false);
    std::vector<std::int64_t> owned(static_cast<std::size_t>(world), 0);
    for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
      const auto& bucket = layout.buckets[b];
      EXPECT_EQ(bucket.padded_numel, bucket.shard_numel * world) << world;
      EXPECT_EQ(bucket.numel, flat.buckets[b].numel);
      const auto alignment = sh::shard_alignment(bucket.dtype);
      // The owners as assign_tensor_owners gives them, over the bucket's parameters in slot
      // order of the plain layout, counting what the buckets before gave each rank.
      std::vector<std::int64_t> numels;
      for (const auto& slot : flat.buckets[b].slots) numels.push_back(slot.numel);
      const auto owners = sh::assign_tensor_owners(numels, world, owned);
      const auto loads = sh::owned_elements(numels, owners, world);
      for (std::size_t r = 0; r < owned.size(); ++r) owned[r] += loads[r];
      std::int64_t end = 0;
      for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
        const auto& slot = bucket.slots[s];
        EXPECT_FALSE(bucket.is_split(slot)) << "param " << slot.param << ", world " << world;
        EXPECT_EQ(slot.offset % alignment, 0) << "param " << slot.param;
        EXPECT_GE(slot.offset, end) << "slots overlap or are out of order";
        end = slot.offset + slot.numel;
        EXPECT_EQ(layout.where[slot.param], std::make_pair(b, s));
        std::size_t plain = 0;  // the slot's place in the plain layout
        while (flat.buckets[b].slots[plain].param != slot.param) ++plain;
        EXPECT_EQ(bucket.first_rank(slot), owners[plain]) << "param " << slot.param;
        // The piece of the owner is the whole parameter; no other rank has one.
        for (std::int64_t r = 0; r < world; ++r) {
          const auto piece = bucket.piece(slot, r);
          EXPECT_EQ(piece.has_value(), r == owners[plain]);
          if (piece) EXPECT_EQ(piece->numel, slot.numel);
        }
        seen[slot.param] = true;
      }
      EXPECT_LE(end, bucket.padded_numel);
      // Each shard is as long as the largest owner's share, rounded up to the alignment.
      const auto largest = *std::max_element(loads.begin(), loads.end());
      EXPECT_GE(bucket.shard_numel, largest);
      EXPECT_LT(bucket.shard_numel, largest + alignment * static_cast<std::int64_t>(numels.size()));
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), static_cast<long>(specs.size()));
  }
  // Two ranks. The bf16 bucket first (the last parameters): 40 -> rank 0, 5 -> rank 1. Then
  // 300 -> rank 1 (5 < 40); 100, 64 -> rank 0; 7 -> rank 0 (204 < 305): shards of 300.
  const auto two = sh::place_whole_tensors(
      sh::plan_flat_layout(specs, 2, std::numeric_limits<std::int64_t>::max()));
  ASSERT_EQ(two.buckets.size(), 2u);
  EXPECT_EQ(two.buckets[0].unit, 1u);
  const auto owner_of = [&](std::size_t param) {
    const auto [b, s] = two.where[param];
    return two.buckets[b].first_rank(two.buckets[b].slots[s]);
  };
  EXPECT_EQ(owner_of(5), 0);
  EXPECT_EQ(owner_of(4), 1);
  EXPECT_EQ(owner_of(2), 1);
  EXPECT_EQ(owner_of(0), 0);
  EXPECT_EQ(owner_of(3), 0);
  EXPECT_EQ(owner_of(1), 0);
  EXPECT_EQ(two.buckets[1].shard_numel, 300);
}

TEST(TensorOwners, TiesGoToTheRankThatOwnsLeastElsewhere) {
  // Rank 0 owns 50 elsewhere: 30 -> rank 1 (0 = 0 here, 0 < 50 elsewhere); 20 -> rank 0
  // (0 < 30); 10 -> rank 0 (20 < 30). What a rank owns elsewhere never outweighs the balance
  // here.
  EXPECT_THAT(sh::assign_tensor_owners({30, 20, 10}, 2, {50, 0}), ElementsAre(1, 0, 0));
  EXPECT_THAT(sh::assign_tensor_owners({8, 8}, 3, {4, 0, 4}), ElementsAre(1, 0));
  EXPECT_THAT(mantissa_test::value_error_of([] { sh::assign_tensor_owners({1}, 2, {0}); }),
              HasSubstr("owned_elsewhere has 1 entries for 2 ranks"));
}

TEST(WholeTensorLayout, EachBucketBalancedOnItsOwn) {
  // A unit of one 100-element tensor, then one of two 60-element tensors: the second unit's
  // tensors go one to each rank (shards of 60), not both to rank 1 (which owns less overall).
  const std::vector<sh::ParamSpec> specs = {{60, torch::kFloat, 0, 0}, {60, torch::kFloat, 0, 0},
                                            {100, torch::kFloat, 0, 1}};
  const auto layout = sh::place_whole_tensors(
      sh::plan_flat_layout(specs, 2, std::numeric_limits<std::int64_t>::max()));
  ASSERT_EQ(layout.buckets.size(), 2u);
  EXPECT_EQ(layout.buckets[0].shard_numel, 100);
  EXPECT_EQ(layout.buckets[1].shard_numel, 60);
  const auto owner_of = [&](std::size_t param) {
    const auto [b, s] = layout.where[param];
    return layout.buckets[b].first_rank(layout.buckets[b].slots[s]);
  };
  EXPECT_EQ(owner_of(2), 0);
  EXPECT_EQ(owner_of(1), 1);  // the tie between two empty ranks goes to rank 1, owning less
  EXPECT_EQ(owner_of(0), 0);
}

}  // namespace
