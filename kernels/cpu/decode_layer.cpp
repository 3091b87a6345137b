// A decoder layer's two sublayers for a decode step (at most 8 tokens), one op each, so a
// step costs two calls per layer instead of a dozen small ops through Python:
//
//     attention sublayer  [residual += x]; h = rms_norm(residual); qkv = h W_qkv^T (+ b);
//                         [per-head q/k rms_norm]; rotary(q, k); k, v -> pool at out_cache_loc;
//                         a = decode_attention(q); out = a W_o^T
//     MLP sublayer        residual += x; h = rms_norm(residual); out = silu_and_mul(h W_gu^T) W_d^T
//
// Each ends at its projection's output, so a tensor-parallel caller can all-reduce it there.
// Without tensor parallelism, DecodeLayers (a TorchScript class) holds a model's layers, checked
// once when bound, and runs a step's every layer in one call.
// The row-wise ops and the attention are the library's own kernels, called through the
// dispatcher; a projection is a list of segments (output rows of one kind each), run by
//
//     ""              float weight [rows, K] in x's dtype    -> small_linear
//     q4_0 q4_1 q8_0  packed 32-weight blocks                -> quant_blocks.h's packed_matmul,
//     q?_?x16         interleaved by 16 rows                 -> interleaved_matmul, x in fp32
//                                                               or, with int8_activations,
//                                                               quantized to int8 once per
//                                                               projection
//     other qtypes    packed (K-quants)                      -> quant_linear (fp32 products,
//                                                               x on its int8 grid with
//                                                               int8_activations)
//
// These are the kernels quant_linear runs for these formats too, so a row's result is the
// same bits through either op and whatever the number of rows (quant_blocks.h).
//
// Before each stretch of single-threaded work the next projection's weights are warmed: a
// helper of the work pool prefetches them meanwhile (work_pool.h `warm`).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <string>
#include <vector>

#include "interleaved_blocks.h"
#include "work_pool.h"

namespace blocks = radixflow_cpu::blocks;

namespace {

constexpr int64_t kMaxRows = 8;

// -- the library's other kernels, through the dispatcher -------------------------------------

template <typename Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

void rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& residual,
              const at::Tensor& weight, double eps, const at::Tensor& out) {
  static const auto handle =
      op<void(const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&, double,
              at::Tensor)>("radixflow_cpu::rms_norm");
  handle.call(x, residual, weight, eps, out);
}

void silu_and_mul(const at::Tensor& gate_up, const at::Tensor& out) {
  static const auto handle =
      op<void(const at::Tensor&, at::Tensor)>("radixflow_cpu::silu_and_mul");
  handle.call(gate_up, out);
}

void rotary_neox(const at::Tensor& x, const at::Tensor& cos_sin, int64_t rotary_dim) {
  static const auto handle =
      op<void(at::Tensor, const at::Tensor&, int64_t)>("radixflow_cpu::rotary_neox");
  handle.call(x, cos_sin, rotary_dim);
}

void small_linear(const at::Tensor& x, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias, const at::Tensor& out) {
  static const auto handle =
      op<void(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
              const at::Tensor&)>("radixflow_cpu::small_linear");
  handle.call(x, weight, bias, out);
}

void quant_linear(const at::Tensor& x, const at::Tensor& packed, const std::string& qtype,
                  int64_t k, const std::optional<at::Tensor>& bias, const at::Tensor& out,
                  bool int8_activations) {
  static const auto handle =
      op<void(const at::Tensor&, const at::Tensor&, const std::string&, int64_t,
              const std::optional<at::Tensor>&, const at::Tensor&, bool)>(
          "radixflow_cpu::quant_linear");
  handle.call(x, packed, qtype, k, bias, out, int8_activations);
}

void decode_attention(const at::Tensor& q, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                      const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                      const at::Tensor& seq_lens, double scale, double logit_cap,
                      int64_t sliding_window, const at::Tensor& out) {
  static const auto handle =
      op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, const at::Tensor&, double, double, int64_t, const at::Tensor&,
              const std::optional<at::Tensor>&)>("radixflow_cpu::decode_attention");
  handle.call(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, scale, logit_cap,
              sliding_window, out, std::nullopt);
}

// -- a projection: segments of output rows -------------------------------------------------

// Bytes of one block of a fast qtype (those packed_matmul or interleaved_matmul run), else 0.
int64_t fast_block_bytes(const std::string& qtype) {
  if (qtype == "q8_0" || qtype == "q8_0x16") return blocks::Q8::kBytes;
  if (qtype == "q4_0" || qtype == "q4_0x16") return blocks::Q4<false>::kBytes;
  if (qtype == "q4_1" || qtype == "q4_1x16") return blocks::Q4<true>::kBytes;
  return 0;
}

// x for the fast segments, made once per projection: fp32 rows, or those rows quantized to
// int8 per block of 32 (quant_blocks.h).
class FastX {
 public:
  FastX(const at::Tensor& x, bool int8_x) : x_(x), int8_x_(int8_x) {}

  // y [M, rows] (row stride ldy) = x W^T (+ bias) for one segment of a fast qtype.
  template <typename Out>
  void multiply(const at::Tensor& packed, const std::string& qtype, const Out* bias, Out* y,
                int64_t ldy) {
    if (!xf_.defined()) {
      xf_ = x_.to(at::kFloat).contiguous();
      if (int8_x_) xq_.emplace(xf_.data_ptr<float>(), xf_.size(0), xf_.size(1));
    }
    const blocks::Packed p{packed.data_ptr<uint8_t>(), packed.size(0), xf_.size(1),
                           packed.size(1)};
    if (qtype == "q4_0") return run<blocks::Plain<blocks::Q4<false>>>(p, bias, y, ldy);
    if (qtype == "q4_1") return run<blocks::Plain<blocks::Q4<true>>>(p, bias, y, ldy);
    if (qtype == "q8_0x16") return run<blocks::Interleaved<blocks::Q8Rows>>(p, bias, y, ldy);
    if (qtype == "q4_0x16") return run<blocks::Interleaved<blocks::Q4Rows<false>>>(p, bias, y, ldy);
    if (qtype == "q4_1x16") return run<blocks::Interleaved<blocks::Q4Rows<true>>>(p, bias, y, ldy);
    run<blocks::Plain<blocks::Q8>>(p, bias, y, ldy);
  }

 private:
  template <typename Layout, typename Out>
  void run(const blocks::Packed& p, const Out* bias, Out* y, int64_t ldy) {
    const int64_t m = xf_.size(0);
    if (xq_) return Layout::matmul(p, xq_->view(), m, bias, y, ldy);
    Layout::matmul(p, blocks::FloatX{xf_.data_ptr<float>(), xf_.size(1)}, m, bias, y, ldy);
  }

  const at::Tensor& x_;
  bool int8_x_;
  at::Tensor xf_;
  std::optional<blocks::QuantizedRows> xq_;
};

// out [M, N] = x [M, K] W^T (+ bias), W the concatenation of `weights` by output rows; the
// packed segments take x quantized to int8 when int8_x.
void project(const at::Tensor& x, const std::vector<at::Tensor>& weights,
             const std::vector<std::string>& qtypes, const std::optional<at::Tensor>& bias,
             const at::Tensor& out, bool int8_x) {
  const int64_t k = x.size(1);
  FastX fast(x, int8_x);
  int64_t first = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i];
    const int64_t rows = w.size(0);
    const at::Tensor y = out.narrow(1, first, rows);
    const std::optional<at::Tensor> b =
        bias ? std::optional<at::Tensor>(bias->narrow(0, first, rows)) : std::nullopt;
    if (qtypes[i].empty()) {
      small_linear(x, w, b, y);
    } else if (fast_block_bytes(qtypes[i]) > 0) {
      if (x.scalar_type() == at::kFloat)
        fast.multiply<float>(w, qtypes[i], b ? b->data_ptr<float>() : nullptr,
                             y.data_ptr<float>(), y.stride(0));
      else
        fast.multiply<c10::BFloat16>(w, qtypes[i], b ? b->data_ptr<c10::BFloat16>() : nullptr,
                                     y.data_ptr<c10::BFloat16>(), y.stride(0));
    } else {
      quant_linear(x, w, qtypes[i], k, b, y, int8_x);
    }
    first += rows;
  }
}

int64_t check_projection(const std::vector<at::Tensor>& weights,
                         const std::vector<std::string>& qtypes, int64_t k, at::ScalarType dtype,
                         const char* name) {
  TORCH_CHECK(!weights.empty() && weights.size() == qtypes.size(), name,
              ": one qtype per weight segment, at least one segment");
  int64_t rows = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i];
    TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.device().is_cpu(), name,
                ": weight segments must be contiguous 2-D CPU tensors");
    if (qtypes[i].empty()) {
      TORCH_CHECK(w.scalar_type() == dtype && w.size(1) == k, name,
                  ": a float segment must be [rows, ", k, "] in x's dtype");
    } else {
      TORCH_CHECK(w.scalar_type() == at::kByte, name, ": a packed segment must be uint8");
      if (const int64_t bytes = fast_block_bytes(qtypes[i]); bytes > 0) {
        const int64_t blocks_per_row = k / blocks::kBlock;
        TORCH_CHECK(k % blocks::kBlock == 0 && w.size(1) == blocks_per_row * bytes, name, ": ",
                    qtypes[i], " rows of K=", k, " take ", blocks_per_row * bytes, " bytes, got ",
                    w.size(1));
      }
    }
    rows += w.size(0);
  }
  return rows;
}

void check_rows(const at::Tensor& t, const char* name, int64_t tokens, int64_t width,
                at::ScalarType dtype) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == tokens && t.size(1) == width && t.is_contiguous() &&
                  t.scalar_type() == dtype && t.device().is_cpu(),
              name, " must be a contiguous CPU [", tokens, ", ", width, "] tensor in x's dtype");
}

void check_x(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= kMaxRows && x.is_contiguous() &&
                  x.device().is_cpu(),
              "x must be a contiguous CPU tensor of 1 to 8 rows");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "x must be float32 or bfloat16");
}

// h = rms_norm(residual += x), or rms_norm(x) without a residual (the first layer).
at::Tensor input_norm(const at::Tensor& x, const std::optional<at::Tensor>& residual,
                      const at::Tensor& norm_weight, double eps) {
  const at::Tensor h = at::empty_like(x);
  if (residual) {
    check_rows(*residual, "residual", x.size(0), x.size(1), x.scalar_type());
    rms_norm(x, residual, norm_weight, eps, h);
  } else {
    rms_norm(x, std::nullopt, norm_weight, eps, h);
  }
  return h;
}

// The tokens' rows of `src` [tokens, heads, head_dim] (rows may be strided) into the pool's
// slots `loc` (what index_copy_ does, without its per-call setup).
void store_rows(const at::Tensor& pool, const at::Tensor& loc, const at::Tensor& src) {
  TORCH_CHECK(src.stride(2) == 1 && src.stride(1) == src.size(2), "k/v rows must be whole");
  const int64_t slots = pool.size(0), row_bytes = src.size(1) * src.size(2) * src.element_size();
  const int64_t* where = loc.data_ptr<int64_t>();
  auto* dst = static_cast<char*>(pool.data_ptr());
  const auto* from = static_cast<const char*>(src.data_ptr());
  for (int64_t t = 0; t < src.size(0); ++t) {
    TORCH_CHECK(where[t] >= 0 && where[t] < slots, "out_cache_loc[", t, "] = ", where[t],
                " is outside the pool's ", slots, " slots");
    std::memcpy(dst + where[t] * row_bytes, from + t * src.stride(0) * src.element_size(),
                row_bytes);
  }
}

void check_norm(const at::Tensor& weight, int64_t size, at::ScalarType dtype, const char* name) {
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == size && weight.scalar_type() == dtype &&
                  weight.is_contiguous(),
              name, " must be a contiguous [", size, "] tensor in x's dtype");
}

// One layer's attention sublayer: its weights and knobs, checked once against the model's
// hidden size and dtype.
struct AttentionLayer {
  at::Tensor norm;
  double eps;
  std::vector<at::Tensor> qkv;
  std::vector<std::string> qkv_qtypes;
  std::optional<at::Tensor> qkv_bias, q_norm, k_norm;
  int64_t num_heads, num_kv_heads, head_dim;
  double scale, logit_cap;
  int64_t sliding_window;
  std::vector<at::Tensor> o;
  std::vector<std::string> o_qtypes;
  bool int8_activations;

  void check(int64_t hidden, at::ScalarType dtype) const {
    check_norm(norm, hidden, dtype, "the attention norm's weight");
    if (q_norm) check_norm(*q_norm, head_dim, dtype, "q_norm's weight");
    if (k_norm) check_norm(*k_norm, head_dim, dtype, "k_norm's weight");
    const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
    TORCH_CHECK(check_projection(qkv, qkv_qtypes, hidden, dtype, "qkv") == q_size + 2 * kv_size,
                "qkv must have num_heads * head_dim + 2 * num_kv_heads * head_dim rows");
    TORCH_CHECK(check_projection(o, o_qtypes, q_size, dtype, "o") == hidden,
                "o must have hidden rows");
  }
};

// The pool and this step's places in it (decode_layer.py's PagedKV).
struct StepKV {
  const at::Tensor& k_buffer;
  const at::Tensor& v_buffer;
  const at::Tensor& out_cache_loc;
  const at::Tensor& req_to_token;
  const at::Tensor& req_pool_indices;
  const at::Tensor& seq_lens;
};

// Starts pulling these projections' weight segments, in order, towards the caches on a helper
// thread while the caller works alone, until the next matmul (work_pool.h). Each sublayer warms
// the projection after each stretch of single-threaded work (norms, rotary, attention,
// SiLU-and-mul), and `then`, the projection that follows its last (nullptr: none known).
void warm(std::initializer_list<const std::vector<at::Tensor>*> projections) {
  std::vector<radixflow_cpu::WorkPool::Range> ranges;
  for (const std::vector<at::Tensor>* p : projections)
    if (p != nullptr)
      for (const at::Tensor& w : *p) ranges.emplace_back(w.data_ptr(), w.nbytes());
  radixflow_cpu::WorkPool::instance().warm(ranges);
}

void attention_sublayer(const AttentionLayer& w, const at::Tensor& x,
                        const std::optional<at::Tensor>& residual, const at::Tensor& cos_sin,
                        int64_t rotary_dim, const StepKV& kv, const at::Tensor& out,
                        const std::vector<at::Tensor>* then = nullptr) {
  const int64_t tokens = x.size(0), hidden = x.size(1);
  const int64_t q_size = w.num_heads * w.head_dim, kv_size = w.num_kv_heads * w.head_dim;
  check_rows(out, "out", tokens, hidden, x.scalar_type());
  TORCH_CHECK(kv.out_cache_loc.scalar_type() == at::kLong && kv.out_cache_loc.numel() == tokens &&
                  kv.out_cache_loc.is_contiguous(),
              "out_cache_loc must be contiguous int64 [tokens]");
  for (const at::Tensor* buffer : {&kv.k_buffer, &kv.v_buffer})
    TORCH_CHECK(buffer->dim() == 3 && buffer->size(1) == w.num_kv_heads &&
                    buffer->size(2) == w.head_dim && buffer->scalar_type() == x.scalar_type() &&
                    buffer->is_contiguous(),
                "k/v buffers must be contiguous [slots, num_kv_heads, head_dim] in x's dtype");

  const at::Tensor h = input_norm(x, residual, w.norm, w.eps);
  const at::Tensor qkv = at::empty({tokens, q_size + 2 * kv_size}, x.options());
  project(h, w.qkv, w.qkv_qtypes, w.qkv_bias, qkv, w.int8_activations);
  warm({&w.o, then});
  at::Tensor q = qkv.narrow(1, 0, q_size).view({tokens, w.num_heads, w.head_dim});
  at::Tensor k = qkv.narrow(1, q_size, kv_size).view({tokens, w.num_kv_heads, w.head_dim});
  const at::Tensor v =
      qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, w.num_kv_heads, w.head_dim});
  if (w.q_norm) {  // Qwen3: RMSNorm over each head, into fresh contiguous q, k
    const at::Tensor qn = at::empty({tokens * w.num_heads, w.head_dim}, x.options());
    const at::Tensor kn = at::empty({tokens * w.num_kv_heads, w.head_dim}, x.options());
    rms_norm(q.reshape({tokens * w.num_heads, w.head_dim}), std::nullopt, *w.q_norm, w.eps, qn);
    rms_norm(k.reshape({tokens * w.num_kv_heads, w.head_dim}), std::nullopt, *w.k_norm, w.eps,
             kn);
    q = qn.view({tokens, w.num_heads, w.head_dim});
    k = kn.view({tokens, w.num_kv_heads, w.head_dim});
  }
  rotary_neox(q, cos_sin, rotary_dim);
  rotary_neox(k, cos_sin, rotary_dim);
  store_rows(kv.k_buffer, kv.out_cache_loc, k);
  store_rows(kv.v_buffer, kv.out_cache_loc, v);
  const at::Tensor attn = at::empty({tokens, w.num_heads, w.head_dim}, x.options());
  decode_attention(q, kv.k_buffer, kv.v_buffer, kv.req_to_token, kv.req_pool_indices,
                   kv.seq_lens, w.scale, w.logit_cap, w.sliding_window, attn);
  project(attn.view({tokens, q_size}), w.o, w.o_qtypes, std::nullopt, out, w.int8_activations);
}

// One layer's MLP sublayer, checked once as AttentionLayer.
struct MlpLayer {
  at::Tensor norm;
  double eps;
  std::vector<at::Tensor> gate_up;
  std::vector<std::string> gate_up_qtypes;
  std::vector<at::Tensor> down;
  std::vector<std::string> down_qtypes;
  bool int8_activations;

  int64_t check(int64_t hidden, at::ScalarType dtype) const {
    check_norm(norm, hidden, dtype, "the MLP norm's weight");
    const int64_t rows = check_projection(gate_up, gate_up_qtypes, hidden, dtype, "gate_up");
    TORCH_CHECK(rows % 2 == 0, "gate_up must have an even number of rows");
    TORCH_CHECK(check_projection(down, down_qtypes, rows / 2, dtype, "down") == hidden,
                "down must have hidden rows and take the intermediate size");
    return rows;
  }
};

void mlp_sublayer(const MlpLayer& w, int64_t gate_up_rows, const at::Tensor& x,
                  const at::Tensor& residual, const at::Tensor& out,
                  const std::vector<at::Tensor>* then = nullptr) {
  const int64_t tokens = x.size(0);
  check_rows(out, "out", tokens, x.size(1), x.scalar_type());
  warm({&w.gate_up});
  const at::Tensor h = input_norm(x, residual, w.norm, w.eps);
  const at::Tensor gate_up = at::empty({tokens, gate_up_rows}, x.options());
  project(h, w.gate_up, w.gate_up_qtypes, std::nullopt, gate_up, w.int8_activations);
  warm({&w.down, then});
  const at::Tensor act = at::empty({tokens, gate_up_rows / 2}, x.options());
  silu_and_mul(gate_up, act);
  project(act, w.down, w.down_qtypes, std::nullopt, out, w.int8_activations);
  warm({then});
}

void decode_linear(const at::Tensor& x, at::TensorList weights, std::vector<std::string> qtypes,
                   const std::optional<at::Tensor>& bias, const at::Tensor& out,
                   bool int8_activations) {
  check_x(x);
  const std::vector<at::Tensor> w(weights.begin(), weights.end());
  const int64_t n = check_projection(w, qtypes, x.size(1), x.scalar_type(), "weights");
  check_rows(out, "out", x.size(0), n, x.scalar_type());
  if (bias) check_rows(bias->view({1, -1}), "bias", 1, n, x.scalar_type());
  project(x, w, qtypes, bias, out, int8_activations);
}

void decode_attention_block(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& norm_weight,
    double eps, at::TensorList qkv_weights, std::vector<std::string> qkv_qtypes,
    const std::optional<at::Tensor>& qkv_bias, const std::optional<at::Tensor>& q_norm_weight,
    const std::optional<at::Tensor>& k_norm_weight, const at::Tensor& cos_sin, int64_t rotary_dim,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, const at::Tensor& k_buffer,
    const at::Tensor& v_buffer, const at::Tensor& out_cache_loc, const at::Tensor& req_to_token,
    const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, double scale,
    double logit_cap, int64_t sliding_window, at::TensorList o_weights,
    std::vector<std::string> o_qtypes, const at::Tensor& out, bool int8_activations) {
  check_x(x);
  const AttentionLayer w{norm_weight,
                         eps,
                         {qkv_weights.begin(), qkv_weights.end()},
                         std::move(qkv_qtypes),
                         qkv_bias,
                         q_norm_weight,
                         k_norm_weight,
                         num_heads,
                         num_kv_heads,
                         head_dim,
                         scale,
                         logit_cap,
                         sliding_window,
                         {o_weights.begin(), o_weights.end()},
                         std::move(o_qtypes),
                         int8_activations};
  w.check(x.size(1), x.scalar_type());
  const StepKV kv{k_buffer, v_buffer, out_cache_loc, req_to_token, req_pool_indices, seq_lens};
  attention_sublayer(w, x, residual, cos_sin, rotary_dim, kv, out);
}

void decode_mlp_block(const at::Tensor& x, const at::Tensor& residual,
                      const at::Tensor& norm_weight, double eps, at::TensorList gate_up_weights,
                      std::vector<std::string> gate_up_qtypes, at::TensorList down_weights,
                      std::vector<std::string> down_qtypes, const at::Tensor& out,
                      bool int8_activations) {
  check_x(x);
  const MlpLayer w{norm_weight,
                   eps,
                   {gate_up_weights.begin(), gate_up_weights.end()},
                   std::move(gate_up_qtypes),
                   {down_weights.begin(), down_weights.end()},
                   std::move(down_qtypes),
                   int8_activations};
  mlp_sublayer(w, w.check(x.size(1), x.scalar_type()), x, residual, out);
}

// A model's decoder layers, bound once (their weights checked then), run for a decode step in
// one call: the layer loop of runtime/layers/decode_block.py without a Python call and a trip
// through the dispatcher per sublayer (a third of a batch-1 step's time before).
class DecodeLayers : public torch::CustomClassHolder {
 public:
  // The next layer: its attention sublayer's arguments as decode_attention_block's, less x,
  // the residual, rotary and the step's K/V; its MLP's as decode_mlp_block's; `kv_index`:
  // its K/V buffers' index in the lists forward takes. The first layer's input norm weight
  // sets the hidden size and dtype the others are checked against.
  void add_layer(at::Tensor attn_norm, double attn_eps, std::vector<at::Tensor> qkv,
                 std::vector<std::string> qkv_qtypes, std::optional<at::Tensor> qkv_bias,
                 std::optional<at::Tensor> q_norm, std::optional<at::Tensor> k_norm,
                 int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scale,
                 double logit_cap, int64_t sliding_window, std::vector<at::Tensor> o,
                 std::vector<std::string> o_qtypes, bool attn_int8, at::Tensor mlp_norm,
                 double mlp_eps, std::vector<at::Tensor> gate_up,
                 std::vector<std::string> gate_up_qtypes, std::vector<at::Tensor> down,
                 std::vector<std::string> down_qtypes, bool mlp_int8, int64_t kv_index) {
    Layer layer{{std::move(attn_norm), attn_eps, std::move(qkv), std::move(qkv_qtypes),
                 std::move(qkv_bias), std::move(q_norm), std::move(k_norm), num_heads,
                 num_kv_heads, head_dim, scale, logit_cap, sliding_window, std::move(o),
                 std::move(o_qtypes), attn_int8},
                {std::move(mlp_norm), mlp_eps, std::move(gate_up), std::move(gate_up_qtypes),
                 std::move(down), std::move(down_qtypes), mlp_int8},
                0,
                kv_index};
    if (layers_.empty()) {
      hidden_ = layer.attention.norm.size(0);
      dtype_ = layer.attention.norm.scalar_type();
    }
    layer.attention.check(hidden_, dtype_);
    layer.gate_up_rows = layer.mlp.check(hidden_, dtype_);
    TORCH_CHECK(kv_index >= 0, "kv_index must be non-negative, got ", kv_index);
    layers_.push_back(std::move(layer));
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // Starts pulling the first layer's weights towards the caches while the caller goes on
  // alone (sampling, the engine's bookkeeping) until the next forward's first matmul.
  void warm_first() const {
    if (layers_.empty()) return;
    const Layer& first = layers_.front();
    warm({&first.attention.qkv, &first.attention.o, &first.mlp.gate_up, &first.mlp.down});
  }

  // x [tokens, hidden] (the embeddings) through every layer: (the last MLP's output, the
  // residual stream without it), as decode_block.py's loop returns them. x becomes the
  // residual stream (updated in place), as there.
  std::tuple<at::Tensor, at::Tensor> forward(
      at::Tensor x, at::Tensor cos_sin, std::vector<at::Tensor> k_buffers,
      std::vector<at::Tensor> v_buffers, at::Tensor out_cache_loc, at::Tensor req_to_token,
      at::Tensor req_pool_indices, at::Tensor seq_lens) {
    check_x(x);
    TORCH_CHECK(!layers_.empty(), "no layers were added");
    TORCH_CHECK(x.size(1) == hidden_ && x.scalar_type() == dtype_, "x must be [tokens, ",
                hidden_, "] in the layers' dtype");
    const int64_t rotary_dim = cos_sin.size(1);
    std::optional<at::Tensor> residual;
    at::Tensor attn = at::empty_like(x), next = at::empty_like(x);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      const Layer* following = i + 1 < layers_.size() ? &layers_[i + 1] : nullptr;
      TORCH_CHECK(layer.kv_index < static_cast<int64_t>(k_buffers.size()) &&
                      layer.kv_index < static_cast<int64_t>(v_buffers.size()),
                  "no K/V buffer at index ", layer.kv_index);
      const StepKV kv{k_buffers[layer.kv_index], v_buffers[layer.kv_index], out_cache_loc,
                      req_to_token,              req_pool_indices,          seq_lens};
      attention_sublayer(layer.attention, x, residual, cos_sin, rotary_dim, kv, attn,
                         &layer.mlp.gate_up);
      if (!residual) residual = x;
      mlp_sublayer(layer.mlp, layer.gate_up_rows, attn, *residual, next,
                   following ? &following->attention.qkv : nullptr);
      std::swap(x, next);
      // after the first layer `next` is the input, now the residual stream: not a scratch
      if (next.is_same(*residual)) next = at::empty_like(x);
    }
    return {x, *residual};
  }

 private:
  struct Layer {
    AttentionLayer attention;
    MlpLayer mlp;
    int64_t gate_up_rows;
    int64_t kv_index;
  };
  int64_t hidden_ = 0;
  at::ScalarType dtype_ = at::kFloat;
  std::vector<Layer> layers_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixflow_cpu, m) {
  m.def(
      "decode_linear(Tensor x, Tensor[] weights, str[] qtypes, Tensor? bias, Tensor(a!) out, "
      "bool int8_activations=False) -> ()");
  m.def(
      "decode_attention_block(Tensor x, Tensor(a!)? residual, Tensor norm_weight, float eps, "
      "Tensor[] qkv_weights, str[] qkv_qtypes, Tensor? qkv_bias, Tensor? q_norm_weight, "
      "Tensor? k_norm_weight, Tensor cos_sin, int rotary_dim, int num_heads, int num_kv_heads, "
      "int head_dim, Tensor(b!) k_buffer, Tensor(c!) v_buffer, Tensor out_cache_loc, "
      "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float scale, "
      "float logit_cap, int sliding_window, Tensor[] o_weights, str[] o_qtypes, "
      "Tensor(d!) out, bool int8_activations=False) -> ()");
  m.def(
      "decode_mlp_block(Tensor x, Tensor(a!) residual, Tensor norm_weight, float eps, "
      "Tensor[] gate_up_weights, str[] gate_up_qtypes, Tensor[] down_weights, "
      "str[] down_qtypes, Tensor(b!) out, bool int8_activations=False) -> ()");
}

TORCH_LIBRARY_FRAGMENT(radixflow_cpu, m) {
  m.class_<DecodeLayers>("DecodeLayers")
      .def(torch::init<>())
      .def("add_layer", &DecodeLayers::add_layer)
      .def("num_layers", &DecodeLayers::num_layers)
      .def("warm_first", &DecodeLayers::warm_first)
      .def("forward", &DecodeLayers::forward);
}

TORCH_LIBRARY_IMPL(radixflow_cpu, CPU, m) {
  m.impl("decode_linear", &decode_linear);
  m.impl("decode_attention_block", &decode_attention_block);
  m.impl("decode_mlp_block", &decode_mlp_block);
}
