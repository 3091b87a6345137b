// The small vector abstraction the CPU kernels are written over: one source, one ISA per build.
//
// kernels/cpu_build.py compiles every kernel for one instruction set with explicit flags
// (AVX-512, AVX2 + FMA, or aarch64 NEON); the compiler's target macros pick the header that
// implements the primitives for it. Each defines, in namespace radixflow_cpu:
//
//     Vec, kLanes               a vector of kLanes fp32 lanes (16 / 8 / 4)
//     kRegisters                vector registers the kernels may plan their blocking around
//     zero set1 add sub mul div max fmadd(a b + c) fnmadd(c - a b) round_nearest
//     scale_pow2(p, n)          p 2^n for integral n
//     reduce_add reduce_max     over the lanes of one vector
//     keep_first(v, n, fill)    lanes [0, n) of v, the others fill
//     sum_lanes(v[kLanes])      lane j = the sum of the lanes of v[j] (a transpose-add)
//     load_i8(p)                kLanes int8 values as fp32 lanes
//     load/store(p[, n])        kLanes (or the first n) float32 or bfloat16 elements as fp32
//                               lanes; bfloat16 stores round to nearest even as c10 does
//     round_bf16(v)             v rounded to bfloat16 precision, kept in fp32 lanes
//     Bf16Pairs load_pairs dot_pairs   (only with RADIXFLOW_BF16_DOT: AVX512-BF16's VDPBF16PS)
//
// What follows the include is written once over these.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include "simd_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__)
#include "simd_avx2.h"
#elif defined(__ARM_NEON)
#include "simd_neon.h"
#else
#error "the CPU kernels need AVX-512 (F, BW, VL), AVX2 with FMA, or NEON"
#endif

namespace radixflow_cpu {

// v rounded to T's precision, kept in fp32 lanes (what storing and reloading would give).
template <typename T>
inline Vec round_to(Vec v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return round_bf16(v);
  }
}

// e^x: x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-7 Taylor polynomial (error below
// 1e-8), times 2^n. Very negative x (including -inf) gives 0.
inline Vec vexp(Vec x) {
  x = max(x, set1(-104.0f));
  const Vec n = round_nearest(mul(x, set1(1.44269504088896341f)));
  Vec r = fnmadd(n, set1(0.693145751953125f), x);
  r = fnmadd(n, set1(1.428606765330187e-06f), r);
  Vec p = set1(1.0f / 5040);
  p = fmadd(p, r, set1(1.0f / 720));
  p = fmadd(p, r, set1(1.0f / 120));
  p = fmadd(p, r, set1(1.0f / 24));
  p = fmadd(p, r, set1(1.0f / 6));
  p = fmadd(p, r, set1(0.5f));
  p = fmadd(p, r, set1(1.0f));
  p = fmadd(p, r, set1(1.0f));
  return scale_pow2(p, n);
}

// Pull the cache line at p towards L1 (prefetch_l1) or L2 (prefetch_l2).
inline void prefetch_l1(const void* p) { __builtin_prefetch(p, 0, 3); }
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

}  // namespace radixflow_cpu
