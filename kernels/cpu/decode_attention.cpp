// Paged decode attention on the CPU: one query token per request over its K/V, read straight
// from the pool through req_to_token (no gather, no padding), with an online softmax in fp32.
//
// Work item = (request, key range), all heads. Keys go in blocks of 16:
//
//     for each block of 16 keys, for each KV head kvh (its rows converted to fp32 once):
//         for each of its G = H / KVH query heads h:
//             scores[16] = q_h . k[j]                 (16 dot products, one transpose-add)
//             m_h, l_h, acc_h rescaled by the new running max
//             acc_h += sum_j p[j] * v[j]
//
// Consecutive rows over the same req_to_token row (the k+1 tokens of a speculative verify,
// each seeing the keys up to its own position) form one group: each block of K/V is loaded
// and converted once for all of the group's queries.
//
// When there are too few requests to keep the threads busy, long sequences are cut into
// ranges; each range writes a normalised partial output and its log-sum-exp, and a second pass
// merges the ranges of one request by their log-sum-exp.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "simd.h"
#include "work_pool.h"

namespace vec = radixflow_cpu;
using vec::Vec;

namespace {

constexpr int kBlock = 16;          // keys per block: 16 / kLanes vectors of scores per head
constexpr int kMaxChunks = 16;      // head_dim <= 256, in chunks of 16 elements
constexpr int64_t kMaxGroup = 16;   // query rows sharing one sequence's K/V loads
constexpr int64_t kMinRange = 256;  // shorter key ranges cost more to merge than they save
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Problem {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* table;
  const int64_t* rows;
  const int64_t* seq_lens;
  void* out;
  float* lse;  // [B, H] or null
  int64_t q_stride_b, q_stride_h, k_stride_s, k_stride_h, v_stride_s, v_stride_h;
  int64_t table_stride, out_stride_b, out_stride_h, lse_stride_b;
  int64_t heads, kv_heads, group, head_dim, window;
  float scale, cap;
};

struct Item {
  int64_t b, rows, lo, hi;  // query rows b .. b + rows - 1 (one group) over keys [lo, hi)
  int64_t piece;            // -1: the whole range, written to out; else which range it is
};

// First visible key of request b (the sliding window's start, or 0).
inline int64_t first_key(const Problem& p, int64_t b) {
  return p.window > 0 ? std::max<int64_t>(0, p.seq_lens[b] - p.window) : 0;
}

// Per-thread working memory.
struct Scratch {
  std::vector<Vec> qv, acc;     // [rows * heads * vectors per head]: scaled queries, sums
  std::vector<float> m, l;      // running max and sum per query row and head
  std::vector<float> kf, vf;    // [kBlock, vectors * kLanes]: one block of one KV head in fp32
  std::vector<float> o, lse;    // one item's result [rows, heads, head_dim], [rows, heads]
  Scratch(int64_t heads, int64_t vecs, int64_t head_dim)
      : qv(kMaxGroup * heads * vecs), acc(kMaxGroup * heads * vecs), m(kMaxGroup * heads),
        l(kMaxGroup * heads), kf(kBlock * vecs * vec::kLanes), vf(kBlock * vecs * vec::kLanes),
        o(kMaxGroup * heads * head_dim), lse(kMaxGroup * heads) {}
};

// Elements [i * kLanes, (i + 1) * kLanes) of a row of D, zero past D.
template <typename T>
inline Vec load_part(const T* row, int i, int64_t D) {
  const int64_t at = (int64_t)i * vec::kLanes;
  return at < D ? vec::load(row + at, D - at) : vec::zero();
}

// Rows of one KV head of a block as NV vectors of fp32: the pool's own rows for float32 when
// head_dim fills them, else copies in `buffer` (converted once, read by every query head of
// the group), zero-padded.
template <int NV, typename T>
inline void rows_fp32(const T* const* rows, int n, int64_t head_dim, float* buffer,
                      const float** out) {
  if constexpr (std::is_same_v<T, float>) {
    if (head_dim == NV * vec::kLanes) {
      for (int j = 0; j < n; ++j) out[j] = rows[j];
      return;
    }
  }
  for (int j = 0; j < n; ++j) {
    float* dst = buffer + j * NV * vec::kLanes;
    for (int i = 0; i < NV; ++i) vec::store(dst + i * vec::kLanes, load_part(rows[j], i, head_dim));
    out[j] = dst;
  }
}

// Attention of every query head of the item's rows over keys [lo, hi), each row seeing the
// keys before its own seq_len: s.o [rows, heads, head_dim] normalised (fp32), s.lse
// [rows, heads]. The query heads (and rows) of one KV head share each K/V row load; all KV
// heads of a key are visited together, so a page of the pool is read front to back. NV vectors
// hold one head (zero-padded). An empty range gives o = 0, lse = -inf.
template <typename T, int NV>
void attend_range(const Problem& p, const Item& it, Scratch& s) {
  constexpr int L = vec::kLanes, kScoreVecs = kBlock / L;
  const int64_t G = p.group, D = p.head_dim, H = p.heads, RH = it.rows * H;
  Vec* qv = s.qv.data();
  Vec* acc = s.acc.data();
  for (int64_t rh = 0; rh < RH; ++rh) {  // rh = row * H + head
    const T* q =
        static_cast<const T*>(p.q) + (it.b + rh / H) * p.q_stride_b + (rh % H) * p.q_stride_h;
    for (int i = 0; i < NV; ++i) {
      qv[rh * NV + i] = vec::mul(load_part(q, i, D), vec::set1(p.scale));
      acc[rh * NV + i] = vec::zero();
    }
    s.m[rh] = kNegInf;
    s.l[rh] = 0.0f;
  }
  const int32_t* slots = p.table + p.rows[it.b] * p.table_stride;
  const T* kbase = static_cast<const T*>(p.k);
  const T* vbase = static_cast<const T*>(p.v);
  // bytes of one slot's K (or V) over all KV heads, from its first element
  const int64_t k_bytes = ((p.kv_heads - 1) * p.k_stride_h + D) * (int64_t)sizeof(T);
  const int64_t v_bytes = ((p.kv_heads - 1) * p.v_stride_h + D) * (int64_t)sizeof(T);
  const T* krow[kBlock];
  const T* vrow[kBlock];
  const float* kf[kBlock];
  const float* vf[kBlock];
  Vec dots[kBlock];
  float probs[kBlock];
  for (int64_t t0 = it.lo; t0 < it.hi; t0 += kBlock) {
    const int n = (int)std::min<int64_t>(kBlock, it.hi - t0);
    // Pull the next block's rows towards the cache while this one is computed.
    const int64_t next_n = std::min<int64_t>(kBlock, it.hi - t0 - kBlock);
    for (int64_t j = 0; j < next_n; ++j) {
      const int64_t slot = slots[t0 + kBlock + j];
      const char* kp = reinterpret_cast<const char*>(kbase + slot * p.k_stride_s);
      const char* vp = reinterpret_cast<const char*>(vbase + slot * p.v_stride_s);
      for (int64_t byte = 0; byte < k_bytes; byte += 64) vec::prefetch_l1(kp + byte);
      for (int64_t byte = 0; byte < v_bytes; byte += 64) vec::prefetch_l1(vp + byte);
    }
    for (int64_t kvh = 0; kvh < p.kv_heads; ++kvh) {
      for (int j = 0; j < n; ++j) {
        krow[j] = kbase + (int64_t)slots[t0 + j] * p.k_stride_s + kvh * p.k_stride_h;
        vrow[j] = vbase + (int64_t)slots[t0 + j] * p.v_stride_s + kvh * p.v_stride_h;
      }
      rows_fp32<NV>(krow, n, D, s.kf.data(), kf);
      rows_fp32<NV>(vrow, n, D, s.vf.data(), vf);
      for (int64_t r = 0; r < it.rows; ++r) {
       // keys of this block that row r sees (its seq_len may end inside or before the block)
       const int nr = (int)std::min<int64_t>(n, p.seq_lens[it.b + r] - t0);
       if (nr <= 0) continue;
       for (int64_t h = r * H + kvh * G; h < r * H + (kvh + 1) * G; ++h) {
        // scores of the block: lane j of sc[j / L] = q_h . k_j
        for (int j = 0; j < kBlock; ++j) {
          if (j >= nr) {
            dots[j] = vec::zero();
            continue;
          }
          Vec dot = vec::mul(qv[h * NV], vec::load(kf[j]));
          for (int i = 1; i < NV; ++i)
            dot = vec::fmadd(qv[h * NV + i], vec::load(kf[j] + i * L), dot);
          dots[j] = dot;
        }
        Vec sc[kScoreVecs];
        for (int c = 0; c < kScoreVecs; ++c) sc[c] = vec::sum_lanes(dots + c * L);
        if (p.cap > 0) {
          for (int c = 0; c < kScoreVecs; ++c) vec::store(probs + c * L, sc[c]);
          for (int j = 0; j < nr; ++j) probs[j] = p.cap * std::tanh(probs[j] / p.cap);
          for (int c = 0; c < kScoreVecs; ++c) sc[c] = vec::load(probs + c * L);
        }
        // online softmax: new running max, rescale what was summed, the block's probabilities
        Vec top = vec::set1(kNegInf);
        for (int c = 0; c < kScoreVecs; ++c) {
          sc[c] = vec::keep_first(sc[c], std::clamp(nr - c * L, 0, L), kNegInf);
          top = vec::max(top, sc[c]);
        }
        const float m_new = std::max(s.m[h], vec::reduce_max(top));
        const float alpha = std::exp(s.m[h] - m_new);  // exp(-inf) = 0 on the first block
        Vec sum = vec::zero();
        for (int c = 0; c < kScoreVecs; ++c) {
          const Vec e = vec::keep_first(vec::vexp(vec::sub(sc[c], vec::set1(m_new))),
                                        std::clamp(nr - c * L, 0, L), 0.0f);
          vec::store(probs + c * L, e);
          sum = vec::add(sum, e);
        }
        s.l[h] = s.l[h] * alpha + vec::reduce_add(sum);
        s.m[h] = m_new;
        const Vec a = vec::set1(alpha);
        for (int i = 0; i < NV; ++i) {
          Vec out = vec::mul(acc[h * NV + i], a);
          for (int j = 0; j < nr; ++j)
            out = vec::fmadd(vec::set1(probs[j]), vec::load(vf[j] + i * L), out);
          acc[h * NV + i] = out;
        }
       }
      }
    }
  }
  for (int64_t rh = 0; rh < RH; ++rh) {
    const float l = s.l[rh];
    const Vec inv = vec::set1(l > 0 ? 1.0f / l : 0.0f);
    for (int i = 0; i < NV && i * L < D; ++i)
      vec::store(s.o.data() + rh * D + i * L, vec::mul(acc[rh * NV + i], inv), D - i * L);
    s.lse[rh] = l > 0 ? s.m[rh] + std::log(l) : kNegInf;
  }
}

template <typename T>
void write_output(const Problem& p, int64_t b, const float* o, const float* lse) {
  T* out = static_cast<T*>(p.out) + b * p.out_stride_b;
  for (int64_t h = 0; h < p.heads; ++h) {
    for (int64_t d = 0; d < p.head_dim; ++d) out[h * p.out_stride_h + d] = T(o[h * p.head_dim + d]);
    if (p.lse) p.lse[b * p.lse_stride_b + h] = lse[h];
  }
}

// Rows b .. end-1 that share b's sequence (same req_to_token row; no sliding window, whose
// start differs per row), at most kMaxGroup.
int64_t group_end(const Problem& p, int64_t batch, int64_t b) {
  int64_t end = b + 1;
  if (p.window > 0) return end;
  while (end < batch && end - b < kMaxGroup && p.rows[end] == p.rows[b]) ++end;
  return end;
}

// One item per group of rows, or several when the batch has too little parallel work for the
// threads (few requests, long sequences). Row r's partial results, if its group is split,
// take the slots [first_part[r], first_part[r + 1]), one per range.
std::vector<Item> plan(const Problem& p, int64_t batch, int64_t threads,
                       std::vector<int64_t>& first_part) {
  std::vector<std::array<int64_t, 3>> groups;  // rows [begin, end), their longest seq_len
  int64_t total = 0;
  for (int64_t b = 0; b < batch;) {
    const int64_t end = group_end(p, batch, b);
    int64_t hi = 0;
    for (int64_t r = b; r < end; ++r) hi = std::max(hi, p.seq_lens[r]);
    total += hi - first_key(p, b);
    groups.push_back({b, end, hi});
    b = end;
  }
  const int64_t target = (total + 4 * threads - 1) / (4 * threads);
  const int64_t range = std::max(kMinRange, (target + kBlock - 1) / kBlock * kBlock);
  std::vector<Item> items;
  int64_t parts = 0;
  first_part.assign(batch + 1, 0);
  for (const auto& [b, end, hi] : groups) {
    const int64_t lo = first_key(p, b);
    const int64_t pieces = std::max<int64_t>(1, (hi - lo + range - 1) / range);
    const int64_t step = ((hi - lo + pieces - 1) / pieces + kBlock - 1) / kBlock * kBlock;
    for (int64_t r = b; r < end; ++r) {
      first_part[r] = parts;
      if (pieces > 1) parts += pieces;
    }
    for (int64_t i = 0; i < pieces; ++i) {
      const int64_t a = std::min(hi, lo + i * step), z = std::min(hi, lo + (i + 1) * step);
      items.push_back({b, end - b, a, z, pieces == 1 ? -1 : i});
    }
  }
  first_part[batch] = parts;
  return items;
}

template <typename T, int NV>
void run(const Problem& p, int64_t batch) {
  const int64_t threads = at::get_num_threads();
  std::vector<int64_t> first_part;
  const std::vector<Item> items = plan(p, batch, threads, first_part);
  const int64_t H = p.heads, D = p.head_dim;
  const int64_t parts = first_part[batch];
  std::vector<float> part_o(parts * H * D), part_lse(parts * H);
  std::atomic<int64_t> next{0};
  const int64_t count = (int64_t)items.size();
  // One task per thread, each taking items from a shared counter: ragged items balance out.
  vec::parallel_chunks(std::min(threads, count), [&](int64_t) {
    Scratch s(H, NV, D);
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
      const Item& it = items[i];
      attend_range<T, NV>(p, it, s);
      for (int64_t r = 0; r < it.rows; ++r) {
        const float* o = s.o.data() + r * H * D;
        const float* lse = s.lse.data() + r * H;
        if (it.piece < 0) {
          write_output<T>(p, it.b + r, o, lse);
        } else {
          const int64_t slot = first_part[it.b + r] + it.piece;
          std::copy(o, o + H * D, part_o.data() + slot * H * D);
          std::copy(lse, lse + H, part_lse.data() + slot * H);
        }
      }
    }
  });
  if (parts == 0) return;
  // Merge the ranges of each split request by their log-sum-exp.
  vec::parallel_chunks(batch, [&](int64_t b) {
    const int64_t first = first_part[b], pieces = first_part[b + 1] - first;
    if (pieces == 0) return;
    std::vector<float> o(H * D), lse(H);
    for (int64_t h = 0; h < H; ++h) {
      float top = kNegInf;
      for (int64_t i = 0; i < pieces; ++i) top = std::max(top, part_lse[(first + i) * H + h]);
      float total = 0.0f;
      std::fill(o.begin() + h * D, o.begin() + (h + 1) * D, 0.0f);
      if (top != kNegInf) {
        for (int64_t i = 0; i < pieces; ++i) {
          const float w = std::exp(part_lse[(first + i) * H + h] - top);
          total += w;
          const float* src = part_o.data() + ((first + i) * H + h) * D;
          for (int64_t d = 0; d < D; ++d) o[h * D + d] += w * src[d];
        }
        for (int64_t d = 0; d < D; ++d) o[h * D + d] /= total;
      }
      lse[h] = top == kNegInf ? kNegInf : top + std::log(total);
    }
    write_output<T>(p, b, o.data(), lse.data());
  });
}

template <typename T>
void dispatch(const Problem& p, int64_t batch) {
  constexpr int per_chunk = 16 / vec::kLanes;  // vectors per 16 elements of a head
  switch ((p.head_dim + 15) / 16) {
#define RADIXFLOW_CASE(chunks) \
  case chunks:                 \
    return run<T, chunks * per_chunk>(p, batch);
    RADIXFLOW_CASE(1) RADIXFLOW_CASE(2) RADIXFLOW_CASE(3) RADIXFLOW_CASE(4)
    RADIXFLOW_CASE(5) RADIXFLOW_CASE(6) RADIXFLOW_CASE(7) RADIXFLOW_CASE(8)
    RADIXFLOW_CASE(9) RADIXFLOW_CASE(10) RADIXFLOW_CASE(11) RADIXFLOW_CASE(12)
    RADIXFLOW_CASE(13) RADIXFLOW_CASE(14) RADIXFLOW_CASE(15) RADIXFLOW_CASE(16)
#undef RADIXFLOW_CASE
  }
}

void decode_attention(const at::Tensor& q, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                      const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                      const at::Tensor& seq_lens, double sm_scale, double logit_cap,
                      int64_t sliding_window, const at::Tensor& out,
                      const std::optional<at::Tensor>& lse) {
  TORCH_CHECK(q.dim() == 3 && k_buffer.dim() == 3 && v_buffer.sizes() == k_buffer.sizes(),
              "q must be [B, H, D] and k/v buffers [S, KVH, D]");
  TORCH_CHECK(q.device().is_cpu() && k_buffer.device().is_cpu() && v_buffer.device().is_cpu(),
              "all tensors must be on the CPU");
  TORCH_CHECK(q.scalar_type() == k_buffer.scalar_type() &&
                  q.scalar_type() == v_buffer.scalar_type() && out.scalar_type() == q.scalar_type(),
              "q, k_buffer, v_buffer and out must share one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16,
              "dtype must be float32 or bfloat16");
  const int64_t batch = q.size(0), heads = q.size(1), head_dim = q.size(2);
  const int64_t kv_heads = k_buffer.size(1);
  TORCH_CHECK(k_buffer.size(2) == head_dim && heads % kv_heads == 0,
              "q heads/dim do not fit the KV heads/dim");
  TORCH_CHECK(head_dim <= 16 * kMaxChunks, "head_dim must be at most 256");
  TORCH_CHECK(q.stride(2) == 1 && k_buffer.stride(2) == 1 && v_buffer.stride(2) == 1 &&
                  out.stride(2) == 1 && req_to_token.stride(1) == 1,
              "q, k/v buffers, out and req_to_token must be contiguous in the last dim");
  TORCH_CHECK(out.sizes() == q.sizes(), "out must have q's shape");
  TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.scalar_type() == at::kInt,
              "req_to_token must be a 2-D int32 tensor");
  TORCH_CHECK(req_pool_indices.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong &&
                  req_pool_indices.is_contiguous() && seq_lens.is_contiguous() &&
                  req_pool_indices.numel() == batch && seq_lens.numel() == batch,
              "req_pool_indices and seq_lens must be contiguous int64 [B]");
  if (lse) {
    TORCH_CHECK(lse->scalar_type() == at::kFloat && lse->dim() == 2 && lse->size(0) == batch &&
                    lse->size(1) == heads && lse->stride(1) == 1,
                "lse must be float32 [B, H] with a contiguous last dim");
  }
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t* rows = req_pool_indices.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(rows[b] >= 0 && rows[b] < req_to_token.size(0), "req_pool_indices out of range");
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= req_to_token.size(1), "seq_lens out of range");
  }
  Problem p{q.data_ptr(),
            k_buffer.data_ptr(),
            v_buffer.data_ptr(),
            req_to_token.data_ptr<int32_t>(),
            rows,
            lens,
            out.data_ptr(),
            lse ? lse->data_ptr<float>() : nullptr,
            q.stride(0),
            q.stride(1),
            k_buffer.stride(0),
            k_buffer.stride(1),
            v_buffer.stride(0),
            v_buffer.stride(1),
            req_to_token.stride(0),
            out.stride(0),
            out.stride(1),
            lse ? lse->stride(0) : 0,
            heads,
            kv_heads,
            heads / kv_heads,
            head_dim,
            sliding_window,
            (float)sm_scale,
            (float)logit_cap};
  if (q.scalar_type() == at::kFloat) {
    dispatch<float>(p, batch);
  } else {
    dispatch<c10::BFloat16>(p, batch);
  }
}

}  // namespace

TORCH_LIBRARY(radixflow_cpu, m) {
  m.def(
      "decode_attention(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor req_to_token, "
      "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
      "int sliding_window, Tensor(a!) out, Tensor(b!)? lse) -> ()");
}

TORCH_LIBRARY_IMPL(radixflow_cpu, CPU, m) { m.impl("decode_attention", &decode_attention); }
