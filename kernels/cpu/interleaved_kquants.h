// q4_k and q6_k weights interleaved by 16 rows (qtypes q4_kx16, q6_kx16): interleaved_blocks.h's
// layout and matmul for ggml's 256-weight super-blocks, whose plain kernel (quant_linear.cpp's
// K-quant matvec) decodes every block of one row to a scratch and runs at a third of the
// interleaved formats' speed.
//
// A group of 16 rows holds, super-block after super-block, the 16 rows' super-blocks (as many
// bytes as the plain rows) as parts, each part's bytes in chunks of `unit` bytes per row (chunk
// c of a part: row r's bytes unit c .. unit (c + 1) - 1 of it at 16 unit c + unit r):
//
//     q4_k (144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks
//          of 32, 128 nibble bytes: bytes 32j..32j+31 hold sub-block 2j in their low nibbles,
//          2j + 1 in their high; w = d scale q - dmin min)
//          parts: the 128 nibble bytes, d, dmin, the 12 pair bytes (units 4, 2, 2, 4)
//     q6_k (210 bytes: 128 bytes ql, 64 bytes qh, 16 int8 scales, fp16 d; weight 128 h + 32 i + l
//          (l < 32) has its low 4 bits in ql[64 h + 32 (i % 2) + l] (low nibble for i < 2), its
//          high 2 in bits 2i of qh[32 h + l], and scale sc[8 h + 2 i + l / 16];
//          w = d scale (q - 32))
//          parts: ql, qh, the scales, d (units 4, 4, 4, 2)
//
// kernels/quant_formats.py `interleave_rows` makes it (`_BLOCK_PARTS` lists the same parts);
// `move_row` below moves one row of a super-block between the layouts. Rows past the last whole
// group are the caller's: they are plain (quant_linear.cpp runs them as one zero-padded group).
//
// Each output element is one row against one row of x, accumulated in its lane sub-block by
// sub-block in K order, the sub-blocks' scales decoded for 16 rows at once:
//
//     q4_k  Int8X   acc = fma(float(sum q_w q_x), d scale d_x, acc); acc = fma(dmin min, -s_x, acc)
//           FloatX  acc = fma(sum q_w x, d scale, acc);               acc = fma(dmin min, -sum x, acc)
//     q6_k  (codes q - 32 as signed bytes; two sub-blocks of 16 per block of 32 of x)
//           Int8X   acc = fma(float(sum c_w q_x), d scale d_x, acc)
//           FloatX  acc = fma(sum c_w x, d scale, acc)
//
// so a row of x gets the same bits in any batch and on every ISA, as interleaved_blocks.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "interleaved_blocks.h"

namespace radixflow_cpu::blocks {

// One part of a plain super-block: its first byte, its bytes, bytes per row in each chunk.
struct Part {
  int first, bytes, unit;
};

template <typename X>
inline float x_unit(const X& x, int64_t i) {
  if constexpr (std::is_same_v<X, Int8X>) {
    return x.d[i];
  } else {
    return 1.0f;
  }
}

struct Q4KRows {
  static constexpr bool kPlainTail = false;
  static constexpr bool kHasOffset = true, kSignedCodes = false, kNegatedOffset = true;
  static constexpr int kTileValues = kBlock;  // AMX's unit (amx_int8.h): a sub-block
  static constexpr int64_t kTiledFromRows = 64;  // as Q4Rows
  static constexpr int kSubBlocks = 8;     // blocks of 32 per super-block
  static constexpr int kPlainBytes = 144;  // one row's super-block
  static constexpr Part kParts[] = {{16, 128, 4}, {0, 2, 2}, {2, 2, 2}, {4, 12, 4}};
  static constexpr int kCodes = 0, kD = 2048, kDmin = 2080, kScales = 2112;
  static constexpr int kGroupBytes = kGroupRows * kPlainBytes;

  // Scale (half 0: sub-blocks 0-3, half 1: 4-7) and min codes of a super-block, one byte per
  // sub-block in each lane's 4 bytes (ggml's get_scale_min_k4 for 16 rows at once).
  struct Pairs {
    rows16::Codes scales[2], mins[2];
    explicit Pairs(const uint8_t* block) {
      using namespace rows16;
      const Codes a = load_codes(block + kScales), b = load_codes(block + kScales + 64);
      const Codes c = load_codes(block + kScales + 128);
      scales[0] = masked(a, 0, 0x3F);
      mins[0] = masked(b, 0, 0x3F);
      scales[1] = either(low(c), masked(a, 2, 0x30));  // low 4 bits, then a's top 2
      mins[1] = either(high(c), masked(b, 2, 0x30));
    }
  };

  // Lane r: codes of sub-block `sub` of each row (chunk i: its weights 4i..4i+3) times x.
  template <int M>
  static void sub_dots(const uint8_t* block, int sub, int64_t at, const Int8X& x,
                       rows16::Floats* dots) {
    using namespace rows16;
    Ints sums[M];
    for (int m = 0; m < M; ++m) sums[m] = zero_ints();
    for (int i = 0; i < 8; ++i) {
      const Codes all = load_codes(block + kCodes + 64 * (8 * (sub / 2) + i));
      const Codes codes = sub % 2 ? high(all) : low(all);
      for (int m = 0; m < M; ++m)
        sums[m] = dot4(sums[m], codes, load_x4(x.q + m * x.k + at + 4 * i));
    }
    for (int m = 0; m < M; ++m) dots[m] = to_floats(sums[m]);
  }

  template <int M>
  static void sub_dots(const uint8_t* block, int sub, int64_t at, const SummedX& x,
                       rows16::Floats* dots) {
    using namespace rows16;
    for (int m = 0; m < M; ++m) dots[m] = zero_floats();
    for (int i = 0; i < 8; ++i) {
      const Codes all = load_codes(block + kCodes + 64 * (8 * (sub / 2) + i));
      const Codes codes = sub % 2 ? high(all) : low(all);
      for (int e = 0; e < 4; ++e) {
        const Floats w = code_floats(codes, e);
        for (int m = 0; m < M; ++m)
          dots[m] = fma(w, splat(x.x[m * x.k + at + 4 * i + e]), dots[m]);
      }
    }
  }

  template <int M, typename X>
  static void group(const uint8_t* block, int64_t blocks, const X& x, float* sums) {
    using namespace rows16;
    Floats acc[M];
    for (int m = 0; m < M; ++m) acc[m] = zero_floats();
    for (int64_t b = 0; b < blocks; b += kSubBlocks, block += kGroupBytes) {
      const Floats d = halves(block + kD), dmin = halves(block + kDmin);
      const Pairs pairs(block);
      for (int sub = 0; sub < kSubBlocks; ++sub) {
        Floats dots[M];
        sub_dots<M>(block, sub, (b + sub) * kBlock, x, dots);
        const Floats scale = mul(d, code_floats(pairs.scales[sub / 4], sub % 4));
        const Floats min = mul(dmin, code_floats(pairs.mins[sub / 4], sub % 4));
        for (int m = 0; m < M; ++m) {
          const int64_t i = m * blocks + b + sub;
          acc[m] = fma(dots[m], mul(scale, splat(x_unit(x, i))), acc[m]);
          acc[m] = fma(min, splat(-x.s[i]), acc[m]);
        }
      }
    }
    for (int m = 0; m < M; ++m) store(sums + m * kGroupRows, acc[m]);
  }

  // Block b (of 32) of a group as AMX tiles read it (amx_int8.h), and where it lies in a row
  // of x: sub-block b % 8's codes in its super-block's chunks (chunk i: codes 4i..4i+3 of each
  // row), the terms of `group`: scale d scale_sub, offset dmin min_sub (taken with -s_x).
  static int64_t tile_unit(const uint8_t* group, int64_t b, uint8_t* operand,
                           rows16::Floats* scale, rows16::Floats* offset) {
    using namespace rows16;
    const uint8_t* block = group + b / kSubBlocks * kGroupBytes;
    const int sub = b % kSubBlocks;
    for (int i = 0; i < 8; ++i) {
      const Codes all = load_codes(block + kCodes + 64 * (8 * (sub / 2) + i));
      store_codes(operand + 64 * i, sub % 2 ? high(all) : low(all));
    }
    const Pairs pairs(block);
    *scale = mul(halves(block + kD), code_floats(pairs.scales[sub / 4], sub % 4));
    *offset = mul(halves(block + kDmin), code_floats(pairs.mins[sub / 4], sub % 4));
    return b * kBlock;
  }
};

struct Q6KRows {
  static constexpr bool kPlainTail = false;
  static constexpr bool kHasOffset = false, kSignedCodes = true, kNegatedOffset = false;
  static constexpr int kTileValues = 16;  // AMX's unit (amx_int8.h): a sub-block of 16
  static constexpr int64_t kTiledFromRows = 16;
  static constexpr int kBlocks = 8;        // blocks of 32 of x per super-block
  static constexpr int kPlainBytes = 210;  // one row's super-block
  static constexpr Part kParts[] = {{0, 128, 4}, {128, 64, 4}, {192, 16, 4}, {208, 2, 2}};
  static constexpr int kLow = 0, kHigh = 2048, kScales = 3072, kD = 3328;
  static constexpr int kGroupBytes = kGroupRows * kPlainBytes;

  // Codes q - 32 (signed bytes) of weights 4c..4c+3 of column i of half h (x's block 4h + i):
  // its 4 low bits from ql, bits 2i, 2i + 1 of qh as bits 4, 5.
  static rows16::Codes codes(const uint8_t* block, int h, int i, int c) {
    using namespace rows16;
    const Codes ql = load_codes(block + kLow + 64 * (16 * h + 8 * (i % 2) + c));
    const Codes qh = load_codes(block + kHigh + 64 * (8 * h + c));
    const Codes high2 = i < 2 ? raised(qh, 4 - 2 * i, 0x30) : masked(qh, 2 * i - 4, 0x30);
    return minus(either(i < 2 ? low(ql) : high(ql), high2), 32);
  }

  // The same for all four columns: w[i] (the compiler shares the columns' loads).
  static void codes(const uint8_t* block, int h, int c, rows16::Codes* w) {
    for (int i = 0; i < 4; ++i) w[i] = codes(block, h, i, c);
  }

  // dots[i * M + m], lane r: row r's sub-block of 16 in column i of half h (weights 16 part ..
  // 16 part + 15 of x's block 4h + i) times row m of x. Up to two rows of x, the four columns
  // share each chunk's loads; more rows take the columns one at a time, so that only M sums
  // are live (4 M spill the registers: 3.5 GB/s at M = 16).
  template <int M>
  static void part_dots(const uint8_t* block, int h, int part, int64_t at, const Int8X& x,
                        rows16::Floats* dots) {
    using namespace rows16;
    const auto dot = [&](Ints& sum, const Codes& w, int m, int i, int c) {
      sum = dot4_signed(sum, w, load_x4(x.q + m * x.k + at + kBlock * i + 4 * c));
    };
    if constexpr (M <= 2) {
      Ints sums[4 * M];
      for (int j = 0; j < 4 * M; ++j) sums[j] = zero_ints();
      for (int c = 4 * part; c < 4 * part + 4; ++c) {
        Codes w[4];
        codes(block, h, c, w);
        for (int i = 0; i < 4; ++i)
          for (int m = 0; m < M; ++m) dot(sums[i * M + m], w[i], m, i, c);
      }
      for (int j = 0; j < 4 * M; ++j) dots[j] = to_floats(sums[j]);
    } else {
      for (int i = 0; i < 4; ++i) {
        Ints sums[M];
        for (int m = 0; m < M; ++m) sums[m] = zero_ints();
        for (int c = 4 * part; c < 4 * part + 4; ++c) {
          const Codes w = codes(block, h, i, c);
          for (int m = 0; m < M; ++m) dot(sums[m], w, m, i, c);
        }
        for (int m = 0; m < M; ++m) dots[i * M + m] = to_floats(sums[m]);
      }
    }
  }

  template <int M>
  static void part_dots(const uint8_t* block, int h, int part, int64_t at, const SummedX& x,
                        rows16::Floats* dots) {
    using namespace rows16;
    for (int j = 0; j < 4 * M; ++j) dots[j] = zero_floats();
    for (int c = 4 * part; c < 4 * part + 4; ++c) {
      Codes w[4];
      codes(block, h, c, w);
      for (int i = 0; i < 4; ++i) {
        for (int e = 0; e < 4; ++e) {
          const Floats wf = signed_floats(w[i], e);
          for (int m = 0; m < M; ++m)
            dots[i * M + m] =
                fma(wf, splat(x.x[m * x.k + at + kBlock * i + 4 * c + e]), dots[i * M + m]);
        }
      }
    }
  }

  template <int M, typename X>
  static void group(const uint8_t* block, int64_t blocks, const X& x, float* sums) {
    using namespace rows16;
    Floats acc[M];
    for (int m = 0; m < M; ++m) acc[m] = zero_floats();
    for (int64_t b = 0; b < blocks; b += kBlocks, block += kGroupBytes) {
      const Floats d = halves(block + kD);
      for (int h = 0; h < 2; ++h) {
        for (int part = 0; part < 2; ++part) {
          // A quarter of the next super-block: the reads below hop between three parts of
          // this one, which the hardware prefetchers do not follow from memory (1 thread:
          // 8 GB/s without, as fast as from L3 with).
          const int quarter = 2 * h + part;
          for (int at = quarter * kGroupBytes / 4; at < (quarter + 1) * kGroupBytes / 4; at += 64)
            prefetch_l1(block + kGroupBytes + at);
          Floats dots[4 * M];
          part_dots<M>(block, h, part, (b + 4 * h) * kBlock, x, dots);
          for (int i = 0; i < 4; ++i) {
            const int sub = 8 * h + 2 * i + part;  // its scale
            const Floats scale =
                mul(d, signed_floats(load_codes(block + kScales + 64 * (sub / 4)), sub % 4));
            for (int m = 0; m < M; ++m) {
              const float unit = x_unit(x, m * blocks + b + 4 * h + i);
              acc[m] = fma(dots[i * M + m], mul(scale, splat(unit)), acc[m]);
            }
          }
        }
      }
    }
    for (int m = 0; m < M; ++m) store(sums + m * kGroupRows, acc[m]);
  }

  // Unit u (of 16 weights) of a group as AMX tiles read it (amx_int8.h), in `group`'s order
  // (per super-block: half h, part, column i), and where it lies in a row of x: the codes of
  // part `part` of column i (chunks 4 part..4 part + 3), scale d scale_sub.
  static int64_t tile_unit(const uint8_t* group, int64_t u, uint8_t* operand,
                           rows16::Floats* scale, rows16::Floats*) {
    using namespace rows16;
    const uint8_t* block = group + u / 16 * kGroupBytes;
    const int h = u % 16 / 8, part = u % 8 / 4, i = u % 4;
    for (int c = 4 * part; c < 4 * part + 4; ++c)
      store_codes(operand + 64 * (c - 4 * part), codes(block, h, i, c));
    const int sub = 8 * h + 2 * i + part;
    *scale = mul(halves(block + kD),
                 signed_floats(load_codes(block + kScales + 64 * (sub / 4)), sub % 4));
    return (u / 16 * kBlocks + 4 * h + i) * kBlock + 16 * part;
  }
};

// Row `row` of one group super-block of `Rows` <-> that row's plain super-block (kToPlain:
// group -> plain; else plain -> group).
template <typename Rows, bool kToPlain>
inline void move_row(std::conditional_t<kToPlain, const uint8_t*, uint8_t*> group_block,
                     std::conditional_t<kToPlain, uint8_t*, const uint8_t*> plain, int row) {
  int at = 0;  // the part's offset in the group super-block
  for (const Part& part : Rows::kParts) {
    for (int c = 0; c < part.bytes / part.unit; ++c) {
      const int g = at + kGroupRows * part.unit * c + part.unit * row;
      const int p = part.first + part.unit * c;
      if constexpr (kToPlain) {
        std::memcpy(plain + p, group_block + g, part.unit);
      } else {
        std::memcpy(group_block + g, plain + p, part.unit);
      }
    }
    at += kGroupRows * part.bytes;
  }
}

}  // namespace radixflow_cpu::blocks
