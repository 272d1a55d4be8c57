// mantissa::nn::MultiheadAttention against PyTorch's torch.nn.MultiheadAttention
// (tests/golden/make_multihead_attention_golden.py writes multihead_attention_golden.json):
// the same initial parameters from the same seed, the same outputs, attention weights and
// gradients, with padding masks, attention masks, other key/value widths and bf16 autocast.
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/amp/autocast.h>
#include <mantissa/nn/multihead_attention.h>

#include "golden_util.h"

namespace {

using json = nlohmann::json;
using mantissa::nn::MultiheadAttention;
using mantissa_test::golden_tensor;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

const json& cases() { return mantissa_test::golden_file("multihead_attention_golden.json")["cases"]; }

MultiheadAttention module_of(const json& c) {
  torch::manual_seed(c["seed"].get<std::uint64_t>());
  return MultiheadAttention(torch::nn::MultiheadAttentionOptions(c["embed_dim"].get<int64_t>(),
                                                                c["num_heads"].get<int64_t>())
                                .kdim(c["kdim"].get<int64_t>())
                                .vdim(c["vdim"].get<int64_t>())
                                .bias(c["bias"].get<bool>())
                                .add_bias_kv(c["add_bias_kv"].get<bool>())
                                .add_zero_attn(c["add_zero_attn"].get<bool>()),
                            c["batch_first"].get<bool>());
}

torch::Tensor optional_tensor(const json& doc) {
  return doc.is_null() ? torch::Tensor() : golden_tensor(doc);
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol,
                  double atol, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const auto a = actual.detach().to(torch::kDouble);
  const auto e = expected.to(torch::kDouble);
  EXPECT_TRUE(torch::allclose(a, e, rtol, atol))
      << what << ": max |difference| " << (a - e).abs().max().item<double>();
}

// Runs one golden case through the C++ module; fp32 cases within float rounding, the bf16
// autocast case within a few bf16 roundings (its GEMMs and softmax round to bf16).
void check_case(const std::string& name) {
  SCOPED_TRACE(name);
  const auto& c = cases().at(name);
  auto mha = module_of(c);
  mha->train();
  for (const auto& item : mha->named_parameters()) {
    ASSERT_TRUE(c["init"].contains(item.key())) << "PyTorch has no parameter " << item.key();
    // The same seed, the same initialization in the same order.
    expect_close(item.value(), golden_tensor(c["init"][item.key()]), 0, 1e-7, "init " + item.key());
  }
  EXPECT_EQ(mha->named_parameters().size(), c["init"].size());

  auto query = golden_tensor(c["query"]).requires_grad_(true);
  const bool self = c["self_attention"].get<bool>();
  const auto key = self ? query : golden_tensor(c["key"]);
  const auto value = self ? query : golden_tensor(c["value"]);
  const bool bf16 = c["autocast"].get<bool>();
  const bool need_weights = c["need_weights"].get<bool>();
  torch::Tensor out, weights;
  {
    mantissa::amp::Autocast autocast(torch::kCPU, torch::kBFloat16, bf16);
    std::tie(out, weights) =
        mha(query, key, value, optional_tensor(c["key_padding_mask"]), need_weights,
            optional_tensor(c["attn_mask"]));
  }
  const auto expected = golden_tensor(c["output"]);
  EXPECT_EQ(out.scalar_type(), expected.scalar_type());
  const double rtol = bf16 ? 4e-2 : 1e-5;
  const double atol = bf16 ? 4e-2 : 1e-5;
  expect_close(out, expected, rtol, atol, "output");
  if (need_weights) {
    ASSERT_TRUE(weights.defined());
    expect_close(weights, golden_tensor(c["weights"]), rtol, atol, "attention weights");
  } else {
    EXPECT_FALSE(weights.defined());
  }
  out.backward(golden_tensor(c["grad_output"]));
  expect_close(query.grad(), golden_tensor(c["grad_query"]), rtol, atol, "grad of the query");
  for (const auto& item : mha->named_parameters()) {
    expect_close(item.value().grad(), golden_tensor(c["grads"][item.key()]), rtol,
                 bf16 ? 1e-1 : 1e-5, "grad " + item.key());
  }
}

TEST(MultiheadAttentionTest, CrossAttentionWithAPaddingMaskAndAFloatMaskReturnsPyTorchsWeights) {
  check_case("cross_float_mask_weights");
}

TEST(MultiheadAttentionTest, PaddedCausalSelfAttentionOnScaledDotProductAttention) {
  check_case("self_padded_causal_sdpa");
}

TEST(MultiheadAttentionTest, OtherKeyAndValueWidthsWithBiasKvAndZeroAttention) {
  check_case("kdim_vdim_bias_kv_zero_attn");
}

TEST(MultiheadAttentionTest, WithoutBiases) { check_case("no_bias"); }

TEST(MultiheadAttentionTest, TrainsUnderBf16AutocastWithAPaddedBatch) {
  // LibTorch's own module fails here ("masked_fill" not implemented for 'BFloat16').
  check_case("self_padded_causal_bf16_autocast");
}

TEST(MultiheadAttentionTest, IsCausalWithoutAMaskEqualsAnExplicitCausalMask) {
  torch::manual_seed(3);
  MultiheadAttention mha(torch::nn::MultiheadAttentionOptions(8, 2), /*batch_first=*/true);
  const auto x = torch::randn({2, 5, 8});
  const auto causal = torch::ones({5, 5}, torch::kBool).triu(1);
  const auto explicit_mask = std::get<0>(mha(x, x, x, torch::Tensor(), false, causal));
  const auto hinted = std::get<0>(mha(x, x, x, torch::Tensor(), false, torch::Tensor(), true, /*is_causal=*/true));
  EXPECT_TRUE(torch::allclose(explicit_mask, hinted, 1e-6, 1e-6));
}

TEST(MultiheadAttentionTest, NoMaskUnderBf16AutocastRunsTheMathPath) {
  // A short bf16 sequence without masks takes nn::scaled_dot_product_attention's math path,
  // which must read the module's "no mask" (an undefined tensor) as none.
  torch::manual_seed(5);
  MultiheadAttention mha(torch::nn::MultiheadAttentionOptions(8, 2), /*batch_first=*/true);
  const auto x = torch::randn({2, 5, 8}, torch::requires_grad());
  torch::Tensor out;
  {
    mantissa::amp::Autocast autocast(torch::kCPU, torch::kBFloat16);
    out = std::get<0>(mha(x, x, x, torch::Tensor(), /*need_weights=*/false));
  }
  const auto [reference, unused] = mha(x, x, x);
  EXPECT_TRUE(torch::allclose(out.to(torch::kFloat), reference, 3e-2, 3e-2));
  out.to(torch::kFloat).sum().backward();
  EXPECT_TRUE(x.grad().isfinite().all().item<bool>());
}

TEST(MultiheadAttentionTest, AnUnbatchedQueryWorks) {
  torch::manual_seed(4);
  MultiheadAttention mha(8, 2);
  const auto x = torch::randn({5, 8});
  const auto [out, weights] = mha(x, x, x);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(weights.sizes(), (std::vector<int64_t>{5, 5}));
  const auto [batched, unused] = mha(x.unsqueeze(1), x.unsqueeze(1), x.unsqueeze(1));
  EXPECT_TRUE(torch::allclose(out, batched.squeeze(1), 1e-6, 1e-6));
}

TEST(MultiheadAttentionTest, BadShapesAndOptionsAreNamed) {
  EXPECT_THAT([] { MultiheadAttention(10, 3); },
              ThrowsMessage<c10::ValueError>(HasSubstr("embed_dim (10) must be a positive "
                                                       "multiple of num_heads (3)")));
  MultiheadAttention mha(torch::nn::MultiheadAttentionOptions(8, 2), /*batch_first=*/true);
  const auto x = torch::randn({2, 5, 8});
  EXPECT_THAT([&] { mha(x, x, x, torch::zeros({2, 4}, torch::kBool)); },
              ThrowsMessage<c10::ValueError>(HasSubstr("key_padding_mask must be [batch, source] "
                                                       "= [2, 5], got [2, 4]")));
  EXPECT_THAT([&] { mha(x, x, x, torch::Tensor(), false, torch::zeros({5, 4})); },
              ThrowsMessage<c10::ValueError>(HasSubstr("attn_mask must be [target, source]")));
  EXPECT_THAT([&] { mha(x, x, x, torch::zeros({2, 5}, torch::kLong)); },
              ThrowsMessage<c10::ValueError>(HasSubstr("key_padding_mask must be bool")));
  EXPECT_THAT([&] { mha(torch::randn({2, 5, 6}), x, x); },
              ThrowsMessage<c10::ValueError>(HasSubstr("query's last dimension is 6")));
}

}  // namespace
