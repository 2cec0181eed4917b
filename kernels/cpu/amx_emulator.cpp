// The AMX kernels' loops (amx_loops.hpp) on the scalar tile model, with each operand's extent
// from the kernels' contracts declared to it.
#include "kernels/cpu/amx_emulator.hpp"

namespace sy::cpu {

void gemm_panels_amx_emulated(const uint16_t* panels, int64_t k, int64_t p0, int64_t p1, const uint16_t* x_bf16,
                              int64_t ldx, int64_t n_tok, float* y, int64_t ldy, amx_tile_model* model) {
  amx_tile_model own;
  amx_tile_model& tl = model ? *model : own;
  if (p0 < p1 && n_tok > 0) {
    tl.readable(panels + p0 * panel_rows * k, static_cast<size_t>((p1 - p0) * panel_rows * k) * sizeof(uint16_t));
    for (int64_t t = 0; t < n_tok; ++t) {
      tl.readable(x_bf16 + t * ldx, static_cast<size_t>(k) * sizeof(uint16_t));
      tl.writable(y + t * ldy + p0 * panel_rows, static_cast<size_t>((p1 - p0) * panel_rows) * sizeof(float));
    }
  }
  amx_gemm_panels(tl, panels, k, p0, p1, x_bf16, ldx, n_tok, y, ldy);
}

void gemv_int_panels_amx_emulated(weight_type t, const line64* panels, int64_t rows, int64_t p0, int64_t p1,
                                  const q8_act_batch& a, float* y, int64_t ldy, amx_tile_model* model) {
  amx_tile_model own;
  amx_tile_model& tl = model ? *model : own;
  const int64_t stride = int_panel_lines(t, a.nb * 32);
  if (p0 < p1 && a.n_tok > 0) {
    tl.readable(panels + p0 * stride, static_cast<size_t>((p1 - p0) * stride) * sizeof(line64));
    for (int64_t i = 0; i < a.n_tok; ++i) tl.readable(a.qs + i * a.k, static_cast<size_t>(a.nb * 32));
  }
  amx_int_panels(tl, t, panels, rows, p0, p1, a, y, ldy);
}

void gemv_kq_panels_amx_emulated(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                                 const block_q8_K* a, int64_t n_tok, float* y, int64_t ldy, amx_tile_model* model) {
  amx_tile_model own;
  amx_tile_model& tl = model ? *model : own;
  std::vector<int8_t> qs(static_cast<size_t>(n_tok * k));
  kq_qs_by_block(a, n_tok, k, qs.data());
  if (p0 < p1 && n_tok > 0) {
    int64_t first = 0, count = 0;  // the groups panels [p0, p1) lie in
    kq_span_of(t, k / qk_k, kq_n_panels(rows), p0, p1, first, count);
    tl.readable(panels + first, static_cast<size_t>(count) * sizeof(line64));
    tl.readable(qs.data(), qs.size());
  }
  amx_kq_panels(tl, t, panels, rows, k, p0, p1, a, qs.data(), n_tok, y, ldy);
}

}  // namespace sy::cpu
