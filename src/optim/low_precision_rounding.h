#pragma once
// The compensated writes of FusedAdamW's low-precision update rules (Kahan, stochastic
// rounding), in integer and plain IEEE fp32 arithmetic only, so that one definition compiles
// into every CPU build (DEFAULT/AVX2/AVX512) and into the CUDA kernel and gives the same bits
// everywhere. Internal: included by src/optim/ only.
//
// - Philox4x32-10 (Salmon et al. 2011, the generator of curand and of ATen's
//   at::philox_engine): a counter-based generator, so a draw is a pure function of its key and
//   counter and needs no state to carry between threads, devices or checkpoints.
// - fp32 -> bf16/fp16 conversions by rounding to nearest even and by stochastic rounding, on
//   bit patterns. NaN becomes a quiet NaN of the same sign, +-inf stays +-inf; a finite value
//   beyond the largest finite value rounds (or, stochastically, may round) to inf, as a cast
//   does.
// - Bias corrections by repeated squaring: the same double multiplies on host and device
//   (pow() in glibc and in CUDA's libdevice may differ in the last bit).
//
// No fp32 multiply here feeds an add except by an exact power-of-two scaling, so contracting
// one into an fma could not change a result; the double multiplies of the bias corrections use
// round-to-nearest intrinsics on the device, which nvcc never contracts.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MANTISSA_HD __host__ __device__ __forceinline__
#else
#define MANTISSA_HD inline
#endif

namespace mantissa::optim::detail {
// Internal linkage: each CPU build compiles these with its own -m flags, and a shared inline
// definition would let the linker hand the AVX512 copy to the DEFAULT build.
namespace {

struct Philox4 {
  std::uint32_t word[4];
};

MANTISSA_HD std::uint32_t mulhilo32(std::uint32_t a, std::uint32_t b, std::uint32_t* high) {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * b;
  *high = static_cast<std::uint32_t>(product >> 32);
  return static_cast<std::uint32_t>(product);
}

/// Philox4x32 with 10 rounds: 128 random bits for the 128-bit counter `c` under the 64-bit key
/// `k`. Equals at::philox_engine(seed = k, subsequence = c2 | c3 << 32, offset = c0 | c1 << 32)'s
/// first four draws.
MANTISSA_HD Philox4 philox4x32_10(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                                  std::uint32_t c3, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    std::uint32_t hi0 = 0, hi1 = 0;
    const std::uint32_t lo0 = mulhilo32(0xD2511F53u, c0, &hi0);
    const std::uint32_t lo1 = mulhilo32(0xCD9E8D57u, c2, &hi1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return Philox4{{c0, c1, c2, c3}};
}

/// The 32 random bits stochastic rounding uses for element `index` of tensor `tensor` at step
/// `step` under `seed`: word `index % 4` of Philox at counter (index / 4, tensor, step).
MANTISSA_HD std::uint32_t rounding_bits(std::uint64_t seed, std::uint32_t tensor,
                                        std::uint32_t step, std::uint64_t index) {
  const std::uint64_t quad = index >> 2;
  const Philox4 r = philox4x32_10(
      static_cast<std::uint32_t>(quad), static_cast<std::uint32_t>(quad >> 32), tensor, step,
      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  return r.word[index & 3];
}

MANTISSA_HD std::uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

MANTISSA_HD float float_of(std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

MANTISSA_HD bool is_finite_bits(std::uint32_t b) { return (b & 0x7F800000u) != 0x7F800000u; }

// ---- bfloat16: the top half of an fp32 pattern ----

MANTISSA_HD float bf16_to_float(std::uint16_t h) {
  return float_of(static_cast<std::uint32_t>(h) << 16);
}

/// Round to nearest even.
MANTISSA_HD std::uint16_t bf16_nearest(float x) {
  const std::uint32_t b = bits_of(x);
  const std::uint32_t nan = ((b >> 16) & 0x8000u) | 0x7FC0u;
  const std::uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>((b & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

/// Stochastic rounding with the random bits `r`: add 16 of them below the kept half and
/// truncate. The magnitude rounds up with probability (low 16 bits) / 2^16; the carry cannot
/// reach the sign bit (0x7F7FFFFF + 0xFFFF < 2^31), and past the largest finite bf16 it gives
/// inf; +-inf itself stays (its low half is zero, and the carry stays below it).
MANTISSA_HD std::uint16_t bf16_stochastic(float x, std::uint32_t r) {
  const std::uint32_t b = bits_of(x);
  const std::uint32_t nan = ((b >> 16) & 0x8000u) | 0x7FC0u;
  const std::uint32_t rounded = (b + (r >> 16)) >> 16;
  return static_cast<std::uint16_t>((b & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

// ---- float16 ----

MANTISSA_HD float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t man = h & 0x3FFu;
  const std::uint32_t special = sign | 0x7F800000u | (man << 13);
  const std::uint32_t normal = sign | ((exp + 112u) << 23) | (man << 13);
  // Zero or subnormal: man * 2^-24, exact in fp32.
  const std::uint32_t small = sign | bits_of(static_cast<float>(man) * 5.9604644775390625e-8f);
  return float_of(exp == 0x1Fu ? special : (exp != 0 ? normal : small));
}

// fp16 values by the fp32 biased exponent e of |x|:
//   e >= 113 (|x| >= 2^-14): normal fp16; the low 13 of fp32's 23 mantissa bits go.
//   103 <= e <= 112 (2^-24 <= |x| < 2^-14): fp16 subnormals, spacing 2^-24; with the implicit
//     bit M = 1.m, |x| / 2^-24 = M / 2^s for s = 126 - e in [14, 23].
//   e <= 102: below the smallest subnormal 2^-24; the neighbours are 0 and 2^-24.
// An fp32 value >= 65520 (0x477FF000) rounds to inf; 65504 is the largest finite fp16.

/// Round to nearest even.
MANTISSA_HD std::uint16_t half_nearest(float x) {
  // Branch-free (every case computed, one selected), so that a loop over it vectorizes.
  const std::uint32_t b = bits_of(x);
  const std::uint32_t sign = (b >> 16) & 0x8000u;
  const std::uint32_t mag = b & 0x7FFFFFFFu;
  const std::uint32_t e = mag >> 23;
  const std::uint32_t rounded = mag + 0xFFFu + ((mag >> 13) & 1u);
  const std::uint32_t normal = (rounded - (112u << 23)) >> 13;
  // Subnormal results: s = 126 - e in [14, 24] for e in [102, 112]; clamped to 31 below
  // (where m < 2^24 <= half gives 0, right for |x| < 2^-25) and to 1 above (unused).
  const std::uint32_t m = (mag & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t s = e >= 125 ? 1u : (e <= 95 ? 31u : 126u - e);
  const std::uint32_t q = m >> s;
  const std::uint32_t rest = m & ((1u << s) - 1u);
  const std::uint32_t half = 1u << (s - 1);
  const std::uint32_t sub = q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u);
  const std::uint32_t value = mag > 0x7F800000u    ? 0x7E00u
                              : mag >= 0x477FF000u ? 0x7C00u
                              : e >= 113           ? normal
                                                   : sub;
  return static_cast<std::uint16_t>(sign | value);
}

/// Stochastic rounding with the random bits `r` at the fp16 spacing of `x` (subnormals
/// included): add as many random bits as are discarded, then truncate. The probabilities are
/// exact for |x| >= 2^-33; below, that of rounding up to 2^-24 is truncated to a multiple of
/// 2^-32 (and is 0 under 2^-56).
MANTISSA_HD std::uint16_t half_stochastic(float x, std::uint32_t r) {
  const std::uint32_t b = bits_of(x);
  const std::uint32_t sign = (b >> 16) & 0x8000u;
  const std::uint32_t mag = b & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);
  if (mag == 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  const std::uint32_t e = mag >> 23;
  if (e >= 113) {
    const std::uint32_t kept = (mag + (r >> 19)) & ~0x1FFFu;
    if (kept >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // 65536: inf
    return static_cast<std::uint16_t>(sign | ((kept - (112u << 23)) >> 13));
  }
  if (e >= 103) {
    const std::uint32_t m = (mag & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t s = 126 - e;  // 14..23
    return static_cast<std::uint16_t>(sign | ((m + (r >> (32 - s))) >> s));
  }
  // |x| < 2^-24: up to 2^-24 with probability |x| / 2^-24 = m * 2^(e - 126), i.e. when r is
  // below t = m * 2^(e - 94) (fp32 subnormals: e = 1 without the implicit bit).
  const std::uint32_t m = e != 0 ? (mag & 0x7FFFFFu) | 0x800000u : mag;
  const int shift = static_cast<int>(e != 0 ? e : 1) - 94;  // -93..8
  std::uint64_t t = 0;
  if (shift >= 0) {
    t = static_cast<std::uint64_t>(m) << shift;
  } else if (shift > -32) {
    t = m >> -shift;
  }
  return static_cast<std::uint16_t>(sign | (static_cast<std::uint64_t>(r) < t ? 1u : 0u));
}

// ---- one element's write ----

/// Round `x` to the dtype (bf16 when `kBf16`, else fp16) to nearest even.
template <bool kBf16>
MANTISSA_HD std::uint16_t round_nearest(float x) {
  if constexpr (kBf16) {
    return bf16_nearest(x);
  } else {
    return half_nearest(x);
  }
}

template <bool kBf16>
MANTISSA_HD std::uint16_t round_stochastic(float x, std::uint32_t r) {
  if constexpr (kBf16) {
    return bf16_stochastic(x, r);
  } else {
    return half_stochastic(x, r);
  }
}

template <bool kBf16>
MANTISSA_HD float widen(std::uint16_t h) {
  if constexpr (kBf16) {
    return bf16_to_float(h);
  } else {
    return half_to_float(h);
  }
}

/// The Kahan-compensated write of the fp32 result `target` into the stored weight `w` with the
/// compensation `*comp` (both in the dtype): the update y = (target - w) + comp is added,
/// t = round(w + y), and the part rounding lost, y - (t - w), becomes the new compensation
/// (rounded to the dtype). A non-finite result is stored as nearest rounding stores it and
/// clears the compensation. Returns t's bits.
template <bool kBf16>
MANTISSA_HD std::uint16_t kahan_write(float w, float target, std::uint16_t* comp) {
  // Branch-free, as half_nearest.
  const float y = (target - w) + widen<kBf16>(*comp);
  const std::uint16_t t = round_nearest<kBf16>(w + y);
  const float tf = widen<kBf16>(t);
  const std::uint16_t c = round_nearest<kBf16>(y - (tf - w));
  const bool finite = is_finite_bits(bits_of(target));
  *comp = finite && is_finite_bits(bits_of(tf)) ? c : std::uint16_t{0};
  return finite ? t : round_nearest<kBf16>(target);
}

MANTISSA_HD double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);  // never contracted with a following add (nvcc's -fmad=true)
#else
  return a * b;
#endif
}

/// base^n by repeated squaring, rounding each double multiply (deterministic on every device).
MANTISSA_HD double pow_by_squaring(double base, std::uint32_t n) {
  double result = 1.0;
  while (n != 0) {
    if (n & 1u) result = mul_rn(result, base);
    base = mul_rn(base, base);
    n >>= 1;
  }
  return result;
}

/// 1 - beta^step, the bias correction of the rules that promise the same bits on the CPU and on
/// CUDA. On the host this needs a build that does not contract the subtraction with the last
/// multiply into an fma: fused_adamw_dispatch.cpp is compiled for baseline x86-64, which has no fma
/// (an fma-enabled host build, e.g. aarch64, would need -ffp-contract=off there).
MANTISSA_HD double exact_bias_correction(double beta, std::uint32_t step) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(1.0, pow_by_squaring(beta, step));
#else
  return 1.0 - pow_by_squaring(beta, step);
#endif
}

}  // namespace
}  // namespace mantissa::optim::detail
