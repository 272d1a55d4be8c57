// The CPU suite also runs under ATEN_CPU_CAPABILITY=default and =avx2 (tests/CMakeLists.txt), so
// that a test which passes only with one instruction set's rounding fails here rather than on
// another machine. ATen takes that variable at its word: asked for avx2 on a CPU without AVX2
// and FMA, it would run AVX2 code and die of an illegal instruction. This file checks, before any
// test runs, that the CPU can run what the variable asks for, and otherwise skips the whole
// binary with the reason (CTest reports those runs as skipped).
#include <cstdlib>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace {

/// What the levels ATEN_CPU_CAPABILITY can ask for on x86-64 need from the CPU.
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512vl = false;
  bool avx512bw = false;
  bool avx512dq = false;
};

CpuFeatures this_cpu() {
  CpuFeatures f;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
#endif
  return f;
}

/// The instructions `requested` (ATEN_CPU_CAPABILITY's value, or null) needs and `cpu` lacks, or
/// nullopt when the CPU can run it. Only the exact lower-case names ATen honours count; any
/// other value ATen ignores with a warning (so does this), and "default" runs anywhere.
std::optional<std::string> missing_instructions(const char* requested, const CpuFeatures& cpu,
                                                bool x86) {
  if (requested == nullptr || !x86) return std::nullopt;  // elsewhere ATen knows no avx2/avx512
  const std::string level(requested);
  // The same tests as ATen's own choice of level (aten/src/ATen/native/DispatchStub.cpp).
  if (level == "avx2" && !(cpu.avx2 && cpu.fma)) return "AVX2 and FMA";
  if (level == "avx512" &&
      !(cpu.avx512f && cpu.avx512vl && cpu.avx512bw && cpu.avx512dq && cpu.fma)) {
    return "AVX512 F/VL/BW/DQ and FMA";
  }
  return std::nullopt;
}

/// Why a run under `requested` would repeat the plain run, or nullopt: asked for avx2 on an x86
/// CPU that can run AVX2 and FMA but not ATen's AVX512 level, ATen runs exactly the kernels it
/// picks by itself (the highest level the CPU has), so the CPU suite under ATEN_CPU_CAPABILITY=avx2
/// is the plain run a second time (AMD Zen 3, Intel cores before AVX512).
std::optional<std::string> repeats_own_level(const char* requested, const CpuFeatures& cpu,
                                             bool x86) {
  if (requested == nullptr || !x86 || std::string(requested) != "avx2") return std::nullopt;
  const bool own_avx512 =
      cpu.avx512f && cpu.avx512vl && cpu.avx512bw && cpu.avx512dq && cpu.fma;
  if (cpu.avx2 && cpu.fma && !own_avx512) {
    return "avx2 is the highest level this CPU has, so ATen already runs it without the variable";
  }
  return std::nullopt;
}

constexpr bool kX86 =
#if defined(__x86_64__)
    true;
#else
    false;
#endif

class CpuCapabilityGuard : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* requested = std::getenv("ATEN_CPU_CAPABILITY");
    if (const auto missing = missing_instructions(requested, this_cpu(), kX86)) {
      GTEST_SKIP() << "this CPU cannot run ATEN_CPU_CAPABILITY=" << requested << ": it lacks "
                   << *missing << ", and ATen would use them anyway; not running the suite";
    }
    if (const auto repeat = repeats_own_level(requested, this_cpu(), kX86)) {
      GTEST_SKIP() << "ATEN_CPU_CAPABILITY=" << requested << " repeats the run without it: "
                   << *repeat << "; not running the suite twice";
    }
  }
};

[[maybe_unused]] ::testing::Environment* const kGuard =
    ::testing::AddGlobalTestEnvironment(new CpuCapabilityGuard);

TEST(CpuCapabilityGuardTest, SkipsOnlyWhatTheCpuCannotRun) {
  CpuFeatures none;
  CpuFeatures avx2;
  avx2.avx2 = avx2.fma = true;
  CpuFeatures avx512 = avx2;
  avx512.avx512f = avx512.avx512vl = avx512.avx512bw = avx512.avx512dq = true;
  CpuFeatures avx2_without_fma = avx2;
  avx2_without_fma.fma = false;

  EXPECT_EQ(missing_instructions(nullptr, none, true), std::nullopt);
  EXPECT_EQ(missing_instructions("default", none, true), std::nullopt);
  EXPECT_EQ(missing_instructions("avx2", none, true), "AVX2 and FMA");
  EXPECT_EQ(missing_instructions("avx2", avx2_without_fma, true), "AVX2 and FMA");
  EXPECT_EQ(missing_instructions("avx2", avx2, true), std::nullopt);
  EXPECT_EQ(missing_instructions("avx512", avx2, true), "AVX512 F/VL/BW/DQ and FMA");
  EXPECT_EQ(missing_instructions("avx512", avx512, true), std::nullopt);
  EXPECT_EQ(missing_instructions("AVX2", none, true), std::nullopt)
      << "ATen ignores other spellings";
  EXPECT_EQ(missing_instructions("avx2", none, false), std::nullopt)
      << "and the x86 names elsewhere";
  EXPECT_EQ(repeats_own_level(nullptr, avx2, true), std::nullopt);
  EXPECT_EQ(repeats_own_level("default", avx2, true), std::nullopt);
  EXPECT_NE(repeats_own_level("avx2", avx2, true), std::nullopt) << "Zen 3: the plain run is avx2";
  EXPECT_EQ(repeats_own_level("avx2", avx512, true), std::nullopt) << "the plain run is avx512";
  EXPECT_EQ(repeats_own_level("avx2", avx2_without_fma, true), std::nullopt)
      << "the plain run is default";
  EXPECT_EQ(repeats_own_level("avx2", avx2, false), std::nullopt);
  // This machine runs the level it is being tested under (else the guard skipped this test).
  EXPECT_EQ(missing_instructions(std::getenv("ATEN_CPU_CAPABILITY"), this_cpu(), kX86),
            std::nullopt);
}

}  // namespace
