// q4_0, q4_1 and q8_0 weights interleaved by 16 rows (qtypes q4_0x16, q4_1x16, q8_0x16), and
// their product with rows of x: the layout a quantized matvec reads at memory speed. In the
// plain layout (quant_blocks.h) each 32-weight block of one row is a short dot product reduced
// across lanes; here one vector lane is one row, so a block of 16 rows is eight 4-byte dot
// products per lane and one scale per lane, and nothing is reduced across lanes.
//
// packed [N, row_bytes] holds as many bytes as the plain layout. The first N - N % 16 rows form
// groups of 16 rows, each group's 16 row_bytes contiguous, block after block; block b of a
// group is
//
//     64-byte chunks   codes: chunk c holds, row by row, bytes 4c..4c+3 of the row's code
//                      bytes (q4: 4 chunks of the 16 nibble bytes, weights 4c..4c+3 in the
//                      low nibbles and 16+4c..19+4c in the high; q8_0: 8 chunks of the 32
//                      int8 codes)
//     32 bytes         the 16 rows' d (fp16)
//     32 bytes         the 16 rows' m (fp16; q4_1 only, q4_0's is -8 d)
//
// and the last N % 16 rows follow in the plain layout (run by quant_blocks.h's kernel).
// kernels/quant_formats.py `interleave_rows` makes this layout from the plain one.
//
// Each output element is one row against one row of x, accumulated block by block in K order
// in that row's lane:
//
//     Int8X   acc = fma(float(sum q_w q_x), d_w d_x, acc); acc = fma(m_w, s_x, acc)
//     FloatX  acc = fma(sum q_w x, d_w, acc); acc = fma(m_w, sum x, acc)
//             (sum q_w x in fp32, in one fixed order; sum x per block of x, computed once)
//
// (q8_0 has no m, and no second fma.)
//
// i.e. the dequantized weight w = d q + m, factored. Nothing in that order depends on M or on
// the vector width, so a row of x gets the same bits in any batch (as quant_blocks.h) and on
// every ISA.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_int8.h"
#include "quant_blocks.h"
#include "row_lanes.h"

namespace radixflow_cpu::blocks {

constexpr int kGroupRows = rows16::kRows;

// Rows of x in fp32 with the sum of each block of 32 (row stride k, k / 32).
struct SummedX {
  const float* x;
  const float* s;
  int64_t k;

  SummedX from(int64_t row) const { return {x + row * k, s + row * (k / kBlock), k}; }
};

template <typename Fmt, int M, typename X>
void group_rows(const uint8_t* group, int64_t blocks, const X& x, float* sums);

// The interleaved formats: the plain block format, where a group block's parts lie, and the
// product of one group with M rows of x (`group`: sums[m * 16 + r], `blocks` blocks of 32 per
// row). Rows past the last group are `Plain` blocks (kPlainTail; interleaved_kquants.h's formats
// leave them to their caller).
template <bool kHasMin_>
struct Q4Rows {
  using Plain = Q4<kHasMin_>;
  static constexpr bool kNibbles = true, kHasOffset = true, kHasMin = kHasMin_;
  static constexpr bool kPlainTail = true;
  // for AMX tiles (amx_int8.h: tile_unit): codes unsigned; the offset term adds m s_x (not
  // -m s_x)
  static constexpr bool kSignedCodes = false, kNegatedOffset = false;
  static constexpr int kTileValues = kBlock, kCodeBytes = 256;  // then the d, then (q4_1) the m
  // rows of x from which tiles beat the vector kernel (docs/benchmarks.md): a group's operands
  // are made once for all of them, and a nibble format's fp32 steps dominate both (q8_0 and
  // q6_k from 16 rows)
  static constexpr int64_t kTiledFromRows = 64;
  static rows16::Floats offsets(const uint8_t* block, rows16::Floats d) {
    return kHasMin_ ? rows16::halves(block + kCodeBytes + 32)
                    : rows16::mul(d, rows16::splat(-8.0f));
  }
  template <int M, typename X>
  static void group(const uint8_t* g, int64_t blocks, const X& x, float* sums) {
    group_rows<Q4Rows, M, X>(g, blocks, x, sums);
  }
  // Block b of a group as AMX tiles read it (amx_int8.h), and where it lies in a row of x:
  // chunk c's low nibbles are codes 4c..4c+3 of each row, its high ones 16 + 4c..19 + 4c;
  // scale d, offset m (group_rows' terms).
  static int64_t tile_unit(const uint8_t* group, int64_t b, uint8_t* operand,
                           rows16::Floats* scale, rows16::Floats* offset) {
    using namespace rows16;
    const uint8_t* block = group + b * kGroupRows * Plain::kBytes;
    for (int c = 0; c < 4; ++c) {
      const Codes codes = load_codes(block + 64 * c);
      store_codes(operand + 64 * c, low(codes));
      store_codes(operand + 64 * (4 + c), high(codes));
    }
    *scale = halves(block + kCodeBytes);
    *offset = offsets(block, *scale);
    return b * kBlock;
  }
};

struct Q8Rows {
  using Plain = Q8;
  static constexpr bool kNibbles = false, kHasOffset = false, kPlainTail = true;
  static constexpr bool kSignedCodes = true, kNegatedOffset = false;
  static constexpr int kTileValues = kBlock, kCodeBytes = 512;
  static constexpr int64_t kTiledFromRows = 16;
  template <int M, typename X>
  static void group(const uint8_t* g, int64_t blocks, const X& x, float* sums) {
    group_rows<Q8Rows, M, X>(g, blocks, x, sums);
  }
  // Block b of a group as AMX tiles read it: its 8 chunks are the operand as they lie; scale d.
  static int64_t tile_unit(const uint8_t* group, int64_t b, uint8_t* operand,
                           rows16::Floats* scale, rows16::Floats*) {
    const uint8_t* block = group + b * kGroupRows * Plain::kBytes;
    std::memcpy(operand, block, kCodeBytes);
    *scale = rows16::halves(block + kCodeBytes);
    return b * kBlock;
  }
};

// One block of 16 rows against M rows of x: dots[m], lane r = row r's codes times row m of x
// over the block, in units of x's block scale (units[m]: Int8X's d, 1 for fp32 x).
template <typename Fmt, int M>
[[gnu::always_inline]] inline void block_dots(const uint8_t* block, int64_t b, int64_t blocks,
                                              const Int8X& x, rows16::Floats* dots,
                                              float* units) {
  using namespace rows16;
  Ints sums[M];
  for (int m = 0; m < M; ++m) sums[m] = zero_ints();
  for (int c = 0; c < Fmt::kCodeBytes / 64; ++c) {
    const Codes codes = load_codes(block + 64 * c);
    for (int m = 0; m < M; ++m) {
      const int8_t* xq = x.q + m * x.k + b * kBlock + 4 * c;
      if constexpr (Fmt::kNibbles) {
        sums[m] = dot4(dot4(sums[m], low(codes), load_x4(xq)), high(codes), load_x4(xq + 16));
      } else {
        sums[m] = dot4_signed(sums[m], codes, load_x4(xq));
      }
    }
  }
  for (int m = 0; m < M; ++m) {
    dots[m] = to_floats(sums[m]);
    units[m] = x.d[m * blocks + b];
  }
}

template <typename Fmt, int M>
[[gnu::always_inline]] inline void block_dots(const uint8_t* block, int64_t b, int64_t,
                                              const SummedX& x, rows16::Floats* dots,
                                              float* units) {
  using namespace rows16;
  for (int m = 0; m < M; ++m) {
    dots[m] = zero_floats();
    units[m] = 1.0f;
  }
  for (int c = 0; c < Fmt::kCodeBytes / 64; ++c) {
    const Codes codes = load_codes(block + 64 * c);
    for (int i = 0; i < 4; ++i) {
      if constexpr (Fmt::kNibbles) {
        const Floats wlo = code_floats(low(codes), i), whi = code_floats(high(codes), i);
        for (int m = 0; m < M; ++m) {
          const float* xb = x.x + m * x.k + b * kBlock + 4 * c + i;
          dots[m] = fma(whi, splat(xb[16]), fma(wlo, splat(xb[0]), dots[m]));
        }
      } else {
        const Floats w = signed_floats(codes, i);
        for (int m = 0; m < M; ++m)
          dots[m] = fma(w, splat(x.x[m * x.k + b * kBlock + 4 * c + i]), dots[m]);
      }
    }
  }
}

// One group of 16 rows against M rows of x: sums[m * 16 + r].
template <typename Fmt, int M, typename X>
void group_rows(const uint8_t* group, int64_t blocks, const X& x, float* sums) {
  using namespace rows16;
  constexpr int kBytes = kGroupRows * Fmt::Plain::kBytes;
  Floats acc[M];
  for (int m = 0; m < M; ++m) acc[m] = zero_floats();
  const uint8_t* block = group;
  for (int64_t b = 0; b < blocks; ++b, block += kBytes) {
    Floats dots[M];
    float units[M];
    block_dots<Fmt, M>(block, b, blocks, x, dots, units);
    const Floats d = halves(block + Fmt::kCodeBytes);
    for (int m = 0; m < M; ++m) acc[m] = fma(dots[m], mul(d, splat(units[m])), acc[m]);
    if constexpr (Fmt::kHasOffset) {
      const Floats offset = Fmt::offsets(block, d);
      for (int m = 0; m < M; ++m) acc[m] = fma(offset, splat(x.s[m * blocks + b]), acc[m]);
    }
  }
  for (int m = 0; m < M; ++m) store(sums + m * kGroupRows, acc[m]);
}

template <typename X>
using GroupFn = void (*)(const uint8_t*, int64_t, const X&, float*);

template <typename Fmt, typename X>
GroupFn<X> group_fn(int64_t m) {
  switch (m) {
    case 1: return &Fmt::template group<1, X>;
    case 2: return &Fmt::template group<2, X>;
    case 3: return &Fmt::template group<3, X>;
    case 4: return &Fmt::template group<4, X>;
    case 5: return &Fmt::template group<5, X>;
    case 6: return &Fmt::template group<6, X>;
    case 7: return &Fmt::template group<7, X>;
    default: return &Fmt::template group<kTileRows, X>;
  }
}

constexpr int kTileMultiplyRows = 16;  // rows of x per AMX tile multiply

// Whether rows of x of type X run on AMX tiles (amx_int8.h) here: int8 x, a build with AMX and
// a process granted the tiles.
template <typename X>
bool on_tiles() {
#if defined(RADIXFLOW_AMX_INT8)
  if constexpr (std::is_same_v<X, Int8X>) return amx::usable();
#endif
  return false;
}

// y [M, N] (row stride ldy) = x [M, K] W^T (+ bias), W interleaved (above), x a FloatX or an
// Int8X: threaded over groups, each group running every tile of x while its blocks are in L1.
// With AMX (`on_tiles`) and Fmt::kTiledFromRows or more, int8 x runs 16 rows per tile multiply,
// the rows past the last 16 on the vector kernel (the same bits either way).
template <typename Fmt, typename X, typename Out>
void interleaved_matmul(const Packed& p, const X& x, int64_t m, const Out* bias, Out* y,
                        int64_t ldy) {
  const int64_t blocks = p.k / kBlock, groups = p.n / kGroupRows;
  if constexpr (Fmt::kPlainTail) {
    const int64_t plain = groups * kGroupRows;
    if (plain < p.n) {
      const Packed rest{p.w + plain * p.row_bytes, p.n - plain, p.k, p.row_bytes};
      packed_matmul<typename Fmt::Plain>(rest, x, m, bias ? bias + plain : nullptr, y + plain,
                                         ldy);
    }
  }
  if (groups == 0) return;
  std::vector<float> block_sums;
  const auto lanes = [&]() {
    if constexpr (std::is_same_v<X, FloatX>) {
      block_sums.resize(m * blocks);
      for (int64_t i = 0; i < m * blocks; ++i) {
        float s = 0.0f;
        for (int j = 0; j < kBlock; ++j) s += x.x[i * kBlock + j];
        block_sums[i] = s;
      }
      return SummedX{x.x, block_sums.data(), x.k};
    } else {
      return x;
    }
  }();
  using Lanes = decltype(lanes);
  const bool tiles_here = m >= Fmt::kTiledFromRows && on_tiles<X>();
  const int64_t tiled = tiles_here ? m / kTileMultiplyRows * kTileMultiplyRows : 0;
  const int64_t full = (m - tiled) / kTileRows, rest = (m - tiled) % kTileRows;
  const int64_t tiles = tiled / kTileMultiplyRows + full + (rest > 0);
  const GroupFn<Lanes> whole = group_fn<Fmt, Lanes>(kTileRows);
  const GroupFn<Lanes> part = group_fn<Fmt, Lanes>(rest);
  const int64_t group_bytes = kGroupRows * p.row_bytes;
  // about 16 KiB of weights per task for one tile, less for more, as packed_matmul
  const int64_t grain = std::max<int64_t>(1, 16384 / (group_bytes * tiles));
  parallel_chunks((groups + grain - 1) / grain, [&](int64_t chunk) {
    float sums[kTileRows * kGroupRows];
    const auto emit = [&](const float* from, int64_t row0, int64_t rows, int64_t n0) {
      for (int64_t i = 0; i < rows; ++i) {
        Out* out = y + (row0 + i) * ldy + n0;
        for (int r = 0; r < kGroupRows; ++r) {
          const float b = bias ? static_cast<float>(bias[n0 + r]) : 0.0f;
          out[r] = Out(from[i * kGroupRows + r] + b);
        }
      }
    };
    const int64_t end = std::min(groups, (chunk + 1) * grain);
#if defined(RADIXFLOW_AMX_INT8)
    if constexpr (std::is_same_v<X, Int8X>) {
      if (tiled > 0) {
        // per group: passes of its units, each read by every 16 rows of x into their sums
        const amx::TileScope<Fmt::kTileValues> scope;
        amx::GroupOperands<Fmt> ops;
        std::vector<float> acc(tiled * kGroupRows);
        const int64_t units = blocks * kBlock / Fmt::kTileValues;
        for (int64_t g = chunk * grain; g < end; ++g) {
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t u = 0; u < units; u += amx::kPassUnits) {
            ops.load(p.w + g * group_bytes, u, std::min<int64_t>(amx::kPassUnits, units - u));
            for (int64_t row0 = 0; row0 < tiled; row0 += kTileMultiplyRows)
              amx::accumulate<Fmt>(ops, blocks, lanes.from(row0), acc.data() + row0 * kGroupRows);
          }
          emit(acc.data(), 0, tiled, g * kGroupRows);
        }
      }
    }
#endif
    for (int64_t g = chunk * grain; g < end && tiled < m; ++g) {
      for (int64_t t = 0; t < full + (rest > 0); ++t) {
        const int64_t row0 = tiled + t * kTileRows;
        (t < full ? whole : part)(p.w + g * group_bytes, blocks, lanes.from(row0), sums);
        emit(sums, row0, t < full ? kTileRows : rest, g * kGroupRows);
      }
    }
  });
}

// Rows [begin, end) of an interleaved weight decoded to fp32 (row r at dst + (r - begin) K, as
// the plain format decodes it), for the sgemm of long prefills: each group they touch is put
// back in the file's layout in a scratch of 16 rows, then decoded row by row.
template <typename Fmt>
void dequantize_interleaved_rows(const Packed& p, int64_t begin, int64_t end, float* dst) {
  using Plain = typename Fmt::Plain;
  constexpr int kScaleBytes = Plain::kBytes - Fmt::kCodeBytes / kGroupRows;  // d (and m)
  const int64_t grouped = p.n / kGroupRows * kGroupRows, blocks = p.k / kBlock;
  std::vector<uint8_t> plain(kGroupRows * p.row_bytes);
  for (int64_t r = begin; r < end;) {
    // rows past the last group are plain already; a group is put back in a 16-row scratch
    const bool in_group = r < grouped;
    const int64_t first = in_group ? r / kGroupRows * kGroupRows : r;
    const int64_t stop = in_group ? std::min(end, first + kGroupRows) : end;
    const uint8_t* rows = in_group ? plain.data() : p.w + first * p.row_bytes;
    const uint8_t* block = p.w + first * p.row_bytes;
    for (int64_t b = 0; in_group && b < blocks; ++b, block += kGroupRows * Plain::kBytes) {
      for (int row = 0; row < kGroupRows; ++row) {
        uint8_t* out = plain.data() + row * p.row_bytes + b * Plain::kBytes;
        for (int part = 0; part < kScaleBytes / 2; ++part)  // d, then m
          std::memcpy(out + 2 * part, block + Fmt::kCodeBytes + 32 * part + 2 * row, 2);
        for (int c = 0; c < Fmt::kCodeBytes / 64; ++c)
          std::memcpy(out + kScaleBytes + 4 * c, block + 64 * c + 4 * row, 4);
      }
    }
    for (; r < stop; ++r)
      dequantize_row<Plain>(rows + (r - first) * p.row_bytes, p.k, dst + (r - begin) * p.k);
  }
}

// The two layouts behind one interface: matmul(p, x, m, bias, y, ldy) and decode_rows(p, begin,
// end, dst), for quant_linear.cpp and decode_layer.cpp.
template <typename Fmt>
struct Plain {
  template <typename X, typename Out>
  static void matmul(const Packed& p, const X& x, int64_t m, const Out* bias, Out* y,
                     int64_t ldy) {
    packed_matmul<Fmt>(p, x, m, bias, y, ldy);
  }
  static void decode_rows(const Packed& p, int64_t begin, int64_t end, float* dst) {
    for (int64_t r = begin; r < end; ++r)
      dequantize_row<Fmt>(p.w + r * p.row_bytes, p.k, dst + (r - begin) * p.k);
  }
};

template <typename Fmt>
struct Interleaved {
  template <typename X, typename Out>
  static void matmul(const Packed& p, const X& x, int64_t m, const Out* bias, Out* y,
                     int64_t ldy) {
    interleaved_matmul<Fmt>(p, x, m, bias, y, ldy);
  }
  static void decode_rows(const Packed& p, int64_t begin, int64_t end, float* dst) {
    dequantize_interleaved_rows<Fmt>(p, begin, end, dst);
  }
};

}  // namespace radixflow_cpu::blocks
