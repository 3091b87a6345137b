// The vector primitives of simd.h for AVX2 + FMA (x86-64 without AVX-512, e.g. AMD Zen 1-3).
#pragma once

#include <immintrin.h>

#include <cstring>

namespace radixflow_cpu {

using Vec = __m256;
constexpr int kLanes = 8;
constexpr int kRegisters = 16;

// All-ones in lanes [0, n).
inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)std::min<int64_t>(n, 8)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec set1(float x) { return _mm256_set1_ps(x); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }   // a b + c
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); } // c - a b
inline Vec round_nearest(Vec v) {
  return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// p 2^n for integral n: two exponent-field multiplies, so that n down to -252 (a denormal or
// zero result) and up to 254 (infinity) stay exact where the result is representable.
inline Vec scale_pow2(Vec p, Vec n) {
  const Vec clamped = _mm256_min_ps(_mm256_max_ps(n, set1(-252.0f)), set1(254.0f));
  const __m256i whole = _mm256_cvtps_epi32(clamped);
  const __m256i half = _mm256_srai_epi32(whole, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const Vec a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const Vec b = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(whole, half), bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, a), b);
}

inline float reduce_add(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float reduce_max(Vec v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// Lanes [0, n) of v, the others `fill`.
inline Vec keep_first(Vec v, int64_t n, float fill) {
  return _mm256_blendv_ps(set1(fill), v, _mm256_castsi256_ps(first_lanes(n)));
}

inline Vec widen_bf16(__m128i raw) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// 8 fp32 lanes rounded to bfloat16 (to nearest even, NaN kept), as c10::BFloat16 rounds.
inline __m128i narrow_bf16(Vec v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  rounded = _mm256_castps_si256(_mm256_blendv_ps(
      _mm256_castsi256_ps(rounded), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC0)), nan));
  // packus packs within each 128-bit half; the permute brings halves 0 and 2 together
  const __m256i packed = _mm256_packus_epi32(rounded, rounded);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

inline Vec round_bf16(Vec v) { return widen_bf16(narrow_bf16(v)); }

// Loads and stores of kLanes elements, or of the first n (the other lanes read as zero;
// n >= kLanes takes the full path).
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load(const c10::BFloat16* p) {
  return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Vec load(const float* p, int64_t n) {
  if (n >= kLanes) return load(p);
  return _mm256_maskload_ps(p, first_lanes(n));
}
inline Vec load(const c10::BFloat16* p, int64_t n) {
  if (n >= kLanes) return load(p);
  alignas(16) uint16_t part[8] = {};
  std::memcpy(part, p, n * sizeof(uint16_t));
  return widen_bf16(_mm_load_si128(reinterpret_cast<const __m128i*>(part)));
}
// kLanes int8 values as fp32 lanes.
inline Vec load_i8(const int8_t* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline void store(c10::BFloat16* p, Vec v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow_bf16(v));
}
inline void store(float* p, Vec v, int64_t n) {
  if (n >= kLanes) return store(p, v);
  _mm256_maskstore_ps(p, first_lanes(n), v);
}
inline void store(c10::BFloat16* p, Vec v, int64_t n) {
  if (n >= kLanes) return store(p, v);
  alignas(16) uint16_t part[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(part), narrow_bf16(v));
  std::memcpy(p, part, n * sizeof(uint16_t));
}

// Lane j of the result is the sum of the lanes of v[j] (8 vectors): three rounds of
// horizontal adds, then the two 128-bit halves added.
inline Vec sum_lanes(const Vec* v) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  // u0 = [v0 v1 v2 v3 over the low half | the same over the high half]; u1 for v4..v7
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

}  // namespace radixflow_cpu
