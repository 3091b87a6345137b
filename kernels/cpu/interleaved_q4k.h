// q4_k weights interleaved by 16 rows (qtype q4_kx16): interleaved_blocks.h's layout and matmul
// for ggml's 256-weight super-blocks, whose plain kernel (quant_linear.cpp's K-quant matvec)
// decodes every block to a scratch and runs at a third of the interleaved formats' speed.
//
// A plain q4_k super-block (144 bytes): fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) pairs
// for its 8 sub-blocks of 32 weights, 128 bytes of nibbles (bytes 32j..32j+31: sub-block 2j in
// the low nibbles, 2j + 1 in the high); w = d scale q - dmin min. A group of 16 rows holds, super-
// block after super-block (16 x 144 bytes each, as many bytes as the plain rows):
//
//     2048 bytes   codes: 32 chunks of 64 bytes, chunk c holding, row by row, bytes 4c..4c+3
//                  of the row's 128 nibble bytes
//     32 + 32      the 16 rows' d, then their dmin (fp16)
//     192 bytes    the rows' 12 scale bytes: 3 chunks of 64, 4 bytes per row
//
// kernels/quant_formats.py `interleave_rows` makes it; `move_q4k_row` below moves one row of a
// super-block between the layouts. Rows past the last whole group are the caller's: they are
// plain q4_k (quant_linear.cpp runs them as one zero-padded group).
//
// Each output element is one row against one row of x, accumulated in its lane sub-block by
// sub-block in K order, with the (scale, min) pairs decoded for 16 rows at once:
//
//     Int8X   acc = fma(float(sum q_w q_x), d scale d_x, acc); acc = fma(dmin min, -s_x, acc)
//     FloatX  acc = fma(sum q_w x, d scale, acc);               acc = fma(dmin min, -sum x, acc)
//
// so a row of x gets the same bits in any batch and on every ISA, as interleaved_blocks.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "interleaved_blocks.h"

namespace radixflow_cpu::blocks {

struct Q4KRows {
  static constexpr bool kPlainTail = false;
  static constexpr int kSubBlocks = 8;     // blocks of 32 per super-block
  static constexpr int kPlainBytes = 144;  // one row's super-block
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
      for (int m = 0; m < M; ++m) sums[m] = dot4(sums[m], codes, load_x4(x.q + m * x.k + at + 4 * i));
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
        for (int m = 0; m < M; ++m) dots[m] = fma(w, splat(x.x[m * x.k + at + 4 * i + e]), dots[m]);
      }
    }
  }

  static float x_unit(const Int8X& x, int64_t i) { return x.d[i]; }
  static float x_unit(const SummedX&, int64_t) { return 1.0f; }

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
};

// Row `row` of one group super-block <-> that row's plain super-block (kToPlain: group ->
// plain; else plain -> group).
template <bool kToPlain>
inline void move_q4k_row(std::conditional_t<kToPlain, const uint8_t*, uint8_t*> group_block,
                         std::conditional_t<kToPlain, uint8_t*, const uint8_t*> plain, int row) {
  const auto move = [&](int at, int from, int bytes) {
    if constexpr (kToPlain) {
      std::memcpy(plain + from, group_block + at, bytes);
    } else {
      std::memcpy(group_block + at, plain + from, bytes);
    }
  };
  move(Q4KRows::kD + 2 * row, 0, 2);
  move(Q4KRows::kDmin + 2 * row, 2, 2);
  for (int c = 0; c < 3; ++c) move(Q4KRows::kScales + 64 * c + 4 * row, 4 + 4 * c, 4);
  for (int c = 0; c < 32; ++c) move(Q4KRows::kCodes + 64 * c + 4 * row, 16 + 4 * c, 4);
}

}  // namespace radixflow_cpu::blocks
