// AMX int8 tiles (Intel Sapphire Rapids on) for the int8-activation matmul of weights
// interleaved by 16 rows (q4_0x16, q4_1x16, q8_0x16: interleaved_blocks.h; q4_kx16, q6_kx16:
// interleaved_kquants.h), in namespace radixflow_cpu::amx. Compiled where the build has
// AMX-TILE and AMX-INT8 (cpu_build.py adds them where the CPU reports both); used where Linux
// grants the process the tile state.
//
//     usable()                       whether tiles can run here (asked of the kernel once)
//     TileScope<V>                   this thread's tile configuration for units of V values
//     GroupOperands<Fmt>             up to kPassUnits of a group's units as tiles read them
//                                    (Fmt::tile_unit)
//     accumulate<Fmt>(ops, b, x, s)  16 rows of x against them, added to sums[m * 16 + r]
//
// A format's tile units are the runs of kTileValues (32, or q6_k's 16) values that its vector
// kernel scales one at a time, in the order it adds them up. One tile multiply per unit gives
// the 16 x 16 exact int32 dot products of 16 rows of x (A: their int8 values, read in place)
// with the group's 16 rows of codes (B: kTileValues / 4 rows of 64 bytes, four codes of each
// weight row per tile row, which is the order the interleaved layouts store them in, nibbles
// split). Every int32 sum equals the one the vector kernel computes, and the fp32 steps after
// it are the same operations in the same order on the same scale lanes (`Fmt::tile_unit` makes
// them as the format's `group` does), so a row of x gets the same bits on either path, in any
// batch.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && \
    defined(__AVX512BW__)
#define RADIXFLOW_AMX_INT8 1

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "row_lanes.h"

namespace radixflow_cpu::amx {

constexpr int kRows = 16;         // rows of x per tile multiply, and weight rows per group
constexpr int kBlockValues = 32;  // values per scale of x (its d and s)
constexpr int kPassUnits = 16;    // units of a group taken at once (GroupOperands)

// Linux gives a process the AMX tile state only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM
// for XFEATURE_XTILEDATA); a kernel that refuses leaves the vector kernels in use.
inline bool usable() {
  static const bool granted = [] {
    constexpr long kRequestPermission = 0x1023;
    constexpr long kTileData = 18;
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return granted;
}

// Tile registers, two sets so that one unit's multiply runs while the vector units scale the
// one before: 0 and 3 the int32 sums C (16 x 16), 1 and 4 the rows of x A (16 x V bytes), 2
// and 5 the codes B (V / 4 x 64 bytes). The configuration is per thread; released with the
// scope.
template <int V>
struct TileScope {
  TileScope() {
    alignas(64) uint8_t config[64] = {};
    config[0] = 1;  // palette 1
    const uint16_t bytes[6] = {64, V, 64, 64, V, 64};
    const uint8_t rows[6] = {kRows, kRows, V / 4, kRows, kRows, V / 4};
    std::memcpy(config + 16, bytes, sizeof bytes);
    std::memcpy(config + 48, rows, sizeof rows);
    _tile_loadconfig(config);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// Units [first, first + count) of a group (a pass: `kPassUnits` at most), as tiles read them:
// each unit's B operand, its scale and offset lanes, and where its values lie in a row of x.
// A pass's operands (8 KiB for units of 32) stay in L1 while every 16 rows of x read them.
template <typename Fmt>
struct GroupOperands {
  static constexpr int kUnitBytes = Fmt::kTileValues * kRows;
  alignas(64) uint8_t operands[kPassUnits * kUnitBytes];
  rows16::Floats scales[kPassUnits], offsets[kPassUnits];
  int64_t at[kPassUnits];  // the unit's first value in a row of x
  int count = 0;

  void load(const uint8_t* group, int64_t first, int units) {
    count = units;
    for (int u = 0; u < units; ++u)
      at[u] = Fmt::tile_unit(group, first + u, operand(u), &scales[u], &offsets[u]);
  }
  uint8_t* operand(int u) { return operands + u * kUnitBytes; }
  const uint8_t* operand(int u) const { return operands + u * kUnitBytes; }
};

// Unit u's int32 dot products into `dots` (16 x 16) on tile set (C, A, B): multiply_0 on
// tiles 0-2, multiply_3 on 3-5 (GCC's tile intrinsics take the numbers as literals).
#define RADIXFLOW_AMX_MULTIPLY(C, A, B)                                                    \
  template <typename Fmt, typename X>                                                      \
  [[gnu::always_inline]] inline void multiply_##C(const GroupOperands<Fmt>& ops, const X& x, \
                                                  int u, int32_t* dots) {                 \
    _tile_zero(C);                                                                         \
    _tile_loadd(A, x.q + ops.at[u], x.k);                                                  \
    _tile_loadd(B, ops.operand(u), 64);                                                    \
    if constexpr (Fmt::kSignedCodes) {                                                     \
      _tile_dpbssd(C, A, B);                                                               \
    } else {                                                                               \
      _tile_dpbsud(C, A, B); /* signed x, unsigned codes */                                \
    }                                                                                      \
    _tile_stored(C, dots, 64);                                                             \
  }
RADIXFLOW_AMX_MULTIPLY(0, 1, 2)
RADIXFLOW_AMX_MULTIPLY(3, 4, 5)
#undef RADIXFLOW_AMX_MULTIPLY

// 16 rows of x (X: blocks::Int8X, from its first row; `blocks` of 32 per row) against the
// units of one pass (`ops`, loaded), added to sums[m * 16 + r] (row m of x, weight row r; zero
// before a group's first pass). Needs a TileScope<Fmt::kTileValues> on this thread.
template <typename Fmt, typename X>
void accumulate(const GroupOperands<Fmt>& ops, int64_t blocks, const X& x, float* sums) {
  using namespace rows16;
  alignas(64) int32_t dots[2][kRows * kRows];
  Floats acc[kRows];
  for (int m = 0; m < kRows; ++m) acc[m] = Floats{_mm512_loadu_ps(sums + m * kRows)};
  // the vector kernel's steps: acc = fma(dot, scale d_x, acc); acc = fma(offset, ±s_x, acc)
  const auto scale = [&](int u, const int32_t* unit_dots) {
    const Floats d = ops.scales[u];
    const int64_t b = ops.at[u] / kBlockValues;
#pragma GCC unroll 16
    for (int m = 0; m < kRows; ++m) {
      const Floats dot = to_floats(Ints{_mm512_load_si512(unit_dots + m * kRows)});
      acc[m] = fma(dot, mul(d, splat(x.d[m * blocks + b])), acc[m]);
    }
    if constexpr (Fmt::kHasOffset) {
      const Floats offset = ops.offsets[u];
#pragma GCC unroll 16
      for (int m = 0; m < kRows; ++m) {
        const float s = x.s[m * blocks + b];
        acc[m] = fma(offset, splat(Fmt::kNegatedOffset ? -s : s), acc[m]);
      }
    }
  };
  const int units = ops.count;
  multiply_0(ops, x, 0, dots[0]);
  for (int u = 0; u < units; u += 2) {
    if (u + 1 < units) multiply_3(ops, x, u + 1, dots[1]);
    scale(u, dots[0]);
    if (u + 1 < units) {
      if (u + 2 < units) multiply_0(ops, x, u + 2, dots[0]);
      scale(u + 1, dots[1]);
    }
  }
  for (int m = 0; m < kRows; ++m) store(sums + m * kRows, acc[m]);
}

}  // namespace radixflow_cpu::amx

#endif
