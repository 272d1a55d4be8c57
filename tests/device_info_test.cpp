// What the run's first line says about bf16 on a CPU without native bf16 (src/device_info.h).
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mantissa/trainer.h>
#include "device_info.h"
#include "toy_training.h"

namespace {

using mantissa::detail::emulated_bf16_note;
using mantissa::detail::has_native_bf16_flag;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(DeviceInfoTest, NativeBf16ComesFromTheBf16Flags) {
  // AMD Zen 3: AVX2, no bf16 instructions.
  EXPECT_FALSE(has_native_bf16_flag({{"avx2", true}, {"avx512_bf16", false}, {"amx_bf16", false},
                                     {"avx_ne_convert", false}}));
  EXPECT_TRUE(has_native_bf16_flag({{"avx2", true}, {"avx512_bf16", true}}));  // Zen 4
  EXPECT_TRUE(has_native_bf16_flag({{"amx_bf16", true}, {"avx512_bf16", false}}));  // AMX Xeon
  EXPECT_TRUE(has_native_bf16_flag({{"bf16", true}}));  // Arm with the BF16 extension
  EXPECT_FALSE(has_native_bf16_flag({}));
}

TEST(DeviceInfoTest, NoteOnlyForBf16OnACpuWithoutIt) {
  EXPECT_THAT(emulated_bf16_note(true, c10::kBFloat16, false),
              HasSubstr("this CPU has no native bf16"));
  EXPECT_EQ(emulated_bf16_note(true, c10::kBFloat16, true), "");
  EXPECT_EQ(emulated_bf16_note(true, c10::kFloat, false), "");
  EXPECT_EQ(emulated_bf16_note(true, c10::kHalf, false), "");
  EXPECT_EQ(emulated_bf16_note(false, c10::kBFloat16, false), "");  // CUDA
}

// The run's first line carries the note exactly when this machine lacks native bf16.
TEST(DeviceInfoTest, FirstLineOfABf16RunSaysWhenBf16IsEmulated) {
  const bool native = mantissa::detail::query_device_info().cpu_native_bf16;
  for (const bool bf16 : {false, true}) {
    auto model = mantissa_test::make_toy_model();
    mantissa::Trainer trainer(
        model, mantissa_test::toy_args(mantissa_test::toy_output_dir()).bf16(bf16).max_steps(1),
        mantissa_test::ToyDataset(16));
    ::testing::internal::CaptureStdout();
    trainer.train();
    const auto out = ::testing::internal::GetCapturedStdout();
    const auto first_line = out.substr(0, out.find('\n'));
    ASSERT_THAT(first_line, HasSubstr("mantissa: "));
    if (bf16 && !native) {
      EXPECT_THAT(first_line, HasSubstr("bf16 math is emulated")) << first_line;
    } else {
      EXPECT_THAT(first_line, Not(HasSubstr("emulated"))) << first_line;
    }
  }
}

}  // namespace
