// CPU kernels against scalar references: integer GEMV and bf16 panel GEMM for every weight
// type, on both kernel families (AVX-512 where the CPU has it, and the portable AVX2 one),
// with guard bytes around outputs; and the row ops of the forward pass.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/gemm_kernels.hpp"
#include "kernels/cpu/huge_pages.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cpu/thread_pool.hpp"

using namespace sy::cpu;

namespace {

std::mt19937 rng(1234);

std::vector<float> random_floats(size_t n, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A random weight matrix in `t`, as raw row-major bytes.
std::vector<uint8_t> random_weights(weight_type t, int64_t rows, int64_t cols) {
  std::vector<uint8_t> w(row_bytes(t, cols) * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.001f, 0.05f);
  const int64_t nb = cols / qk;
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + r * row_bytes(t, cols);
    switch (t) {
      case weight_type::f32: {
        auto v = random_floats(cols, 0.1f);
        std::memcpy(row, v.data(), 4 * cols);
        break;
      }
      case weight_type::f16:
      case weight_type::bf16: {
        auto v = random_floats(cols, 0.1f);
        auto* p = reinterpret_cast<uint16_t*>(row);
        for (int64_t i = 0; i < cols; ++i) p[i] = t == weight_type::f16 ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
        break;
      }
      case weight_type::q4_0: {
        auto* b = reinterpret_cast<block_q4_0*>(row);
        for (int64_t i = 0; i < nb; ++i) {
          b[i].d = fp32_to_fp16(sc(rng));
          for (auto& q : b[i].qs) q = static_cast<uint8_t>(byte(rng));
        }
        break;
      }
      case weight_type::q4_1: {
        auto* b = reinterpret_cast<block_q4_1*>(row);
        for (int64_t i = 0; i < nb; ++i) {
          b[i].d = fp32_to_fp16(sc(rng));
          b[i].m = fp32_to_fp16(-8 * sc(rng));
          for (auto& q : b[i].qs) q = static_cast<uint8_t>(byte(rng));
        }
        break;
      }
      case weight_type::q8_0: {
        auto* b = reinterpret_cast<block_q8_0*>(row);
        for (int64_t i = 0; i < nb; ++i) {
          b[i].d = fp32_to_fp16(sc(rng) / 16);
          for (auto& q : b[i].qs) q = static_cast<int8_t>(byte(rng) % 255 - 127);
        }
        break;
      }
      case weight_type::q5_0:
      case weight_type::q5_1: {
        // d, then m (q5_1), then 4 bytes of fifth bits and 16 of nibbles, all random.
        const size_t bytes = t == weight_type::q5_0 ? sizeof(block_q5_0) : sizeof(block_q5_1);
        for (int64_t i = 0; i < nb; ++i) {
          uint8_t* b = row + i * bytes;
          for (size_t j = 0; j < bytes; ++j) b[j] = static_cast<uint8_t>(byte(rng));
          const uint16_t d = fp32_to_fp16(sc(rng) / 2), m = fp32_to_fp16(-16 * sc(rng) / 2);
          std::memcpy(b, &d, 2);
          if (t == weight_type::q5_1) std::memcpy(b + 2, &m, 2);
        }
        break;
      }
      case weight_type::q4_k:
      case weight_type::q5_k:
      case weight_type::q6_k: {
        // Random bytes everywhere (scales, mins, quants), then sane super-block scales.
        const size_t bytes = row_bytes(t, qk_k);
        for (int64_t i = 0; i < cols / qk_k; ++i) {
          uint8_t* b = row + i * bytes;
          for (size_t j = 0; j < bytes; ++j) b[j] = static_cast<uint8_t>(byte(rng));
          if (t == weight_type::q6_k) {
            const uint16_t d = fp32_to_fp16(sc(rng) / 64);
            std::memcpy(b + bytes - 2, &d, 2);
          } else {
            const uint16_t d = fp32_to_fp16(sc(rng) / 32), dmin = fp32_to_fp16(sc(rng) / 8);
            std::memcpy(b, &d, 2);
            std::memcpy(b + 2, &dmin, 2);
          }
        }
        break;
      }
    }
  }
  return w;
}

// Normalised mean squared error of `got` against `ref`.
double nmse(const std::vector<double>& ref, const float* got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (ref[i] - got[i]) * (ref[i] - got[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

constexpr float guard_value = 12345.f;
constexpr int64_t guard = 64;

struct guarded {
  std::vector<float> buf;
  explicit guarded(size_t n) : buf(n + 2 * guard, std::nanf("")) {
    for (int64_t i = 0; i < guard; ++i) buf[i] = buf[buf.size() - 1 - i] = guard_value;
  }
  float* data() { return buf.data() + guard; }
  bool guards_intact() const {
    for (int64_t i = 0; i < guard; ++i)
      if (buf[i] != guard_value || buf[buf.size() - 1 - i] != guard_value) return false;
    return true;
  }
};

// The kernel families this CPU can run, each switched on in this process by use(): the portable
// AVX2 kernels; the AVX-512 VNNI ones without BF16 (what an Ice Lake or Cascade Lake Xeon runs);
// all of AVX-512 (AMX stays as the process found it).
struct isa_mode {
  const char* name;
  bool portable, no_bf16;
  void use() const {
    force_portable_kernels(portable);
    force_bf16_off(no_bf16);
  }
};
std::vector<isa_mode> isa_modes() {
  std::vector<isa_mode> m{{"avx2", true, false}};
  if (cpu_features().avx512 && cpu_features().avx512_vnni) m.push_back({"avx512-vnni", false, true});
  if (cpu_features().avx512 && cpu_features().avx512_vnni && cpu_features().avx512_bf16)
    m.push_back({"avx512", false, false});
  return m;
}
void default_kernels() { isa_mode{"default", false, false}.use(); }

}  // namespace

TEST_CASE("fp16 and bf16 conversions round-trip representable values") {
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 0.000061035156f}) CHECK(fp16_to_fp32(fp32_to_fp16(f)) == f);
  for (float f : {0.f, 1.f, -2.5f, 3.0e38f}) CHECK(bf16_to_fp32(fp32_to_bf16(f)) == Approx(f).epsilon(0.004));
  CHECK(fp32_to_bf16(1.00390625f) == 0x3f80);  // halfway: ties to even
}

TEST_CASE("activation quantization matches its definition") {
  auto x = random_floats(64, 3.f);
  std::vector<block_q8_act> a(2);
  quantize_row_q8_act(x.data(), a.data(), 64);
  for (int b = 0; b < 2; ++b) {
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      CHECK(std::fabs(a[b].qs[j] * a[b].d - x[b * 32 + j]) <= a[b].d * 0.5f + 1e-6f);
      sum += a[b].qs[j];
    }
    CHECK(a[b].s == Approx(a[b].d * sum));
  }
}

TEST_CASE("q8_K activation quantization follows ggml's rule") {
  auto x = random_floats(512, 2.f);
  x[300] = -9.f;  // the largest magnitude of the second block, negative
  std::vector<block_q8_K> a(2);
  quantize_row_q8_K(x.data(), a.data(), 512);
  for (int b = 0; b < 2; ++b) {
    for (int j = 0; j < 256; ++j)
      CHECK(std::fabs(a[b].qs[j] * a[b].d - x[b * 256 + j]) <= std::fabs(a[b].d) * 0.5f + 1e-6f);
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += a[b].qs[16 * g + j];
      CHECK(a[b].bsums[g] == s);
    }
  }
  CHECK(a[1].qs[300 - 256] == -127);  // the extreme value maps to -127 exactly
  CHECK(a[1].d == Approx(9.f / 127));
  std::vector<float> zeros(256, 0.f);
  quantize_row_q8_K(zeros.data(), a.data(), 256);
  CHECK(a[0].d == 0.f);
}

TEST_CASE("dequantization of q5 and K-quant blocks matches hand-computed values") {
  // q5_0: element j = d * (q - 16) with q's fifth bit from bit j of qh.
  block_q5_0 b5{};
  b5.d = fp32_to_fp16(0.5f);
  b5.qh[0] = 0x01;  // element 0 gets bit 4
  b5.qh[2] = 0x01;  // element 16 gets bit 4
  b5.qs[0] = 0x3F;  // element 0: 15 (+16), element 16: 3 (+16)
  float out5[32];
  dequantize_row(weight_type::q5_0, &b5, out5, 32);
  CHECK(out5[0] == 0.5f * (31 - 16));
  CHECK(out5[16] == 0.5f * (19 - 16));
  CHECK(out5[1] == 0.5f * (0 - 16));
  // q4_K: sub-block 0 scale 2 min 3; sub-block 4 takes its scale from the packed high bits.
  block_q4_K b4{};
  b4.d = fp32_to_fp16(1.f);
  b4.dmin = fp32_to_fp16(0.25f);
  b4.scales[0] = 2;      // sc0
  b4.scales[4] = 3;      // m0
  b4.scales[8] = 0x21;   // sc4 low 4 bits = 1, m4 low 4 bits = 2
  b4.scales[0] |= 0x40;  // sc4 bit 4 (q[j-4] >> 6 << 4 = 16)
  b4.qs[0] = 0x75;       // element 0: 5, element 32: 7
  b4.qs[64] = 0x09;      // element 128 (sub-block 4): 9
  float out4[256];
  dequantize_row(weight_type::q4_k, &b4, out4, 256);
  CHECK(out4[0] == 1.f * 2 * 5 - 0.25f * 3);
  CHECK(out4[32] == 0.f);  // sub-block 1: scale 0, min 0
  CHECK(out4[128] == 1.f * 17 * 9 - 0.25f * 2);
  // q6_K: element 0 = d * scales[0] * (q - 32), q = low nibble of ql[0] | (qh[0] & 3) << 4.
  block_q6_K b6{};
  b6.d = fp32_to_fp16(0.125f);
  b6.scales[0] = -3;
  b6.scales[15] = 5;
  b6.ql[0] = 0x0A;
  b6.qh[0] = 0x02;             // q = 10 | 32 = 42
  b6.ql[64 + 32 + 31] = 0xF0;  // element 255: high nibble of ql[64 + 32 + 31] = 15
  b6.qh[32 + 31] = 0xC0;       // top bits 3 -> q = 63
  float out6[256];
  dequantize_row(weight_type::q6_k, &b6, out6, 256);
  CHECK(out6[0] == 0.125f * -3 * (42 - 32));
  CHECK(out6[255] == 0.125f * 5 * (63 - 32));
}

TEST_CASE("bf16 panels built from integer panels equal those built from the GGUF rows") {
  for (weight_type t :
       {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0}) {
    const int64_t rows = 40, cols = 96, n_panels = 3;
    auto w = random_weights(t, rows, cols);
    std::vector<line64> ip(static_cast<size_t>(n_panels * int_panel_lines(t, cols)));
    repack_int_panels(t, w.data(), row_bytes(t, cols), rows, cols, 0, n_panels, ip.data());
    std::vector<uint16_t> a(static_cast<size_t>(n_panels * panel_rows * cols)), b(a.size());
    pack_bf16_panels(t, w.data(), row_bytes(t, cols), rows, cols, 0, n_panels, a.data());
    pack_bf16_panels_from_int(t, ip.data(), cols, 0, n_panels, b.data());
    INFO(weight_type_name(t));
    CHECK(a == b);
  }
}

TEST_CASE("linear layers match the scalar reference for every weight type and kernel family") {
  // The same draws whichever test cases ran before (ctest runs each alone): the bf16 bound below is
  // a statistical one, checked on these draws.
  rng.seed(1234);
  thread_pool pool(2);
  const weight_type types[] = {weight_type::f32,  weight_type::f16,  weight_type::bf16, weight_type::q4_0,
                               weight_type::q4_1, weight_type::q8_0, weight_type::q5_0, weight_type::q5_1,
                               weight_type::q4_k, weight_type::q5_k, weight_type::q6_k};
  for (const isa_mode& mode : isa_modes()) {
    mode.use();
    const char* isa = mode.name;
    for (weight_type t : types) {
      for (int64_t rows : {16, 40, 192}) {
        const int64_t cols = is_k_quant(t) ? (rows == 40 ? 256 : 768) : rows == 40 ? 96 : 576;
        auto w = random_weights(t, rows, cols);
        linear lin(t, w.data(), rows, cols, pool);
        std::vector<float> deq(static_cast<size_t>(rows * cols));
        for (int64_t r = 0; r < rows; ++r)
          dequantize_row(t, w.data() + r * row_bytes(t, cols), deq.data() + r * cols, cols);
        for (int64_t n_tok : {1, 3, 7, 13}) {
          INFO("isa " << isa << " type " << weight_type_name(t) << " rows " << rows << " tokens " << n_tok);
          auto x = random_floats(static_cast<size_t>(n_tok * cols));
          std::vector<double> ref(static_cast<size_t>(n_tok * rows));
          for (int64_t i = 0; i < n_tok; ++i)
            for (int64_t r = 0; r < rows; ++r) {
              double s = 0;
              for (int64_t k = 0; k < cols; ++k) s += static_cast<double>(deq[r * cols + k]) * x[i * cols + k];
              ref[i * rows + r] = s;
            }
          guarded g1(ref.size()), g2(ref.size());
          lin.forward_gemm(x.data(), cols, n_tok, g1.data(), rows, pool);
          CHECK(g1.guards_intact());
          if (lin.prompt_on_integer_kernel())
            CHECK(nmse(ref, g1.data()) < 1e-3);  // the integer kernel, as forward_gemv below
          else
            CHECK(nmse(ref, g1.data()) < 2e-5);  // bf16 weights and activations
          lin.forward_gemv(x.data(), cols, n_tok, g2.data(), rows, pool);
          CHECK(g2.guards_intact());
          if (is_float_type(t)) {
            CHECK(nmse(ref, g2.data()) < 1e-9);  // f32 FMAs on the weights as stored
          } else {
            // 8-bit activations (per 256 for the K-quants: a coarser scale, as llama.cpp's q8_K).
            CHECK(nmse(ref, g2.data()) < (is_k_quant(t) ? 1e-3 : 2e-4));
            // The integer kernel computes exactly the quantized dot product (up to f32 sums), for
            // every token of the batch.
            for (int64_t i = 0; i < n_tok; ++i) {
              const float* xi = x.data() + i * cols;
              std::vector<float> exact(static_cast<size_t>(rows));
              if (is_k_quant(t)) {
                std::vector<block_q8_K> a(static_cast<size_t>(cols / qk_k));
                quantize_row_q8_K(xi, a.data(), cols);
                for (int64_t r = 0; r < rows; ++r)
                  exact[r] = dot_row_q8_K_ref(t, w.data() + r * row_bytes(t, cols), a.data(), cols);
              } else {
                std::vector<block_q8_act> a(static_cast<size_t>(cols / qk));
                quantize_row_q8_act(xi, a.data(), cols);
                for (int64_t r = 0; r < rows; ++r)
                  exact[r] = dot_row_q8_act_ref(t, w.data() + r * row_bytes(t, cols), a.data(), cols);
              }
              for (int64_t r = 0; r < rows; ++r)
                REQUIRE(g2.data()[i * rows + r] == Approx(exact[r]).epsilon(1e-4).margin(1e-4));
            }
          }
        }
      }
    }
  }
  default_kernels();
}

TEST_CASE("fused layers give each layer's own result bitwise") {
  thread_pool pool(2);
  for (const isa_mode& mode : isa_modes()) {
    mode.use();
    const char* isa = mode.name;
    for (weight_type t :
         {weight_type::q4_1, weight_type::q8_0, weight_type::f16, weight_type::q4_k, weight_type::q6_k}) {
      const int64_t cols = is_k_quant(t) ? 256 : 96;
      auto w1 = random_weights(t, 48, cols), w2 = random_weights(t, 16, cols), w3 = random_weights(t, 40, cols);
      const linear a(t, w1.data(), 48, cols, pool), b(t, w2.data(), 16, cols, pool), c(t, w3.data(), 40, cols, pool);
      for (int64_t n_tok : {1, 9}) {
        INFO("isa " << isa << " type " << weight_type_name(t) << " tokens " << n_tok);
        auto x = random_floats(static_cast<size_t>(n_tok * cols));
        for (bool gemv : {true, false}) {
          std::vector<float> ya(n_tok * 48), yb(n_tok * 16), yc(n_tok * 40), fa(ya.size()), fb(yb.size()),
              fc(yc.size());
          const linear_out outs[] = {{&a, fa.data(), 48}, {&b, fb.data(), 16}, {&c, fc.data(), 40}};
          if (gemv) {
            a.forward_gemv(x.data(), cols, n_tok, ya.data(), 48, pool);
            b.forward_gemv(x.data(), cols, n_tok, yb.data(), 16, pool);
            c.forward_gemv(x.data(), cols, n_tok, yc.data(), 40, pool);
            forward_gemv_fused(outs, x.data(), cols, n_tok, pool);
          } else {
            a.forward_gemm(x.data(), cols, n_tok, ya.data(), 48, pool);
            b.forward_gemm(x.data(), cols, n_tok, yb.data(), 16, pool);
            c.forward_gemm(x.data(), cols, n_tok, yc.data(), 40, pool);
            forward_gemm_fused(outs, x.data(), cols, n_tok, pool);
          }
          CHECK(fa == ya);
          CHECK(fb == yb);
          CHECK(fc == yc);
        }
      }
    }
  }
  default_kernels();
}

TEST_CASE("resident prompt panels give the per-step panels' results bitwise") {
  thread_pool pool(2);
  for (const isa_mode& mode : isa_modes()) {
    mode.use();
    const char* isa = mode.name;
    for (weight_type t : {weight_type::q4_1, weight_type::q4_0, weight_type::q8_0, weight_type::f16, weight_type::q4_k,
                          weight_type::q6_k}) {
      const int64_t cols = is_k_quant(t) ? 256 : 96, rows = 40;  // 40: a last panel past the end
      auto w = random_weights(t, rows, cols);
      const linear per_step(t, w.data(), rows, cols, pool);
      linear resident(t, w.data(), rows, cols, pool);
      const size_t held = resident.keep_prompt_panels(pool);
      INFO("isa " << isa << " type " << weight_type_name(t));
      // A layer whose prompt tokens take the integer kernel keeps nothing; the others hold
      // 2 bytes per weight, rows rounded up to whole panels.
      CHECK(held == (resident.prompt_on_integer_kernel() ? 0 : static_cast<size_t>(48 * cols * 2)));
      CHECK(resident.prompt_panel_bytes() == held);
      for (int64_t n_tok : {1, 5, 17}) {
        auto x = random_floats(static_cast<size_t>(n_tok * cols));
        std::vector<float> a(n_tok * rows), b(a.size());
        per_step.forward_gemm(x.data(), cols, n_tok, a.data(), rows, pool);
        resident.forward_gemm(x.data(), cols, n_tok, b.data(), rows, pool);
        CHECK(a == b);
      }
    }
  }
  default_kernels();
}

TEST_CASE("integer prompts: a layer with integer panels takes decode's kernel for prompt tokens, bitwise") {
  thread_pool pool(2);
  for (const isa_mode& mode : isa_modes()) {
    mode.use();
    const char* isa = mode.name;
    for (weight_type t : {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0,
                          weight_type::f16, weight_type::q4_k}) {
      const int64_t cols = is_k_quant(t) ? 256 : 96, rows = 40;
      auto w = random_weights(t, rows, cols);
      const linear plain(t, w.data(), rows, cols, pool);
      linear opted(t, w.data(), rows, cols, pool);
      const bool moved = opted.use_integer_prompts();
      INFO("isa " << isa << " type " << weight_type_name(t));
      // Only the integer-panel types move, and wherever the VNNI kernel runs without AMX they do.
      const bool int_panel_type = !is_float_type(t) && !is_k_quant(t);
      CHECK(moved == (int_panel_type && use_avx512_vnni_kernels() && !use_amx_kernels()));
      CHECK(opted.prompt_on_integer_kernel() == (moved || plain.prompt_on_integer_kernel()));
      for (int64_t n_tok : {1, 5, 17}) {
        auto x = random_floats(static_cast<size_t>(n_tok * cols));
        std::vector<float> gemm(n_tok * rows), gemv(gemm.size()), before(gemm.size());
        opted.forward_gemm(x.data(), cols, n_tok, gemm.data(), rows, pool);
        opted.forward_gemv(x.data(), cols, n_tok, gemv.data(), rows, pool);
        plain.forward_gemm(x.data(), cols, n_tok, before.data(), rows, pool);
        if (opted.prompt_on_integer_kernel())
          CHECK(gemm == gemv);  // a prompt token computes what a decode token would
        else
          CHECK(gemm == before);  // nothing changed for this layer
      }
    }
  }
  default_kernels();
}

TEST_CASE("rms_norm / rope / silu / softmax and exp match naive formulas") {
  auto x = random_floats(576);
  auto w = random_floats(576);
  std::vector<float> out(576);
  rms_norm(x.data(), w.data(), out.data(), 576, 1e-5f);
  double ss = 0;
  for (float v : x) ss += v * v;
  const double sc = 1.0 / std::sqrt(ss / 576 + 1e-5);
  for (int i = 0; i < 576; ++i) REQUIRE(out[i] == Approx(x[i] * sc * w[i]).epsilon(1e-5));

  auto h = random_floats(2 * 64);
  auto r = h;
  rope_norm(r.data(), 2, 64, 64, 37, 100000.f);
  for (int head = 0; head < 2; ++head)
    for (int i = 0; i < 32; ++i) {
      const double theta = 37 * std::pow(100000.0, -2.0 * i / 64);
      const double a = h[head * 64 + 2 * i], b = h[head * 64 + 2 * i + 1];
      REQUIRE(r[head * 64 + 2 * i] == Approx(a * std::cos(theta) - b * std::sin(theta)).margin(2e-5));
      REQUIRE(r[head * 64 + 2 * i + 1] == Approx(a * std::sin(theta) + b * std::cos(theta)).margin(2e-5));
    }

  std::vector<float> e;
  for (float v = -90.f; v <= 88.f; v += 0.37f) e.push_back(v);
  auto ee = e;
  exp_inplace(ee.data(), static_cast<int64_t>(ee.size()));
  for (size_t i = 0; i < e.size(); ++i) REQUIRE(ee[i] == Approx(std::exp(e[i])).epsilon(1e-6).margin(1e-37));

  auto g = random_floats(100, 4.f), u = random_floats(100);
  std::vector<float> s(100);
  silu_mul(g.data(), u.data(), s.data(), 100);
  for (int i = 0; i < 100; ++i) REQUIRE(s[i] == Approx(g[i] / (1 + std::exp(-g[i])) * u[i]).epsilon(1e-5).margin(1e-6));

  auto p = random_floats(37, 5.f);
  auto q = p;
  softmax_inplace(q.data(), 37);
  double z = 0, mx = *std::max_element(p.begin(), p.end());
  for (float v : p) z += std::exp(v - mx);
  for (int i = 0; i < 37; ++i) REQUIRE(q[i] == Approx(std::exp(p[i] - mx) / z).epsilon(1e-5));
}

TEST_CASE("the AVX-512 gates and softmax give the 8-lane loops' results bitwise") {
  // Where the CPU runs the AVX-512 parts; elsewhere both runs take the 8-lane loops (and agree).
  // Lengths around the 16- and 8-element steps; values through exp's clamps, a -inf (a masked
  // score) and signed zeros.
  for (const int64_t n : {1, 7, 8, 15, 16, 17, 24, 31, 37, 160, 8192}) {
    auto g = random_floats(static_cast<size_t>(n), 12.f), u = random_floats(static_cast<size_t>(n));
    if (n > 3) {
      g[0] = -95.f;
      g[1] = 91.f;
      g[2] = -0.f;
      g[3] = 0.f;
    }
    auto sm = random_floats(static_cast<size_t>(n), 2.f);  // comparable terms: a changed sum order shows
    if (n > 2) sm[1] = -INFINITY;
    std::vector<float> silu[2], gelu[2], soft[2];
    for (const int portable : {0, 1}) {
      force_portable_kernels(portable == 1);
      silu[portable].resize(static_cast<size_t>(n));
      gelu[portable].resize(static_cast<size_t>(n));
      soft[portable] = sm;
      silu_mul(g.data(), u.data(), silu[portable].data(), n);
      gelu_mul(g.data(), u.data(), gelu[portable].data(), n);
      softmax_inplace(soft[portable].data(), n);
    }
    force_portable_kernels(false);
    INFO("n " << n);
    REQUIRE(std::memcmp(silu[0].data(), silu[1].data(), static_cast<size_t>(n) * sizeof(float)) == 0);
    REQUIRE(std::memcmp(gelu[0].data(), gelu[1].data(), static_cast<size_t>(n) * sizeof(float)) == 0);
    REQUIRE(std::memcmp(soft[0].data(), soft[1].data(), static_cast<size_t>(n) * sizeof(float)) == 0);
  }
}

TEST_CASE("paged attention equals attention over a contiguous cache") {
  const int64_t hd = 64, n_kv = 3, stride = n_kv * hd, n_keys = 45, bs = 16;
  auto keys = random_floats(static_cast<size_t>(n_keys * stride));
  auto vals = random_floats(static_cast<size_t>(n_keys * stride));
  auto q = random_floats(hd);
  // Scatter positions into blocks in a shuffled order: block table {2, 0, 1}.
  const int32_t table[] = {2, 0, 1};
  std::vector<float> karena(3 * bs * stride), varena(3 * bs * stride);
  for (int64_t p = 0; p < n_keys; ++p) {
    std::copy_n(keys.begin() + p * stride, stride, karena.begin() + (table[p / bs] * bs + p % bs) * stride);
    std::copy_n(vals.begin() + p * stride, stride, varena.begin() + (table[p / bs] * bs + p % bs) * stride);
  }
  const void* kb[3];
  const void* vb[3];
  for (int b = 0; b < 3; ++b) {
    kb[b] = karena.data() + table[b] * bs * stride;
    vb[b] = varena.data() + table[b] * bs * stride;
  }
  std::vector<float> scores(n_keys), out(hd);
  attend_head(q.data(), n_keys, kv_layer_view{kb, vb, bs, stride, kv_type::f32}, 1, hd, 0.125f, scores.data(),
              out.data());
  // The same cache stored as f16: close to the f32 result (f16 keeps 11 bits).
  std::vector<uint16_t> k16(karena.size()), v16(varena.size());
  for (size_t i = 0; i < karena.size(); i += stride) {
    store_kv_row(karena.data() + i, k16.data() + i, stride, kv_type::f16);
    store_kv_row(varena.data() + i, v16.data() + i, stride, kv_type::f16);
  }
  const void* kb16[3];
  const void* vb16[3];
  for (int b = 0; b < 3; ++b) {
    kb16[b] = k16.data() + table[b] * bs * stride;
    vb16[b] = v16.data() + table[b] * bs * stride;
  }
  std::vector<float> out16(hd);
  attend_head(q.data(), n_keys, kv_layer_view{kb16, vb16, bs, stride, kv_type::f16}, 1, hd, 0.125f, scores.data(),
              out16.data());
  for (int64_t i = 0; i < hd; ++i) REQUIRE(out16[i] == Approx(out[i]).margin(2e-3));
  // And as q8_0 (8 bits and a scale per 32 elements): close relative to the output scale.
  const int64_t rb8 = kv_row_bytes(kv_type::q8_0, stride);
  std::vector<uint8_t> k8(3 * bs * rb8), v8(k8.size());
  for (int64_t r = 0; r < 3 * bs; ++r) {
    store_kv_row(karena.data() + r * stride, k8.data() + r * rb8, stride, kv_type::q8_0);
    store_kv_row(varena.data() + r * stride, v8.data() + r * rb8, stride, kv_type::q8_0);
  }
  const void* kb8[3];
  const void* vb8[3];
  for (int b = 0; b < 3; ++b) {
    kb8[b] = k8.data() + table[b] * bs * rb8;
    vb8[b] = v8.data() + table[b] * bs * rb8;
  }
  std::vector<float> out8(hd);
  attend_head(q.data(), n_keys, kv_layer_view{kb8, vb8, bs, stride, kv_type::q8_0}, 1, hd, 0.125f, scores.data(),
              out8.data());
  float out_scale = 0, err8 = 0;
  for (int64_t i = 0; i < hd; ++i) out_scale = std::max(out_scale, std::fabs(out[i]));
  for (int64_t i = 0; i < hd; ++i) err8 = std::max(err8, std::fabs(out8[i] - out[i]));
  INFO("q8_0 max error " << err8 << ", output scale " << out_scale);
  REQUIRE(err8 <= 2e-2f * out_scale);
  std::vector<double> w(n_keys);
  double mx = -1e30, z = 0;
  for (int64_t j = 0; j < n_keys; ++j) {
    double d = 0;
    for (int64_t i = 0; i < hd; ++i) d += q[i] * keys[j * stride + hd + i];
    w[j] = d * 0.125;
    mx = std::max(mx, w[j]);
  }
  for (auto& v : w) z += (v = std::exp(v - mx));
  for (int64_t i = 0; i < hd; ++i) {
    double ref = 0;
    for (int64_t j = 0; j < n_keys; ++j) ref += w[j] / z * vals[j * stride + hd + i];
    REQUIRE(out[i] == Approx(ref).margin(1e-5));
  }
}

TEST_CASE("grouped-query attention equals attention head by head") {
  const int64_t block_size = GENERATE(16, 8, 32);  // the heads layout steps 16, 8 or 32 keys at a time
  std::mt19937 rng(7);
  for (const kv_type type : {kv_type::f32, kv_type::f16, kv_type::q8_0}) {
    for (const int64_t hd : {64, 24, 128, 20}) {  // 20: not a multiple of 8 (the per-head path)
      if (!kv_type_error(type, hd).empty()) continue;
      // Query heads per KV head of the families served (Qwen2.5-1.5B 6, Qwen2.5-7B 7, Qwen3-14B 5, ...);
      // q8_0 runs up to 3 (16 keys) or 6 (8 keys) heads per pass.
      for (const int64_t n_q : {1, 3, 4, 5, 6, 7, 8}) {
        for (const int64_t n_keys : {1, 7, 8, 9, 37}) {
          const int64_t bs = block_size, n_kv = 2, stride = n_kv * hd, n_blocks = (n_keys + bs - 1) / bs;
          const int64_t row_bytes = kv_row_bytes(type, stride);
          std::vector<float> rows(static_cast<size_t>(n_blocks * bs * stride));
          std::normal_distribution<float> nd(0.f, 1.f);
          for (auto& v : rows) v = nd(rng);
          std::vector<uint8_t> stored(static_cast<size_t>(n_blocks * bs * row_bytes));
          for (int64_t r = 0; r < n_blocks * bs; ++r)
            store_kv_row(rows.data() + r * stride, stored.data() + r * row_bytes, stride, type);
          // Keys and values in reversed block order; V reads the same rows shifted by one block.
          auto view_of = [&](const uint8_t* base, int64_t rb, std::vector<const void*>& kb,
                             std::vector<const void*>& vb, kv_type t) {
            kb.resize(n_blocks);
            vb.resize(n_blocks);
            for (int64_t b = 0; b < n_blocks; ++b) {
              kb[b] = base + (n_blocks - 1 - b) * bs * rb;
              vb[b] = base + ((n_blocks - b) % n_blocks) * bs * rb;
            }
            return kv_layer_view{kb.data(), vb.data(), bs, stride, t};
          };
          std::vector<const void*> kb, vb, kb32, vb32;
          const kv_layer_view view = view_of(stored.data(), row_bytes, kb, vb, type);
          const kv_layer_view view32 = view_of(reinterpret_cast<const uint8_t*>(rows.data()),
                                               kv_row_bytes(kv_type::f32, stride), kb32, vb32, kv_type::f32);
          std::vector<float> q(n_q * hd);
          for (auto& v : q) v = nd(rng);
          std::vector<float> want(n_q * hd), exact(n_q * hd), got(n_q * hd, 12345.f), scores(n_keys);
          for (int64_t g = 0; g < n_q; ++g) {
            attend_head(q.data() + g * hd, n_keys, view, 1, hd, 0.2f, scores.data(), want.data() + g * hd);
            attend_head(q.data() + g * hd, n_keys, view32, 1, hd, 0.2f, scores.data(), exact.data() + g * hd);
          }
          std::vector<float> scratch(attend_group_scratch(n_q, n_keys, hd) + 16, -7.f);
          attend_group(q.data(), n_q, n_keys, view, 1, hd, 0.2f, scratch.data(), got.data());
          INFO("type " << kv_type_name(type) << " hd " << hd << " n_q " << n_q << " n_keys " << n_keys);
          for (size_t i = 0; i < want.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(1e-5));
          // Against the f32 cache: within what the element type keeps, relative to the output scale.
          float out_scale = 0;
          for (float v : exact) out_scale = std::max(out_scale, std::fabs(v));
          // q8_0: a key element is off by up to d / 2 (d ~ max|k| / 127), which moves a score by
          // ~0.015 here (0.2 * sqrt(128) * d / sqrt(12)); seen up to 0.024 of the output scale.
          const float tol = type == kv_type::f32 ? 1e-6f : type == kv_type::f16 ? 2e-3f : 4e-2f;
          for (size_t i = 0; i < want.size(); ++i) REQUIRE(got[i] == Approx(exact[i]).margin(tol * out_scale));
          // Bitwise the same as each head run as a group of one (the engine relies on it).
          std::vector<float> one(hd);
          for (int64_t g = 0; g < n_q; ++g) {
            attend_group(q.data() + g * hd, 1, n_keys, view, 1, hd, 0.2f, scratch.data(), one.data());
            for (int64_t i = 0; i < hd; ++i) REQUIRE(one[i] == got[g * hd + i]);
          }
          // The same rows in the worker's heads layout (keys dimension-major): close to the
          // reference, and each head bitwise the same as a group of one. Key positions past n_keys
          // stay unwritten (0xff bytes: NaN as f16/f32 and as q8_0 scales) and must not leak in.
          std::vector<uint8_t> hk(stored.size(), 0xff), hv(stored.size(), 0xff);  // K and V differ in layout
          kv_layer_view hm_layout{nullptr, nullptr, bs, stride, type, kv_layout::heads};
          auto key_used = [&](int64_t b, int64_t p) { return (n_blocks - 1 - b) * bs + p < n_keys; };  // K: reversed
          for (int64_t b = 0; b < n_blocks; ++b)
            for (int64_t h = 0; h < n_kv; ++h)
              for (int64_t p = 0; p < bs; ++p) {
                const float* src = rows.data() + (b * bs + p) * stride + h * hd;
                if (key_used(b, p)) store_kv_head(src, hk.data() + b * bs * row_bytes, hm_layout, p, h, hd, true);
                store_kv_head(src, hv.data() + b * bs * row_bytes, hm_layout, p, h, hd, false);
              }
          if (type == kv_type::q8_0) {
            // Dimension-major q8_0 keys: the very scales and int8 values of the key's Q8_0 row.
            for (int64_t b = 0; b < n_blocks; ++b)
              for (int64_t h = 0; h < n_kv; ++h) {
                const uint8_t* slice = hk.data() + b * bs * row_bytes + h * bs * kv_row_bytes(type, hd);
                for (int64_t p = 0; p < bs; ++p) {
                  if (!key_used(b, p)) continue;
                  const auto* row =
                      reinterpret_cast<const block_q8_0*>(stored.data() + (b * bs + p) * row_bytes) + h * hd / qk;
                  for (int64_t i = 0; i < hd / qk; ++i) {
                    REQUIRE(q8_dm_scales(slice)[i * bs + p] == row[i].d);
                    for (int k = 0; k < qk; ++k)
                      REQUIRE(q8_dm_values(slice, hd, bs)[(i * qk + k) * bs + p] == row[i].qs[k]);
                  }
                }
              }
          }
          std::vector<const void*> kbh, vbh, unused_k, unused_v;
          kv_layer_view view_hm = view_of(hk.data(), row_bytes, kbh, unused_v, type);
          view_of(hv.data(), row_bytes, unused_k, vbh, type);
          view_hm.v_blocks = vbh.data();
          view_hm.layout = kv_layout::heads;
          std::vector<float> got_hm(n_q * hd, 54321.f), ref_hm(n_q * hd);
          attend_group(q.data(), n_q, n_keys, view_hm, 1, hd, 0.2f, scratch.data(), got_hm.data());
          {  // The AVX-512 loops (where this CPU runs them) give the portable loops' results bitwise.
            std::vector<float> portable(n_q * hd, 777.f);
            force_portable_kernels(true);
            attend_group(q.data(), n_q, n_keys, view_hm, 1, hd, 0.2f, scratch.data(), portable.data());
            force_portable_kernels(false);
            for (size_t i = 0; i < portable.size(); ++i) REQUIRE(portable[i] == got_hm[i]);
          }
          for (int64_t g = 0; g < n_q; ++g) {
            attend_head(q.data() + g * hd, n_keys, view_hm, 1, hd, 0.2f, scores.data(), ref_hm.data() + g * hd);
            attend_group(q.data() + g * hd, 1, n_keys, view_hm, 1, hd, 0.2f, scratch.data(), one.data());
            for (int64_t i = 0; i < hd; ++i) REQUIRE(one[i] == got_hm[g * hd + i]);
          }
          for (size_t i = 0; i < want.size(); ++i) {
            REQUIRE(got_hm[i] == Approx(ref_hm[i]).margin(1e-5));
            REQUIRE(got_hm[i] == Approx(want[i]).margin(1e-5));  // same stored values as the rows layout
            REQUIRE(got_hm[i] == Approx(exact[i]).margin(std::max(tol * out_scale, 1e-5f)));  // f32: other order
          }
          for (size_t i = attend_group_scratch(n_q, n_keys, hd); i < scratch.size(); ++i)
            REQUIRE(scratch[i] == -7.f);  // nothing written past the documented scratch size
        }
      }
    }
  }
}

TEST_CASE("q8_0 KV rows are Q8_0 blocks within half a step of the input") {
  CHECK(kv_row_bytes(kv_type::q8_0, 192) == 6 * 34);
  CHECK(kv_row_bytes(kv_type::f16, 192) == 384);
  CHECK(kv_type_error(kv_type::q8_0, 64).empty());
  CHECK(kv_type_error(kv_type::q8_0, 48).find("multiple of 32") != std::string::npos);
  CHECK(kv_type_error(kv_type::f16, 48).empty());
  std::string why;
  CHECK(parse_kv_type("q8_0", 64, why) == kv_type::q8_0);
  CHECK_FALSE(parse_kv_type("q8_0", 48, why));
  CHECK(why.find("q8_0") != std::string::npos);
  CHECK_FALSE(parse_kv_type("q4_0", 64, why));
  CHECK(why.find("f16, f32 or q8_0") != std::string::npos);

  const int64_t n = 192, nb = n / qk;
  for (const float scale : {1.f, 1e-3f, 40.f}) {
    auto x = random_floats(n, scale);
    x[5] = 9 * scale;                              // an outlier: its block gets a coarse step, the others keep theirs
    for (int64_t i = 64; i < 96; ++i) x[i] = 0.f;  // an all-zero block
    x[100] = -x[101];                              // exact negatives round alike
    std::vector<uint8_t> buf(kv_row_bytes(kv_type::q8_0, n) + 16, 0xAB);
    store_kv_row(x.data(), buf.data(), n, kv_type::q8_0);
    for (size_t i = kv_row_bytes(kv_type::q8_0, n); i < buf.size(); ++i) REQUIRE(buf[i] == 0xAB);  // guard bytes
    std::vector<block_q8_0> b(nb);
    std::memcpy(b.data(), buf.data(), nb * sizeof(block_q8_0));
    for (int64_t i = 0; i < nb; ++i) {
      float amax = 0;
      for (int k = 0; k < qk; ++k) amax = std::max(amax, std::fabs(x[i * qk + k]));
      const float d = fp16_to_fp32(b[i].d);
      INFO("scale " << scale << " block " << i);
      REQUIRE(d == fp16_to_fp32(fp32_to_fp16(amax / 127)));
      for (int k = 0; k < qk; ++k) {
        const float v = x[i * qk + k];
        REQUIRE(b[i].qs[k] >= -127);
        REQUIRE(std::fabs(v - d * b[i].qs[k]) <= 0.5f * d * (1 + 1e-6f));
      }
      if (i == 2) {  // the zero block
        REQUIRE(b[i].d == 0);
        for (int k = 0; k < qk; ++k) REQUIRE(b[i].qs[k] == 0);
      }
    }
    REQUIRE(b[3].qs[100 - 96] == -b[3].qs[101 - 96]);
    REQUIRE(std::abs(b[0].qs[5]) == 127);
  }
  // A zero row is all zero bytes.
  std::vector<float> z(n, 0.f);
  std::vector<uint8_t> zb(kv_row_bytes(kv_type::q8_0, n), 0xCD);
  store_kv_row(z.data(), zb.data(), n, kv_type::q8_0);
  for (uint8_t c : zb) REQUIRE(c == 0);
}

TEST_CASE("thread pool runs every thread once per job and splits ranges exactly") {
  thread_pool pool(2);
  for (int job = 0; job < 1000; ++job) {
    std::atomic<int> mask{0};
    pool.run([&](int ith, int nth) { mask.fetch_or(1 << ith); });
    REQUIRE(mask.load() == 3);
  }
  for (int64_t n : {0, 1, 15, 16, 17, 1000})
    for (int nth : {1, 2, 3, 7}) {
      int64_t covered = 0, prev_end = 0;
      for (int i = 0; i < nth; ++i) {
        int64_t b, e;
        thread_pool::split(n, 16, i, nth, b, e);
        REQUIRE(b == prev_end);
        REQUIRE((b % 16 == 0 || b == n));
        covered += e - b;
        prev_end = e;
      }
      REQUIRE(covered == n);
    }
}

TEST_CASE("thread pool for_each visits every index once, alone or split") {
  thread_pool pool(2);
  for (int64_t n : {0, 1, 15, 16, 17, 1000}) {
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    std::atomic<int> other_thread{0};
    const auto caller = std::this_thread::get_id();
    pool.for_each(n, 16, [&](int64_t i) {
      seen[static_cast<size_t>(i)]++;
      if (std::this_thread::get_id() != caller) other_thread++;
    });
    for (const auto& c : seen) REQUIRE(c == 1);
    if (n < 16) CHECK(other_thread == 0);  // below the threshold: no job
    if (n >= 64) CHECK(other_thread > 0);  // split: the other thread took a range
  }
}

TEST_CASE("thread pool for_chunks covers every index once in whole grains, with any thread count") {
  for (int threads : {1, 2, 3}) {
    thread_pool pool(threads);
    for (int64_t n : {0, 1, 3, 4, 5, 64, 1001}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
      std::mutex mu;
      std::vector<std::pair<int64_t, int64_t>> chunks;
      pool.for_chunks(n, 4, 8, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)]++;
        std::lock_guard<std::mutex> lk(mu);
        chunks.emplace_back(b, e);
      });
      for (const auto& c : seen) REQUIRE(c == 1);
      for (const auto& [b, e] : chunks) {
        CHECK(b < e);
        CHECK(b % 4 == 0);             // every chunk starts on a grain
        if (e < n) CHECK(e - b >= 8);  // and but for the last is at least min_chunk
      }
      if (threads == 1 && n > 0) CHECK(chunks.size() == 1);
    }
  }
}

TEST_CASE("thread pool rethrows a job's exception on the caller and stays usable") {
  thread_pool pool(2);
  for (int thrower : {0, 1}) {
    CHECK_THROWS_WITH(pool.run([&](int ith, int) {
      if (ith == thrower) throw std::runtime_error("boom");
    }),
                      "boom");
    std::atomic<int> n{0};
    pool.run([&](int, int) { n.fetch_add(1); });
    CHECK(n.load() == 2);
  }
}

namespace {

// AnonHugePages (bytes) of the mapping that holds `p`, from /proc/self/smaps; -1 when not found.
int64_t anon_huge_bytes_at(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(' ') > line.find('-')) {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) return std::stoll(line.substr(14)) * 1024;
  }
  return -1;
}

}  // namespace

TEST_CASE("deferred huge pages: promotion keeps every byte, skips freed buffers and pauses when asked") {
  defer_huge_pages();
  if (!huge_pages_enabled()) {  // SY_HUGE_PAGES=0: no advice, nothing deferred
    huge_free(huge_alloc(size_t{4} << 20));
    const huge_promotion r = promote_huge_pages();
    CHECK((r.bytes == 0 && r.refused == 0));
    return;
  }
  const size_t n = (size_t{8} << 20) + 100;
  auto* a = static_cast<uint8_t*>(huge_alloc(n));
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<uint8_t>(i * 7 + i / 4096);
  huge_free(huge_alloc(size_t{4} << 20));  // freed before the promotion: not touched by it
  auto* b = static_cast<uint8_t*>(huge_alloc(size_t{2} << 20));
  b[0] = 1;

  CHECK(deferred_huge_page_bytes() == huge_round_up(n) + (size_t{2} << 20));

  const std::atomic<bool> stopped{true};
  const huge_promotion none = promote_huge_pages(&stopped);  // a stop asked for first: nothing done
  CHECK((none.bytes == 0 && none.refused == 0));
  huge_promotion first;
  REQUIRE(promote_huge_page_step(first));  // one step: 2 MiB of one buffer
  CHECK(first.bytes + first.refused == (first.advised ? 0 : huge_page_bytes));
  huge_free(b);  // freed between steps: the rest skips it

  auto* late = static_cast<uint8_t*>(huge_alloc(size_t{2} << 20));  // after a step: advised at once
  huge_promotion r = promote_huge_pages();
  r.bytes += first.bytes;
  r.refused += first.refused;
  CHECK(r.bytes + r.refused <= huge_round_up(n) + (size_t{2} << 20));
  CHECK(r.bytes + r.refused >= huge_round_up(n) - (r.advised ? huge_round_up(n) : 0));
  CHECK_FALSE(promote_huge_page_step(r));  // nothing left; `late` was never deferred
  CHECK(deferred_huge_page_bytes() == 0);
  for (size_t i = 0; i < n; ++i)
    if (a[i] != static_cast<uint8_t>(i * 7 + i / 4096)) FAIL("byte " << i << " changed by the promotion");
  if (r.advised) {
    WARN("the kernel refused MADV_COLLAPSE (before Linux 6.1, or huge pages off): only the advice was given");
  } else {
    // What the kernel collapsed is mapped on huge pages (the mapping may hold more than this buffer).
    CHECK(r.bytes > 0);
    CHECK(anon_huge_bytes_at(a) >= static_cast<int64_t>(std::min(r.bytes, huge_round_up(n))));
  }
  huge_free(late);
  huge_free(a);
}
