// y = x @ W^T (+ bias) where W [N, K] stays packed as GGUF blocks (q8_0, q4_0, q4_1, q4_k, q6_k),
// one row of blocks per output feature, byte for byte as in the file, or (q8_0x16, q4_0x16,
// q4_1x16, q4_kx16, q6_kx16) the same blocks interleaved by 16 rows (interleaved_blocks.h,
// interleaved_kquants.h).
//
//     q4_0 q4_1 q8_0, M <= 128  quant_blocks.h's packed_matmul: blocks decoded in registers,
//     (any M with int8 x)
//                               tiles of 8 rows of x; batch invariant (each output's sum in one
//                               order whatever M), the same kernel as decode_layer.cpp's; with
//                               int8_activations x is first quantized per block of 32 and the
//                               blocks multiplied in int8 (llama.cpp's q8 activations); the
//                               other paths then multiply x rounded to that grid in fp32
//     q?_?x16, M as above       interleaved_blocks.h's interleaved_matmul: one row per vector
//                               lane, the same tiles, batch invariant, x in fp32 or int8
//                               (q4_kx16, q6_kx16: their rows past the last group as one
//                               zero-padded group); int8 x from 64 rows on AMX tiles where the
//                               CPU has AMX-INT8 (amx_int8.h: the same bits)
//     q4_k q6_k, M <= 8         each 256-weight block decoded to int8 q, a scale s and an
//                               offset o per 16 weights (w = s q + o, as ggml) in an L1 scratch,
//                               then acc[r][m] = fma(w_r, x[m, k:k+kLanes], acc[r][m])
//     more rows of fp32 x       a tile of rows that fits L2 decoded to fp32, one sgemm per tile
//     (prefill)                 (int8 x stays on the blocked kernels above: 2-2.6x the sgemm
//                               for q4_kx16 and q4_1x16, on par for q6_kx16)
//
// The weights are exact in fp32 (gguf's own dequantize, up to one rounding of s q + o, which is
// fused here); sums are fp32, so the result is F.linear on the dequantized weight (and on x's
// int8 grid with int8_activations) within fp32 summation-order error, rounded once to x's dtype.
// The vectors are simd.h's for the ISA this file is compiled for.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "interleaved_kquants.h"

namespace {

namespace vec = radixflow_cpu;
namespace blocks = radixflow_cpu::blocks;
using blocks::half_at;
using vec::Vec;

// -- K-quant block decoders: bytes -> q, and s, o per group of 16 ----------------------------

constexpr int kGroup = 16;
constexpr int kMaxRows = 8;  // K-quants: rows of x taken by the matvec; more go to the sgemm
// q4_0, q4_1, q8_0: rows of x taken by blocks::packed_matmul, which is batch invariant: every
// decode batch up to the default max_running_requests (measured faster than the sgemm there,
// docs/benchmarks.md)
constexpr int64_t kMaxBlockedRows = 128;  // with x in fp32; with x in int8 every M (below)
constexpr int64_t kSlabBytes = 1 << 20;

// fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks of 32, then 128
// bytes: each 32-byte run holds sub-block 2j in its low and 2j + 1 in its high nibbles.
// w = d * scale * q - dmin * min.
struct Q4_K {
  static constexpr int QK = 256, kBytes = 144;
  static void scale_min(const uint8_t* sc, int j, int& scale, int& min) {
    if (j < 4) {
      scale = sc[j] & 63;
      min = sc[j + 4] & 63;
    } else {
      scale = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
      min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
  }
  static void decode(const uint8_t* b, int8_t* q, float* s, float* o) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* sc = b + 4;
    const uint8_t* qs = b + 16;
    for (int j = 0; j < 4; ++j, qs += 32) {
      for (int l = 0; l < 32; ++l) {
        q[64 * j + l] = static_cast<int8_t>(qs[l] & 0x0F);
        q[64 * j + 32 + l] = static_cast<int8_t>(qs[l] >> 4);
      }
      for (int half = 0; half < 2; ++half) {
        int scale, min;
        scale_min(sc, 2 * j + half, scale, min);
        const int g = 4 * j + 2 * half;  // two groups of 16 per sub-block
        s[g] = s[g + 1] = d * static_cast<float>(scale);
        o[g] = o[g + 1] = -dmin * static_cast<float>(min);
      }
    }
  }
};

// 128 bytes of low nibbles ql, 64 bytes of high 2-bit pairs qh, 16 int8 scales (one per 16
// weights), fp16 d: w = d * scale * (q - 32). Each half of 128 weights takes 64 bytes of ql and
// 32 of qh; within it, weight l + 32 i (i < 4) takes nibble i / 2 of ql[l + 32 (i % 2)] and bits
// 2i of qh[l].
struct Q6_K {
  static constexpr int QK = 256, kBytes = 210;
  static void decode(const uint8_t* b, int8_t* q, float* s, float* o) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_at(b + 208);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, q += 128) {
      for (int l = 0; l < 32; ++l) {
        q[l] = static_cast<int8_t>(((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32);
        q[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32);
        q[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        q[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    for (int g = 0; g < 16; ++g) {
      s[g] = d * static_cast<float>(sc[g]);
      o[g] = 0.0f;
    }
  }
};

// One decoded block: 16 bytes of slack so that a vector load past the last q stays in bounds.
template <typename Fmt>
struct Scratch {
  alignas(64) int8_t q[Fmt::QK + 16];
  float s[Fmt::QK / kGroup], o[Fmt::QK / kGroup];

  void decode(const uint8_t* bytes) { Fmt::decode(bytes, q, s, o); }
  // The fp32 weights [i, i + kLanes) of the decoded block.
  Vec at(int i) const {
    const int g = i / kGroup;
    return vec::fmadd(vec::load_i8(q + i), vec::set1(s[g]), vec::set1(o[g]));
  }
};

// -- K-quant decode: M <= 8 rows of x against each packed row ---------------------------------

struct Problem {
  const float* x;  // [M, K] fp32, contiguous
  const uint8_t* w;  // [N, row_bytes]
  int64_t m, n, k, row_bytes;
};

// Packed rows [row, row + R) against the M rows of x: sums[r * M + m]. R rows at once share
// each load of x between R FMAs.
template <typename Fmt, int M, int R>
void dot_rows(const Problem& p, int64_t row, float* sums) {
  Vec acc[R * M];
  for (int i = 0; i < R * M; ++i) acc[i] = vec::zero();
  Scratch<Fmt> t[R];
  const uint8_t* block = p.w + row * p.row_bytes;
  for (int64_t k0 = 0; k0 < p.k; k0 += Fmt::QK, block += Fmt::kBytes) {
    for (int r = 0; r < R; ++r) t[r].decode(block + r * p.row_bytes);
    for (int i = 0; i < Fmt::QK; i += vec::kLanes) {
      Vec w[R];
      for (int r = 0; r < R; ++r) w[r] = t[r].at(i);
      const float* x = p.x + k0 + i;
      for (int m = 0; m < M; ++m) {
        const Vec xv = vec::load(x + m * p.k);
        for (int r = 0; r < R; ++r) acc[r * M + m] = vec::fmadd(w[r], xv, acc[r * M + m]);
      }
    }
  }
  for (int i = 0; i < R * M; ++i) sums[i] = vec::reduce_add(acc[i]);
}

// Two rows at a time from M = 4 on (measured: 1.2-1.4x at M = 8, slower for M = 1) while 2 M
// accumulators, two weight vectors and x fit the registers.
constexpr int rows_per_step(int m) { return m >= 4 && 2 * m + 3 <= vec::kRegisters ? 2 : 1; }

template <typename Fmt, int M, typename Out>
void matvec(const Problem& p, const Out* bias, Out* y, int64_t ldy) {
  constexpr int R = rows_per_step(M);
  const auto finish = [&](int64_t n, int rows, const float* sums) {
    for (int r = 0; r < rows; ++r) {
      const float b = bias ? static_cast<float>(bias[n + r]) : 0.0f;
      for (int m = 0; m < M; ++m) y[m * ldy + n + r] = Out(sums[r * M + m] + b);
    }
  };
  // About 32 KiB of packed rows per task: enough that the fork costs little.
  const int64_t steps = p.n / R;
  const int64_t grain = std::max<int64_t>(1, 32768 / (R * p.row_bytes));
  vec::parallel_chunks((steps + grain - 1) / grain, [&](int64_t chunk) {
    float sums[R * M];
    const int64_t end = std::min(steps, (chunk + 1) * grain);
    for (int64_t step = chunk * grain; step < end; ++step) {
      dot_rows<Fmt, M, R>(p, step * R, sums);
      finish(step * R, R, sums);
    }
  });
  for (int64_t n = steps * R; n < p.n; ++n) {
    float sums[M];
    dot_rows<Fmt, M, 1>(p, n, sums);
    finish(n, 1, sums);
  }
}

template <typename Fmt, typename Out>
void matvec_rows(const Problem& p, const Out* bias, Out* y, int64_t ldy) {
  switch (p.m) {
#define RADIXFLOW_CASE(rows) \
  case rows:                 \
    return matvec<Fmt, rows, Out>(p, bias, y, ldy);
    RADIXFLOW_CASE(1) RADIXFLOW_CASE(2) RADIXFLOW_CASE(3) RADIXFLOW_CASE(4)
    RADIXFLOW_CASE(5) RADIXFLOW_CASE(6) RADIXFLOW_CASE(7) RADIXFLOW_CASE(8)
#undef RADIXFLOW_CASE
  }
}

// -- prefill: dequantize a tile of rows to fp32, then one sgemm ------------------------------

// A K-quant row to fp32. One flat loop over each block's vectors, as in dot_rows: with a
// nested group / lane loop here, GCC 12 at -O3 for AVX2 dropped the calls to this function for
// q4_k and q6_k (the prefill tests caught it).
template <typename Fmt>
void dequantize_row(const uint8_t* row, int64_t k, float* dst) {
  Scratch<Fmt> t;
  for (int64_t k0 = 0; k0 < k; k0 += Fmt::QK, row += Fmt::kBytes) {
    t.decode(row);
    for (int i = 0; i < Fmt::QK; i += vec::kLanes) vec::store(dst + k0 + i, t.at(i));
  }
}

// Rows [begin, end) of packed weights to fp32, row r at dst + (r - begin) K.
using RowsDecoder = void (*)(const blocks::Packed& p, int64_t begin, int64_t end, float* dst);

template <typename Fmt>
void decode_rows(const blocks::Packed& p, int64_t begin, int64_t end, float* dst) {
  for (int64_t r = begin; r < end; ++r)
    dequantize_row<Fmt>(p.w + r * p.row_bytes, p.k, dst + (r - begin) * p.k);
}

// out = xf [M, K] (fp32) W^T (+ bias), W's rows decoded to fp32 a tile at a time by `decode`.
void sgemm(const at::Tensor& xf, const at::Tensor& packed, RowsDecoder decode,
           const std::optional<at::Tensor>& bias, const at::Tensor& out) {
  const int64_t n = packed.size(0), k = xf.size(1);
  const blocks::Packed p{packed.data_ptr<uint8_t>(), n, k, packed.size(1)};
  const std::optional<at::Tensor> bias_f =
      bias ? std::optional<at::Tensor>(bias->to(at::kFloat)) : std::nullopt;
  // A tile of about 1 MiB of fp32 weights: it stays in L2 while the sgemm reads it.
  const int64_t tile_rows = std::min<int64_t>(n, std::max<int64_t>(16, (1 << 20) / (4 * k)));
  const at::Tensor tile = at::empty({tile_rows, k}, xf.options());
  for (int64_t n0 = 0; n0 < n; n0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, n - n0);
    const at::Tensor wt = tile.narrow(0, 0, rows);
    float* dst = wt.data_ptr<float>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      decode(p, n0 + begin, n0 + end, dst + begin * k);
    });
    at::Tensor y = at::mm(xf, wt.t());
    if (bias_f) y.add_(bias_f->narrow(0, n0, rows));
    out.narrow(1, n0, rows).copy_(y);
  }
}

// -- K-quants interleaved by 16 rows (interleaved_kquants.h) ---------------------------------

// The q4_kx16 / q6_kx16 layout (Rows; Fmt its plain super-block), as blocks::Interleaved for the
// 32-weight formats: whole groups by interleaved_matmul; the rows past the last group (plain)
// interleaved into one zero-padded group and run by the same kernel, so that every row takes
// one path whatever M is.
template <typename Rows, typename Fmt>
struct KInterleaved {
  template <typename X, typename Out>
  static void matmul(const blocks::Packed& p, const X& x, int64_t m, const Out* bias, Out* y,
                     int64_t ldy) {
    const int64_t whole = p.n / blocks::kGroupRows * blocks::kGroupRows, rest = p.n - whole;
    blocks::interleaved_matmul<Rows>({p.w, whole, p.k, p.row_bytes}, x, m, bias, y, ldy);
    if (rest == 0) return;
    std::vector<uint8_t> group(blocks::kGroupRows * p.row_bytes, 0);  // d = 0: zero rows
    for (int64_t r = 0; r < rest; ++r)
      for (int64_t s = 0; s < p.k / Fmt::QK; ++s)
        blocks::move_row<Rows, false>(group.data() + s * Rows::kGroupBytes,
                                      p.w + (whole + r) * p.row_bytes + s * Fmt::kBytes, r);
    std::vector<Out> group_bias(blocks::kGroupRows, Out(0.0f));
    if (bias) std::copy(bias + whole, bias + p.n, group_bias.begin());
    std::vector<Out> out(m * blocks::kGroupRows);
    blocks::interleaved_matmul<Rows>({group.data(), blocks::kGroupRows, p.k, p.row_bytes}, x, m,
                                     bias ? group_bias.data() : nullptr, out.data(),
                                     blocks::kGroupRows);
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(out.data() + i * blocks::kGroupRows, rest, y + i * ldy + whole);
  }

  // Each row put back in the file's layout, then decoded as plain Fmt.
  static void decode_rows(const blocks::Packed& p, int64_t begin, int64_t end, float* dst) {
    const int64_t whole = p.n / blocks::kGroupRows * blocks::kGroupRows;
    std::vector<uint8_t> plain(p.row_bytes);
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* row = p.w + r * p.row_bytes;
      if (r < whole) {
        const uint8_t* group = p.w + r / blocks::kGroupRows * blocks::kGroupRows * p.row_bytes;
        for (int64_t s = 0; s < p.k / Fmt::QK; ++s)
          blocks::move_row<Rows, true>(group + s * Rows::kGroupBytes,
                                       plain.data() + s * Fmt::kBytes, r % blocks::kGroupRows);
        row = plain.data();
      }
      dequantize_row<Fmt>(row, p.k, dst + (r - begin) * p.k);
    }
  }
};

using Q4KInterleaved = KInterleaved<blocks::Q4KRows, Q4_K>;
using Q6KInterleaved = KInterleaved<blocks::Q6KRows, Q6_K>;

// -- the op ----------------------------------------------------------------------------------

// q4_0, q4_1, q8_0 (blocks::Q4, blocks::Q8), x in fp32 or quantized to int8 per block.
// y = x W^T (+ bias) in out's dtype; Layout is blocks::Plain<Fmt> or blocks::Interleaved<...>.
template <typename Layout, typename X>
void multiply_blocks(const X& x, int64_t m, const blocks::Packed& p,
                     const std::optional<at::Tensor>& bias, const at::Tensor& out) {
  if (out.scalar_type() == at::kFloat) {
    return Layout::matmul(p, x, m, bias ? bias->data_ptr<float>() : nullptr,
                          out.data_ptr<float>(), out.stride(0));
  }
  using BF = c10::BFloat16;
  Layout::matmul(p, x, m, bias ? bias->data_ptr<BF>() : nullptr, out.data_ptr<BF>(),
                 out.stride(0));
}

// x in fp32, contiguous; with int8_x rounded to its int8 grid (for the fp32 paths, so that every
// path of one op multiplies the same x).
at::Tensor float_rows(const at::Tensor& x, bool int8_x) {
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  if (!int8_x) return xf;
  const at::Tensor rounded = at::empty_like(xf);
  blocks::QuantizedRows(xf.data_ptr<float>(), xf.size(0), xf.size(1))
      .dequantize(rounded.data_ptr<float>());
  return rounded;
}

template <typename Layout>
void run_blocks(const at::Tensor& x, const at::Tensor& packed,
                const std::optional<at::Tensor>& bias, const at::Tensor& out, bool int8_x) {
  const int64_t m = x.size(0), k = x.size(1);
  if (m > kMaxBlockedRows && !int8_x)
    return sgemm(float_rows(x, int8_x), packed, &Layout::decode_rows, bias, out);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const blocks::Packed p{packed.data_ptr<uint8_t>(), packed.size(0), k, packed.size(1)};
  if (int8_x) {
    const blocks::QuantizedRows xq(xf.data_ptr<float>(), m, k);
    // slabs of rows whose int8 x (about kSlabBytes) stays in L2 while every weight group runs
    // over it; each row's sums are the same whatever slab it falls in
    const int64_t slab = std::max<int64_t>(blocks::kTileRows, kSlabBytes / k);
    for (int64_t m0 = 0; m0 < m; m0 += slab) {
      const int64_t rows = std::min(slab, m - m0);
      multiply_blocks<Layout>(xq.view().from(m0), rows, p, bias, out.narrow(0, m0, rows));
    }
    return;
  }
  multiply_blocks<Layout>(blocks::FloatX{xf.data_ptr<float>(), k}, m, p, bias, out);
}

// q4_k, q6_k.
template <typename Fmt>
void run_kquant(const at::Tensor& x, const at::Tensor& packed,
                const std::optional<at::Tensor>& bias, const at::Tensor& out, bool int8_x) {
  const at::Tensor xf = float_rows(x, int8_x);
  if (x.size(0) > kMaxRows) return sgemm(xf, packed, &decode_rows<Fmt>, bias, out);
  const Problem p{xf.data_ptr<float>(), packed.data_ptr<uint8_t>(), x.size(0), packed.size(0),
                  x.size(1), packed.size(1)};
  if (x.scalar_type() == at::kFloat) {
    return matvec_rows<Fmt, float>(p, bias ? bias->data_ptr<float>() : nullptr,
                                   out.data_ptr<float>(), out.stride(0));
  }
  using BF = c10::BFloat16;
  matvec_rows<Fmt, BF>(p, bias ? bias->data_ptr<BF>() : nullptr, out.data_ptr<BF>(),
                       out.stride(0));
}

void check_layout(const at::Tensor& packed, int64_t k, const std::string& qtype, int64_t block,
                  int64_t bytes) {
  TORCH_CHECK(k > 0 && k % block == 0, qtype, " needs K to be a positive multiple of ", block,
              ", got ", k);
  TORCH_CHECK(packed.size(1) == k / block * bytes, qtype, " rows of K=", k, " take ",
              k / block * bytes, " bytes, packed has ", packed.size(1));
}

void quant_linear(const at::Tensor& x, const at::Tensor& packed, const std::string& qtype,
                  int64_t k, const std::optional<at::Tensor>& bias, const at::Tensor& out,
                  bool int8_activations) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 2 && out.dim() == 2,
              "x, packed and out must be 2-D");
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu() && out.device().is_cpu(),
              "all tensors must be on the CPU");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "x must be float32 or bfloat16");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "packed must be a contiguous uint8 tensor");
  TORCH_CHECK(x.size(1) == k && x.size(0) >= 1, "x must be [M, K] with M >= 1 and K=", k);
  TORCH_CHECK(out.scalar_type() == dtype && out.size(0) == x.size(0) &&
                  out.size(1) == packed.size(0) && out.stride(1) == 1,
              "out must be [M, N] of x's dtype, contiguous in its last dim");
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == dtype && bias->dim() == 1 &&
                    bias->size(0) == packed.size(0) && bias->is_contiguous(),
                "bias must be a contiguous [N] tensor of x's dtype");
  }
#define RADIXFLOW_QTYPE(name, Layout, Fmt, block, run)         \
  if (qtype == name) {                                          \
    check_layout(packed, k, qtype, block, Fmt::kBytes);         \
    return run<Layout>(x, packed, bias, out, int8_activations); \
  }
  RADIXFLOW_QTYPE("q8_0", blocks::Plain<blocks::Q8>, blocks::Q8, blocks::kBlock, run_blocks)
  RADIXFLOW_QTYPE("q4_0", blocks::Plain<blocks::Q4<false>>, blocks::Q4<false>, blocks::kBlock,
                  run_blocks)
  RADIXFLOW_QTYPE("q4_1", blocks::Plain<blocks::Q4<true>>, blocks::Q4<true>, blocks::kBlock,
                  run_blocks)
  RADIXFLOW_QTYPE("q8_0x16", blocks::Interleaved<blocks::Q8Rows>, blocks::Q8, blocks::kBlock,
                  run_blocks)
  RADIXFLOW_QTYPE("q4_0x16", blocks::Interleaved<blocks::Q4Rows<false>>, blocks::Q4<false>,
                  blocks::kBlock, run_blocks)
  RADIXFLOW_QTYPE("q4_1x16", blocks::Interleaved<blocks::Q4Rows<true>>, blocks::Q4<true>,
                  blocks::kBlock, run_blocks)
  RADIXFLOW_QTYPE("q4_kx16", Q4KInterleaved, Q4_K, Q4_K::QK, run_blocks)
  RADIXFLOW_QTYPE("q6_kx16", Q6KInterleaved, Q6_K, Q6_K::QK, run_blocks)
  RADIXFLOW_QTYPE("q4_k", Q4_K, Q4_K, Q4_K::QK, run_kquant)
  RADIXFLOW_QTYPE("q6_k", Q6_K, Q6_K, Q6_K::QK, run_kquant)
#undef RADIXFLOW_QTYPE
  TORCH_CHECK(false, "unknown qtype ", qtype,
              "; expected q8_0, q4_0, q4_1, q8_0x16, q4_0x16, q4_1x16, q4_kx16, q6_kx16, q4_k or q6_k");
}

// Whether the int8-activation matmul runs on AMX tiles in this process (amx_int8.h).
bool amx_tiles() {
#if defined(RADIXFLOW_AMX_INT8)
  return radixflow_cpu::amx::usable();
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixflow_cpu, m) {
  m.def(
      "quant_linear(Tensor x, Tensor packed, str qtype, int k, Tensor? bias, Tensor(a!) out, "
      "bool int8_activations=False) -> ()");
  m.def("amx_tiles() -> bool", &amx_tiles);
}

TORCH_LIBRARY_IMPL(radixflow_cpu, CPU, m) { m.impl("quant_linear", &quant_linear); }
