// A scalar model of the AMX tile instructions the kernels use, so their loops (amx_loops.hpp)
// run and are checked on any CPU: the element order of Intel's pseudo-code for tdpbf16ps (f32
// sums of bf16 products, pair element 0 then 1, k in order) and tdpbsud (exact int32 sums), and
// (tdpbssd likewise, both operands signed), and the checks where the hardware faults: a configuration palette 1
// rejects, an instruction on an unconfigured tile or with mismatched shapes. On top of the hardware, every row a tile
// loads or stores must lie inside the memory declared readable / writable (the kernel's operands, its scratch): a
// layout or edge-tile bug shows here as an exception, not as a wrong number on the first AMX machine. Tile rows past
// `rows` and bytes past `colsb` read as zero, as in hardware. DAZ/FTZ are not modelled (the tests use normal numbers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/amx_loops.hpp"
#include "kernels/cpu/quant.hpp"

namespace sy::cpu {

class amx_tile_model {
 public:
  // Memory the tiles may read (loads) or write (stores); none declared: no memory checks.
  void readable(const void* p, size_t bytes) { add(p, bytes, false); }
  void writable(void* p, size_t bytes) { add(p, bytes, true); }
  void scratch(const void* p, size_t bytes) { add(p, bytes, true); }

  void configure(const tile_config& c) {
    if (c.palette != 1) fail("palette " + std::to_string(c.palette) + " (the kernels use 1)");
    if (c.start_row != 0) fail("start_row not 0");
    for (uint8_t r : c.reserved)
      if (r != 0) fail("reserved bytes not zero");
    for (int t = 0; t < 16; ++t) {
      if (t >= 8 && (c.rows[t] != 0 || c.colsb[t] != 0)) fail("tile " + std::to_string(t) + " outside palette 1");
      if (c.rows[t] > 16 || c.colsb[t] > 64) fail("tile " + std::to_string(t) + " larger than 16 x 64 bytes");
      if ((c.rows[t] == 0) != (c.colsb[t] == 0)) fail("tile " + std::to_string(t) + " half configured");
    }
    cfg_ = c;
    configured_ = true;
    std::memset(regs_, 0, sizeof regs_);
    ++n_configs_;
  }
  void release() {
    configured_ = false;
    std::memset(regs_, 0, sizeof regs_);
  }

  template <int T>
  void zero() {
    check_tile(T);
    std::memset(regs_[T], 0, sizeof regs_[T]);
  }
  template <int T>
  void load(const void* p, int64_t stride) {
    check_tile(T);
    std::memset(regs_[T], 0, sizeof regs_[T]);
    for (int r = 0; r < cfg_.rows[T]; ++r) {
      const auto* row = static_cast<const uint8_t*>(p) + r * stride;
      check_memory(row, cfg_.colsb[T], false, "load", T, r);
      std::memcpy(regs_[T][r], row, cfg_.colsb[T]);
    }
  }
  template <int T>
  void store(void* p, int64_t stride) {
    check_tile(T);
    for (int r = 0; r < cfg_.rows[T]; ++r) {
      auto* row = static_cast<uint8_t*>(p) + r * stride;
      check_memory(row, cfg_.colsb[T], true, "store", T, r);
      std::memcpy(row, regs_[T][r], cfg_.colsb[T]);
    }
  }
  // tdpbf16ps: C[m][n] += A[m][2k] B[k][2n] then += A[m][2k+1] B[k][2n+1], k ascending.
  template <int C, int A, int B>
  void dot_bf16() {
    check_dot(C, A, B);
    for (int m = 0; m < cfg_.rows[C]; ++m)
      for (int k = 0; k < cfg_.colsb[A] / 4; ++k)
        for (int n = 0; n < cfg_.colsb[C] / 4; ++n) {
          float c = get<float>(C, m, n);
          c += bf16_to_fp32(get<uint16_t>(A, m, 2 * k)) * bf16_to_fp32(get<uint16_t>(B, k, 2 * n));
          c += bf16_to_fp32(get<uint16_t>(A, m, 2 * k + 1)) * bf16_to_fp32(get<uint16_t>(B, k, 2 * n + 1));
          put(C, m, n, c);
        }
    ++n_dots_;
  }
  // tdpbsud: C[m][n] += sum_j A[m][4k+j] (signed) * B[k][4n+j] (unsigned), k ascending, int32.
  template <int C, int A, int B>
  void dot_s8u8() {
    dot_int<C, A, B, uint8_t>();
  }
  // tdpbssd: the same with B signed.
  template <int C, int A, int B>
  void dot_s8s8() {
    dot_int<C, A, B, int8_t>();
  }

  void split_kq(kq_v64u v, const kq_sub_scale& s, line64* hi, line64* lo) { kq_split_scalar(v, s, hi, lo); }
  void fold_kq(float* acc, const int32_t* hi, const int32_t* lo, int hi_shift, const float* dw, float dx,
               const uint32_t (*mins)[16], const int16_t* sums32, const float* dmw) {
    kq_fold_scalar(acc, hi, lo, hi_shift, dw, dx, mins, sums32, dmw);
  }
  void fold_int(float (*acc)[16], const int32_t (*sums)[16], int64_t m, const float* dw, const float* mw,
                const float* dx, const float* sx, int64_t x_stride) {
    int_fold_scalar(acc, sums, m, dw, mw, dx, sx, x_stride);
  }
  void fp16x16(const void* src, float* dst) { fp16x16_scalar(src, dst); }
  void prefetch(const void*) {}

  // Counts, for tests: configurations loaded and dot-product instructions run.
  int64_t n_configs() const { return n_configs_; }
  int64_t n_dots() const { return n_dots_; }

 private:
  struct range {
    const uint8_t *b, *e;
    bool writable;
  };
  [[noreturn]] static void fail(const std::string& what) { throw std::logic_error("amx model: " + what); }
  void add(const void* p, size_t n, bool w) {
    const auto* b = static_cast<const uint8_t*>(p);
    ranges_.push_back({b, b + n, w});
  }
  void check_tile(int t) const {
    if (!configured_) fail("tile instruction before ldtilecfg");
    if (cfg_.rows[t] == 0) fail("tile " + std::to_string(t) + " not configured");
  }
  void check_memory(const uint8_t* p, int n, bool write, const char* op, int t, int r) const {
    if (ranges_.empty()) return;
    for (const auto& g : ranges_)
      if (p >= g.b && p + n <= g.e && (g.writable || !write)) return;
    fail(std::string(op) + " of tile " + std::to_string(t) + " row " + std::to_string(r) + " outside its operands");
  }
  void check_dot(int c, int a, int b) const {
    check_tile(c);
    check_tile(a);
    check_tile(b);
    if (c == a || c == b || a == b) fail("dot product with a repeated tile");
    if (cfg_.rows[c] != cfg_.rows[a]) fail("C and A rows differ");
    if (cfg_.colsb[c] != cfg_.colsb[b]) fail("C and B bytes per row differ");
    if (cfg_.colsb[a] != 4 * cfg_.rows[b]) fail("A bytes per row != 4 x B rows");
    if (cfg_.colsb[c] % 4 != 0 || cfg_.colsb[a] % 4 != 0) fail("bytes per row not a multiple of 4");
  }
  template <int C, int A, int B, class BV>
  void dot_int() {
    check_dot(C, A, B);
    for (int m = 0; m < cfg_.rows[C]; ++m)
      for (int k = 0; k < cfg_.colsb[A] / 4; ++k)
        for (int n = 0; n < cfg_.colsb[C] / 4; ++n) {
          int64_t s = get<int32_t>(C, m, n);
          for (int j = 0; j < 4; ++j)
            s += static_cast<int64_t>(get<int8_t>(A, m, 4 * k + j)) * get<BV>(B, k, 4 * n + j);
          put(C, m, n, static_cast<int32_t>(static_cast<uint32_t>(s)));  // wraps like the hardware
        }
    ++n_dots_;
  }
  template <class V>
  V get(int t, int r, int i) const {
    V v;
    std::memcpy(&v, regs_[t][r] + i * sizeof(V), sizeof(V));
    return v;
  }
  template <class V>
  void put(int t, int r, int i, V v) {
    std::memcpy(regs_[t][r] + i * sizeof(V), &v, sizeof(V));
  }

  tile_config cfg_;
  bool configured_ = false;
  uint8_t regs_[8][16][64] = {};
  std::vector<range> ranges_;
  int64_t n_configs_ = 0, n_dots_ = 0;
};

// The AMX kernels' loops on the model (amx_emulator.cpp), with the memory each may touch declared
// from its contract (gemm_kernels.hpp): the same arguments and results as gemm_panels_amx /
// gemv_int_panels_amx. Throws std::logic_error where the hardware would fault or the kernel
// strays outside its operands. `model`: optional, to read its counts afterwards.
void gemm_panels_amx_emulated(const uint16_t* panels, int64_t k, int64_t p0, int64_t p1, const uint16_t* x_bf16,
                              int64_t ldx, int64_t n_tok, float* y, int64_t ldy, amx_tile_model* model = nullptr);
void gemv_int_panels_amx_emulated(weight_type t, const line64* panels, int64_t rows, int64_t p0, int64_t p1,
                                  const q8_act_batch& a, float* y, int64_t ldy, amx_tile_model* model = nullptr);
void gemv_kq_panels_amx_emulated(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                                 const block_q8_K* a, int64_t n_tok, float* y, int64_t ldy,
                                 amx_tile_model* model = nullptr);

}  // namespace sy::cpu
