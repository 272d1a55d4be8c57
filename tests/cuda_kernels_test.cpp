// CUDA kernels against their CPU twins on the same inputs. Skipped (with the reason) on
// machines without a GPU; scripts/gpu-check runs them on one.
#include <limits>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/unscale.h>

#include "test_util.h"

namespace {

using mantissa::amp::non_finite_check_and_unscale_;

TEST(UnscaleCudaTest, Bf16MatchesCpuTwin) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(mantissa::amp::cuda_kernels_built()) << "built without MANTISSA_CUDA";
  torch::manual_seed(0);
  const auto source = (torch::randn({1000, 37}) * 1000).to(torch::kBFloat16);
  const auto inv_scale = torch::full({1}, 1.0 / 3.0);
  std::vector<torch::Tensor> cpu{source.clone(), source.clone().t()};
  std::vector<torch::Tensor> gpu{source.clone().cuda(), source.clone().cuda().t()};
  auto found_cpu = torch::zeros({1});
  auto found_gpu = torch::zeros({1}, torch::kCUDA);
  non_finite_check_and_unscale_(cpu, found_cpu, inv_scale);
  non_finite_check_and_unscale_(gpu, found_gpu, inv_scale.cuda());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(torch::equal(cpu[i], gpu[i].cpu()));
  EXPECT_EQ(found_gpu.item<float>(), 0.f);

  gpu[1][3][5].fill_(std::numeric_limits<float>::quiet_NaN());
  non_finite_check_and_unscale_(gpu, found_gpu, inv_scale.cuda());
  EXPECT_EQ(found_gpu.item<float>(), 1.f);
}

TEST(GradScalerCudaTest, Bf16ParamsStepThroughScalerOnCuda) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  // pytorch issue #127176: bf16 grads on CUDA through GradScaler fail in PyTorch.
  auto p =
      torch::zeros({8}, torch::dtype(torch::kBFloat16).device(torch::kCUDA).requires_grad(true));
  torch::optim::SGD opt({p}, 0.5);
  mantissa::amp::GradScaler scaler;
  scaler.scale(p.to(torch::kFloat).sum()).backward();
  scaler.step(opt);
  scaler.update();
  EXPECT_TRUE(torch::equal(p.cpu(), torch::full({8}, -0.5, torch::kBFloat16)));
  EXPECT_EQ(scaler.scale_tensor().device().type(), torch::kCUDA);
}

}  // namespace
