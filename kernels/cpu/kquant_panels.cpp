// K panels (kquant_panels.hpp): the repack from GGUF rows, the dequantization of a panel row, and
// the scalar model of the kernels' arithmetic.
#include "kernels/cpu/kquant_panels.hpp"

#include <cmath>
#include <cstring>

namespace sy::cpu {
namespace {

// One row's super-block, unpacked: its 256 unsigned values (q4_K 0..15, q5_K 0..31, q6_K 0..63),
// scales, mins (q4_K/q5_K) and the fp16 d, dmin as stored.
struct kq_block {
  uint8_t q[256];
  int8_t sc[16];  // q4_K/q5_K: 8 scales (0..63); q6_K: 16 signed scales
  uint8_t mn[8];
  uint16_t d = 0, dmin = 0;
};

void unpack_block(weight_type t, const uint8_t* p, kq_block& u) {
  unpack_k_block(t, p, u.q, u.sc, u.mn);
  if (t == weight_type::q6_k) {
    u.d = reinterpret_cast<const block_q6_K*>(p)->d;
    return;
  }
  std::memcpy(&u.d, p, 2);  // q4_K and q5_K both start with d, dmin
  std::memcpy(&u.dmin, p + 2, 2);
}

size_t gguf_block_bytes(weight_type t) {
  return t == weight_type::q4_k ? sizeof(block_q4_K) : t == weight_type::q5_k ? sizeof(block_q5_K) : sizeof(block_q6_K);
}

// Where a row's value of column `col` (< 256) lives in the super-block's lines: the nibble line,
// whether it is the high nibble, and the byte within lane i (4i + byte).
struct kq_place {
  int line, byte;
  bool high;
};
kq_place place_of(weight_type t, int col) {
  if (t == weight_type::q6_k) {
    const bool high = col >= 128;
    const int c = col & 127;
    return {c / 4, c % 4, high};
  }
  const int g = col / 64, r = col % 64;
  const bool high = r >= 32;
  const int l = r & 31;
  return {8 * g + l / 4, l % 4, high};
}

// Writes one row's super-block into lane i of the panel's lines `blk`.
void put_block(weight_type t, const kq_block& u, int i, line64* blk) {
  for (int col = 0; col < 256; ++col) {
    const kq_place w = place_of(t, col);
    uint8_t& nib = blk[kq_at(t, w.line)].b[4 * i + w.byte];
    const uint8_t v = u.q[col];
    nib |= static_cast<uint8_t>((v & 15) << (w.high ? 4 : 0));
    if (t == weight_type::q5_k) {  // fifth bit
      const int g = w.line / 8, c = w.line % 8;
      uint8_t& h = blk[kq_at(t, 32 + 2 * g + c / 4)].b[4 * i + w.byte];
      h |= static_cast<uint8_t>(((v >> 4) & 1) << (2 * (c % 4) + (w.high ? 1 : 0)));
    } else if (t == weight_type::q6_k) {  // top two bits
      const int j = w.line / 4, c = w.line % 4;
      uint8_t& h = blk[kq_at(t, 32 + 2 * j + c / 2)].b[4 * i + w.byte];
      h |= static_cast<uint8_t>(((v >> 4) & 3) << (4 * (c % 2) + (w.high ? 2 : 0)));
    }
  }
  const int64_t n = kq_lines(t);
  if (t == weight_type::q6_k) {
    for (int j = 0; j < 16; ++j)
      blk[kq_at(t, 48 + j / 4)].b[32 * (j / 2 % 2) + 2 * i + j % 2] = static_cast<uint8_t>(u.sc[j]);
    std::memcpy(blk[kq_at(t, 52)].b + 2 * i, &u.d, 2);
    return;
  }
  const int64_t s = n - 5;  // first scales line
  for (int j = 0; j < 8; ++j) {
    blk[kq_at(t, s + j / 4)].b[32 * (j / 2 % 2) + 2 * i + j % 2] = static_cast<uint8_t>(u.sc[j]);
    blk[kq_at(t, s + 2 + j / 4)].b[32 * (j / 2 % 2) + 2 * i + j % 2] = u.mn[j];
  }
  std::memcpy(blk[kq_at(t, n - 1)].b + 2 * i, &u.d, 2);
  std::memcpy(blk[kq_at(t, n - 1)].b + 32 + 2 * i, &u.dmin, 2);
}

// Reads back lane i of a super-block's lines (the inverse of put_block).
void get_block(weight_type t, const line64* blk, int i, kq_block& u) {
  for (int col = 0; col < 256; ++col) {
    const kq_place w = place_of(t, col);
    uint8_t v = static_cast<uint8_t>((blk[kq_at(t, w.line)].b[4 * i + w.byte] >> (w.high ? 4 : 0)) & 15);
    if (t == weight_type::q5_k) {
      const int g = w.line / 8, c = w.line % 8;
      v |= static_cast<uint8_t>(
          ((blk[kq_at(t, 32 + 2 * g + c / 4)].b[4 * i + w.byte] >> (2 * (c % 4) + (w.high ? 1 : 0))) & 1) << 4);
    } else if (t == weight_type::q6_k) {
      const int j = w.line / 4, c = w.line % 4;
      v |= static_cast<uint8_t>(
          ((blk[kq_at(t, 32 + 2 * j + c / 2)].b[4 * i + w.byte] >> (4 * (c % 2) + (w.high ? 2 : 0))) & 3) << 4);
    }
    u.q[col] = v;
  }
  const int64_t n = kq_lines(t);
  if (t == weight_type::q6_k) {
    for (int j = 0; j < 16; ++j)
      u.sc[j] = static_cast<int8_t>(blk[kq_at(t, 48 + j / 4)].b[32 * (j / 2 % 2) + 2 * i + j % 2]);
    std::memcpy(&u.d, blk[kq_at(t, 52)].b + 2 * i, 2);
    return;
  }
  const int64_t s = n - 5;
  for (int j = 0; j < 8; ++j) {
    u.sc[j] = static_cast<int8_t>(blk[kq_at(t, s + j / 4)].b[32 * (j / 2 % 2) + 2 * i + j % 2]);
    u.mn[j] = blk[kq_at(t, s + 2 + j / 4)].b[32 * (j / 2 % 2) + 2 * i + j % 2];
  }
  std::memcpy(&u.d, blk[kq_at(t, n - 1)].b + 2 * i, 2);
  std::memcpy(&u.dmin, blk[kq_at(t, n - 1)].b + 32 + 2 * i, 2);
}

// put_block for one GGUF super-block, written straight from its bytes (the load-time path):
// q4_K/q5_K nibble lines are the GGUF qs bytes as they are, 4 at a time; the fifth bits, the q6_K
// values and the scales are moved bit-field by bit-field. The same lines as put_block (tested).
void put_gguf_block(weight_type t, const uint8_t* p, int i, line64* blk) {
  auto pair_byte = [&](int64_t first, int j) -> uint8_t& {
    return blk[kq_at(t, first + j / 4)].b[32 * (j / 2 % 2) + 2 * i + j % 2];
  };
  if (t == weight_type::q6_k) {
    const auto& b = *reinterpret_cast<const block_q6_K*>(p);
    for (int L = 0; L < 32; ++L)
      for (int k = 0; k < 4; ++k) {
        const int col = 4 * L + k, c = col / 32, l = col % 32;  // (half n, chunk c, lane l) of the GGUF layout
        const uint8_t b0 = b.ql[l + 32 * (c & 1)], b1 = b.ql[64 + l + 32 * (c & 1)];
        const uint8_t lo = c < 2 ? b0 & 15 : b0 >> 4, hi = c < 2 ? b1 & 15 : b1 >> 4;
        blk[kq_at(t, L)].b[4 * i + k] = static_cast<uint8_t>(lo | (hi << 4));
        const uint8_t top_lo = (b.qh[l] >> (2 * c)) & 3, top_hi = (b.qh[32 + l] >> (2 * c)) & 3;
        const int j = L / 4, cc = L % 4;
        blk[kq_at(t, 32 + 2 * j + cc / 2)].b[4 * i + k] |=
            static_cast<uint8_t>((top_lo | (top_hi << 2)) << (4 * (cc % 2)));
      }
    for (int j = 0; j < 16; ++j)
      blk[kq_at(t, 48 + j / 4)].b[32 * (j / 2 % 2) + 2 * i + j % 2] = static_cast<uint8_t>(b.scales[j]);
    std::memcpy(blk[kq_at(t, 52)].b + 2 * i, &b.d, 2);
    return;
  }
  const bool q5 = t == weight_type::q5_k;
  const uint8_t* qs = q5 ? reinterpret_cast<const block_q5_K*>(p)->qs : reinterpret_cast<const block_q4_K*>(p)->qs;
  const uint8_t* scales = p + 4;  // after d, dmin (both layouts)
  for (int g = 0; g < 4; ++g)
    for (int c = 0; c < 8; ++c) std::memcpy(blk[kq_at(t, 8 * g + c)].b + 4 * i, qs + 32 * g + 4 * c, 4);
  if (q5) {
    const uint8_t* qh = reinterpret_cast<const block_q5_K*>(p)->qh;
    for (int g = 0; g < 4; ++g)
      for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k) {
          uint8_t v = 0;  // bits (2g, 2g + 1) of qh[l] are the fifth bits of columns 64g + l and 64g + 32 + l
          for (int cc = 0; cc < 4; ++cc)
            v |= static_cast<uint8_t>(((qh[16 * h + 4 * cc + k] >> (2 * g)) & 3) << (2 * cc));
          blk[kq_at(t, 32 + 2 * g + h)].b[4 * i + k] = v;
        }
  }
  const int64_t s = kq_lines(t) - 5;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, mn;
    k_scale_min(j, scales, sc, mn);
    pair_byte(s, j) = sc;
    pair_byte(s + 2, j) = mn;
  }
  std::memcpy(blk[kq_at(t, s + 4)].b + 2 * i, p, 2);           // d
  std::memcpy(blk[kq_at(t, s + 4)].b + 32 + 2 * i, p + 2, 2);  // dmin
}

}  // namespace

// The slow, obviously-right writer of a block's lines (from the unpacked values), for the test
// that holds put_gguf_block to it.
void repack_kq_panels_reference(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, int64_t p0,
                                int64_t p1, line64* out) {
  const int64_t nb = k / qk_k, lines = kq_lines(t);
  const size_t bb = gguf_block_bytes(t);
  kq_block u;
  for (int64_t p = p0; p < p1; ++p) {
    const kq_where at = kq_where_of(t, nb, kq_n_panels(rows), p);
    for (int64_t b = 0; b < nb; ++b)
      std::memset(static_cast<void*>(out + at.first + b * at.step), 0, static_cast<size_t>(lines) * sizeof(line64));
    for (int i = 0; i < panel_rows && 16 * p + i < rows; ++i) {
      const uint8_t* row = w + (16 * p + i) * row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        unpack_block(t, row + b * bb, u);
        put_block(t, u, i, out + at.first + b * at.step);
      }
    }
  }
}

void repack_kq_panels(weight_type t, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t k, int64_t p0,
                      int64_t p1, line64* out) {
  const int64_t nb = k / qk_k, lines = kq_lines(t);
  const size_t bb = gguf_block_bytes(t);
  for (int64_t p = p0; p < p1; ++p) {
    const kq_where at = kq_where_of(t, nb, kq_n_panels(rows), p);
    for (int64_t b = 0; b < nb; ++b)
      std::memset(static_cast<void*>(out + at.first + b * at.step), 0, static_cast<size_t>(lines) * sizeof(line64));
    for (int i = 0; i < panel_rows && 16 * p + i < rows; ++i) {
      const uint8_t* row = w + (16 * p + i) * row_bytes;
      for (int64_t b = 0; b < nb; ++b) put_gguf_block(t, row + b * bb, i, out + at.first + b * at.step);
    }
  }
}

void dequantize_kq_panel_row(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p, int i,
                             float* out) {
  // The inverse of put_gguf_block, field by field, with the reference dequantization's expressions
  // (quant_k.cpp) so the values are the same floats.
  const int64_t nb = k / qk_k, lines = kq_lines(t);
  const kq_panel panel = kq_panel_of(panels, t, nb, kq_n_panels(rows), p);
  auto pair_byte = [&](const line64* blk, int64_t first, int j) {
    return blk[kq_at(t, first + j / 4)].b[32 * (j / 2 % 2) + 2 * i + j % 2];
  };
  for (int64_t b = 0; b < nb; ++b, out += qk_k) {
    const line64* blk = panel.block(b);
    uint16_t dh, dmh;
    std::memcpy(&dh, blk[kq_at(t, lines - 1)].b + 2 * i, 2);
    const float d = fp16_to_fp32(dh);
    if (t == weight_type::q6_k) {
      for (int L = 0; L < 32; ++L) {
        const int j = L / 4, cc = L % 4;
        const float s_lo = d * static_cast<int8_t>(pair_byte(blk, 48, j));
        const float s_hi = d * static_cast<int8_t>(pair_byte(blk, 48, 8 + j));
        for (int kk = 0; kk < 4; ++kk) {
          const uint8_t v = blk[kq_at(t, L)].b[4 * i + kk];
          const uint8_t h = blk[kq_at(t, 32 + 2 * j + cc / 2)].b[4 * i + kk] >> (4 * (cc % 2));
          out[4 * L + kk] = s_lo * ((static_cast<int>(v & 15) | ((h & 3) << 4)) - 32);
          out[128 + 4 * L + kk] = s_hi * ((static_cast<int>(v >> 4) | (((h >> 2) & 3) << 4)) - 32);
        }
      }
      continue;
    }
    std::memcpy(&dmh, blk[kq_at(t, lines - 1)].b + 32 + 2 * i, 2);
    const float dmin = fp16_to_fp32(dmh);
    const int64_t s0 = lines - 5;
    for (int g = 0; g < 4; ++g) {
      const float s_lo = d * static_cast<float>(pair_byte(blk, s0, 2 * g));
      const float s_hi = d * static_cast<float>(pair_byte(blk, s0, 2 * g + 1));
      const float m_lo = dmin * pair_byte(blk, s0 + 2, 2 * g), m_hi = dmin * pair_byte(blk, s0 + 2, 2 * g + 1);
      for (int c = 0; c < 8; ++c)
        for (int kk = 0; kk < 4; ++kk) {
          const uint8_t v = blk[kq_at(t, 8 * g + c)].b[4 * i + kk];
          int lo = v & 15, hi = v >> 4;
          if (t == weight_type::q5_k) {
            const uint8_t h = blk[kq_at(t, 32 + 2 * g + c / 4)].b[4 * i + kk] >> (2 * (c % 4));
            lo |= (h & 1) << 4;
            hi |= ((h >> 1) & 1) << 4;
          }
          out[64 * g + 4 * c + kk] = s_lo * lo - m_lo;
          out[64 * g + 32 + 4 * c + kk] = s_hi * hi - m_hi;
        }
    }
  }
}

void kq_qs_by_block_token(const block_q8_K* a, int64_t t, int64_t n_tok, int64_t k, int8_t* out) {
  const int64_t nb = k / qk_k;
  for (int64_t b = 0; b < nb; ++b) std::memcpy(out + (b * n_tok + t) * qk_k, a[t * nb + b].qs, qk_k);
}

void kq_qs_by_block(const block_q8_K* a, int64_t n_tok, int64_t k, int8_t* out) {
  for (int64_t t = 0; t < n_tok; ++t) kq_qs_by_block_token(a, t, n_tok, k, out);
}

void gemv_kq_panels_model(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                          const block_q8_K* a, int64_t n_tok, float* y, int64_t ldy) {
  const int64_t nb = k / qk_k;
  kq_block u;
  for (int64_t p = p0; p < p1; ++p) {
    const kq_panel panel = kq_panel_of(panels, t, nb, kq_n_panels(rows), p);
    for (int i = 0; i < panel_rows && 16 * p + i < rows; ++i)
      for (int64_t tk = 0; tk < n_tok; ++tk) {
        float acc = 0.f;
        for (int64_t b = 0; b < nb; ++b) {
          get_block(t, panel.block(b), i, u);
          const block_q8_K& x = a[tk * nb + b];
          int32_t isum = 0, msum = 0;
          if (t == weight_type::q6_k) {
            int32_t off = 0;
            for (int j = 0; j < 16; ++j) {
              int32_t s = 0;
              for (int l = 0; l < 16; ++l) s += u.q[16 * j + l] * x.qs[16 * j + l];
              isum += u.sc[j] * s;
              off += u.sc[j] * x.bsums[j];
            }
            isum -= 32 * off;
          } else {
            for (int j = 0; j < 8; ++j) {
              int32_t s = 0;
              for (int l = 0; l < 32; ++l) s += u.q[32 * j + l] * x.qs[32 * j + l];
              isum += u.sc[j] * s;
              msum += u.mn[j] * x.sums32[j];
            }
          }
          acc = std::fma(static_cast<float>(isum), fp16_to_fp32(u.d) * x.d, acc);
          if (t != weight_type::q6_k) acc = std::fma(-static_cast<float>(msum), fp16_to_fp32(u.dmin) * x.d, acc);
        }
        y[tk * ldy + 16 * p + i] = acc;
      }
  }
}

}  // namespace sy::cpu
