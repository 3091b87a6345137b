// The row-wise ops of a decoder layer on the CPU, each one pass over memory with fp32 arithmetic
// and the rounding order of the torch / HF reference (every op's result rounded to the dtype):
//
//     rms_norm:      y = dtype(x * rsqrt(mean(x^2) + eps) * w)   (as F.rms_norm rounds)
//     add_rms_norm:  r = dtype(x + r) in place, then y = rms_norm(r)
//     silu_and_mul:  y = dtype(dtype(silu(g)) * u)          for each row [g | u]
//     rotary_neox:   for the halves x1, x2 of each head's first rotary_dim elements, in place
//                    x1 = dtype(dtype(x1 c) - dtype(x2 s)),  x2 = dtype(dtype(x2 c) + dtype(x1 s))
//
// In a prefill step these are a quarter of the time when run as separate torch ops (each a
// pass over memory, many with a temporary); here each row is read and written once.
#ifndef __AVX512F__
#error "the CPU elementwise kernels need AVX-512F"
#endif

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "simd.h"

using radixflow_cpu::exp16;
using radixflow_cpu::first_lanes;
using radixflow_cpu::load16;
using radixflow_cpu::round_to;
using radixflow_cpu::store16;

namespace {

constexpr int64_t kGrainElements = 16384;  // per task: below this, threading costs more

int64_t grain(int64_t row_elements) { return std::max<int64_t>(1, kGrainElements / row_elements); }

template <typename T>
void norm_row(const T* x, const T* w, T* y, int64_t D, float eps) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) {
    const __m512 v = load16(x + d, first_lanes(D - d));
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / D + eps));
  for (int64_t d = 0; d < D; d += 16) {
    const __mmask16 m = first_lanes(D - d);
    store16(y + d, _mm512_mul_ps(_mm512_mul_ps(load16(x + d, m), r), load16(w + d, m)), m);
  }
}

template <typename T>
void add_row(const T* x, T* r, int64_t D) {
  for (int64_t d = 0; d < D; d += 16) {
    const __mmask16 m = first_lanes(D - d);
    store16(r + d, _mm512_add_ps(load16(x + d, m), load16(r + d, m)), m);
  }
}

template <typename T>
void norm_rows(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
               const at::Tensor& out, double eps) {
  const int64_t rows = x.size(0), D = x.size(1);
  const T* xp = x.data_ptr<T>();
  T* rp = residual.defined() ? residual.data_ptr<T>() : nullptr;
  const T* wp = weight.data_ptr<T>();
  T* yp = out.data_ptr<T>();
  const int64_t sx = x.stride(0), sy = out.stride(0);
  const int64_t sr = residual.defined() ? residual.stride(0) : 0;
  at::parallel_for(0, rows, grain(D), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (rp) {
        add_row(xp + i * sx, rp + i * sr, D);
        norm_row(rp + i * sr, wp, yp + i * sy, D, static_cast<float>(eps));
      } else {
        norm_row(xp + i * sx, wp, yp + i * sy, D, static_cast<float>(eps));
      }
    }
  });
}

void check_rows(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, " must be 2-D with a contiguous last dim");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " must have the input's dtype");
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
}

// out = rms_norm(x) or, with a residual, residual += x then out = rms_norm(residual).
void rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
              const at::Tensor& weight, double eps, at::Tensor out) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "rms_norm takes float32 or bfloat16");
  check_rows(x, "x", x);
  check_rows(out, "out", x);
  TORCH_CHECK(out.sizes() == x.sizes(), "out must have x's shape");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous() &&
                  weight.scalar_type() == x.scalar_type(),
              "weight must be contiguous [D] in x's dtype");
  at::Tensor res = residual.has_value() ? *residual : at::Tensor();
  if (res.defined()) {
    check_rows(res, "residual", x);
    TORCH_CHECK(res.sizes() == x.sizes(), "residual must have x's shape");
  }
  if (x.scalar_type() == at::kFloat)
    norm_rows<float>(x, res, weight, out, eps);
  else
    norm_rows<c10::BFloat16>(x, res, weight, out, eps);
}

template <typename T>
void silu_mul_rows(const at::Tensor& gate_up, const at::Tensor& out) {
  const int64_t rows = gate_up.size(0), I = out.size(1);
  const T* gp = gate_up.data_ptr<T>();
  T* yp = out.data_ptr<T>();
  const int64_t sg = gate_up.stride(0), sy = out.stride(0);
  const __m512 one = _mm512_set1_ps(1.0f);
  at::parallel_for(0, rows, grain(2 * I), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* g = gp + i * sg;
      const T* u = g + I;
      T* y = yp + i * sy;
      for (int64_t d = 0; d < I; d += 16) {
        const __mmask16 m = first_lanes(I - d);
        const __m512 gv = load16(g + d, m);
        const __m512 denom = _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv)));
        const __m512 silu = round_to<T>(_mm512_div_ps(gv, denom));
        store16(y + d, _mm512_mul_ps(silu, load16(u + d, m)), m);
      }
    }
  });
}

// out[:, :I] = silu(gate_up[:, :I]) * gate_up[:, I:].
void silu_and_mul(const at::Tensor& gate_up, at::Tensor out) {
  TORCH_CHECK(gate_up.scalar_type() == at::kFloat || gate_up.scalar_type() == at::kBFloat16,
              "silu_and_mul takes float32 or bfloat16");
  check_rows(gate_up, "gate_up", gate_up);
  check_rows(out, "out", gate_up);
  TORCH_CHECK(gate_up.size(1) % 2 == 0 && out.size(0) == gate_up.size(0) &&
                  out.size(1) * 2 == gate_up.size(1),
              "gate_up must be [T, 2I] and out [T, I]");
  if (gate_up.scalar_type() == at::kFloat)
    silu_mul_rows<float>(gate_up, out);
  else
    silu_mul_rows<c10::BFloat16>(gate_up, out);
}

template <typename T>
void rotate_heads(const at::Tensor& x, const at::Tensor& cos_sin, int64_t rotary_dim) {
  const int64_t tokens = x.size(0), heads = x.size(1), half = rotary_dim / 2;
  T* xp = x.data_ptr<T>();
  const T* cp = cos_sin.data_ptr<T>();
  const int64_t st = x.stride(0), sh = x.stride(1), sc = cos_sin.stride(0);
  at::parallel_for(0, tokens * heads, grain(rotary_dim), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / heads;
      T* x1 = xp + t * st + (i % heads) * sh;
      T* x2 = x1 + half;
      const T* c = cp + t * sc;
      const T* s = c + half;
      for (int64_t d = 0; d < half; d += 16) {
        const __mmask16 m = first_lanes(half - d);
        const __m512 a = load16(x1 + d, m), b = load16(x2 + d, m);
        const __m512 cv = load16(c + d, m), sv = load16(s + d, m);
        const __m512 ac = round_to<T>(_mm512_mul_ps(a, cv)), bs = round_to<T>(_mm512_mul_ps(b, sv));
        const __m512 bc = round_to<T>(_mm512_mul_ps(b, cv)), as = round_to<T>(_mm512_mul_ps(a, sv));
        store16(x1 + d, _mm512_sub_ps(ac, bs), m);
        store16(x2 + d, _mm512_add_ps(bc, as), m);
      }
    }
  });
}

// Rotate x [T, H, head_dim] in place by cos_sin [T, rotary_dim] (cos | sin, x's dtype).
void rotary_neox(at::Tensor x, const at::Tensor& cos_sin, int64_t rotary_dim) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "rotary_neox takes float32 or bfloat16");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "x must be [T, H, D] with a contiguous last dim");
  TORCH_CHECK(rotary_dim % 2 == 0 && rotary_dim <= x.size(2), "bad rotary_dim");
  check_rows(cos_sin, "cos_sin", x);
  TORCH_CHECK(cos_sin.size(0) == x.size(0) && cos_sin.size(1) == rotary_dim,
              "cos_sin must be [T, rotary_dim]");
  if (x.scalar_type() == at::kFloat)
    rotate_heads<float>(x, cos_sin, rotary_dim);
  else
    rotate_heads<c10::BFloat16>(x, cos_sin, rotary_dim);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixflow_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor(a!)? residual, Tensor weight, float eps, Tensor(b!) out) -> ()");
  m.def("silu_and_mul(Tensor gate_up, Tensor(a!) out) -> ()");
  m.def("rotary_neox(Tensor(a!) x, Tensor cos_sin, int rotary_dim) -> ()");
}

TORCH_LIBRARY_IMPL(radixflow_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rotary_neox", &rotary_neox);
}
