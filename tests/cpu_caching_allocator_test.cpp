// The CPU caching allocator: its size classes (a pure function), reuse of freed blocks, the
// limit on cached bytes, threads, and the Trainer turning it on for CPU runs.
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/core/CPUAllocator.h>

#include <mantissa/memory/cpu_caching_allocator.h>
#include <mantissa/trainer.h>

#include "address_sanitizer.h"
#include "toy_training.h"

namespace {

using mantissa::memory::cpu_cache_size_class;
using mantissa::memory::cpu_cache_stats;
using mantissa::memory::CpuCachingAllocatorOptions;

// The bytes the cache holds for a tensor of `bytes`: a header line, then the size class.
std::int64_t block_of(std::size_t bytes) {
  return static_cast<std::int64_t>(cpu_cache_size_class(bytes + 64));
}

// Leaves LibTorch's own allocator in place when a test ends, whatever it did.
class CpuCachingAllocatorTest : public ::testing::Test {
 protected:
  void TearDown() override { mantissa::memory::disable_cpu_caching_allocator(); }
};

TEST(CpuCacheSizeClassTest, RoundsToLinesThenToEightStepsPerPowerOfTwo) {
  EXPECT_EQ(cpu_cache_size_class(0), 64u);
  EXPECT_EQ(cpu_cache_size_class(1), 64u);
  EXPECT_EQ(cpu_cache_size_class(64), 64u);
  EXPECT_EQ(cpu_cache_size_class(65), 128u);
  EXPECT_EQ(cpu_cache_size_class(1024), 1024u);
  EXPECT_EQ(cpu_cache_size_class(1025), 1152u);  // 1024 + 1024 / 8
  EXPECT_EQ(cpu_cache_size_class(4097), 4608u);  // 4096 + 4096 / 8
  EXPECT_EQ(cpu_cache_size_class(65536), 65536u);
  EXPECT_EQ(cpu_cache_size_class(65537), 65536u + 8192u);
  EXPECT_EQ(cpu_cache_size_class(std::size_t{3} << 20), std::size_t{3} << 20);
}

TEST(CpuCacheSizeClassTest, NeverShortAndAtMostAnEighthOver) {
  for (std::size_t bytes = 1; bytes < (std::size_t{1} << 22); bytes = bytes * 9 / 8 + 7) {
    const auto size_class = cpu_cache_size_class(bytes);
    EXPECT_GE(size_class, bytes);
    EXPECT_EQ(size_class % 64, 0u) << bytes;
    if (bytes > 512) EXPECT_LE(size_class - bytes, bytes / 8) << bytes;
    EXPECT_EQ(cpu_cache_size_class(size_class), size_class) << bytes;  // a class is its own class
  }
}

TEST(CpuCacheSizeClassTest, ASizeWhoseClassOverflowsIsNamed) {
  const auto huge = std::numeric_limits<std::size_t>::max() - 5;
  try {
    cpu_cache_size_class(huge);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(std::to_string(huge)), std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST_F(CpuCachingAllocatorTest, AFreedBlockServesTheNextRequestOfItsClass) {
  ASSERT_TRUE(mantissa::memory::enable_cpu_caching_allocator());
  EXPECT_NE(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
  const auto before = cpu_cache_stats();
  EXPECT_TRUE(before.enabled);
  const void* first = nullptr;
  {
    auto t = torch::empty({300001}, torch::kFloat);  // 1200004 bytes
    first = t.data_ptr();
    EXPECT_EQ(cpu_cache_stats().allocated_bytes - before.allocated_bytes,
              static_cast<std::int64_t>(block_of(1200004)));
  }
  const auto freed = cpu_cache_stats();
  EXPECT_EQ(freed.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(freed.cached_bytes - before.cached_bytes,
            static_cast<std::int64_t>(block_of(1200004)));
  auto again = torch::empty({300010}, torch::kFloat);  // same class, a little larger
  EXPECT_EQ(again.data_ptr(), first);
  const auto after = cpu_cache_stats();
  EXPECT_EQ(after.cache_hits - before.cache_hits, 1);
  EXPECT_EQ(after.allocations - before.allocations, 2);
  auto other = torch::empty({600000}, torch::kFloat);  // another class: a new block
  EXPECT_NE(other.data_ptr(), first);
}

TEST_F(CpuCachingAllocatorTest, SmallRequestsAreNotCached) {
  CpuCachingAllocatorOptions options;
  options.min_block_bytes = 1 << 20;
  ASSERT_TRUE(mantissa::memory::enable_cpu_caching_allocator(options));
  const auto before = cpu_cache_stats();
  { auto t = torch::ones({1000}, torch::kFloat); }
  EXPECT_EQ(cpu_cache_stats().allocations, before.allocations);
  { auto t = torch::ones({1 << 18}, torch::kFloat); }  // exactly 1 MiB
  EXPECT_EQ(cpu_cache_stats().allocations - before.allocations, 1);
}

TEST_F(CpuCachingAllocatorTest, BlocksBeyondTheLimitGoBackToTheSystem) {
  CpuCachingAllocatorOptions options;
  options.max_cached_bytes = 3 << 20;
  ASSERT_TRUE(mantissa::memory::enable_cpu_caching_allocator(options));
  mantissa::memory::empty_cpu_cache();
  {
    auto a = torch::empty({1 << 19}, torch::kFloat);  // 2 MiB
    auto b = torch::empty({1 << 19}, torch::kFloat);  // 2 MiB more: over the 3 MiB limit
  }
  EXPECT_EQ(cpu_cache_stats().cached_bytes, block_of(2 << 20));
  mantissa::memory::empty_cpu_cache();
  EXPECT_EQ(cpu_cache_stats().cached_bytes, 0);
}

TEST_F(CpuCachingAllocatorTest, TensorsOutliveDisablingAndFreeThemselves) {
  ASSERT_TRUE(mantissa::memory::enable_cpu_caching_allocator());
  auto kept = torch::arange(1 << 18, torch::kFloat);
  const auto held = cpu_cache_stats().allocated_bytes;
  EXPECT_GE(held, 1 << 20);
  mantissa::memory::disable_cpu_caching_allocator();
  EXPECT_EQ(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
  EXPECT_FALSE(cpu_cache_stats().enabled);
  EXPECT_EQ(kept.sum().item<double>(), (double(1 << 18) - 1) * double(1 << 18) / 2);
  kept = at::Tensor();
  const auto after = cpu_cache_stats();
  EXPECT_EQ(after.allocated_bytes, held - block_of(1 << 20));
  EXPECT_EQ(after.cached_bytes, 0);  // not kept once disabled
}

// oneDNN takes its scratch memory with raw_allocate, which needs the data pointer to be the
// DataPtr's context and one deleter for every block.
TEST_F(CpuCachingAllocatorTest, RawAllocateAndDeallocateWork) {
  ASSERT_TRUE(mantissa::memory::enable_cpu_caching_allocator());
  auto* allocator = c10::GetCPUAllocator();
  ASSERT_NE(allocator->raw_deleter(), nullptr);
  for (std::size_t n : {std::size_t{0}, std::size_t{100}, std::size_t{1} << 20}) {
    void* p = allocator->raw_allocate(n);
    if (n > 0) {
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
      static_cast<char*>(p)[n - 1] = 1;
    }
    allocator->raw_deallocate(p);
  }
  const auto a = torch::randn({64, 96}).to(torch::kBFloat16);
  const auto b = torch::randn({96, 32}).to(torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(a.matmul(b).to(torch::kFloat), a.to(torch::kFloat).matmul(b.to(torch::kFloat)),
                              2e-2, 2e-1));
}

TEST_F(CpuCachingAllocatorTest, ThreadsAllocateAndFreeAcrossEachOther) {
  ASSERT_TRUE(mantissa::memory::enable_cpu_caching_allocator());
  const auto before = cpu_cache_stats().allocated_bytes;
  std::vector<std::vector<at::Tensor>> made(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&made, t] {
      for (int i = 0; i < 50; ++i) made[t].push_back(torch::full({20000 + 1000 * (i % 5)}, float(t)));
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) {
    for (const auto& x : made[t]) ASSERT_EQ(x.max().item<float>(), float(t));
  }
  threads.clear();
  for (int t = 0; t < 4; ++t) {  // each thread frees another's tensors
    threads.emplace_back([&made, t] { made[(t + 1) % 4].clear(); });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(cpu_cache_stats().allocated_bytes, before);
}

TEST_F(CpuCachingAllocatorTest, TheTrainerTurnsItOnForACpuRun) {
  if (mantissa::detail::kAddressSanitizer) GTEST_SKIP() << "an AddressSanitizer build keeps LibTorch's allocator";
  mantissa::memory::disable_cpu_caching_allocator();
  mantissa::Trainer trainer(mantissa_test::make_toy_model(),
                            mantissa_test::toy_args(mantissa_test::toy_output_dir()).max_steps(2),
                            mantissa_test::ToyDataset(32));
  trainer.train();
  EXPECT_TRUE(cpu_cache_stats().enabled);
  EXPECT_NE(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
}

TEST_F(CpuCachingAllocatorTest, FalseLeavesLibTorchsAllocator) {
  mantissa::memory::disable_cpu_caching_allocator();
  mantissa::Trainer trainer(
      mantissa_test::make_toy_model(),
      mantissa_test::toy_args(mantissa_test::toy_output_dir()).max_steps(2).cpu_caching_allocator(false),
      mantissa_test::ToyDataset(32));
  trainer.train();
  EXPECT_FALSE(cpu_cache_stats().enabled);
  EXPECT_EQ(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
}

}  // namespace
