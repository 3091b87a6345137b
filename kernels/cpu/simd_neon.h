// The vector primitives of simd.h for aarch64 NEON (Apple Silicon, Graviton, ...).
#pragma once

#include <arm_neon.h>

#include <cstring>

namespace radixflow_cpu {

using Vec = float32x4_t;
constexpr int kLanes = 4;
constexpr int kRegisters = 32;

// All-ones in lanes [0, n).
inline uint32x4_t first_lanes(int64_t n) {
  const uint32_t iota[4] = {0, 1, 2, 3};
  return vcltq_u32(vld1q_u32(iota), vdupq_n_u32((uint32_t)std::min<int64_t>(n, 4)));
}

inline Vec zero() { return vdupq_n_f32(0.0f); }
inline Vec set1(float x) { return vdupq_n_f32(x); }
inline Vec add(Vec a, Vec b) { return vaddq_f32(a, b); }
inline Vec sub(Vec a, Vec b) { return vsubq_f32(a, b); }
inline Vec mul(Vec a, Vec b) { return vmulq_f32(a, b); }
inline Vec div(Vec a, Vec b) { return vdivq_f32(a, b); }
inline Vec max(Vec a, Vec b) { return vmaxq_f32(a, b); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return vfmaq_f32(c, a, b); }   // a b + c
inline Vec fnmadd(Vec a, Vec b, Vec c) { return vfmsq_f32(c, a, b); }  // c - a b
inline Vec round_nearest(Vec v) { return vrndnq_f32(v); }

// p 2^n for integral n, as in simd_avx2.h: two exponent-field multiplies.
inline Vec scale_pow2(Vec p, Vec n) {
  const int32x4_t whole = vcvtq_s32_f32(vminq_f32(vmaxq_f32(n, set1(-252.0f)), set1(254.0f)));
  const int32x4_t half = vshrq_n_s32(whole, 1);
  const int32x4_t bias = vdupq_n_s32(127);
  const Vec a = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(half, bias), 23));
  const Vec b = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(whole, half), bias), 23));
  return vmulq_f32(vmulq_f32(p, a), b);
}

inline float reduce_add(Vec v) { return vaddvq_f32(v); }
inline float reduce_max(Vec v) { return vmaxvq_f32(v); }

// Lanes [0, n) of v, the others `fill`.
inline Vec keep_first(Vec v, int64_t n, float fill) {
  return vbslq_f32(first_lanes(n), v, set1(fill));
}

inline Vec widen_bf16(uint16x4_t raw) { return vreinterpretq_f32_u32(vshll_n_u16(raw, 16)); }

// 4 fp32 lanes rounded to bfloat16 (to nearest even, NaN kept), as c10::BFloat16 rounds.
inline uint16x4_t narrow_bf16(Vec v) {
  const uint32x4_t bits = vreinterpretq_u32_f32(v);
  const uint32x4_t odd = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
  const uint32x4_t rounded =
      vshrq_n_u32(vaddq_u32(bits, vaddq_u32(odd, vdupq_n_u32(0x7FFF))), 16);
  return vmovn_u32(vbslq_u32(vceqq_f32(v, v), rounded, vdupq_n_u32(0x7FC0)));
}

inline Vec round_bf16(Vec v) { return widen_bf16(narrow_bf16(v)); }

// Loads and stores of kLanes elements, or of the first n (the other lanes read as zero;
// n >= kLanes takes the full path).
inline Vec load(const float* p) { return vld1q_f32(p); }
inline Vec load(const c10::BFloat16* p) {
  return widen_bf16(vld1_u16(reinterpret_cast<const uint16_t*>(p)));
}
inline Vec load(const float* p, int64_t n) {
  if (n >= kLanes) return load(p);
  float part[4] = {};
  std::memcpy(part, p, n * sizeof(float));
  return vld1q_f32(part);
}
inline Vec load(const c10::BFloat16* p, int64_t n) {
  if (n >= kLanes) return load(p);
  uint16_t part[4] = {};
  std::memcpy(part, p, n * sizeof(uint16_t));
  return widen_bf16(vld1_u16(part));
}
// kLanes int8 values as fp32 lanes.
inline Vec load_i8(const int8_t* p) {
  int32_t bits;
  std::memcpy(&bits, p, 4);
  const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(bits)));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
}
inline void store(float* p, Vec v) { vst1q_f32(p, v); }
inline void store(c10::BFloat16* p, Vec v) {
  vst1_u16(reinterpret_cast<uint16_t*>(p), narrow_bf16(v));
}
inline void store(float* p, Vec v, int64_t n) {
  if (n >= kLanes) return store(p, v);
  float part[4];
  vst1q_f32(part, v);
  std::memcpy(p, part, n * sizeof(float));
}
inline void store(c10::BFloat16* p, Vec v, int64_t n) {
  if (n >= kLanes) return store(p, v);
  uint16_t part[4];
  vst1_u16(part, narrow_bf16(v));
  std::memcpy(p, part, n * sizeof(uint16_t));
}

// Lane j of the result is the sum of the lanes of v[j] (4 vectors): two pairwise adds.
inline Vec sum_lanes(const Vec* v) {
  return vpaddq_f32(vpaddq_f32(v[0], v[1]), vpaddq_f32(v[2], v[3]));
}

}  // namespace radixflow_cpu
