// The AMX kernels on the tile instructions: against the scalar references, the tile model (the
// same loops, test_amx_emulation.cpp) and the AVX-512 kernels, and through `linear` with AMX on
// and forced off. Exits 77 (ctest: skipped) with the reason where the CPU has no AMX or Linux
// refuses the tile state: the instructions cannot run there; the loops are still checked on the
// model by test_kernels.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "kernels/cpu/amx_emulator.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/kquant_panels.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "tests/unit/amx_test_data.hpp"

using namespace sy::cpu;
using namespace amx_test;

int main(int argc, char** argv) {
  if (!use_amx_kernels()) {
    std::fprintf(stderr, "SKIP: %s\n", amx_status());
    return 77;
  }
  std::fprintf(stderr, "%s (kernels %s)\n", amx_status(), kernel_isa_name());
  return Catch::Session().run(argc, argv);
}

TEST_CASE("AMX bf16 GEMM matches the tile model, the scalar reference and itself token by token") {
  for (int64_t k : {32, 576, 1536}) {
    for (int64_t n_panels : {1, 3, 4}) {
      const int64_t rows = n_panels * panel_rows;
      const bf16_matrix m = random_bf16_matrix(rows, k);
      for (int64_t n_tok : {1, 7, 16, 33, 64}) {
        INFO("k " << k << " panels " << n_panels << " tokens " << n_tok);
        const int64_t ldx = k + 32;
        std::vector<uint16_t> x(static_cast<size_t>(n_tok * ldx), fp32_to_bf16(1e30f));
        for (int64_t t = 0; t < n_tok; ++t) {
          const auto v = to_bf16(random_floats(static_cast<size_t>(k)));
          std::copy(v.begin(), v.end(), x.begin() + t * ldx);
        }
        const int64_t ldy = rows + 5;
        sentinel_out hw(n_tok, ldy), model(n_tok, ldy);
        gemm_panels_amx(m.panels.data(), k, 0, n_panels, x.data(), ldx, n_tok, hw.y(), ldy);
        gemm_panels_amx_emulated(m.panels.data(), k, 0, n_panels, x.data(), ldx, n_tok, model.y(), ldy);
        CHECK(hw.only_wrote(0, rows));
        std::vector<double> ref(static_cast<size_t>(n_tok * rows)), mod(ref.size());
        for (int64_t t = 0; t < n_tok; ++t)
          for (int64_t r = 0; r < rows; ++r) {
            ref[t * rows + r] = bf16_dot(m, r, &x[t * ldx]);
            mod[t * rows + r] = model.y()[t * ldy + r];
          }
        CHECK(nmse(ref, hw.y(), rows, ldy, 0) < 1e-10);
        // The model's order of f32 sums is the documented one; the hardware may round its
        // intermediate sums differently, but only at f32 precision.
        CHECK(nmse(mod, hw.y(), rows, ldy, 0) < 1e-10);
        for (int64_t t : {int64_t{0}, n_tok - 1}) {
          std::vector<float> alone(static_cast<size_t>(rows));
          gemm_panels_amx(m.panels.data(), k, 0, n_panels, &x[t * ldx], ldx, 1, alone.data(), rows);
          for (int64_t r = 0; r < rows; ++r) REQUIRE(alone[r] == hw.y()[t * ldy + r]);
        }
      }
    }
  }
}

TEST_CASE("AMX integer panels equal the AVX-512 VNNI kernel and the tile model bitwise") {
  for (weight_type t :
       {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0}) {
    for (int64_t rows : {16, 40}) {
      const int64_t cols = 576, n_panels = (rows + panel_rows - 1) / panel_rows;
      const auto w = random_int_weights(t, rows, cols);
      std::vector<line64> ip(static_cast<size_t>(n_panels * int_panel_lines(t, cols)));
      repack_int_panels(t, w.data(), row_bytes(t, cols), rows, cols, 0, n_panels, ip.data());
      for (int64_t n_tok : {1, 16, 17, 40, 131}) {
        INFO(weight_type_name(t) << " rows " << rows << " tokens " << n_tok);
        const auto x = random_floats(static_cast<size_t>(n_tok * cols));
        const act_batch b = quantize_batch(x, n_tok, cols);
        const int64_t ldy = rows + 3;
        sentinel_out hw(n_tok, ldy), vnni(n_tok, ldy), model(n_tok, ldy);
        gemv_int_panels_amx(t, ip.data(), rows, 0, n_panels, b.a, hw.y(), ldy);
        gemv_int_panels_avx512(t, ip.data(), rows, 0, n_panels, b.a, vnni.y(), ldy);
        gemv_int_panels_amx_emulated(t, ip.data(), rows, 0, n_panels, b.a, model.y(), ldy);
        CHECK(hw.only_wrote(0, rows));
        CHECK(hw.buf == vnni.buf);
        CHECK(hw.buf == model.buf);
        for (int64_t i = 0; i < n_tok; ++i)
          for (int64_t r = 0; r < rows; ++r)
            REQUIRE(hw.y()[i * ldy + r] == int_kernel_reference(t, w.data() + r * row_bytes(t, cols), b.a, i));
      }
    }
  }
}

TEST_CASE("AMX K panels equal the AVX-512 VNNI kernel and the model bitwise") {
  for (weight_type t : {weight_type::q4_k, weight_type::q5_k, weight_type::q6_k}) {
    for (int64_t rows : {16, 40}) {
      const int64_t cols = 768, n_panels = (rows + panel_rows - 1) / panel_rows;
      const auto w = random_k_weights(t, rows, cols);
      std::vector<line64> kp(static_cast<size_t>(n_panels * kq_panel_lines(t, cols)));
      repack_kq_panels(t, w.data(), static_cast<int64_t>(row_bytes(t, cols)), rows, cols, 0, n_panels, kp.data());
      for (int64_t n_tok : {1, 16, 17, 40, 131}) {
        INFO(weight_type_name(t) << " rows " << rows << " tokens " << n_tok);
        const auto x = random_floats(static_cast<size_t>(n_tok * cols));
        const auto a = quantize_k_batch(x, n_tok, cols);
        const int64_t ldy = rows + 3;
        sentinel_out hw(n_tok, ldy), vnni(n_tok, ldy), model(n_tok, ldy);
        std::vector<int8_t> qs(static_cast<size_t>(n_tok * cols));
        kq_qs_by_block(a.data(), n_tok, cols, qs.data());
        gemv_kq_panels_amx(t, kp.data(), rows, cols, 0, n_panels, a.data(), qs.data(), n_tok, hw.y(), ldy);
        gemv_kq_panels_avx512(t, kp.data(), rows, cols, 0, n_panels, a.data(), n_tok, vnni.y(), ldy);
        gemv_kq_panels_model(t, kp.data(), rows, cols, 0, n_panels, a.data(), n_tok, model.y(), ldy);
        CHECK(hw.only_wrote(0, rows));
        CHECK(hw.buf == vnni.buf);
        CHECK(hw.buf == model.buf);
      }
    }
  }
}

TEST_CASE("linear layers on AMX match the scalar reference and the AVX-512 kernels") {
  thread_pool pool(2);
  for (weight_type t : {weight_type::q4_0, weight_type::q4_1, weight_type::q8_0, weight_type::f16, weight_type::q4_k,
                        weight_type::q6_k}) {
    const int64_t rows = 72, cols = is_k_quant(t) ? 768 : 576;
    std::vector<uint8_t> w(row_bytes(t, cols) * rows);
    if (t == weight_type::f16 || is_k_quant(t)) {
      std::uniform_int_distribution<int> byte(0, 255);
      for (auto& v : w) v = static_cast<uint8_t>(byte(rng()));
      for (int64_t r = 0; r < rows; ++r) {  // sane scales in place of the random bytes
        uint8_t* row = w.data() + r * row_bytes(t, cols);
        if (t == weight_type::f16) {
          for (int64_t c = 0; c < cols; ++c) {
            const uint16_t h = fp32_to_fp16(random_floats(1, 0.1f)[0]);
            std::memcpy(row + 2 * c, &h, 2);
          }
        } else {
          for (int64_t i = 0; i < cols / qk_k; ++i) {
            const uint16_t d = fp32_to_fp16(0.001f), dmin = fp32_to_fp16(0.002f);
            uint8_t* blk = row + i * row_bytes(t, qk_k);
            if (t == weight_type::q6_k) {
              std::memcpy(blk + row_bytes(t, qk_k) - 2, &d, 2);
            } else {
              std::memcpy(blk, &d, 2);
              std::memcpy(blk + 2, &dmin, 2);
            }
          }
        }
      }
    } else {
      w = random_int_weights(t, rows, cols);
    }
    const linear lin(t, w.data(), rows, cols, pool);
    std::vector<float> deq(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(t, w.data() + r * row_bytes(t, cols), &deq[r * cols], cols);
    for (int64_t n_tok : {3, 16, 45}) {
      INFO(weight_type_name(t) << " tokens " << n_tok);
      const auto x = random_floats(static_cast<size_t>(n_tok * cols));
      std::vector<double> ref(static_cast<size_t>(n_tok * rows));
      for (int64_t i = 0; i < n_tok; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0;
          for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(deq[r * cols + c]) * x[i * cols + c];
          ref[i * rows + r] = s;
        }
      sentinel_out amx_gemm(n_tok, rows), amx_gemv(n_tok, rows), off_gemv(n_tok, rows);
      lin.forward_gemm(x.data(), cols, n_tok, amx_gemm.y(), rows, pool);
      lin.forward_gemv(x.data(), cols, n_tok, amx_gemv.y(), rows, pool);
      force_amx_off(true);
      lin.forward_gemv(x.data(), cols, n_tok, off_gemv.y(), rows, pool);
      force_amx_off(false);
      CHECK(amx_gemm.only_wrote(0, rows));
      if (lin.prompt_on_integer_kernel()) {  // K-quants: prompt tokens on the integer kernel too
        CHECK(amx_gemm.buf == amx_gemv.buf);
        CHECK(nmse(ref, amx_gemm.y(), rows, rows, 0) < 1e-3);  // 8-bit activations per 256
      } else {
        CHECK(nmse(ref, amx_gemm.y(), rows, rows, 0) < 2e-5);  // the AVX-512 bf16 kernels' contract
      }
      CHECK(amx_gemv.buf == off_gemv.buf);  // AMX or VNNI: the same bits
      // A prompt token's result does not depend on the chunk it came in.
      sentinel_out one(1, rows);
      lin.forward_gemm(x.data() + (n_tok - 1) * cols, cols, 1, one.y(), rows, pool);
      for (int64_t r = 0; r < rows; ++r) REQUIRE(one.y()[r] == amx_gemm.y()[(n_tok - 1) * rows + r]);
    }
  }
  CHECK(std::string(kernel_isa_name()).find("amx") != std::string::npos);
}
