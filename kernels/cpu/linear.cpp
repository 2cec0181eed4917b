#include "kernels/cpu/linear.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/cpu/kquant_panels.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace sy::cpu {
namespace {

// Per-calling-thread scratch for converted activations (the step loop calls from one thread;
// pool workers only read it during the call).
struct scratch {
  std::vector<block_q8_act> q8;      // per token k / 32 blocks
  std::vector<block_q8_K> q8k;       // per token k / 256 blocks
  std::vector<int8_t> q8k_by_block;  // the same values block-major, for the AMX K-panel kernel
  std::vector<int8_t> q8_qs;         // q8_act_batch (AVX-512 VNNI)
  std::vector<float> q8_d, q8_s;
  std::vector<uint16_t> bf16;
};
thread_local scratch tls_scratch;

// Per-pool-thread scratch of the prompt GEMM: the bf16 panels being multiplied, and the output of
// a panel group that runs past the matrix's last row.
struct panel_scratch {
  std::vector<uint16_t, huge_page_allocator<uint16_t>> panels;
  std::vector<float> y;
};
thread_local panel_scratch tls_panels;

// Activation conversions before a product: split over the pool from this many tokens on.
constexpr int64_t k_parallel_tokens = 16;
// Matrix products with this many tokens or more hand out their last panels one group at a time;
// with fewer, the last shares are 1 / k_few_token_shares of a thread's share.
constexpr int64_t k_tokens_per_panel_chunk = 8;
constexpr int64_t k_few_token_shares = 32;

bool integer_type(weight_type t) { return !is_float_type(t); }
bool vnni_type(weight_type t) {
  return t == weight_type::q4_0 || t == weight_type::q4_1 || t == weight_type::q5_0 || t == weight_type::q5_1 ||
         t == weight_type::q8_0;
}

// Returns the memory map's pages under [p, p + n) to the kernel (they are re-read from the page
// cache if touched again). Only for file mappings: on anonymous memory it would zero the data.
void release_pages(const uint8_t* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n) & ~(page - 1);
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

}  // namespace

namespace {
// Integer panels (q4_0/q4_1/q5_0/q5_1/q8_0) only where the AVX-512 VNNI kernels can run
// (use_avx512_vnni_kernels: BF16 or not); elsewhere they would sit unused next to the rows.
bool avx512_cpu() {
  const auto& f = cpu_features();
  return f.avx512 && f.avx512_vnni;
}
bool builds_int_panels(weight_type t, int64_t cols) { return vnni_type(t) && cols <= k_max_int_cols && avx512_cpu(); }
// K panels on every CPU: the AVX-512 VNNI, AMX and AVX2 kernels all stream them.
bool builds_kq_panels(weight_type t) { return is_k_quant(t); }
constexpr size_t k_arena_align = 64;
}  // namespace

size_t linear::arena_bytes(weight_type type, int64_t rows, int64_t cols) {
  size_t n = 0;
  if (builds_int_panels(type, cols)) {
    n = static_cast<size_t>((rows + panel_rows - 1) / panel_rows * int_panel_lines(type, cols)) * sizeof(line64);
  } else if (builds_kq_panels(type)) {
    n = static_cast<size_t>((rows + panel_rows - 1) / panel_rows * kq_panel_lines(type, cols)) * sizeof(line64);
  } else if (huge_pages_enabled()) {
    n = row_bytes(type, cols) * static_cast<size_t>(rows);
  }
  return (n + k_arena_align - 1) / k_arena_align * k_arena_align;
}

linear::linear(weight_type type, const void* data, int64_t rows, int64_t cols, thread_pool& pool, void* arena)
    : type_(type), source_(static_cast<const uint8_t*>(data)), data_(source_), rows_(rows), cols_(cols) {
  if (cols % block_elements(type) != 0 || cols % qk != 0)
    throw std::runtime_error("linear: input width " + std::to_string(cols) + " is not a multiple of " +
                             std::to_string(std::max<int64_t>(qk, block_elements(type))) + " (" +
                             weight_type_name(type) + ")");
  row_bytes_ = static_cast<int64_t>(row_bytes(type, cols));
  n_panels_ = (rows + panel_rows - 1) / panel_rows;
  held_bytes_ = arena_bytes(type, rows, cols);
  uint8_t* held = static_cast<uint8_t*>(arena);
  if (held_bytes_ > 0 && held == nullptr) {
    own_.resize(held_bytes_);
    held = own_.data();
  }
  const bool int_panels = builds_int_panels(type_, cols_), kq_panels = builds_kq_panels(type_);
  if (int_panels || kq_panels) {
    // Repacked over the pool in chunks taken by whichever thread is free: the first write to each
    // huge page is the kernel zeroing it, which at times takes several times longer on one thread
    // than the other (a VM's host backing the page); fixed halves left the other thread waiting.
    line64* panels = reinterpret_cast<line64*>(held);
    pool.for_chunks(n_panels_, 1, 8, [&](int64_t p0, int64_t p1) {
      (int_panels ? repack_int_panels : repack_kq_panels)(type_, data_, row_bytes_, rows_, cols_, p0, p1, panels);
    });
    (int_panels ? int_panels_ : kq_panels_) = panels;
  } else if (held_bytes_ > 0) {
    // The GGUF rows copied once onto huge pages, the map's pages let go: decode streams every
    // weight each step, and on the map's 4 KiB pages that is a TLB miss every 4 KiB (measured on
    // the 1B Q4_K_M file, Zen 3, alternating runs: tg64 23-26 vs 16-23 tok/s, pp64 72-74 vs 56-72).
    std::memcpy(held, source_, file_bytes());
    data_ = held;
  }
}

void linear::release_source_pages() const {
  if (held_bytes_ > 0 && std::getenv("SY_KEEP_MAPPED_WEIGHTS") == nullptr) release_pages(source_, file_bytes());
}

bool linear::vnni_ready() const { return int_panels_ != nullptr && use_avx512_vnni_kernels(); }
bool linear::kq_ready() const { return kq_panels_ != nullptr; }

void linear::pack_panels(int64_t p0, int64_t p1, uint16_t* out) const {
  if (int_panels_) return pack_bf16_panels_from_int(type_, int_panels_, cols_, p0, p1, out);
  if (kq_panels_) return pack_bf16_panels_from_kq(type_, kq_panels_, rows_, cols_, p0, p1, out);
  pack_bf16_panels(type_, data_, row_bytes_, rows_, cols_, p0, p1, out);
}

size_t linear::keep_prompt_panels(thread_pool& pool) {
  if (prompt_on_integer_kernel() || !prompt_panels_.empty()) return prompt_panel_bytes();
  prompt_panels_.resize(static_cast<size_t>(n_panels_ * panel_rows * cols_));
  uint16_t* out = prompt_panels_.data();
  pool.run([&](int ith, int nth) {
    int64_t p0, p1;
    thread_pool::split(n_panels_, 1, ith, nth, p0, p1);
    if (p0 < p1) pack_panels(p0, p1, out + p0 * panel_rows * cols_);
  });
  return prompt_panel_bytes();
}

void linear::forward_gemv(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy, thread_pool& pool) const {
  const linear_out out{this, y, ldy};
  forward_gemv_fused({&out, 1}, x, ldx, n_tok, pool);
}

// One pool job over the panels of all layers in `outs`, concatenated and taken by the threads in
// chunks of 4 panels or more (the prompt kernels' panel groups): fn(i, p0, p1) runs panels
// [p0, p1) of layer i. With few tokens a chunk is at least a 32nd of a thread's share (a panel is
// a few microseconds; docs/cpu-backend.md, Threads); with many a panel is long enough (a 512-token
// prompt: ~0.4 ms for a panel of an 8192-wide layer) that the last chunks shrink to one group, so
// the thread that finishes first waits for one group at most.
template <class F>
void linear::for_panels(std::span<const linear_out> outs, int64_t n_tok, thread_pool& pool, F&& fn) {
  int64_t total = 0;
  for (const auto& o : outs) total += o.w->n_panels_;
  constexpr int64_t grain = 4;
  const int64_t min_chunk =
      n_tok >= k_tokens_per_panel_chunk ? grain : std::max(grain, total / (k_few_token_shares * pool.size()));
  pool.for_chunks(total, grain, min_chunk, [&](int64_t p0, int64_t p1) {
    int64_t base = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      const int64_t n = outs[i].w->n_panels_;
      const int64_t b0 = std::max(p0, base) - base, b1 = std::min(p1, base + n) - base;
      if (b0 < b1) fn(i, b0, b1);
      base += n;
    }
  });
}

void forward_gemv_fused(std::span<const linear_out> outs, const float* x, int64_t ldx, int64_t n_tok,
                        thread_pool& pool) {
  if (outs.empty() || n_tok == 0) return;
  const int64_t cols = outs[0].w->cols();
  // Which activation forms the layers need; each is made once for all of them.
  bool need_vnni = false, need_q8 = false, need_q8k = false;
  for (const auto& o : outs) {
    if (o.w->cols() != cols) throw std::invalid_argument("forward_gemv_fused: layers differ in input width");
    const weight_type t = o.w->type_;
    if (o.w->vnni_ready()) {
      need_vnni = true;
    } else if (is_k_quant(t)) {  // K panels (every CPU): q8_K activations
      need_q8k = true;
    } else if (integer_type(t)) {
      need_q8 = true;
    }
  }
  auto& sc = tls_scratch;
  q8_act_batch a;
  if (need_vnni) {
    a.n_tok = n_tok;
    a.k = cols;
    a.nb = cols / qk;
    a.nb_pad = (a.nb + 15) / 16 * 16;
    sc.q8_qs.resize(static_cast<size_t>(n_tok * cols));
    sc.q8_d.resize(static_cast<size_t>(n_tok * a.nb_pad));
    sc.q8_s.resize(static_cast<size_t>(n_tok * a.nb_pad));
    a.qs = sc.q8_qs.data();
    a.d = sc.q8_d.data();
    a.s = sc.q8_s.data();
    pool.for_each(n_tok, k_parallel_tokens, [&](int64_t t) { quantize_q8_act_avx512(x + t * ldx, a, t); });
  }
  const int64_t nb = cols / qk, nbk = cols / qk_k;
  if (need_q8) {
    sc.q8.resize(static_cast<size_t>(n_tok * nb));
    pool.for_each(n_tok, k_parallel_tokens,
                  [&](int64_t t) { quantize_row_q8_act(x + t * ldx, sc.q8.data() + t * nb, cols); });
  }
  // AMX from a full tile of tokens on (K panels: amx_kq_min_tokens): bitwise the VNNI kernels'
  // results, so no token's result depends on which of the two ran. Its activations also go
  // block-major, each token's by its own quantization job.
  const bool amx_cpu = use_amx_kernels(), amx = n_tok >= amx_int_min_tokens && amx_cpu;
  auto kq_amx = [&](const linear& w) { return amx_cpu && w.kq_ready() && n_tok >= amx_kq_min_tokens(w.type_); };
  const bool by_block = std::any_of(outs.begin(), outs.end(), [&](const linear_out& o) { return kq_amx(*o.w); });
  if (need_q8k) {
    sc.q8k.resize(static_cast<size_t>(n_tok * nbk));
    if (by_block) sc.q8k_by_block.resize(static_cast<size_t>(n_tok * cols));
    pool.for_each(n_tok, k_parallel_tokens, [&, avx512 = use_avx512_vnni_kernels()](int64_t t) {
      (avx512 ? quantize_row_q8_K_avx512 : quantize_row_q8_K_avx2)(x + t * ldx, sc.q8k.data() + t * nbk, cols);
      if (by_block) kq_qs_by_block_token(sc.q8k.data(), t, n_tok, cols, sc.q8k_by_block.data());
    });
  }
  linear::for_panels(outs, n_tok, pool, [&](size_t i, int64_t b0, int64_t b1) {
    const linear& w = *outs[i].w;
    float* y = outs[i].y;
    const int64_t ldy = outs[i].ldy;
    if (w.vnni_ready() && amx) return gemv_int_panels_amx(w.type_, w.int_panels_, w.rows_, b0, b1, a, y, ldy);
    if (w.vnni_ready()) return gemv_int_panels_avx512(w.type_, w.int_panels_, w.rows_, b0, b1, a, y, ldy);
    if (kq_amx(w))
      return gemv_kq_panels_amx(w.type_, w.kq_panels_, w.rows_, cols, b0, b1, sc.q8k.data(), sc.q8k_by_block.data(),
                                n_tok, y, ldy);
    if (w.kq_ready())
      return (use_avx512_vnni_kernels() ? gemv_kq_panels_avx512 : gemv_kq_panels_avx2)(
          w.type_, w.kq_panels_, w.rows_, cols, b0, b1, sc.q8k.data(), n_tok, y, ldy);
    const int64_t r0 = b0 * panel_rows, r1 = std::min(b1 * panel_rows, w.rows_);
    if (integer_type(w.type_))
      return gemv_q8act_avx2(w.type_, w.data_, w.row_bytes_, r0, r1, sc.q8.data(), cols, n_tok, y, ldy);
    gemv_f32act_avx2(w.type_, w.data_, w.row_bytes_, r0, r1, x, ldx, cols, n_tok, y, ldy);
  });
}

void linear::forward_gemm(const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy, thread_pool& pool) const {
  const linear_out out{this, y, ldy};
  forward_gemm_fused({&out, 1}, x, ldx, n_tok, pool);
}

bool linear::prompt_on_integer_kernel() const {
  return (is_k_quant(type_) || (integer_prompts_ && vnni_ready())) && !use_amx_kernels();
}

bool linear::use_integer_prompts() {
  integer_prompts_ = true;
  return !is_k_quant(type_) && prompt_on_integer_kernel();
}

void forward_gemm_fused(std::span<const linear_out> outs, const float* x, int64_t ldx, int64_t n_tok,
                        thread_pool& pool) {
  if (outs.empty() || n_tok == 0) return;
  const int64_t cols = outs[0].w->cols();
  for (const auto& o : outs)
    if (o.w->cols() != cols) throw std::invalid_argument("forward_gemm_fused: layers differ in input width");
  // Layers whose prompt tokens take the integer kernel run there (together), the rest below.
  if (std::any_of(outs.begin(), outs.end(), [](const linear_out& o) { return o.w->prompt_on_integer_kernel(); })) {
    std::vector<linear_out> integer, panel;
    for (const auto& o : outs) (o.w->prompt_on_integer_kernel() ? integer : panel).push_back(o);
    forward_gemv_fused(integer, x, ldx, n_tok, pool);
    if (panel.empty()) return;
    return forward_gemm_fused(panel, x, ldx, n_tok, pool);
  }
  const bool wide = use_avx512_kernels();
  const bool amx = wide && use_amx_kernels();  // tdpbf16ps on the same bf16 panels and activations
  const uint16_t* xb = nullptr;
  if (wide) {  // activations converted to bf16 once for every layer
    auto& buf = tls_scratch.bf16;
    buf.resize(static_cast<size_t>(n_tok * cols));
    uint16_t* xbw = buf.data();
    pool.for_each(n_tok, k_parallel_tokens,
                  [&](int64_t t) { convert_f32_to_bf16_avx512(x + t * ldx, xbw + t * cols, cols); });
    xb = xbw;
  }
  // Panels are converted a group at a time (4 for the AVX-512 kernel's 4-panel tiles, 1 for the
  // AVX2 one) into this thread's scratch, then multiplied by every token of the step.
  const int64_t group = wide ? 4 : 1;
  linear::for_panels(outs, n_tok, pool, [&](size_t i, int64_t b0, int64_t b1) {
    const linear& w = *outs[i].w;
    auto& ps = tls_panels;
    if (w.prompt_panels_.empty()) ps.panels.resize(static_cast<size_t>(group * panel_rows * cols));
    for (int64_t p = b0; p < b1; p += group) {
      const int64_t g = std::min(group, b1 - p);
      const uint16_t* panels = nullptr;
      if (w.prompt_panels_.empty()) {
        w.pack_panels(p, p + g, ps.panels.data());
        panels = ps.panels.data();
      } else {
        panels = w.prompt_panels_.data() + p * panel_rows * cols;  // resident (keep_prompt_panels)
      }
      const int64_t row0 = p * panel_rows;
      const bool past_end = row0 + g * panel_rows > w.rows();
      float* y = outs[i].y + row0;
      int64_t ldy = outs[i].ldy;
      if (past_end) {  // the last group: rows past the matrix go to a scratch, the rest is copied
        ps.y.resize(static_cast<size_t>(n_tok * g * panel_rows));
        y = ps.y.data();
        ldy = g * panel_rows;
      }
      if (amx)
        gemm_panels_amx(panels, cols, 0, g, xb, cols, n_tok, y, ldy);
      else if (wide)
        gemm_panels_avx512(panels, cols, 0, g, xb, cols, n_tok, y, ldy);
      else
        gemm_panels_avx2(panels, cols, 0, g, x, ldx, n_tok, y, ldy);
      if (past_end)
        for (int64_t t = 0; t < n_tok; ++t)
          std::copy(y + t * ldy, y + t * ldy + (w.rows() - row0), outs[i].y + t * outs[i].ldy + row0);
    }
  });
}

}  // namespace sy::cpu
