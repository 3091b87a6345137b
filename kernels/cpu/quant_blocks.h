// The 32-weight GGUF blocks (q4_0, q4_1, q8_0) decoded in registers, and the register-blocked
// product of rows of x with rows of such blocks: one copy for quant_linear.cpp and
// decode_layer.cpp. x comes in one of two forms:
//
//     FloatX   fp32 rows: each block decoded to kBlockVecs fp32 vectors (w = d q + m, one
//              rounding as gguf's own), acc[r][m] = fma(w_r, x[m, k:k+kLanes], acc[r][m]);
//              the result is F.linear on the dequantized weight within fp32 summation error
//     Int8X    x quantized per block of 32 (QuantizedRows: d = max|x| / 127, q = round(x / d)
//              to nearest even, as llama.cpp's q8 activations): each block's int8 codes times
//              x's codes summed exactly in int32 (int8_dot.h), then
//              y += d_w d_x sum(q_w q_x) + m_w d_x sum(q_x)
//              i.e. F.linear of the dequantized weight and of x rounded to its int8 grid
//
//     x [M, K] in tiles of up to kTileRows rows; packed rows in steps of kStepRows, threaded.
//
// Every output element is one packed row against one row of x, summed in one fixed order: a
// vector of fp32 partial sums fed by every block of the row in K order, then reduced (and x's
// quantization depends on its own row only). Nothing in that order depends on M, on the tile
// a row of x falls in or on how many packed rows share a step, so a row of x gets the same bits
// in a batch of 1 or of 64, through either op (batch invariance: a request's tokens do not
// depend on its neighbours).
//
// On AVX-512 a 4-bit block's 16 possible weights d q + m are one vector (fma of 0..15 by d, m)
// and its nibbles index it with one permute per 16 weights; elsewhere the nibbles are widened
// and converted.
#pragma once

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "int8_dot.h"
#include "simd.h"
#include "work_pool.h"

namespace radixflow_cpu::blocks {

constexpr int kBlock = 32;  // weights per block of every format here
constexpr int kBlockVecs = kBlock / kLanes;

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// fp16 d, fp16 m (q4_1 only), 16 bytes of nibbles: weight j < 16 is the low nibble of byte j,
// weight j + 16 its high nibble; w = d q + m (q4_0: m = -8 d).
template <bool kHasMin>
struct Q4 {
  static constexpr int kBytes = kHasMin ? 20 : 18;
  static void decode(const uint8_t* b, Vec* w) {
    const float d = half_at(b);
    const float m = kHasMin ? half_at(b + 2) : -8.0f * d;
    const uint8_t* qs = b + (kHasMin ? 4 : 2);
#if defined(__AVX512F__)
    const Vec table = _mm512_fmadd_ps(
        _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_ps(d),
        _mm512_set1_ps(m));
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)qs));
    w[0] = _mm512_permutexvar_ps(bytes, table);  // the permute reads the low 4 bits
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
#elif defined(__AVX2__)
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    const __m256i low = _mm256_set1_epi32(0x0F);
    for (int half = 0; half < 2; ++half) {
      const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(qs + 8 * half)));
      w[half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(bytes, low)), dv, mv);
      w[2 + half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4)), dv, mv);
    }
#else
    alignas(64) float f[kBlock];
    for (int j = 0; j < 16; ++j) {
      f[j] = std::fma(static_cast<float>(qs[j] & 0x0F), d, m);
      f[j + 16] = std::fma(static_cast<float>(qs[j] >> 4), d, m);
    }
    for (int i = 0; i < kBlockVecs; ++i) w[i] = load(f + i * kLanes);
#endif
  }
  // For int8 x: the codes q (0..15), d and m (offset: read only where kHasOffset).
  static constexpr bool kHasOffset = true;
  static int8::Bytes codes(const uint8_t* b) { return int8::nibbles(b + (kHasMin ? 4 : 2)); }
  static float scale(const uint8_t* b) { return half_at(b); }
  static float offset(const uint8_t* b) { return kHasMin ? half_at(b + 2) : -8.0f * half_at(b); }
  static int8::IntSums dot(int8::Bytes q, int8::Bytes x) { return int8::dot_nonneg(q, x); }
};

// fp16 d, int8 q[32]: w = d q.
struct Q8 {
  static constexpr int kBytes = 34;
  static void decode(const uint8_t* b, Vec* w) {
    const Vec d = set1(half_at(b));
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int i = 0; i < kBlockVecs; ++i) w[i] = mul(load_i8(qs + i * kLanes), d);
  }
  static constexpr bool kHasOffset = false;
  static int8::Bytes codes(const uint8_t* b) {
    return int8::load_bytes(reinterpret_cast<const int8_t*>(b + 2));
  }
  static float scale(const uint8_t* b) { return half_at(b); }
  static int8::IntSums dot(int8::Bytes q, int8::Bytes x) { return int8::dot(q, x); }
};

// One row of K weights decoded to fp32 (for the tiled sgemm of many rows of x).
template <typename Fmt>
void dequantize_row(const uint8_t* row, int64_t k, float* dst) {
  Vec w[kBlockVecs];
  for (int64_t k0 = 0; k0 < k; k0 += kBlock, row += Fmt::kBytes) {
    Fmt::decode(row, w);
    for (int i = 0; i < kBlockVecs; ++i) store(dst + k0 + i * kLanes, w[i]);
  }
}

struct Packed {
  const uint8_t* w;  // [n, row_bytes], blocks of one format
  int64_t n, k, row_bytes;
};

// Rows of x in fp32 (row stride k).
struct FloatX {
  const float* x;
  int64_t k;

  FloatX from(int64_t row) const { return {x + row * k, k}; }
  // Packed rows per dot_rows: 4 for one row of x (independent chains), else 2 while the 2 M
  // accumulators, both rows' decoded block and x fit the registers (AVX-512: up to 8 rows).
  static constexpr int rows_per_step(int m) {
    return m == 1 ? 4 : m <= 4 || 2 * m + 2 * kBlockVecs + 1 <= kRegisters ? 2 : 1;
  }
};

// Rows of x quantized per block of 32 (QuantizedRows): codes q [rows, k], and per block d and
// s = d sum(q) [rows, k / 32].
struct Int8X {
  const int8_t* q;
  const float* d;
  const float* s;
  int64_t k;

  Int8X from(int64_t row) const {
    const int64_t blocks = k / kBlock;
    return {q + row * k, d + row * blocks, s + row * blocks, k};
  }
  // 4 packed rows for one row of x, 2 up to 4 rows (8 accumulators), else 1.
  static constexpr int rows_per_step(int m) { return m == 1 ? 4 : m <= 4 ? 2 : 1; }
};

// x [m, k] (fp32) quantized per block of 32, owned: d = max|x| / 127, q = round(x 127 / max|x|)
// to nearest even (0 for an all-zero block), s = d sum(q). kernels/quant_formats.py
// `quantize_activations` is its torch twin (q d), bit for bit.
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  int64_t k;

  QuantizedRows(const float* x, int64_t m, int64_t k_) : q(m * k_), d(m * k_ / kBlock),
                                                         s(m * k_ / kBlock), k(k_) {
    for (int64_t b = 0; b < m * k / kBlock; ++b) {
      const float* xb = x + b * kBlock;
      float amax = 0.0f;
      for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
      int sum = 0;
      for (int j = 0; j < kBlock; ++j) {
        const int code = static_cast<int>(std::nearbyint(xb[j] * inverse));
        q[b * kBlock + j] = static_cast<int8_t>(code);
        sum += code;
      }
      d[b] = amax / 127.0f;
      s[b] = d[b] * static_cast<float>(sum);
    }
  }
  Int8X view() const { return {q.data(), d.data(), s.data(), k}; }
  // The rows on their int8 grid, q d, in fp32 (for the paths that multiply in fp32).
  void dequantize(float* dst) const {
    for (size_t i = 0; i < q.size(); ++i) dst[i] = static_cast<float>(q[i]) * d[i / kBlock];
  }
};

// The packed rows after [row, row + R) are one contiguous run, and a row is too short (a few
// cache lines) for the hardware prefetcher to follow R of them at once: each block step of
// dot_rows pulls the next stretch of that run into L1, front to back, so that the next
// dot_rows finds its rows there (the default model's 30 layers of q4_1 matvecs, one thread:
// 10-11 ms without, 6 ms with; towards L2 instead, 10 ms).
class NextRows {
 public:
  NextRows(const Packed& p, int64_t row, int rows)
      : next_(reinterpret_cast<const char*>(p.w + (row + rows) * p.row_bytes)),
        lines_per_block_((rows * p.row_bytes + 64 * (p.k / kBlock) - 1) / (64 * (p.k / kBlock))) {}
  void pull(int64_t block) const {
    for (int64_t i = 0; i < lines_per_block_; ++i)
      prefetch_l1(next_ + 64 * (block * lines_per_block_ + i));
  }

 private:
  const char* next_;
  int64_t lines_per_block_;
};

// Packed rows [row, row + R) against M rows of x: sums[r * M + m]. R rows at once give R
// independent accumulator chains and share each load of x between R products.
template <typename Fmt, int M, int R>
inline void dot_rows(const Packed& p, const FloatX& x, int64_t row, float* sums) {
  Vec acc[R * M];
  for (int i = 0; i < R * M; ++i) acc[i] = zero();
  const uint8_t* block = p.w + row * p.row_bytes;
  const NextRows ahead(p, row, R);
  for (int64_t k0 = 0; k0 < p.k; k0 += kBlock, block += Fmt::kBytes) {
    ahead.pull(k0 / kBlock);
    Vec w[R][kBlockVecs];
    for (int r = 0; r < R; ++r) Fmt::decode(block + r * p.row_bytes, w[r]);
    for (int i = 0; i < kBlockVecs; ++i) {
      for (int m = 0; m < M; ++m) {
        const Vec xv = load(x.x + m * x.k + k0 + i * kLanes);
        for (int r = 0; r < R; ++r) acc[r * M + m] = fmadd(w[r][i], xv, acc[r * M + m]);
      }
    }
  }
  for (int i = 0; i < R * M; ++i) sums[i] = reduce_add(acc[i]);
}

template <typename Fmt, int M, int R>
inline void dot_rows(const Packed& p, const Int8X& x, int64_t row, float* sums) {
  int8::FloatSums acc[R * M];
  float offsets[R * M];  // sum over blocks of m_w s_x (q4_0, q4_1)
  for (int i = 0; i < R * M; ++i) {
    acc[i] = int8::zero_sums();
    offsets[i] = 0.0f;
  }
  const int64_t blocks = p.k / kBlock;
  const uint8_t* first = p.w + row * p.row_bytes;
  const NextRows ahead(p, row, R);
  for (int64_t b = 0; b < blocks; ++b) {
    ahead.pull(b);
    int8::Bytes w[R];
    float dw[R], mw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* bytes = first + r * p.row_bytes + b * Fmt::kBytes;
      w[r] = Fmt::codes(bytes);
      dw[r] = Fmt::scale(bytes);
      if constexpr (Fmt::kHasOffset) mw[r] = Fmt::offset(bytes);
    }
    for (int m = 0; m < M; ++m) {
      const int8::Bytes xq = int8::load_bytes(x.q + m * x.k + b * kBlock);
      const float dx = x.d[m * blocks + b];
      for (int r = 0; r < R; ++r) {
        acc[r * M + m] = int8::scaled_add(acc[r * M + m], Fmt::dot(w[r], xq), dw[r] * dx);
        if constexpr (Fmt::kHasOffset)
          offsets[r * M + m] = std::fma(mw[r], x.s[m * blocks + b], offsets[r * M + m]);
      }
    }
  }
  for (int i = 0; i < R * M; ++i) {
    sums[i] = int8::reduce(acc[i]) + offsets[i];
  }
}

constexpr int kTileRows = 8;  // rows of x per register tile
constexpr int kStepRows = 4;  // packed rows per unit of work; every rows_per_step divides it

// The `rows` (<= kStepRows) packed rows from n0 against a tile of M rows of x into y [M, ldy].
template <typename Fmt, int M, typename X, typename Out>
void tile(const Packed& p, const X& x, int64_t n0, int rows, const Out* bias, Out* y,
          int64_t ldy) {
  constexpr int R = X::rows_per_step(M);
  float sums[R * M];
  const auto finish = [&](int64_t n, int count) {
    for (int r = 0; r < count; ++r) {
      const float b = bias ? static_cast<float>(bias[n + r]) : 0.0f;
      for (int m = 0; m < M; ++m) y[m * ldy + n + r] = Out(sums[r * M + m] + b);
    }
  };
  if (rows == kStepRows) {
    for (int r = 0; r < kStepRows; r += R) {
      dot_rows<Fmt, M, R>(p, x, n0 + r, sums);
      finish(n0 + r, R);
    }
  } else {
    for (int r = 0; r < rows; ++r) {
      dot_rows<Fmt, M, 1>(p, x, n0 + r, sums);
      finish(n0 + r, 1);
    }
  }
}

template <typename X, typename Out>
using TileFn = void (*)(const Packed&, const X&, int64_t, int, const Out*, Out*, int64_t);

template <typename Fmt, typename X, typename Out>
TileFn<X, Out> tile_for(int64_t m) {
  switch (m) {
    case 1: return &tile<Fmt, 1, X, Out>;
    case 2: return &tile<Fmt, 2, X, Out>;
    case 3: return &tile<Fmt, 3, X, Out>;
    case 4: return &tile<Fmt, 4, X, Out>;
    case 5: return &tile<Fmt, 5, X, Out>;
    case 6: return &tile<Fmt, 6, X, Out>;
    case 7: return &tile<Fmt, 7, X, Out>;
    default: return &tile<Fmt, kTileRows, X, Out>;
  }
}

// y [M, N] (row stride ldy) = x [M, K] W^T (+ bias), W the packed rows, x a FloatX or an
// Int8X: threaded (work_pool.h) over steps of packed rows, each step running every tile of x
// while its blocks are in L1.
template <typename Fmt, typename X, typename Out>
void packed_matmul(const Packed& p, const X& x, int64_t m, const Out* bias, Out* y,
                   int64_t ldy) {
  static_assert(kTileRows == 8, "tile_for covers tiles of 1 to 8 rows");
  const int64_t full = m / kTileRows, rest = m % kTileRows, tiles = full + (rest > 0);
  const TileFn<X, Out> whole = tile_for<Fmt, X, Out>(kTileRows);
  const TileFn<X, Out> part = tile_for<Fmt, X, Out>(rest);
  const int64_t steps = (p.n + kStepRows - 1) / kStepRows;
  // about 16 KiB of packed rows per task for one tile, less for more: the fork costs little
  const int64_t grain = std::max<int64_t>(1, 16384 / (kStepRows * p.row_bytes * tiles));
  parallel_chunks((steps + grain - 1) / grain, [&](int64_t chunk) {
    const int64_t begin = chunk * grain, end = std::min(steps, begin + grain);
    for (int64_t step = begin; step < end; ++step) {
      const int64_t n0 = step * kStepRows;
      const int rows = static_cast<int>(std::min<int64_t>(kStepRows, p.n - n0));
      for (int64_t t = 0; t < tiles; ++t) {
        const TileFn<X, Out> run = t < full ? whole : part;
        run(p, x.from(t * kTileRows), n0, rows, bias, y + t * kTileRows * ldy, ldy);
      }
    }
  });
}

}  // namespace radixflow_cpu::blocks
