// y = x @ w^T (+ bias) for a few rows of x (M <= 8): the decode / verify shape, bound by reading
// w once. Each task takes a block of R consecutive rows of w and walks them together along K,
// one vector (a "line") per row per step, against all M rows of x (which stay in L1/L2):
//
//     for k in steps of one line:             acc[r][m] (R*M vector registers)
//         w_r = w[n0 + r, k:k+line]            += x[m, k:k+line] * w_r   (lane-wise)
//
// then the R*M lane vectors are summed kLanes at a time by a transpose-add. Accumulation is
// fp32: FMA for float32; for bfloat16, VDPBF16PS (two bf16 products per fp32 lane) when the
// build has AVX512-BF16, else w and x widened to fp32.
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "simd.h"
#include "work_pool.h"

namespace vec = radixflow_cpu;
using vec::Vec;

namespace {

constexpr int kMaxRows = 8;

// How one line of w meets one line of x. `W`/`X` are the element types read, `kStep` the
// elements per line, `Line` what a line loads into; `load(p, n)` reads the first n.
struct Fp32Op {
  using W = float;
  using X = float;
  using Line = Vec;
  static constexpr int kStep = vec::kLanes;
  static Line load(const float* p) { return vec::load(p); }
  static Line load(const float* p, int64_t n) { return vec::load(p, n); }
  static Vec madd(Vec acc, Line x, Line w) { return vec::fmadd(x, w, acc); }
};

#ifdef RADIXFLOW_BF16_DOT
struct Bf16DotOp {
  using W = c10::BFloat16;
  using X = c10::BFloat16;
  using Line = vec::Bf16Pairs;
  static constexpr int kStep = 2 * vec::kLanes;
  static Line load(const W* p) { return vec::load_pairs(p); }
  static Line load(const W* p, int64_t n) { return vec::load_pairs(p, n); }
  static Vec madd(Vec acc, Line x, Line w) { return vec::dot_pairs(acc, x, w); }
};
#else
// bf16 w widened on load; x already widened to fp32 once per call.
struct Bf16WidenOp {
  using W = c10::BFloat16;
  using X = float;
  using Line = Vec;
  static constexpr int kStep = vec::kLanes;
  static Line load(const W* p) { return vec::load(p); }
  static Line load(const W* p, int64_t n) { return vec::load(p, n); }
  static Line load(const float* p) { return vec::load(p); }
  static Line load(const float* p, int64_t n) { return vec::load(p, n); }
  static Vec madd(Vec acc, Line x, Line w) { return vec::fmadd(x, w, acc); }
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
  constexpr int L = vec::kLanes, kCount = R * M, kGroups = (kCount + L - 1) / L;
  Vec acc[kGroups * L];
  for (int i = 0; i < kGroups * L; ++i) acc[i] = vec::zero();
  const typename Op::W* w = p.w + n0 * p.k;
  const int64_t full = p.k / S * S;
  // Rows of a block are short (a few lines each), too short for the hardware prefetcher to
  // follow R of them at once; the block is one contiguous run, so each step pulls the next
  // stretch of the following block in, front to back, and that block is in L2 by the time it is
  // read.
  const char* next = reinterpret_cast<const char*>(w + R * p.k);
  const int64_t steps = (p.k + S - 1) / S;
  const int64_t bytes = R * p.k * (int64_t)sizeof(typename Op::W);
  const int64_t per_step = (bytes + 64 * steps - 1) / (64 * steps);
  for (int64_t k = 0; k < full; k += S) {
    for (int64_t i = 0; i < per_step; ++i) vec::prefetch_l2(next + 64 * ((k / S) * per_step + i));
    for (int r = 0; r < R; ++r) {
      const typename Op::Line wv = Op::load(w + r * p.k + k);
      for (int m = 0; m < M; ++m)
        acc[r * M + m] = Op::madd(acc[r * M + m], Op::load(p.x + m * p.ldx + k), wv);
    }
  }
  if (full < p.k) {
    const int64_t n = p.k - full;
    for (int r = 0; r < R; ++r) {
      const typename Op::Line wv = Op::load(w + r * p.k + full, n);
      for (int m = 0; m < M; ++m)
        acc[r * M + m] = Op::madd(acc[r * M + m], Op::load(p.x + m * p.ldx + full, n), wv);
    }
  }
  float sums[kGroups * L];
  for (int g = 0; g < kGroups; ++g) vec::store(sums + g * L, vec::sum_lanes(acc + g * L));
  for (int r = 0; r < R; ++r) {
    const float b = p.bias ? static_cast<float>(p.bias[n0 + r]) : 0.0f;
    for (int m = 0; m < M; ++m) p.y[m * p.ldy + n0 + r] = Out(sums[r * M + m] + b);
  }
}

// Rows of w per block: R * M accumulators plus a line of w and one of x fit the registers.
constexpr int rows_per_block(int m) {
  if constexpr (vec::kRegisters >= 32) return m <= 2 ? 8 : m <= 4 ? 4 : 3;
  return m == 1 ? 8 : m == 2 ? 6 : m <= 4 ? 3 : m <= 6 ? 2 : 1;
}

template <typename Op, typename Out, int M>
void run(const Problem<Op, Out>& p) {
  constexpr int R = rows_per_block(M);
  const int64_t blocks = p.n / R;
  // Enough blocks per task that the fork costs little next to the stream (~64 KiB of w).
  const int64_t grain = std::max<int64_t>(1, 65536 / (R * p.k * (int64_t)sizeof(typename Op::W)));
  vec::parallel_chunks((blocks + grain - 1) / grain, [&](int64_t chunk) {
    const int64_t end = std::min(blocks, (chunk + 1) * grain);
    for (int64_t b = chunk * grain; b < end; ++b) block<Op, Out, M, R>(p, b * R);
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
#ifdef RADIXFLOW_BF16_DOT
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
