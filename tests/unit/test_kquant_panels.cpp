// K panels (kernels/cpu/kquant_panels.hpp): the repack keeps every value, scale and min of the
// GGUF rows; the scalar model computes the quantized dot product; the AVX2 kernel, the AVX-512
// kernel (where the CPU has it) and the AMX loops on the tile model (any CPU) give the model's
// results bitwise for every edge of rows, columns and tokens, and write nothing they do not own.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/amx_emulator.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/kquant_panels.hpp"
#include "tests/unit/amx_test_data.hpp"

using namespace sy::cpu;
using namespace amx_test;

namespace {

const weight_type k_types[] = {weight_type::q4_k, weight_type::q5_k, weight_type::q6_k};

struct kq_matrix {
  int64_t rows, cols, n_panels;
  std::vector<uint8_t> w;
  std::vector<line64> panels;
};
kq_matrix make_matrix(weight_type t, int64_t rows, int64_t cols) {
  kq_matrix m{rows, cols, (rows + panel_rows - 1) / panel_rows, random_k_weights(t, rows, cols), {}};
  m.panels.resize(static_cast<size_t>(m.n_panels * kq_panel_lines(t, cols)));
  repack_kq_panels(t, m.w.data(), static_cast<int64_t>(row_bytes(t, cols)), rows, cols, 0, m.n_panels, m.panels.data());
  return m;
}

}  // namespace

TEST_CASE("K panels hold exactly the GGUF rows' values, scales and mins") {
  for (weight_type t : k_types)
    for (int64_t rows : {16, 21}) {
      const auto m = make_matrix(t, rows, 512);
      std::vector<float> want(512), got(512);
      for (int64_t r = 0; r < m.n_panels * panel_rows; ++r) {
        INFO(weight_type_name(t) << " row " << r);
        dequantize_kq_panel_row(t, m.panels.data(), m.rows, m.cols, r / 16, static_cast<int>(r % 16), got.data());
        if (r < rows)
          dequantize_row(t, m.w.data() + r * row_bytes(t, m.cols), want.data(), m.cols);
        else
          std::fill(want.begin(), want.end(), 0.f);  // rows past the matrix are zero
        REQUIRE(got == want);
      }
    }
}

TEST_CASE("a super-block's K-panel lines lie in the order the kernels read them") {
  for (weight_type t : k_types) {  // (that kq_at is a permutation is a static_assert)
    INFO(static_cast<int>(t));
    const int64_t s0 = t == weight_type::q6_k ? 48 : kq_lines(t) - 5;
    for (int64_t l = 0; l < 5; ++l) CHECK(kq_at(t, s0 + l) == l);  // scales (and mins), d first
    // then the groups' nibble lines, each followed by its lines of high bits (none for q4_K)
    const int nib = t == weight_type::q6_k ? 4 : 8, bits = t == weight_type::q4_k ? 0 : 2;
    for (int64_t g = 0; g < 32 / nib; ++g)
      for (int c = 0; c < nib; ++c) {
        CHECK(kq_at(t, nib * g + c) == 5 + (nib + bits) * g + c);
        if (bits) CHECK(kq_at(t, 32 + 2 * g + c * 2 / nib) == 5 + (nib + bits) * g + nib + c * 2 / nib);
      }
  }
}

TEST_CASE("a group of K panels holds super-block b of each of its panels in turn") {
  // 7 panels: a group of 4, then a last group of 3; 3 super-blocks a row.
  for (weight_type t : k_types) {
    INFO(weight_type_name(t));
    const int64_t L = kq_lines(t), nb = 3, n_panels = 7;
    std::vector<int> seen(static_cast<size_t>(n_panels * nb), 0);
    for (int64_t p = 0; p < n_panels; ++p)
      for (int64_t b = 0; b < nb; ++b) {
        const kq_where at = kq_where_of(t, nb, n_panels, p);
        const int64_t line = at.first + b * at.step;
        const int64_t g0 = p / 4 * 4, in_group = p < 4 ? 4 : 3;
        CHECK(line == (g0 * nb + b * in_group + (p - g0)) * L);
        REQUIRE(line % L == 0);
        ++seen[static_cast<size_t>(line / L)];
      }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));  // every slot once
    int64_t first = 0, count = 0;
    kq_span_of(t, nb, n_panels, 5, 6, first, count);  // panel 5 lies in the last group's lines
    CHECK(first == 4 * nb * L);
    CHECK(count == 3 * nb * L);
  }
}

TEST_CASE("the kernels prefetch K-panel lines in software except on AMD CPUs, unless forced") {
  // The vendor as Linux reports it, apart from the CPUID read under test.
  std::ifstream info("/proc/cpuinfo");
  std::string line, vendor;
  while (vendor.empty() && std::getline(info, line))
    if (line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 2);
  if (!vendor.empty()) CHECK(cpu_features().amd == (vendor == "AuthenticAMD" || vendor == "HygonGenuine"));
  const char* forced = std::getenv("SY_KQ_PREFETCH");
  const bool is_forced = forced && (std::string(forced) == "0" || std::string(forced) == "1");
  if (is_forced)
    CHECK(kq_line_prefetch() == (std::string(forced) == "1"));
  else
    CHECK(kq_line_prefetch() == !cpu_features().amd);
  CHECK(std::string(kq_line_prefetch_status()).rfind(kq_line_prefetch() ? "on" : "off", 0) == 0);
}

TEST_CASE("the load-time K-panel repack writes the reference repack's bytes") {
  for (weight_type t : k_types) {
    const auto m = make_matrix(t, 37, 768);
    std::vector<line64> ref(m.panels.size());
    repack_kq_panels_reference(t, m.w.data(), static_cast<int64_t>(row_bytes(t, m.cols)), m.rows, m.cols, 0, m.n_panels,
                               ref.data());
    INFO(weight_type_name(t));
    REQUIRE(std::memcmp(ref.data(), m.panels.data(), ref.size() * sizeof(line64)) == 0);
  }
}

TEST_CASE("bf16 panels built from K panels equal those built from the GGUF rows") {
  // Under every kernel family (SY_CPU_ISA): the AVX-512 lane-parallel build where the CPU has it,
  // the scalar one otherwise; a whole panel and a part-filled one.
  for (weight_type t : k_types)
    for (int64_t n_rows : {21, 32}) {
      const auto m = make_matrix(t, n_rows, 512);
      std::vector<uint16_t> want(static_cast<size_t>(m.n_panels * panel_rows * m.cols)), got(want.size());
      pack_bf16_panels(t, m.w.data(), static_cast<int64_t>(row_bytes(t, m.cols)), m.rows, m.cols, 0, m.n_panels,
                       want.data());
      pack_bf16_panels_from_kq(t, m.panels.data(), m.rows, m.cols, 0, m.n_panels, got.data());
      INFO(weight_type_name(t) << " rows " << n_rows);
      size_t bad = 0, first = want.size();
      for (size_t i = 0; i < want.size(); ++i)
        if (got[i] != want[i]) {
          ++bad;
          first = std::min(first, i);
        }
      INFO("differing " << bad << ", first at " << first);
      REQUIRE(bad == 0);
    }
}

TEST_CASE("the K-panel model computes the quantized dot product") {
  for (weight_type t : k_types) {
    const auto m = make_matrix(t, 40, 768);
    const int64_t n_tok = 3;
    const auto x = random_floats(static_cast<size_t>(n_tok * m.cols));
    const auto a = quantize_k_batch(x, n_tok, m.cols);
    std::vector<float> y(static_cast<size_t>(n_tok * m.rows));
    gemv_kq_panels_model(t, m.panels.data(), m.rows, m.cols, 0, m.n_panels, a.data(), n_tok, y.data(), m.rows);
    for (int64_t i = 0; i < n_tok; ++i)
      for (int64_t r = 0; r < m.rows; ++r) {
        INFO(weight_type_name(t) << " row " << r << " token " << i);
        const float ref =
            dot_row_q8_K_ref(t, m.w.data() + r * row_bytes(t, m.cols), a.data() + i * (m.cols / qk_k), m.cols);
        REQUIRE(y[i * m.rows + r] == Approx(ref).epsilon(1e-5).margin(1e-5));
      }
  }
}

namespace {
using kq_kernel = void (*)(weight_type, const line64*, int64_t, int64_t, int64_t, int64_t, const block_q8_K*, int64_t,
                           float*, int64_t);
// A kernel against the model over every edge of rows (a last panel of 5 or 8 rows: one half empty
// or half-filled; of 12: the second half part-filled; 104: a whole group of panels and a part of
// one), columns, tokens (past one token block, kq_token_block: a block and a rest of 2; 70 at
// 1024 columns: past the AVX2 kernel's 64-token passes; 5-8: the VNNI kernel's one-pass groups
// after the panel groups of 1-4; 11, 12, 15, 16 and 21: groups of 8 (the VNNI kernel's, the AVX2
// kernel's for q6_K) and rests of 3, 4, 7, none and 5 after them; 21 at 8192 columns: blocks of 12
// tokens, or of 16 where the groups are 8) and range of panels (from inside a group, to inside
// one); and it writes nothing it does not own.
void check_against_model(kq_kernel kernel) {
  for (weight_type t : k_types)
    for (int64_t rows : {5, 16, 24, 28, 40, 104})
      for (int64_t cols : {256, 1024, 4096, 8192}) {
        const auto m = make_matrix(t, rows, cols);
        const std::vector<int64_t> counts = cols == 4096   ? std::vector<int64_t>{kq_token_block(cols / qk_k) + 6}
                                            : cols == 8192 ? std::vector<int64_t>{21}
                                            : cols == 1024
                                                ? std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 15, 16, 21, 70}
                                                : std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 15, 16, 21};
        for (int64_t n_tok : counts) {
          INFO(weight_type_name(t) << " rows " << rows << " cols " << cols << " tokens " << n_tok);
          const auto x = random_floats(static_cast<size_t>(n_tok * cols));
          const auto a = quantize_k_batch(x, n_tok, cols);
          std::vector<std::pair<int64_t, int64_t>> ranges{{0, m.n_panels}, {m.n_panels - 1, m.n_panels}};
          if (m.n_panels > 2) ranges.push_back({1, m.n_panels - 1});
          for (const auto& [p0, p1] : ranges) {
            INFO("panels " << p0 << " to " << p1);
            const int64_t ldy = rows + 3;
            sentinel_out got(n_tok, ldy), want(n_tok, ldy);
            kernel(t, m.panels.data(), rows, cols, p0, p1, a.data(), n_tok, got.y(), ldy);
            gemv_kq_panels_model(t, m.panels.data(), rows, cols, p0, p1, a.data(), n_tok, want.y(), ldy);
            CHECK(got.only_wrote(p0 * panel_rows, std::min(rows, p1 * panel_rows)));
            REQUIRE(got.buf == want.buf);
          }
        }
      }
}
}  // namespace

TEST_CASE("the AVX-512 K-panel kernel gives the model's results bitwise") {
  if (!use_avx512_vnni_kernels()) {
    WARN("no AVX-512 VNNI here (" << kernel_isa_name()
                                  << "): the kernel cannot run; the model it must equal is checked above");
    SUCCEED();
    return;
  }
  check_against_model(gemv_kq_panels_avx512);
}

TEST_CASE("the AVX2 K-panel kernel gives the model's results bitwise") {
  check_against_model(gemv_kq_panels_avx2);  // the x86-64-v3 baseline: every CPU these builds run on
}

TEST_CASE("the K-panel kernels' integer sums do not overflow at the extremes of weights and activations") {
  // Every weight at its largest value (all bits set) and every activation at -128 or 127: the
  // AVX2 kernel's int16 partial sums are at their bound (q4_K 8 lines, q5_K 4, q6_K 2 of
  // 2 * (2^w - 1) * 128 each); scales and mins at their largest too.
  for (weight_type t : k_types)
    for (int8_t v : {int8_t{-128}, int8_t{127}}) {
      const int64_t rows = 16, cols = 512;
      auto m = make_matrix(t, rows, cols);
      const size_t bytes = row_bytes(t, qk_k);
      for (size_t b = 0; b < m.w.size() / bytes; ++b) {
        uint8_t* blk = m.w.data() + b * bytes;
        const uint16_t d = fp32_to_fp16(1e-3f);
        if (t == weight_type::q6_k) {
          std::memset(blk, 0xff, bytes - 2);                // ql, qh: 63; scales: -1
          std::memset(blk + 192, b % 2 ? 0x7f : 0x80, 16);  // scales 127 or -128
          std::memcpy(blk + bytes - 2, &d, 2);
        } else {
          std::memset(blk + 4, 0xff, bytes - 4);  // scales and mins 63, values 15 / 31
          std::memcpy(blk, &d, 2);
          std::memcpy(blk + 2, &d, 2);
        }
      }
      repack_kq_panels(t, m.w.data(), static_cast<int64_t>(row_bytes(t, cols)), rows, cols, 0, m.n_panels,
                       m.panels.data());
      // 16 tokens, all the same: every kernel's widest token group (8: the VNNI kernel's, and the
      // AVX2 kernel's for q6_K) sees them too.
      const int64_t n_tok = 16;
      std::vector<block_q8_K> a(n_tok * cols / qk_k);
      for (auto& blk : a) {
        blk.d = 0.5f;
        std::fill(std::begin(blk.qs), std::end(blk.qs), v);
        std::fill(std::begin(blk.bsums), std::end(blk.bsums), static_cast<int16_t>(16 * v));
        std::fill(std::begin(blk.sums32), std::end(blk.sums32), static_cast<int16_t>(32 * v));
      }
      INFO(weight_type_name(t) << " activations " << int{v});
      sentinel_out got(n_tok, rows), want(n_tok, rows);
      gemv_kq_panels_model(t, m.panels.data(), rows, cols, 0, m.n_panels, a.data(), n_tok, want.y(), rows);
      gemv_kq_panels_avx2(t, m.panels.data(), rows, cols, 0, m.n_panels, a.data(), n_tok, got.y(), rows);
      REQUIRE(got.buf == want.buf);
      CHECK(want.y()[(n_tok - 1) * rows] == want.y()[0]);
      // and the model's sum is the reference dot product's
      const float ref = dot_row_q8_K_ref(t, m.w.data(), a.data(), cols);
      CHECK(want.y()[0] == Approx(ref).epsilon(1e-5));
      if (use_avx512_vnni_kernels()) {
        sentinel_out wide(n_tok, rows);
        gemv_kq_panels_avx512(t, m.panels.data(), rows, cols, 0, m.n_panels, a.data(), n_tok, wide.y(), rows);
        REQUIRE(wide.buf == want.buf);
      }
    }
}

namespace {

// A vectorised q8_K quantizer against the scalar rule on random rows, ties, zeros, tiny and huge
// values, values at .5 steps, NaN and infinities: every block bitwise.
void check_q8_K_quantizer(void (*quantize)(const float*, block_q8_K*, int64_t)) {
  const int64_t n = 4 * 256;
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < 8; ++r) rows.push_back(random_floats(static_cast<size_t>(n)));
  auto& ties = rows.emplace_back(random_floats(static_cast<size_t>(n)));
  for (int b = 0; b < 4; ++b) {  // the same magnitude twice: the first one's sign gives the scale's
    ties[256 * b + 17] = b % 2 ? 3.5f : -3.5f;
    ties[256 * b + 200] = b % 2 ? -3.5f : 3.5f;
  }
  auto& edges = rows.emplace_back(static_cast<size_t>(n), 0.f);  // block 0 all zeros
  edges[256 + 5] = -0.f;                                         // block 1: -0 and tiny values
  edges[256 + 6] = 1e-30f;
  edges[256 + 7] = -2e-30f;
  for (int j = 0; j < 256; ++j) edges[512 + j] = (j % 3 - 1) * 1e30f;                  // block 2: huge values
  for (int j = 0; j < 256; ++j) edges[768 + j] = static_cast<float>(j % 255) - 127.f;  // ties at .5 steps
  auto& bad = rows.emplace_back(random_floats(static_cast<size_t>(n)));
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  bad[256 + 9] = std::numeric_limits<float>::infinity();
  bad[512 + 1] = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < rows.size(); ++r) {
    INFO("row " << r);
    std::vector<block_q8_K> want(4), got(4);
    quantize_row_q8_K(rows[r].data(), want.data(), n);
    quantize(rows[r].data(), got.data(), n);
    for (int b = 0; b < 4; ++b) {
      INFO("block " << b);
      CHECK(std::memcmp(&want[b], &got[b], sizeof(block_q8_K)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("the AVX2 q8_K quantizer gives the scalar rule's blocks bitwise") {
  check_q8_K_quantizer(quantize_row_q8_K_avx2);
}

TEST_CASE("the AVX-512 q8_K quantizer gives the scalar rule's blocks bitwise") {
  if (!use_avx512_vnni_kernels()) {
    WARN("no AVX-512 VNNI here (" << kernel_isa_name()
                                  << "): the quantizer cannot run; the scalar rule is checked against ggml's");
    SUCCEED();
    return;
  }
  check_q8_K_quantizer(quantize_row_q8_K_avx512);
}

TEST_CASE("AMX K-panel loops on the tile model give the model's results bitwise") {
  for (weight_type t : k_types)
    for (int64_t rows : {16, 40, 104}) {  // 104: a whole group of panels and a part of one
      const int64_t cols = 512;
      const auto m = make_matrix(t, rows, cols);
      for (int64_t n_tok : {1, 15, 16, 17, 40, 129}) {  // 129: past a 128-token pass
        INFO(weight_type_name(t) << " rows " << rows << " tokens " << n_tok);
        const auto x = random_floats(static_cast<size_t>(n_tok * cols));
        const auto a = quantize_k_batch(x, n_tok, cols);
        for (int64_t p0 : {int64_t{0}, int64_t{1}, m.n_panels - 1}) {
          if (p0 >= m.n_panels) continue;
          INFO("first panel " << p0);
          const int64_t ldy = rows + 3;
          sentinel_out got(n_tok, ldy), want(n_tok, ldy);
          amx_tile_model model;
          gemv_kq_panels_amx_emulated(t, m.panels.data(), rows, cols, p0, m.n_panels, a.data(), n_tok, got.y(), ldy,
                                      &model);
          gemv_kq_panels_model(t, m.panels.data(), rows, cols, p0, m.n_panels, a.data(), n_tok, want.y(), ldy);
          CHECK(got.only_wrote(p0 * panel_rows, rows));
          CHECK(model.n_configs() == 1);
          // per super-block and token tile, two dot products (high and low parts) per 64 columns
          CHECK(model.n_dots() == 2 * 4 * (cols / qk_k) * (m.n_panels - p0) * ((n_tok + 15) / 16));
          REQUIRE(got.buf == want.buf);
        }
      }
    }
}

// (-Wpsabi: the 64-byte vector values stay inside this function.)
#pragma GCC diagnostic ignored "-Wpsabi"
TEST_CASE("the scale split of q4_K and q5_K weights gives every product exactly, in bytes") {
  // Every value with every 6-bit scale, in even and odd bytes: lo + 2^s hi = q sc per byte.
  for (const auto& [q_max, shift] : {std::pair{15, 4}, std::pair{31, 3}}) {
    for (int sc = 0; sc < 64; ++sc) {
      alignas(64) line64 v{}, hi{}, lo{};
      for (int b = 0; b < 64; ++b) v.b[b] = static_cast<uint8_t>((b * 7 + sc) % (q_max + 1));
      kq_v32u16 sc16;
      for (int i = 0; i < 32; ++i) sc16[i] = static_cast<uint16_t>(sc);
      kq_split_scale(kq_load<kq_v64u>(&v), kq_make_scale_split(sc16, shift), &hi, &lo);
      for (int b = 0; b < 64; ++b) {
        INFO("q max " << q_max << " scale " << sc << " byte " << b);
        REQUIRE(lo.b[b] + (hi.b[b] << shift) == v.b[b] * sc);
      }
    }
    // The largest products: the largest value with the largest scale in every byte.
    alignas(64) line64 v{}, hi{}, lo{};
    for (auto& x : v.b) x = static_cast<uint8_t>(q_max);
    kq_v32u16 sc16;
    for (int i = 0; i < 32; ++i) sc16[i] = 63;
    kq_split_scale(kq_load<kq_v64u>(&v), kq_make_scale_split(sc16, shift), &hi, &lo);
    for (int b = 0; b < 64; ++b) REQUIRE(lo.b[b] + (hi.b[b] << shift) == q_max * 63);
  }
}

TEST_CASE("the product split of q6_K weights gives every product exactly, in bytes") {
  // Every 6-bit value with every int8 scale, in even and odd bytes: lo + 256 hi = (q - 32) sc.
  for (int sc = -128; sc < 128; ++sc) {
    alignas(64) line64 v{}, hi{}, lo{};
    for (int b = 0; b < 64; ++b) v.b[b] = static_cast<uint8_t>((b * 5 + sc + 128) % 64);
    kq_v32i16 sc16;
    for (int i = 0; i < 32; ++i) sc16[i] = static_cast<int16_t>(sc);
    kq_split_scalar(kq_load<kq_v64u>(&v), kq_make_sub_scale(sc16, 32), &hi, &lo);
    for (int b = 0; b < 64; ++b) {
      INFO("scale " << sc << " byte " << b);
      REQUIRE(lo.b[b] + 256 * static_cast<int8_t>(hi.b[b]) == (v.b[b] - 32) * sc);
    }
  }
}
