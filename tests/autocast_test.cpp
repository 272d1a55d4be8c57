#include <stdexcept>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/autocast.h>

namespace {

using mantissa::amp::Autocast;

torch::Tensor matmul_result() { return torch::mm(torch::ones({4, 4}), torch::ones({4, 4})); }

int nesting_depth() {
  // increment_nesting returns the new depth; undo it straight away.
  const int depth = at::autocast::increment_nesting() - 1;
  at::autocast::decrement_nesting();
  return depth;
}

TEST(AutocastTest, CpuBf16GuardMakesMatmulBf16) {
  EXPECT_EQ(matmul_result().scalar_type(), torch::kFloat);
  {
    Autocast autocast(torch::kCPU, torch::kBFloat16);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(matmul_result().scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(matmul_result().scalar_type(), torch::kFloat);
}

TEST(AutocastTest, CpuFp16Guard) {
  Autocast autocast(torch::kCPU, torch::kHalf);
  EXPECT_EQ(matmul_result().scalar_type(), torch::kHalf);
}

TEST(AutocastTest, NestedGuardsRestoreOuterState) {
  Autocast outer(torch::kCPU, torch::kBFloat16);
  EXPECT_EQ(nesting_depth(), 1);
  {
    Autocast inner(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
    EXPECT_EQ(nesting_depth(), 2);
    EXPECT_EQ(matmul_result().scalar_type(), torch::kFloat);
    {
      Autocast innermost(torch::kCPU, torch::kHalf);
      EXPECT_EQ(matmul_result().scalar_type(), torch::kHalf);
    }
    EXPECT_EQ(matmul_result().scalar_type(), torch::kFloat);
  }
  EXPECT_EQ(nesting_depth(), 1);
  EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), torch::kBFloat16);
  EXPECT_EQ(matmul_result().scalar_type(), torch::kBFloat16);
}

TEST(AutocastTest, ExceptionInsideGuardRestoresState) {
  const auto dtype_before = at::autocast::get_autocast_dtype(torch::kCPU);
  EXPECT_THROW(
      {
        Autocast autocast(torch::kCPU, torch::kHalf, true, /*cache_enabled=*/false);
        EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
        throw std::runtime_error("boom");
      },
      std::runtime_error);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), dtype_before);
  EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
  EXPECT_EQ(nesting_depth(), 0);
}

TEST(AutocastTest, CpuAndCudaGuardsAtOnceRestoreBoth) {
  const auto cuda_dtype_before = at::autocast::get_autocast_dtype(torch::kCUDA);
  const bool cuda_enabled_before = at::autocast::is_autocast_enabled(torch::kCUDA);
  {
    Autocast cpu(torch::kCPU, torch::kBFloat16);
    Autocast cuda(torch::kCUDA, torch::kBFloat16);
    EXPECT_EQ(nesting_depth(), 2);
    EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCUDA), torch::kBFloat16);
    // Without a GPU the CUDA guard disables itself, as Python's does.
    EXPECT_EQ(at::autocast::is_autocast_enabled(torch::kCUDA), torch::cuda::is_available());
    EXPECT_EQ(matmul_result().scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCUDA), cuda_dtype_before);
  EXPECT_EQ(at::autocast::is_autocast_enabled(torch::kCUDA), cuda_enabled_before);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(nesting_depth(), 0);
}

TEST(AutocastTest, UnsupportedDtypeDisablesTheGuard) {
  Autocast autocast(torch::kCPU, torch::kDouble);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(matmul_result().scalar_type(), torch::kFloat);
}

TEST(AutocastTest, WeightCastCacheIsClearedWhenOutermostGuardExits) {
  // A leaf fp32 weight that requires grad is cast once and cached inside autocast; the cache
  // must be emptied on exit, or a later in-place update of the weight would be invisible.
  auto weight = torch::ones({4, 4}, torch::requires_grad());
  {
    Autocast autocast(torch::kCPU, torch::kBFloat16);
    auto first = torch::mm(torch::ones({4, 4}), weight);
    EXPECT_FLOAT_EQ(first.sum().item<float>(), 64.f);
  }
  {
    torch::NoGradGuard no_grad;
    weight.mul_(2);
  }
  Autocast autocast(torch::kCPU, torch::kBFloat16);
  auto second = torch::mm(torch::ones({4, 4}), weight);
  EXPECT_FLOAT_EQ(second.sum().item<float>(), 128.f);
}

}  // namespace
