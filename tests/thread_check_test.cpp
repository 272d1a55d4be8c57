// src/trainer/thread_check.h: when a CPU run oversubscribes the cores it may use.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "trainer/thread_check.h"

namespace {

using mantissa::detail::thread_oversubscription;
using ::testing::HasSubstr;

TEST(ThreadCheckTest, ThreadsThatFitSayNothing) {
  EXPECT_FALSE(thread_oversubscription(2, 1, 2));
  EXPECT_FALSE(thread_oversubscription(1, 2, 2));  // torchrun's OMP_NUM_THREADS=1
  EXPECT_FALSE(thread_oversubscription(8, 4, 32));
}

TEST(ThreadCheckTest, TwoRanksOfTwoThreadsOnTwoCoresAreNamed) {
  const auto message = thread_oversubscription(2, 2, 2);
  ASSERT_TRUE(message);
  EXPECT_THAT(*message, HasSubstr("2 process(es) on this machine with 2 OpenMP thread(s) each "
                                  "want 4 cores, and this process may use 2"));
  EXPECT_THAT(*message, HasSubstr("OMP_NUM_THREADS=1"));
  EXPECT_THAT(*thread_oversubscription(16, 1, 8), HasSubstr("OMP_NUM_THREADS=8"));
  EXPECT_THAT(*thread_oversubscription(4, 8, 4), HasSubstr("OMP_NUM_THREADS=1"));  // never 0
}

TEST(ThreadCheckTest, TheUsableCoresAreCounted) {
  EXPECT_GE(mantissa::detail::usable_cores(), 1);
}

}  // namespace
