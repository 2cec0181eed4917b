// The AMX kernels' loops (kernels/cpu/amx_loops.hpp) on the scalar tile model, on any CPU: tile
// configuration, panel and activation layouts, k steps, edge tiles of tokens and panels, strides
// and every byte the tiles touch, against references built from the definitions. On an AMX
// machine test_kernels_amx runs the same loops on the instructions.
#include <catch2/catch.hpp>

#include "kernels/cpu/amx_emulator.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "tests/unit/amx_test_data.hpp"

using namespace sy::cpu;
using namespace amx_test;

TEST_CASE("AMX tile model computes tdpbf16ps and tdpbsud as defined and faults like the hardware") {
  amx_tile_model tl;
  CHECK_THROWS_AS(tl.zero<0>(), std::logic_error);  // before ldtilecfg
  {
    tile_config bad;
    bad.palette = 0;
    CHECK_THROWS_AS(tl.configure(bad), std::logic_error);
    tile_config half;
    half.rows[3] = 4;
    CHECK_THROWS_AS(tl.configure(half), std::logic_error);
    tile_config wide;
    wide.set(0, 16, 128);
    CHECK_THROWS_AS(tl.configure(wide), std::logic_error);
  }
  // tdpbsud: C (2 x 2 int32) += A (2 rows x 8 signed bytes) . B (2 rows x 2 quadruples of unsigned bytes).
  tile_config c;
  c.set(0, 2, 8);
  c.set(1, 2, 8);
  c.set(2, 2, 8);
  tl.configure(c);
  const int8_t a[2][8] = {{1, -2, 3, -4, 5, -6, 7, -128}, {127, 0, 0, 0, -1, 0, 0, 0}};
  const uint8_t b[2][8] = {{255, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 255}};
  const int32_t c0[2][2] = {{100, -100}, {7, 0}};
  tl.load<0>(c0, 8);
  tl.load<1>(a, 8);
  tl.load<2>(b, 8);
  tl.dot_s8u8<0, 1, 2>();
  int32_t got[2][2];
  tl.store<0>(got, 8);
  // C[m][n] += sum_{k<2, j<4} A[m][4k+j] * B[k][4n+j]
  for (int m = 0; m < 2; ++m)
    for (int n = 0; n < 2; ++n) {
      int32_t want = c0[m][n];
      for (int k = 0; k < 2; ++k)
        for (int j = 0; j < 4; ++j) want += a[m][4 * k + j] * b[k][4 * n + j];
      CHECK(got[m][n] == want);
    }
  CHECK(got[0][1] == -100 + (1 * 4 - 2 * 5 + 3 * 6 - 4 * 7) + (5 * 12 - 6 * 13 + 7 * 14 - 128 * 255));
  // Shapes the instruction rejects: A bytes per row must be 4 x B rows.
  c.set(1, 2, 4);
  tl.configure(c);
  CHECK_THROWS_AS((tl.dot_s8u8<0, 1, 2>()), std::logic_error);
  // tdpbf16ps: 1 x 2 f32 += (1 x 2 pairs) . (2 pairs-rows x 2 columns of pairs).
  tile_config f;
  f.set(0, 1, 8);
  f.set(1, 1, 8);
  f.set(2, 2, 8);
  tl.configure(f);
  const uint16_t fa[4] = {fp32_to_bf16(1.f), fp32_to_bf16(2.f), fp32_to_bf16(-3.f), fp32_to_bf16(0.5f)};
  const uint16_t fb[2][4] = {{fp32_to_bf16(1.f), fp32_to_bf16(10.f), fp32_to_bf16(100.f), fp32_to_bf16(1000.f)},
                             {fp32_to_bf16(2.f), fp32_to_bf16(4.f), fp32_to_bf16(8.f), fp32_to_bf16(16.f)}};
  tl.zero<0>();
  tl.load<1>(fa, 8);
  tl.load<2>(fb, 8);
  tl.dot_bf16<0, 1, 2>();
  float fy[2];
  tl.store<0>(fy, 8);
  CHECK(fy[0] == 1.f * 1 + 2.f * 10 + -3.f * 2 + 0.5f * 4);
  CHECK(fy[1] == 1.f * 100 + 2.f * 1000 + -3.f * 8 + 0.5f * 16);
  // Declared memory: a load past it is caught.
  amx_tile_model strict;
  strict.readable(fa, sizeof fa);
  strict.configure(f);
  strict.load<1>(fa, 8);
  CHECK_THROWS_AS(strict.load<2>(fb, 8), std::logic_error);
}

TEST_CASE("AMX bf16 GEMM loops on the tile model match the scalar reference at every edge") {
  for (int64_t k : {32, 96, 576}) {
    for (int64_t n_panels : {1, 2, 3, 4}) {
      const int64_t rows = n_panels * panel_rows;
      const bf16_matrix m = random_bf16_matrix(rows, k);
      for (int64_t n_tok : {1, 5, 16, 17, 32, 33, 47, 70}) {
        INFO("k " << k << " panels " << n_panels << " tokens " << n_tok);
        const int64_t ldx = k + 32;  // rows of x further apart than k: the stride, not k, must be used
        std::vector<uint16_t> x(static_cast<size_t>(n_tok * ldx), fp32_to_bf16(1e30f));  // poison the gaps
        for (int64_t t = 0; t < n_tok; ++t) {
          const auto v = to_bf16(random_floats(static_cast<size_t>(k)));
          std::copy(v.begin(), v.end(), x.begin() + t * ldx);
        }
        // Panels [p0, n_panels): all of them, and all but the first (an offset p0).
        for (int64_t p0 : {int64_t{0}, std::min<int64_t>(1, n_panels - 1)}) {
          const int64_t ldy = rows + 5;
          sentinel_out out(n_tok, ldy);
          amx_tile_model model;
          gemm_panels_amx_emulated(m.panels.data(), k, p0, n_panels, x.data(), ldx, n_tok, out.y(), ldy, &model);
          CHECK(out.only_wrote(p0 * panel_rows, rows));
          const int64_t n_rows = rows - p0 * panel_rows;
          std::vector<double> ref(static_cast<size_t>(n_tok * n_rows));
          for (int64_t t = 0; t < n_tok; ++t)
            for (int64_t r = 0; r < n_rows; ++r) ref[t * n_rows + r] = bf16_dot(m, p0 * panel_rows + r, &x[t * ldx]);
          CHECK(nmse(ref, out.y(), n_rows, ldy, p0 * panel_rows) < 1e-11);  // f32 sums of exact products
          // One tdpbf16ps per (token tile, panel, 32 columns); one configuration for the full
          // tiles, one for the remainder.
          const int64_t tiles = (n_tok + 15) / 16;
          CHECK(model.n_dots() == tiles * (n_panels - p0) * (k / 32));
          CHECK(model.n_configs() == (n_tok >= 16 ? 1 : 0) + (n_tok % 16 ? 1 : 0));
          // Batching cannot change a result: each token alone gives the same bits.
          for (int64_t t : {int64_t{0}, n_tok / 2, n_tok - 1}) {
            std::vector<float> alone(static_cast<size_t>(rows));
            gemm_panels_amx_emulated(m.panels.data(), k, p0, n_panels, &x[t * ldx], ldx, 1, alone.data(), rows);
            for (int64_t r = p0 * panel_rows; r < rows; ++r) REQUIRE(alone[r] == out.y()[t * ldy + r]);
          }
        }
      }
    }
  }
}

TEST_CASE("AMX bf16 GEMM loops on the tile model meet the bf16 kernels' accuracy on quantized layers") {
  // The prompt path as forward_gemm runs it: panels from the repacking code, activations rounded
  // to bf16; against the f32 weights and activations in double (the AVX-512 kernels' 2e-5).
  for (weight_type t :
       {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0}) {
    const int64_t rows = 40, cols = 576, n_panels = 3, n_tok = 21;
    const auto w = random_int_weights(t, rows, cols);
    std::vector<uint16_t> panels(static_cast<size_t>(n_panels * panel_rows * cols));
    pack_bf16_panels(t, w.data(), row_bytes(t, cols), rows, cols, 0, n_panels, panels.data());
    const auto x = random_floats(static_cast<size_t>(n_tok * cols));
    const auto xb = to_bf16(x);
    std::vector<float> deq(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(t, w.data() + r * row_bytes(t, cols), &deq[r * cols], cols);
    const int64_t ldy = n_panels * panel_rows;  // the last panel's rows past the matrix land here too
    sentinel_out out(n_tok, ldy);
    gemm_panels_amx_emulated(panels.data(), cols, 0, n_panels, xb.data(), cols, n_tok, out.y(), ldy);
    std::vector<double> ref(static_cast<size_t>(n_tok * rows));
    for (int64_t i = 0; i < n_tok; ++i)
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(deq[r * cols + c]) * x[i * cols + c];
        ref[i * rows + r] = s;
      }
    INFO(weight_type_name(t));
    CHECK(nmse(ref, out.y(), rows, ldy, 0) < 2e-5);
    for (int64_t i = 0; i < n_tok; ++i)
      for (int64_t r = rows; r < ldy; ++r) REQUIRE(out.y()[i * ldy + r] == 0.f);  // zero rows of the panel
  }
}

TEST_CASE("AMX integer panel loops on the tile model give the VNNI kernel's arithmetic bitwise") {
  for (weight_type t :
       {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0}) {
    for (int64_t rows : {16, 40}) {
      for (int64_t cols : {96, 576}) {
        const auto w = random_int_weights(t, rows, cols);
        const int64_t n_panels = (rows + panel_rows - 1) / panel_rows;
        std::vector<line64> ip(static_cast<size_t>(n_panels * int_panel_lines(t, cols)));
        repack_int_panels(t, w.data(), row_bytes(t, cols), rows, cols, 0, n_panels, ip.data());
        for (int64_t n_tok : {1, 15, 16, 17, 40, 131}) {  // 131: past a 128-token pass
          INFO(weight_type_name(t) << " rows " << rows << " cols " << cols << " tokens " << n_tok);
          const auto x = random_floats(static_cast<size_t>(n_tok * cols));
          const act_batch b = quantize_batch(x, n_tok, cols);
          for (int64_t p0 : {int64_t{0}, n_panels - 1}) {
            const int64_t ldy = rows + 3;
            sentinel_out out(n_tok, ldy);
            amx_tile_model model;
            gemv_int_panels_amx_emulated(t, ip.data(), rows, p0, n_panels, b.a, out.y(), ldy, &model);
            CHECK(out.only_wrote(p0 * panel_rows, rows));  // rows past the matrix are not stored
            CHECK(model.n_configs() == 1);
            CHECK(model.n_dots() == (n_panels - p0) * (cols / qk) * ((n_tok + 15) / 16));
            std::vector<block_q8_act> blocks(static_cast<size_t>(cols / qk));
            for (int64_t i = 0; i < n_tok; ++i) {
              quantize_row_q8_act(x.data() + i * cols, blocks.data(), cols);
              for (int64_t r = p0 * panel_rows; r < rows; ++r) {
                const uint8_t* row = w.data() + r * row_bytes(t, cols);
                REQUIRE(out.y()[i * ldy + r] == int_kernel_reference(t, row, b.a, i));
                // and the quantized dot product it stands for, up to f32 sums
                REQUIRE(out.y()[i * ldy + r] ==
                        Approx(dot_row_q8_act_ref(t, row, blocks.data(), cols)).epsilon(1e-4).margin(1e-4));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("AMX is only chosen where it is usable, and named when it is") {
  const amx_state s = cpu_features().amx;
  if (s != amx_state::usable) {
    CHECK_FALSE(use_amx_kernels());
    CHECK(std::string(kernel_isa_name()).find("amx") == std::string::npos);
  } else {
    CHECK(use_amx_kernels() == use_avx512_kernels());
  }
  force_amx_off(true);
  CHECK_FALSE(use_amx_kernels());
  CHECK(std::string(kernel_isa_name()).find("amx") == std::string::npos);
  force_amx_off(false);
  CHECK_FALSE(std::string(amx_status()).empty());
}
