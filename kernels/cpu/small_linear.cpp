// y = x @ w^T (+ bias) for a few rows of x (M <= 8): the decode / verify shape, bound by reading
// w once. Each task takes a block of R consecutive rows of w and walks them together along K,
// one 64-byte line per row per step, against all M rows of x (which stay in L1/L2):
//
//     for k in steps of one line:             acc[r][m] (R*M <= 24 zmm registers)
//         w_r = w[n0 + r, k:k+line]            += x[m, k:k+line] * w_r   (lane-wise)
//
// then the R*M lane vectors are summed 16 at a time by a transpose-add. Accumulation is fp32:
// FMA for float32; for bfloat16, VDPBF16PS (two bf16 products per fp32 lane) when the CPU has
// AVX512-BF16, else w and x widened to fp32.
#ifndef __AVX512F__
#error "the CPU linear kernel needs AVX-512F"
#endif

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include "simd.h"

using radixflow_cpu::sum_lanes16;

#include <algorithm>
#include <vector>

namespace {

constexpr int kMaxRows = 8;

// How one line of w meets one line of x. `W`/`X` are the element types read, `kStep` the
// elements per line, `Vec` what a line loads into.
struct Fp32Op {
  using W = float;
  using X = float;
  using Vec = __m512;
  static constexpr int kStep = 16;
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load(const float* p, uint32_t mask) { return _mm512_maskz_loadu_ps((__mmask16)mask, p); }
  static __m512 madd(__m512 acc, Vec x, Vec w) { return _mm512_fmadd_ps(x, w, acc); }
};

#ifdef __AVX512BF16__
struct Bf16DotOp {
  using W = c10::BFloat16;
  using X = c10::BFloat16;
  using Vec = __m512i;
  static constexpr int kStep = 32;
  static Vec load(const W* p) { return _mm512_loadu_si512(p); }
  static Vec load(const W* p, uint32_t mask) { return _mm512_maskz_loadu_epi16((__mmask32)mask, p); }
  static __m512 madd(__m512 acc, Vec x, Vec w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
  }
};
#else
// bf16 w widened on load; x already widened to fp32 once per call.
struct Bf16WidenOp {
  using W = c10::BFloat16;
  using X = float;
  using Vec = __m512;
  static constexpr int kStep = 16;
  static __m512 widen(__m256i raw) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
  static Vec load(const W* p) { return widen(_mm256_loadu_si256((const __m256i*)p)); }
  static Vec load(const W* p, uint32_t mask) { return widen(_mm256_maskz_loadu_epi16((__mmask16)mask, p)); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load(const float* p, uint32_t mask) { return _mm512_maskz_loadu_ps((__mmask16)mask, p); }
  static __m512 madd(__m512 acc, Vec x, Vec w) { return _mm512_fmadd_ps(x, w, acc); }
};
#endif

template <typename Op, typename Out>
struct Problem {
  const typename Op::X* x;
  const typename Op::W* w;
  const Out* bias;  // [N] or null
  Out* y;
  int64_t n, k, ldx, ldy;
};

// Rows [n0, n0 + R) of w against the M rows of x: y[m, n0 + r] for all m, r.
template <typename Op, typename Out, int M, int R>
inline void block(const Problem<Op, Out>& p, int64_t n0) {
  constexpr int S = Op::kStep;
  constexpr int kCount = R * M, kGroups = (kCount + 15) / 16;
  __m512 acc[kGroups * 16];
  for (int i = 0; i < kGroups * 16; ++i) acc[i] = _mm512_setzero_ps();
  const typename Op::W* w = p.w + n0 * p.k;
  const int64_t full = p.k / S * S;
  // Rows of a block are short (a few lines each), too short for the hardware prefetcher to
  // follow R of them at once; the block is one contiguous run, so each step pulls the next
  // stretch of the following block in, front to back, and that block is in L2 by the time it is read.
  const char* next = reinterpret_cast<const char*>(w + R * p.k);
  const int64_t steps = (p.k + S - 1) / S;
  const int64_t per_step = (R * p.k * (int64_t)sizeof(typename Op::W) + 64 * steps - 1) / (64 * steps);
  for (int64_t k = 0; k < full; k += S) {
    for (int64_t i = 0; i < per_step; ++i) _mm_prefetch(next + 64 * ((k / S) * per_step + i), _MM_HINT_T1);
    for (int r = 0; r < R; ++r) {
      const typename Op::Vec wv = Op::load(w + r * p.k + k);
      for (int m = 0; m < M; ++m) acc[r * M + m] = Op::madd(acc[r * M + m], Op::load(p.x + m * p.ldx + k), wv);
    }
  }
  if (full < p.k) {
    const uint32_t mask = (uint32_t)((1ull << (p.k - full)) - 1);
    for (int r = 0; r < R; ++r) {
      const typename Op::Vec wv = Op::load(w + r * p.k + full, mask);
      for (int m = 0; m < M; ++m)
        acc[r * M + m] = Op::madd(acc[r * M + m], Op::load(p.x + m * p.ldx + full, mask), wv);
    }
  }
  alignas(64) float sums[kGroups * 16];
  for (int g = 0; g < kGroups; ++g) _mm512_store_ps(sums + g * 16, sum_lanes16(acc + g * 16));
  for (int r = 0; r < R; ++r) {
    const float b = p.bias ? static_cast<float>(p.bias[n0 + r]) : 0.0f;
    for (int m = 0; m < M; ++m) p.y[m * p.ldy + n0 + r] = Out(sums[r * M + m] + b);
  }
}

// Rows of w per block: R * M accumulators plus a line of w and one of x fit the 32 registers.
constexpr int rows_per_block(int m) { return m <= 2 ? 8 : m <= 4 ? 4 : 3; }

template <typename Op, typename Out, int M>
void run(const Problem<Op, Out>& p) {
  constexpr int R = rows_per_block(M);
  const int64_t blocks = p.n / R;
  // Enough blocks per task that the fork costs little next to the stream (~64 KiB of w).
  const int64_t grain = std::max<int64_t>(1, 65536 / (R * p.k * (int64_t)sizeof(typename Op::W)));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) block<Op, Out, M, R>(p, b * R);
  });
  for (int64_t n = blocks * R; n < p.n; ++n) block<Op, Out, M, 1>(p, n);
}

template <typename Op, typename Out>
void dispatch(const Problem<Op, Out>& p, int64_t m) {
  switch (m) {
#define RADIXFLOW_CASE(rows) \
  case rows:                 \
    return run<Op, Out, rows>(p);
    RADIXFLOW_CASE(1) RADIXFLOW_CASE(2) RADIXFLOW_CASE(3) RADIXFLOW_CASE(4)
    RADIXFLOW_CASE(5) RADIXFLOW_CASE(6) RADIXFLOW_CASE(7) RADIXFLOW_CASE(8)
#undef RADIXFLOW_CASE
  }
}

void small_linear(const at::Tensor& x, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias, const at::Tensor& out) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && out.dim() == 2,
              "x, weight and out must be 2-D");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  TORCH_CHECK(m >= 1 && m <= kMaxRows, "x must have 1 to 8 rows");
  TORCH_CHECK(weight.size(1) == k && out.size(0) == m && out.size(1) == n,
              "x [M, K], weight [N, K] and out [M, N] do not fit");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && out.device().is_cpu(),
              "all tensors must be on the CPU");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "dtype must be float32 or bfloat16");
  TORCH_CHECK(weight.scalar_type() == dtype && out.scalar_type() == dtype,
              "x, weight and out must share one dtype");
  TORCH_CHECK(x.stride(1) == 1 && out.stride(1) == 1 && weight.is_contiguous(),
              "weight must be contiguous and x, out contiguous in the last dim");
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == dtype && bias->dim() == 1 && bias->size(0) == n &&
                    bias->is_contiguous(),
                "bias must be a contiguous [N] tensor of x's dtype");
  }
  if (dtype == at::kFloat) {
    const Problem<Fp32Op, float> p{x.data_ptr<float>(), weight.data_ptr<float>(),
                                   bias ? bias->data_ptr<float>() : nullptr,
                                   out.data_ptr<float>(), n, k, x.stride(0), out.stride(0)};
    return dispatch(p, m);
  }
  using BF = c10::BFloat16;
  const BF* b = bias ? bias->data_ptr<BF>() : nullptr;
#ifdef __AVX512BF16__
  const Problem<Bf16DotOp, BF> p{x.data_ptr<BF>(), weight.data_ptr<BF>(), b, out.data_ptr<BF>(),
                                 n, k, x.stride(0), out.stride(0)};
  dispatch(p, m);
#else
  const at::Tensor wide = x.to(at::kFloat).contiguous();
  const Problem<Bf16WidenOp, BF> p{wide.data_ptr<float>(), weight.data_ptr<BF>(), b,
                                   out.data_ptr<BF>(), n, k, k, out.stride(0)};
  dispatch(p, m);
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixflow_cpu, m) {
  m.def("small_linear(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(radixflow_cpu, CPU, m) { m.impl("small_linear", &small_linear); }
