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
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "simd.h"

namespace vec = radixflow_cpu;
using vec::Vec;

namespace {

constexpr int64_t kGrainElements = 16384;  // per task: below this, threading costs more

int64_t grain(int64_t row_elements) { return std::max<int64_t>(1, kGrainElements / row_elements); }

template <typename T>
void norm_row(const T* x, const T* w, T* y, int64_t D, float eps) {
  constexpr int L = vec::kLanes;
  const int64_t full = D / L * L;
  Vec acc = vec::zero();
  for (int64_t d = 0; d < full; d += L) {
    const Vec v = vec::load(x + d);
    acc = vec::fmadd(v, v, acc);
  }
  if (full < D) {
    const Vec v = vec::load(x + full, D - full);
    acc = vec::fmadd(v, v, acc);
  }
  const Vec r = vec::set1(1.0f / std::sqrt(vec::reduce_add(acc) / D + eps));
  for (int64_t d = 0; d < full; d += L)
    vec::store(y + d, vec::mul(vec::mul(vec::load(x + d), r), vec::load(w + d)));
  if (full < D) {
    const int64_t n = D - full;
    vec::store(y + full, vec::mul(vec::mul(vec::load(x + full, n), r), vec::load(w + full, n)), n);
  }
}

template <typename T>
void add_row(const T* x, T* r, int64_t D) {
  constexpr int L = vec::kLanes;
  const int64_t full = D / L * L;
  for (int64_t d = 0; d < full; d += L)
    vec::store(r + d, vec::add(vec::load(x + d), vec::load(r + d)));
  if (full < D) {
    const int64_t n = D - full;
    vec::store(r + full, vec::add(vec::load(x + full, n), vec::load(r + full, n)), n);
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
  at::parallel_for(0, rows, grain(2 * I), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* g = gp + i * sg;
      const T* u = g + I;
      T* y = yp + i * sy;
      for (int64_t d = 0; d < I; d += vec::kLanes) {
        const int64_t n = I - d;
        const Vec gv = vec::load(g + d, n);
        const Vec denom = vec::add(vec::set1(1.0f), vec::vexp(vec::sub(vec::zero(), gv)));
        const Vec silu = vec::round_to<T>(vec::div(gv, denom));
        vec::store(y + d, vec::mul(silu, vec::load(u + d, n)), n);
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
      for (int64_t d = 0; d < half; d += vec::kLanes) {
        const int64_t n = half - d;
        const Vec a = vec::load(x1 + d, n), b = vec::load(x2 + d, n);
        const Vec cv = vec::load(c + d, n), sv = vec::load(s + d, n);
        const Vec ac = vec::round_to<T>(vec::mul(a, cv)), bs = vec::round_to<T>(vec::mul(b, sv));
        const Vec bc = vec::round_to<T>(vec::mul(b, cv)), as = vec::round_to<T>(vec::mul(a, sv));
        vec::store(x1 + d, vec::sub(ac, bs), n);
        vec::store(x2 + d, vec::add(bc, as), n);
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
