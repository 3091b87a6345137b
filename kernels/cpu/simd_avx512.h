// The vector primitives of simd.h for AVX-512 (F, BW, VL, DQ; AVX512-BF16 where compiled in).
#pragma once

#include <immintrin.h>

namespace radixflow_cpu {

using Vec = __m512;
constexpr int kLanes = 16;
constexpr int kRegisters = 32;

// Lanes [0, n) of a vector (n >= kLanes: all of them).
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec set1(float x) { return _mm512_set1_ps(x); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }   // a b + c
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); } // c - a b
inline Vec round_nearest(Vec v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline Vec scale_pow2(Vec p, Vec n) { return _mm512_scalef_ps(p, n); }  // p 2^n
inline float reduce_add(Vec v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(Vec v) { return _mm512_reduce_max_ps(v); }
// Lanes [0, n) of v, the others `fill`.
inline Vec keep_first(Vec v, int64_t n, float fill) {
  return _mm512_mask_mov_ps(_mm512_set1_ps(fill), first_lanes(n), v);
}

inline Vec widen_bf16(__m256i raw) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// 16 fp32 lanes rounded to bfloat16 (to nearest even, NaN kept), as c10::BFloat16 rounds.
inline __m256i narrow_bf16(Vec v) {
#ifdef __AVX512BF16__
  return (__m256i)_mm512_cvtneps_pbh(v);
#else
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(rounded);
#endif
}

inline Vec round_bf16(Vec v) { return widen_bf16(narrow_bf16(v)); }

// Loads and stores of kLanes elements, or of the first n (the other lanes read as zero).
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec load(const c10::BFloat16* p) {
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Vec load(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first_lanes(n), p); }
inline Vec load(const c10::BFloat16* p, int64_t n) {
  return widen_bf16(_mm256_maskz_loadu_epi16(first_lanes(n), p));
}
// kLanes int8 values as fp32 lanes.
inline Vec load_i8(const int8_t* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
}
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline void store(c10::BFloat16* p, Vec v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow_bf16(v));
}
inline void store(float* p, Vec v, int64_t n) { _mm512_mask_storeu_ps(p, first_lanes(n), v); }
inline void store(c10::BFloat16* p, Vec v, int64_t n) {
  _mm256_mask_storeu_epi16(p, first_lanes(n), narrow_bf16(v));
}

// Lane j of the result is the sum of the lanes of v[j] (16 vectors): a transpose and add in
// four rounds.
inline Vec sum_lanes(const Vec* v) {
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // u[i] lane group c holds the partial sums of v[4i..4i+3] over their 128-bit lane c
  for (int i = 0; i < 2; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88),
                       _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
}

#ifdef __AVX512BF16__
// Pairs of bfloat16 products summed into fp32 lanes by one VDPBF16PS: 2 * kLanes elements.
#define RADIXFLOW_BF16_DOT 1
using Bf16Pairs = __m512i;
inline Bf16Pairs load_pairs(const c10::BFloat16* p) { return _mm512_loadu_si512(p); }
inline Bf16Pairs load_pairs(const c10::BFloat16* p, int64_t n) {
  return _mm512_maskz_loadu_epi16(n >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << n) - 1), p);
}
inline Vec dot_pairs(Vec acc, Bf16Pairs a, Bf16Pairs b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
#endif

}  // namespace radixflow_cpu
