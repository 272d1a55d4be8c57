#include <stdexcept>

#include <gtest/gtest.h>

#include <mantissa/amp/tf32_guard.h>

namespace {

using mantissa::amp::tf32_conv_allowed;
using mantissa::amp::tf32_matmul_allowed;
using mantissa::amp::Tf32Guard;

TEST(Tf32GuardTest, AllowsAndRestores) {
  Tf32Guard off(false);
  EXPECT_FALSE(tf32_matmul_allowed());
  EXPECT_FALSE(tf32_conv_allowed());
  {
    Tf32Guard on(true);
    EXPECT_TRUE(tf32_matmul_allowed());
    EXPECT_TRUE(tf32_conv_allowed());
  }
  EXPECT_FALSE(tf32_matmul_allowed());
  EXPECT_FALSE(tf32_conv_allowed());
}

TEST(Tf32GuardTest, RestoresTheOriginalSettingAfterNesting) {
  const bool matmul_before = tf32_matmul_allowed();
  const bool conv_before = tf32_conv_allowed();
  {
    Tf32Guard a(!matmul_before);
    EXPECT_EQ(tf32_matmul_allowed(), !matmul_before);
    Tf32Guard b(matmul_before);
    EXPECT_EQ(tf32_matmul_allowed(), matmul_before);
  }
  EXPECT_EQ(tf32_matmul_allowed(), matmul_before);
  EXPECT_EQ(tf32_conv_allowed(), conv_before);
}

TEST(Tf32GuardTest, ExceptionRestores) {
  Tf32Guard off(false);
  EXPECT_THROW(
      {
        Tf32Guard on(true);
        throw std::runtime_error("boom");
      },
      std::runtime_error);
  EXPECT_FALSE(tf32_matmul_allowed());
}

}  // namespace
