// y = x @ W^T (+ bias) where W [N, K] stays packed as GGUF blocks (q8_0, q4_0, q4_1, q4_k, q6_k),
// one row of blocks per output feature, byte for byte as in the file.
//
// Each block decodes to small integers q, one scale s and one offset o per group of 16 weights
// (w = s * q + o, as ggml dequantizes), into an L1-resident scratch:
//
//     block bytes --decode--> int8 q[QK], s[QK/16], o[QK/16]
//                              |  per vector of W lanes: w = fma(float(q), s, o)   (registers)
//                              v
//     decode (M <= 8):  acc[r][m] = fma(w_r, x[m, k:k+W], acc[r][m]) for 1 or 2 packed rows r
//                       at a time, then a horizontal sum per (r, m)
//     prefill (M > 8):  w stored into an fp32 tile of rows that fits L2, then one sgemm per tile
//
// The weights are exact in fp32 (gguf's own dequantize, up to one rounding of s * q + o, which
// is fused here); sums are fp32, so the result is F.linear on the dequantized weight within
// fp32 summation-order error, rounded once to x's dtype. The vector type is chosen by the ISA
// this file is compiled for: AVX-512F (16 lanes), AVX2 + FMA (8), NEON (4) or plain C++ (1).
// It is a little over 400 lines because it holds the five block formats and both paths.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

namespace {

// -- the vector abstraction: W fp32 lanes ------------------------------------------------------

#if defined(__AVX512F__)
struct VecF {
  static constexpr int W = 16;
  __m512 v;
  static VecF zero() { return {_mm512_setzero_ps()}; }
  static VecF set1(float a) { return {_mm512_set1_ps(a)}; }
  static VecF load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static VecF from_i8(const int8_t* p) {
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)))};
  }
  static VecF fma(VecF a, VecF b, VecF c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  float sum() const { return _mm512_reduce_add_ps(v); }
};
#elif defined(__AVX2__) && defined(__FMA__)
struct VecF {
  static constexpr int W = 8;
  __m256 v;
  static VecF zero() { return {_mm256_setzero_ps()}; }
  static VecF set1(float a) { return {_mm256_set1_ps(a)}; }
  static VecF load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static VecF from_i8(const int8_t* p) {
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)))};
  }
  static VecF fma(VecF a, VecF b, VecF c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  float sum() const {
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
  }
};
#elif defined(__ARM_NEON) && defined(__aarch64__)
struct VecF {
  static constexpr int W = 4;
  float32x4_t v;
  static VecF zero() { return {vdupq_n_f32(0.0f)}; }
  static VecF set1(float a) { return {vdupq_n_f32(a)}; }
  static VecF load(const float* p) { return {vld1q_f32(p)}; }
  static VecF from_i8(const int8_t* p) {
    int32_t bits;
    std::memcpy(&bits, p, 4);
    const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(bits)));
    return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)))};
  }
  static VecF fma(VecF a, VecF b, VecF c) { return {vfmaq_f32(c.v, a.v, b.v)}; }
  void store(float* p) const { vst1q_f32(p, v); }
  float sum() const { return vaddvq_f32(v); }
};
#else
struct VecF {
  static constexpr int W = 1;
  float v;
  static VecF zero() { return {0.0f}; }
  static VecF set1(float a) { return {a}; }
  static VecF load(const float* p) { return {*p}; }
  static VecF from_i8(const int8_t* p) { return {static_cast<float>(*p)}; }
  static VecF fma(VecF a, VecF b, VecF c) { return {a.v * b.v + c.v}; }
  void store(float* p) const { *p = v; }
  float sum() const { return v; }
};
#endif

// -- block decoders: bytes -> q, and s, o per group of 16 --------------------------------------

constexpr int kGroup = 16;
constexpr int kMaxRows = 8;

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// Low nibbles of 16 bytes to q[0..16), high nibbles to q[16..32): two 16-byte stores, which
// the vector loads that follow can forward from (byte-wise stores could not).
inline void nibbles16(const uint8_t* qs, int8_t* q) {
#if defined(__SSE2__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low = _mm_set1_epi8(0x0F);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm_and_si128(bytes, low));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16),
                   _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
#elif defined(__ARM_NEON)
  const uint8x16_t bytes = vld1q_u8(qs);
  vst1q_s8(q, vreinterpretq_s8_u8(vandq_u8(bytes, vdupq_n_u8(0x0F))));
  vst1q_s8(q + 16, vreinterpretq_s8_u8(vshrq_n_u8(bytes, 4)));
#else
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(qs[j] & 0x0F);
    q[j + 16] = static_cast<int8_t>(qs[j] >> 4);
  }
#endif
}

struct Q8_0 {  // fp16 d, int8 q[32]: w = d * q
  static constexpr int QK = 32, kBytes = 34;
  static void decode(const uint8_t* b, int8_t* q, float* s, float* o) {
    std::memcpy(q, b + 2, 32);
    s[0] = s[1] = half_at(b);
    o[0] = o[1] = 0.0f;
  }
};

struct Q4_0 {  // fp16 d, 16 bytes of nibbles: w = d * (q - 8) = d * q - 8 d
  static constexpr int QK = 32, kBytes = 18;
  static void decode(const uint8_t* b, int8_t* q, float* s, float* o) {
    nibbles16(b + 2, q);
    s[0] = s[1] = half_at(b);
    o[0] = o[1] = -8.0f * s[0];
  }
};

struct Q4_1 {  // fp16 d, fp16 m, 16 bytes of nibbles: w = d * q + m
  static constexpr int QK = 32, kBytes = 20;
  static void decode(const uint8_t* b, int8_t* q, float* s, float* o) {
    nibbles16(b + 4, q);
    s[0] = s[1] = half_at(b);
    o[0] = o[1] = half_at(b + 2);
  }
};

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
  // The fp32 weights [i, i + W) of the decoded block.
  VecF at(int i) const {
    const int g = i / kGroup;
    return VecF::fma(VecF::from_i8(q + i), VecF::set1(s[g]), VecF::set1(o[g]));
  }
};

// -- decode: M <= 8 rows of x against each packed row ----------------------------------------

struct Problem {
  const float* x;  // [M, K] fp32, contiguous
  const uint8_t* w;  // [N, row_bytes]
  int64_t m, n, k, row_bytes;
};

// Packed rows [row, row + R) against the M rows of x: sums[r * M + m]. R rows at once share
// each load of x between R FMAs.
template <typename Fmt, int M, int R>
void dot_rows(const Problem& p, int64_t row, float* sums) {
  VecF acc[R * M];
  for (int i = 0; i < R * M; ++i) acc[i] = VecF::zero();
  Scratch<Fmt> t[R];
  const uint8_t* block = p.w + row * p.row_bytes;
  for (int64_t k0 = 0; k0 < p.k; k0 += Fmt::QK, block += Fmt::kBytes) {
    for (int r = 0; r < R; ++r) t[r].decode(block + r * p.row_bytes);
    for (int i = 0; i < Fmt::QK; i += VecF::W) {
      VecF w[R];
      for (int r = 0; r < R; ++r) w[r] = t[r].at(i);
      const float* x = p.x + k0 + i;
      for (int m = 0; m < M; ++m) {
        const VecF xv = VecF::load(x + m * p.k);
        for (int r = 0; r < R; ++r) acc[r * M + m] = VecF::fma(w[r], xv, acc[r * M + m]);
      }
    }
  }
  for (int i = 0; i < R * M; ++i) sums[i] = acc[i].sum();
}

// Two rows at a time from M = 4 on (measured: 1.2-1.4x at M = 8, slower for M = 1) while 2 M
// accumulators, two weight vectors and x fit the registers (AVX-512 and NEON have 32).
constexpr int kRegisters = VecF::W == 8 ? 16 : 32;  // AVX2 has 16 vector registers
constexpr int rows_per_step(int m) { return m >= 4 && 2 * m + 3 <= kRegisters ? 2 : 1; }

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
  at::parallel_for(0, steps, grain, [&](int64_t begin, int64_t end) {
    float sums[R * M];
    for (int64_t step = begin; step < end; ++step) {
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

// One flat loop over each block's vectors, as in dot_rows: with a nested group / lane loop
// here, GCC 12 at -O3 for AVX2 dropped the calls to this function for q4_k and q6_k (the
// prefill tests caught it).
template <typename Fmt>
void dequantize_row(const Problem& p, int64_t row, float* dst) {
  Scratch<Fmt> t;
  const uint8_t* block = p.w + row * p.row_bytes;
  for (int64_t k0 = 0; k0 < p.k; k0 += Fmt::QK, block += Fmt::kBytes) {
    t.decode(block);
    for (int i = 0; i < Fmt::QK; i += VecF::W) t.at(i).store(dst + k0 + i);
  }
}

template <typename Fmt>
void matmul(const Problem& p, const at::Tensor& x, const std::optional<at::Tensor>& bias,
            const at::Tensor& out) {
  // A tile of about 1 MiB of fp32 weights: it stays in L2 while the sgemm reads it.
  const int64_t tile_rows = std::min<int64_t>(p.n, std::max<int64_t>(16, (1 << 20) / (4 * p.k)));
  const at::Tensor tile = at::empty({tile_rows, p.k}, x.options().dtype(at::kFloat));
  for (int64_t n0 = 0; n0 < p.n; n0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, p.n - n0);
    const at::Tensor w = tile.narrow(0, 0, rows);
    float* dst = w.data_ptr<float>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) dequantize_row<Fmt>(p, n0 + r, dst + r * p.k);
    });
    at::Tensor y = at::mm(x, w.t());
    if (bias) y.add_(bias->narrow(0, n0, rows));
    out.narrow(1, n0, rows).copy_(y);
  }
}

// -- the op ----------------------------------------------------------------------------------

template <typename Fmt>
void run(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
         const at::Tensor& out) {
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const Problem p{xf.data_ptr<float>(), packed.data_ptr<uint8_t>(), x.size(0), packed.size(0),
                  x.size(1), packed.size(1)};
  if (p.m > kMaxRows) {
    const std::optional<at::Tensor> bias_f =
        bias ? std::optional<at::Tensor>(bias->to(at::kFloat)) : std::nullopt;
    return matmul<Fmt>(p, xf, bias_f, out);
  }
  if (x.scalar_type() == at::kFloat) {
    return matvec_rows<Fmt, float>(p, bias ? bias->data_ptr<float>() : nullptr,
                                   out.data_ptr<float>(), out.stride(0));
  }
  using BF = c10::BFloat16;
  matvec_rows<Fmt, BF>(p, bias ? bias->data_ptr<BF>() : nullptr, out.data_ptr<BF>(),
                       out.stride(0));
}

template <typename Fmt>
void check_layout(const at::Tensor& packed, int64_t k, const std::string& qtype) {
  TORCH_CHECK(k > 0 && k % Fmt::QK == 0, qtype, " needs K to be a positive multiple of ", Fmt::QK,
              ", got ", k);
  TORCH_CHECK(packed.size(1) == k / Fmt::QK * Fmt::kBytes, qtype, " rows of K=", k, " take ",
              k / Fmt::QK * Fmt::kBytes, " bytes, packed has ", packed.size(1));
}

void quant_linear(const at::Tensor& x, const at::Tensor& packed, const std::string& qtype,
                  int64_t k, const std::optional<at::Tensor>& bias, const at::Tensor& out) {
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
#define RADIXFLOW_QTYPE(name, Fmt)             \
  if (qtype == name) {                         \
    check_layout<Fmt>(packed, k, qtype);       \
    return run<Fmt>(x, packed, bias, out);     \
  }
  RADIXFLOW_QTYPE("q8_0", Q8_0)
  RADIXFLOW_QTYPE("q4_0", Q4_0)
  RADIXFLOW_QTYPE("q4_1", Q4_1)
  RADIXFLOW_QTYPE("q4_k", Q4_K)
  RADIXFLOW_QTYPE("q6_k", Q6_K)
#undef RADIXFLOW_QTYPE
  TORCH_CHECK(false, "unknown qtype ", qtype, "; expected q8_0, q4_0, q4_1, q4_k or q6_k");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixflow_cpu, m) {
  m.def(
      "quant_linear(Tensor x, Tensor packed, str qtype, int k, Tensor? bias, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(radixflow_cpu, CPU, m) { m.impl("quant_linear", &quant_linear); }
