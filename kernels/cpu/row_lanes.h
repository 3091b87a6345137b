// Sixteen weight rows side by side, one row per lane: the primitives of the interleaved
// matmuls (interleaved_blocks.h, interleaved_kquants.h), in namespace radixflow_cpu::rows16:
//
//     Codes                 64 bytes: 4 consecutive bytes of each of 16 rows (row r's at 4r)
//     Ints                  16 int32 lanes, one per row
//     Floats                16 fp32 lanes, one per row
//     load_codes(p)         64 bytes
//     store_codes(p, c)     64 bytes stored
//     low(c) high(c)        their low / high nibbles (0..15), in place of each byte
//     masked(c, s, mask)    (byte >> s) & mask for each byte (s < 8)
//     raised(c, s, mask)    (byte << s) & mask for each byte (s < 8)
//     either(a, b)          a | b, byte by byte
//     minus(c, v)           byte - v, byte by byte (wrapping)
//     dot4(acc, c, x4)      acc + in each lane the dot product of its 4 codes (0..15) with the
//                           4 int8 values packed in x4 (exact in int32)
//     dot4_signed(acc, c, x4)   the same for int8 codes (-128..127) and x4's values in
//                           [-127, 127]: |c| times x with c's sign (no pair of products can
//                           saturate a 16-bit sum: 128 * 127 * 2 < 2^15)
//     code_floats(c, i)     byte i (0..3) of each lane (a code, 0..15) as fp32
//     signed_floats(c, i)   the same for int8 codes
//     halves(p)             16 fp16 values as fp32
//     to_floats zero_ints zero_floats splat fma(a, b, c) = a b + c    store(p, v)
//
// A row's lanes hold the same operations whatever the vector width, so every ISA gives the same
// bits: AVX-512 holds the 16 lanes in one register (VPDPBUSD where the build has AVX512-VNNI,
// else VPMADDUBSW + VPMADDWD), AVX2 in two, NEON in four (SDOT with the dot-product extension,
// else widening multiplies and pairwise adds).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

namespace radixflow_cpu::rows16 {

constexpr int kRows = 16;

#if defined(__AVX512F__) && defined(__AVX512BW__)

struct Codes {
  __m512i v;
};
struct Ints {
  __m512i v;
};
struct Floats {
  __m512 v;
};

inline Codes load_codes(const uint8_t* p) { return {_mm512_loadu_si512(p)}; }
inline void store_codes(uint8_t* p, Codes c) { _mm512_storeu_si512(p, c.v); }
inline Codes low(Codes c) { return {_mm512_and_si512(c.v, _mm512_set1_epi8(0x0F))}; }
inline Codes high(Codes c) {
  return {_mm512_and_si512(_mm512_srli_epi16(c.v, 4), _mm512_set1_epi8(0x0F))};
}
// (a shift of 16-bit lanes: the mask drops the bits a byte took from its neighbour)
inline Codes masked(Codes c, int shift, uint8_t mask) {
  return {_mm512_and_si512(_mm512_srl_epi16(c.v, _mm_cvtsi32_si128(shift)),
                           _mm512_set1_epi8(static_cast<char>(mask)))};
}
inline Codes either(Codes a, Codes b) { return {_mm512_or_si512(a.v, b.v)}; }
inline Codes raised(Codes c, int shift, uint8_t mask) {
  return {_mm512_and_si512(_mm512_sll_epi16(c.v, _mm_cvtsi32_si128(shift)),
                           _mm512_set1_epi8(static_cast<char>(mask)))};
}
inline Codes minus(Codes c, uint8_t v) {
  return {_mm512_sub_epi8(c.v, _mm512_set1_epi8(static_cast<char>(v)))};
}
inline Ints zero_ints() { return {_mm512_setzero_si512()}; }
// acc + the dot products of unsigned bytes u with signed bytes s, four per int32 lane.
inline Ints dot_bytes(Ints acc, __m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
  return {_mm512_dpbusd_epi32(acc.v, u, s)};
#else
  const __m512i pairs = _mm512_maddubs_epi16(u, s);
  return {_mm512_add_epi32(acc.v, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))};
#endif
}
inline Ints dot4(Ints acc, Codes c, int32_t x4) {
  return dot_bytes(acc, c.v, _mm512_set1_epi32(x4));
}
inline Ints dot4_signed(Ints acc, Codes c, int32_t x4) {
  const __m512i x = _mm512_set1_epi32(x4);
  const __m512i x_signed =
      _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(c.v), _mm512_setzero_si512(), x);
  return dot_bytes(acc, _mm512_abs_epi8(c.v), x_signed);
}
inline Floats code_floats(Codes c, int i) {
  const __m512i lanes = _mm512_srl_epi32(c.v, _mm_cvtsi32_si128(8 * i));
  return {_mm512_cvtepi32_ps(_mm512_and_si512(lanes, _mm512_set1_epi32(0xFF)))};
}
inline Floats signed_floats(Codes c, int i) {
  const __m512i high = _mm512_sll_epi32(c.v, _mm_cvtsi32_si128(24 - 8 * i));
  return {_mm512_cvtepi32_ps(_mm512_srai_epi32(high, 24))};
}
inline Floats halves(const uint8_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline Floats to_floats(Ints s) { return {_mm512_cvtepi32_ps(s.v)}; }
inline Floats zero_floats() { return {_mm512_setzero_ps()}; }
inline Floats splat(float x) { return {_mm512_set1_ps(x)}; }
inline Floats fma(Floats a, Floats b, Floats c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Floats mul(Floats a, Floats b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline void store(float* p, Floats v) { _mm512_storeu_ps(p, v.v); }

#elif defined(__AVX2__)

struct Codes {
  __m256i v[2];
};
struct Ints {
  __m256i v[2];
};
struct Floats {
  __m256 v[2];
};

inline Codes load_codes(const uint8_t* p) {
  return {{_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))}};
}
inline void store_codes(uint8_t* p, Codes c) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), c.v[0]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 32), c.v[1]);
}
inline Codes low(Codes c) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  return {{_mm256_and_si256(c.v[0], mask), _mm256_and_si256(c.v[1], mask)}};
}
inline Codes high(Codes c) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  return {{_mm256_and_si256(_mm256_srli_epi16(c.v[0], 4), mask),
           _mm256_and_si256(_mm256_srli_epi16(c.v[1], 4), mask)}};
}
inline Codes masked(Codes c, int shift, uint8_t mask) {
  const __m256i bits = _mm256_set1_epi8(static_cast<char>(mask));
  const __m128i count = _mm_cvtsi32_si128(shift);
  return {{_mm256_and_si256(_mm256_srl_epi16(c.v[0], count), bits),
           _mm256_and_si256(_mm256_srl_epi16(c.v[1], count), bits)}};
}
inline Codes either(Codes a, Codes b) {
  return {{_mm256_or_si256(a.v[0], b.v[0]), _mm256_or_si256(a.v[1], b.v[1])}};
}
inline Codes raised(Codes c, int shift, uint8_t mask) {
  const __m256i bits = _mm256_set1_epi8(static_cast<char>(mask));
  const __m128i count = _mm_cvtsi32_si128(shift);
  return {{_mm256_and_si256(_mm256_sll_epi16(c.v[0], count), bits),
           _mm256_and_si256(_mm256_sll_epi16(c.v[1], count), bits)}};
}
inline Codes minus(Codes c, uint8_t v) {
  const __m256i value = _mm256_set1_epi8(static_cast<char>(v));
  return {{_mm256_sub_epi8(c.v[0], value), _mm256_sub_epi8(c.v[1], value)}};
}
inline Ints zero_ints() { return {{_mm256_setzero_si256(), _mm256_setzero_si256()}}; }
// acc + the dot products of unsigned bytes u with signed bytes s, four per int32 lane.
inline __m256i dot_bytes(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}
inline Ints dot4(Ints acc, Codes c, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  return {{dot_bytes(acc.v[0], c.v[0], x), dot_bytes(acc.v[1], c.v[1], x)}};
}
inline Ints dot4_signed(Ints acc, Codes c, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  return {{dot_bytes(acc.v[0], _mm256_abs_epi8(c.v[0]), _mm256_sign_epi8(x, c.v[0])),
           dot_bytes(acc.v[1], _mm256_abs_epi8(c.v[1]), _mm256_sign_epi8(x, c.v[1]))}};
}
inline Floats code_floats(Codes c, int i) {
  const __m256i mask = _mm256_set1_epi32(0xFF);
  const __m128i shift = _mm_cvtsi32_si128(8 * i);
  return {{_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(c.v[0], shift), mask)),
           _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(c.v[1], shift), mask))}};
}
inline Floats signed_floats(Codes c, int i) {
  const __m128i shift = _mm_cvtsi32_si128(24 - 8 * i);
  return {{_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_sll_epi32(c.v[0], shift), 24)),
           _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_sll_epi32(c.v[1], shift), 24))}};
}
inline Floats halves(const uint8_t* p) {
  return {{_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
           _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))}};
}
inline Floats to_floats(Ints s) {
  return {{_mm256_cvtepi32_ps(s.v[0]), _mm256_cvtepi32_ps(s.v[1])}};
}
inline Floats zero_floats() { return {{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
inline Floats splat(float x) { return {{_mm256_set1_ps(x), _mm256_set1_ps(x)}}; }
inline Floats fma(Floats a, Floats b, Floats c) {
  return {{_mm256_fmadd_ps(a.v[0], b.v[0], c.v[0]), _mm256_fmadd_ps(a.v[1], b.v[1], c.v[1])}};
}
inline Floats mul(Floats a, Floats b) {
  return {{_mm256_mul_ps(a.v[0], b.v[0]), _mm256_mul_ps(a.v[1], b.v[1])}};
}
inline void store(float* p, Floats v) {
  _mm256_storeu_ps(p, v.v[0]);
  _mm256_storeu_ps(p + 8, v.v[1]);
}

#elif defined(__ARM_NEON)

struct Codes {
  uint8x16_t v[4];
};
struct Ints {
  int32x4_t v[4];
};
struct Floats {
  float32x4_t v[4];
};

inline Codes load_codes(const uint8_t* p) {
  return {{vld1q_u8(p), vld1q_u8(p + 16), vld1q_u8(p + 32), vld1q_u8(p + 48)}};
}
inline void store_codes(uint8_t* p, Codes c) {
  for (int i = 0; i < 4; ++i) vst1q_u8(p + 16 * i, c.v[i]);
}
inline Codes low(Codes c) {
  const uint8x16_t mask = vdupq_n_u8(0x0F);
  for (auto& v : c.v) v = vandq_u8(v, mask);
  return c;
}
inline Codes high(Codes c) {
  for (auto& v : c.v) v = vshrq_n_u8(v, 4);
  return c;
}
inline Codes masked(Codes c, int shift, uint8_t mask) {
  const int8x16_t right = vdupq_n_s8(static_cast<int8_t>(-shift));
  for (auto& v : c.v) v = vandq_u8(vshlq_u8(v, right), vdupq_n_u8(mask));
  return c;
}
inline Codes either(Codes a, Codes b) {
  for (int j = 0; j < 4; ++j) a.v[j] = vorrq_u8(a.v[j], b.v[j]);
  return a;
}
inline Codes raised(Codes c, int shift, uint8_t mask) {
  const int8x16_t left = vdupq_n_s8(static_cast<int8_t>(shift));
  for (auto& v : c.v) v = vandq_u8(vshlq_u8(v, left), vdupq_n_u8(mask));
  return c;
}
inline Codes minus(Codes c, uint8_t v) {
  for (auto& x : c.v) x = vsubq_u8(x, vdupq_n_u8(v));
  return c;
}
inline Ints zero_ints() {
  return {{vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)}};
}
// acc + the dot products of int8 lanes a and b, four per int32 lane.
inline int32x4_t dot_bytes(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  // per 8 bytes: products (|p| <= 128 * 128) widened in pairs into int32, then pairs of pairs
  const int32x4_t low = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  const int32x4_t high = vpaddlq_s16(vmull_s8(vget_high_s8(a), vget_high_s8(b)));
  return vaddq_s32(acc, vpaddq_s32(low, high));
#endif
}
inline Ints dot4(Ints acc, Codes c, int32_t x4) {
  const int8x16_t x = vreinterpretq_s8_s32(vdupq_n_s32(x4));
  for (int j = 0; j < 4; ++j) acc.v[j] = dot_bytes(acc.v[j], vreinterpretq_s8_u8(c.v[j]), x);
  return acc;
}
inline Ints dot4_signed(Ints acc, Codes c, int32_t x4) { return dot4(acc, c, x4); }
inline Floats code_floats(Codes c, int i) {
  Floats f;
  const int32x4_t shift = vdupq_n_s32(-8 * i);
  for (int j = 0; j < 4; ++j) {
    const uint32x4_t lanes = vshlq_u32(vreinterpretq_u32_u8(c.v[j]), shift);
    f.v[j] = vcvtq_f32_u32(vandq_u32(lanes, vdupq_n_u32(0xFF)));
  }
  return f;
}
inline Floats signed_floats(Codes c, int i) {
  Floats f;
  const int32x4_t up = vdupq_n_s32(24 - 8 * i);
  for (int j = 0; j < 4; ++j) {
    const int32x4_t high = vshlq_s32(vreinterpretq_s32_u8(c.v[j]), up);
    f.v[j] = vcvtq_f32_s32(vshrq_n_s32(high, 24));
  }
  return f;
}
inline Floats halves(const uint8_t* p) {
  Floats f;
  for (int j = 0; j < 4; ++j) {
    const uint16x4_t bits = vld1_u16(reinterpret_cast<const uint16_t*>(p) + 4 * j);
    f.v[j] = vcvt_f32_f16(vreinterpret_f16_u16(bits));
  }
  return f;
}
inline Floats to_floats(Ints s) {
  Floats f;
  for (int j = 0; j < 4; ++j) f.v[j] = vcvtq_f32_s32(s.v[j]);
  return f;
}
inline Floats zero_floats() {
  return {{vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}};
}
inline Floats splat(float x) {
  return {{vdupq_n_f32(x), vdupq_n_f32(x), vdupq_n_f32(x), vdupq_n_f32(x)}};
}
inline Floats fma(Floats a, Floats b, Floats c) {
  for (int j = 0; j < 4; ++j) c.v[j] = vfmaq_f32(c.v[j], a.v[j], b.v[j]);
  return c;
}
inline Floats mul(Floats a, Floats b) {
  for (int j = 0; j < 4; ++j) a.v[j] = vmulq_f32(a.v[j], b.v[j]);
  return a;
}
inline void store(float* p, Floats v) {
  for (int j = 0; j < 4; ++j) vst1q_f32(p + 4 * j, v.v[j]);
}

#else
#error "the interleaved rows need AVX2 or NEON"
#endif

inline int32_t load_x4(const int8_t* p) {
  int32_t x4;
  std::memcpy(&x4, p, 4);
  return x4;
}

}  // namespace radixflow_cpu::rows16
