// CUDA kernels against their CPU twins on the same inputs. Skipped (with the reason) on
// machines without a GPU; scripts/gpu-check runs them on one.
#include <limits>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/amp/unscale.h>

#include "optim/low_precision_write.h"
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

// The low-precision rules' write of Adafactor, AdamW8bit and Muon: the GPU kernel gives the
// host's bits, for bf16 and fp16, Kahan (parameter and compensation) and stochastic rounding,
// on a tensor of an odd size and on a transposed (non-contiguous) one.
TEST(LowPrecisionWriteCudaTest, MatchesTheHostBitForBit) {
  MANTISSA_SKIP_WITHOUT_CUDA();
  using mantissa::optim::LowPrecisionUpdate;
  using mantissa::optim::detail::write_low_precision_;
  torch::manual_seed(0);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    for (const auto rule : {LowPrecisionUpdate::kKahan, LowPrecisionUpdate::kStochasticRounding}) {
      for (const bool transposed : {false, true}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " " +
                     mantissa::optim::to_string(rule) + (transposed ? " transposed" : ""));
        auto weights = torch::randn({37, 129}).to(dtype);
        const auto target = weights.to(torch::kFloat) + torch::randn({37, 129}) * 1e-3;
        auto comp = (torch::randn({37, 129}) * 1e-4).to(dtype);
        auto cpu_param = transposed ? weights.clone().t() : weights.clone();
        auto gpu_param = transposed ? weights.clone().cuda().t() : weights.clone().cuda();
        auto cpu_comp = transposed ? comp.clone().t() : comp.clone();
        auto gpu_comp = transposed ? comp.clone().cuda().t() : comp.clone().cuda();
        const auto cpu_target = transposed ? target.t() : target;
        const mantissa::optim::detail::RoundingKey key{1234, 5, 7};
        write_low_precision_(cpu_param, cpu_target, rule, cpu_comp, key, "test");
        write_low_precision_(gpu_param, cpu_target.cuda(), rule, gpu_comp, key, "test");
        EXPECT_TRUE(torch::equal(cpu_param.view(torch::kShort), gpu_param.cpu().view(torch::kShort)));
        EXPECT_TRUE(torch::equal(cpu_comp.view(torch::kShort), gpu_comp.cpu().view(torch::kShort)));
        EXPECT_FALSE(torch::equal(cpu_param.view(torch::kShort),
                                  (transposed ? weights.t() : weights).view(torch::kShort)))
            << "the write changed nothing";
      }
    }
  }
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
