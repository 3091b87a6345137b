// Blocks of 32 int8 values and their dot products: the primitives of the int8-activation
// matmul (quant_blocks.h), in namespace radixflow_cpu::int8:
//
//     Bytes                 32 int8 lanes (a block of weight codes or of quantized x)
//     IntSums               int32 lanes whose sum is a block's dot product (exact)
//     FloatSums             fp32 lanes accumulating scaled IntSums
//     load_bytes(p)         32 int8 values
//     nibbles(qs)           16 bytes -> their 16 low nibbles, then their 16 high nibbles (0..15)
//     dot(w, x)             w . x for int8 w and x in [-127, 127]
//     dot_nonneg(w, x)      the same for w in [0, 127] (no sign handling on x86)
//     scaled_add(acc, s, c) acc + c float(s), lane by lane
//     reduce(acc)           the sum of acc's lanes
//
// x86 (AVX2 and AVX-512 builds alike) works on 256-bit integer vectors (two blocks per 512-bit
// vector measured no faster on Zen 4, which splits 512-bit operations in two): VPDPBUSD where
// the build has AVX512-VNNI, else VPMADDUBSW + VPMADDWD (no pair of products can saturate:
// |w| <= 128 and |x| <= 127). aarch64 uses SDOT where the build has the dot-product extension,
// else widening multiplies.
#pragma once

#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

namespace radixflow_cpu::int8 {

#if defined(__AVX2__)

using Bytes = __m256i;
using IntSums = __m256i;
using FloatSums = __m256;

inline Bytes load_bytes(const int8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

inline Bytes nibbles(const uint8_t* qs) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both =
      _mm256_inserti128_si256(_mm256_castsi128_si256(bytes), _mm_srli_epi16(bytes, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Unsigned bytes u times signed bytes s, four products summed per int32 lane.
inline IntSums dot_unsigned_signed(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline IntSums dot_nonneg(Bytes w, Bytes x) { return dot_unsigned_signed(w, x); }
// |w| (unsigned) times x with w's sign: w = -128 reads as 128, which is still exact.
inline IntSums dot(Bytes w, Bytes x) {
  return dot_unsigned_signed(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
}

inline FloatSums zero_sums() { return _mm256_setzero_ps(); }
inline FloatSums scaled_add(FloatSums acc, IntSums s, float c) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(c), acc);
}
inline float reduce(FloatSums v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

#elif defined(__ARM_NEON)

struct Bytes {
  int8x16_t low, high;
};
using IntSums = int32x4_t;
using FloatSums = float32x4_t;

inline Bytes load_bytes(const int8_t* p) { return {vld1q_s8(p), vld1q_s8(p + 16)}; }

inline Bytes nibbles(const uint8_t* qs) {
  const uint8x16_t bytes = vld1q_u8(qs);
  return {vreinterpretq_s8_u8(vandq_u8(bytes, vdupq_n_u8(0x0F))),
          vreinterpretq_s8_u8(vshrq_n_u8(bytes, 4))};
}

inline IntSums dot(Bytes w, Bytes x) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w.low, x.low), w.high, x.high);
#else
  // two products per int16 lane: |w x| <= 128 * 127, so a pair stays below 2^15
  int16x8_t low = vmull_s8(vget_low_s8(w.low), vget_low_s8(x.low));
  low = vmlal_s8(low, vget_high_s8(w.low), vget_high_s8(x.low));
  int16x8_t high = vmull_s8(vget_low_s8(w.high), vget_low_s8(x.high));
  high = vmlal_s8(high, vget_high_s8(w.high), vget_high_s8(x.high));
  return vpadalq_s16(vpaddlq_s16(low), high);
#endif
}
inline IntSums dot_nonneg(Bytes w, Bytes x) { return dot(w, x); }

inline FloatSums zero_sums() { return vdupq_n_f32(0.0f); }
inline FloatSums scaled_add(FloatSums acc, IntSums s, float c) {
  return vfmaq_n_f32(acc, vcvtq_f32_s32(s), c);
}
inline float reduce(FloatSums v) { return vaddvq_f32(v); }

#else
#error "the int8 dot products need AVX2 or NEON"
#endif

}  // namespace radixflow_cpu::int8
