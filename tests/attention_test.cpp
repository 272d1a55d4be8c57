// mantissa::nn::scaled_dot_product_attention: which kernel it picks (a pure policy), and that
// each pick gives exactly what PyTorch gives with that kernel, forward and backward.
#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/autocast.h>
#include <mantissa/nn/attention.h>

namespace {

using mantissa::nn::prefers_math_attention;

TEST(AttentionPolicyTest, MathOnlyForShortBf16SequencesOnTheCpu) {
  EXPECT_TRUE(prefers_math_attention(c10::DeviceType::CPU, at::kBFloat16, 128, 128));
  EXPECT_TRUE(prefers_math_attention(c10::DeviceType::CPU, at::kBFloat16, 1, 64));
  EXPECT_FALSE(prefers_math_attention(c10::DeviceType::CPU, at::kBFloat16, 129, 128));
  EXPECT_FALSE(prefers_math_attention(c10::DeviceType::CPU, at::kBFloat16, 1, 256));
  EXPECT_FALSE(prefers_math_attention(c10::DeviceType::CPU, at::kFloat, 64, 64));
  EXPECT_FALSE(prefers_math_attention(c10::DeviceType::CPU, at::kHalf, 64, 64));
  EXPECT_FALSE(prefers_math_attention(c10::DeviceType::CUDA, at::kBFloat16, 64, 64));
}

// Turns ATen's flash and memory-efficient SDPA kernels off for one scope, so that
// at::scaled_dot_product_attention takes its math path (PyTorch's sdpa_kernel(SDPBackend.MATH)).
class OnlyMathSdpa {
 public:
  OnlyMathSdpa()
      : flash_(at::globalContext().userEnabledFlashSDP()),
        mem_efficient_(at::globalContext().userEnabledMemEfficientSDP()) {
    at::globalContext().setSDPUseFlash(false);
    at::globalContext().setSDPUseMemEfficient(false);
  }
  ~OnlyMathSdpa() {
    at::globalContext().setSDPUseFlash(flash_);
    at::globalContext().setSDPUseMemEfficient(mem_efficient_);
  }
  OnlyMathSdpa(const OnlyMathSdpa&) = delete;
  OnlyMathSdpa& operator=(const OnlyMathSdpa&) = delete;

 private:
  bool flash_;
  bool mem_efficient_;
};

struct AttentionRun {
  torch::Tensor output, grad_qkv;
};

// Attention over q, k, v cut from one packed [B, T, 3, H, D] tensor (as char_gpt does), causal
// or with an additive mask, optionally under bf16 autocast; the output and d(sum of output
// times a fixed tensor)/d(packed input).
template <typename Attend>
AttentionRun run(const torch::Tensor& packed_values, bool autocast, const Attend& attend) {
  const auto packed = packed_values.clone().requires_grad_(true);
  torch::Tensor output;
  {
    mantissa::amp::Autocast guard(c10::DeviceType::CPU, torch::kBFloat16, autocast);
    const auto heads = packed.permute({2, 0, 3, 1, 4}).unbind(0);
    output = attend(heads[0], heads[1], heads[2]);
  }
  torch::manual_seed(5);
  output.backward(torch::randn(output.sizes()).to(output.scalar_type()));
  return {output, packed.grad()};
}

void expect_same(const AttentionRun& ours, const AttentionRun& theirs) {
  ASSERT_EQ(ours.output.scalar_type(), theirs.output.scalar_type());
  EXPECT_TRUE(torch::equal(ours.output, theirs.output));
  EXPECT_TRUE(torch::equal(ours.grad_qkv, theirs.grad_qkv));
}

torch::Tensor packed_input(int64_t time, torch::ScalarType dtype) {
  torch::manual_seed(time);
  return torch::randn({2, time, 3, 4, 32}).to(dtype);
}

const auto ours_causal = [](const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v) {
  return mantissa::nn::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true);
};
const auto aten_causal = [](const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v) {
  return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true);
};

TEST(AttentionTest, ShortBf16IsPyTorchsMathPathUnderAutocast) {
  const auto packed = packed_input(64, torch::kFloat);
  const auto ours = run(packed, /*autocast=*/true, ours_causal);
  OnlyMathSdpa only_math;
  const auto theirs = run(packed, /*autocast=*/true, aten_causal);
  EXPECT_EQ(ours.output.scalar_type(), torch::kBFloat16);
  expect_same(ours, theirs);
}

TEST(AttentionTest, ShortBf16IsPyTorchsMathPathWithoutAutocast) {
  const auto packed = packed_input(128, torch::kBFloat16);
  const auto ours = run(packed, /*autocast=*/false, ours_causal);
  OnlyMathSdpa only_math;
  expect_same(ours, run(packed, /*autocast=*/false, aten_causal));
}

TEST(AttentionTest, AMaskAndAScaleReachTheMathPath) {
  const auto packed = packed_input(32, torch::kBFloat16);
  torch::manual_seed(9);
  const auto mask = torch::randn({32, 32});  // float: autocast casts it along with q, k, v
  const auto ours = run(packed, /*autocast=*/true, [&](auto q, auto k, auto v) {
    return mantissa::nn::scaled_dot_product_attention(q, k, v, mask, 0.0, false, 0.25);
  });
  OnlyMathSdpa only_math;
  const auto theirs = run(packed, /*autocast=*/true, [&](auto q, auto k, auto v) {
    return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, 0.25);
  });
  expect_same(ours, theirs);
}

// Whether ATen's bf16 flash attention runs here. PyTorch 2.11 on an AMX CPU with
// ATEN_CPU_CAPABILITY below avx512 raises "pack_vnni2 is only supported when avx512 is
// supported" from it (Python's F.scaled_dot_product_attention too).
bool aten_bf16_flash_attention_runs() {
  const auto q = torch::randn({1, 1, 256, 32}).to(torch::kBFloat16);
  try {
    at::scaled_dot_product_attention(q, q, q, std::nullopt, 0.0, true);
  } catch (const c10::Error&) {
    return false;
  }
  return true;
}

#define SKIP_UNLESS_ATEN_BF16_FLASH_RUNS()                                                 \
  if (!aten_bf16_flash_attention_runs()) {                                                 \
    GTEST_SKIP() << "ATen's bf16 flash attention fails at ATEN_CPU_CAPABILITY="            \
                 << at::get_cpu_capability() << " on this CPU (PyTorch's own limitation)"; \
  }

TEST(AttentionTest, ABoolMaskMeansMayAttendOnTheMathPathToo) {
  const auto packed = packed_input(48, torch::kFloat);
  // Causal plus a few more keys hidden; every query keeps key 0.
  auto mask = torch::ones({48, 48}, torch::kBool).tril();
  mask.index_put_({torch::indexing::Slice(), 5}, false);
  mask.index_put_({torch::indexing::Slice(), 0}, true);
  const auto with_mask = [&](bool ours) {
    return [&, ours](auto q, auto k, auto v) {
      return ours ? mantissa::nn::scaled_dot_product_attention(q, k, v, mask)
                  : at::scaled_dot_product_attention(q, k, v, mask);
    };
  };
  const auto ours = run(packed, /*autocast=*/true, with_mask(true));
  OnlyMathSdpa only_math;
  expect_same(ours, run(packed, /*autocast=*/true, with_mask(false)));
}

TEST(AttentionTest, AnUndefinedMaskIsNoMask) {
  const auto packed = packed_input(32, torch::kBFloat16);
  const auto ours = run(packed, /*autocast=*/false, [](auto q, auto k, auto v) {
    return mantissa::nn::scaled_dot_product_attention(q, k, v, torch::Tensor(), 0.0, true);
  });
  OnlyMathSdpa only_math;
  expect_same(ours, run(packed, /*autocast=*/false, aten_causal));
}

TEST(AttentionTest, MathTurnedOffLeavesTheChoiceToAten) {
  SKIP_UNLESS_ATEN_BF16_FLASH_RUNS();
  struct MathOff {
    bool before = at::globalContext().userEnabledMathSDP();
    MathOff() { at::globalContext().setSDPUseMath(false); }
    ~MathOff() { at::globalContext().setSDPUseMath(before); }
  } math_off;
  const auto packed = packed_input(64, torch::kFloat);
  expect_same(run(packed, /*autocast=*/true, ours_causal),
              run(packed, /*autocast=*/true, aten_causal));
}

TEST(AttentionTest, LongSequencesAndFloat32KeepAtensChoice) {
  expect_same(run(packed_input(64, torch::kFloat), /*autocast=*/false, ours_causal),
              run(packed_input(64, torch::kFloat), /*autocast=*/false, aten_causal));
  SKIP_UNLESS_ATEN_BF16_FLASH_RUNS();
  expect_same(run(packed_input(256, torch::kFloat), /*autocast=*/true, ours_causal),
              run(packed_input(256, torch::kFloat), /*autocast=*/true, aten_causal));
}

TEST(AttentionTest, MathAndFlashAgreeWithinBf16Rounding) {
  SKIP_UNLESS_ATEN_BF16_FLASH_RUNS();
  const auto packed = packed_input(128, torch::kFloat);
  const auto ours = run(packed, /*autocast=*/true, ours_causal);
  const auto flash = run(packed, /*autocast=*/true, aten_causal);
  // Not the same bits: so the equalities above tell the two paths apart.
  EXPECT_FALSE(torch::equal(ours.output, flash.output));
  EXPECT_TRUE(torch::allclose(ours.output.to(torch::kFloat), flash.output.to(torch::kFloat),
                              /*rtol=*/2e-2, /*atol=*/2e-2));
  EXPECT_TRUE(torch::allclose(ours.grad_qkv, flash.grad_qkv, /*rtol=*/5e-2, /*atol=*/5e-2));
}

}  // namespace
