// AMX kernels: the loops of amx_loops.hpp on the tile instructions. Compiled with -mamx-tile
// -mamx-bf16 -mamx-int8 and the AVX-512 flags (the f32 fold of the integer kernel vectorizes to
// them); only called when use_amx_kernels() says the CPU has AMX and Linux granted the tile state.
// Nothing from the standard library is instantiated here: an out-of-line copy compiled with these
// flags could be the one the linker keeps for every other caller.
// GCC 12 flags the self-initialised placeholder inside _mm512_undefined_* that some intrinsics use
// (GCC bug 105593), a false positive; nothing else in this file needs the warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/amx_loops.hpp"
#include "kernels/cpu/gemm_kernels.hpp"

namespace sy::cpu {
namespace {

// The tile intrinsics are asm statements that name the tile by a literal (stringified) and do not
// tell the compiler which memory a load or ldtilecfg reads or a store writes: `fence(p)` before a
// load makes every store before it (p escaping) happen before the instruction, so a just-written
// scratch buffer or configuration is not reordered past it or dropped as dead; after a store it
// makes every later read of that memory happen after it (GCC otherwise sees the buffer as never
// written).
inline void fence(const void* p) { __asm__ volatile("" : : "r"(p) : "memory"); }

#define SY_TILE_CHAIN(OP)        \
  if constexpr (T == 0) {        \
    OP(0);                       \
  } else if constexpr (T == 1) { \
    OP(1);                       \
  } else if constexpr (T == 2) { \
    OP(2);                       \
  } else if constexpr (T == 3) { \
    OP(3);                       \
  } else if constexpr (T == 4) { \
    OP(4);                       \
  } else if constexpr (T == 5) { \
    OP(5);                       \
  } else if constexpr (T == 6) { \
    OP(6);                       \
  } else {                       \
    OP(7);                       \
  }

struct amx_tiles {
  void scratch(const void*, size_t) {}
  // kq_split_scalar on zmm registers: the even and the odd values' products by vpmaddubsw (each
  // 16-bit sum has one non-zero term: |q sc| <= 63 * 128, no saturation), minus q6_K's offset term,
  // then the products' low bytes and their high bytes gathered by byte blends.
  void split_kq(kq_v64u v, const kq_sub_scale& s, line64* hi, line64* lo) {
    const __m512i w = kq_cast<__m512i>(v);
    const __m512i off = kq_cast<__m512i>(s.off);
    const __m512i pe = _mm512_sub_epi16(_mm512_maddubs_epi16(w, kq_cast<__m512i>(s.sc_even)), off);
    const __m512i po = _mm512_sub_epi16(_mm512_maddubs_epi16(w, kq_cast<__m512i>(s.sc_odd)), off);
    constexpr __mmask64 odd = 0xAAAAAAAAAAAAAAAAull;
    _mm512_store_si512(hi, _mm512_mask_blend_epi8(odd, _mm512_srli_epi16(pe, 8), po));
    _mm512_store_si512(lo, _mm512_mask_blend_epi8(odd, pe, _mm512_slli_epi16(po, 8)));
  }
  // kq_fold_scalar on zmm registers: the same operations per lane, so the same bits; msum by four
  // vpdpwssd of the rows' min pairs against each pair of activation sums, broadcast.
  void fold_kq(float* acc, const int32_t* hi, const int32_t* lo, int hi_shift, const float* dw, float dx,
               const uint32_t (*mins)[16], const int16_t* sums32, const float* dmw) {
    const __m512 vdx = _mm512_set1_ps(dx);
    const __m512i isum =
        _mm512_add_epi32(_mm512_sll_epi32(_mm512_load_si512(hi), _mm_cvtsi32_si128(hi_shift)), _mm512_load_si512(lo));
    __m512 a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(_mm512_load_ps(dw), vdx), _mm512_load_ps(acc));
    if (mins) {
      __m512i ms = _mm512_setzero_si512();
      for (int q = 0; q < 4; ++q) {
        int32_t pair;
        __builtin_memcpy(&pair, sums32 + 2 * q, 4);
        ms = _mm512_dpwssd_epi32(ms, _mm512_load_si512(mins[q]), _mm512_set1_epi32(pair));
      }
      a = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(_mm512_load_ps(dmw), vdx), a);
    }
    _mm512_store_ps(acc, a);
  }
  // int_fold_scalar on zmm registers: the same operations per lane, so the same bits.
  void fold_int(float (*acc)[16], const int32_t (*sums)[16], int64_t m, const float* dw, const float* mw,
                const float* dx, const float* sx, int64_t x_stride) {
    const __m512 vdw = _mm512_load_ps(dw), vmw = _mm512_load_ps(mw);
    for (int64_t t = 0; t < m; ++t) {
      const __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512(sums[t]));
      const __m512 a = _mm512_fmadd_ps(c, _mm512_mul_ps(vdw, _mm512_set1_ps(dx[t * x_stride])), _mm512_load_ps(acc[t]));
      _mm512_store_ps(acc[t], _mm512_fmadd_ps(vmw, _mm512_set1_ps(sx[t * x_stride]), a));
    }
  }
  void fp16x16(const void* src, float* dst) {
    _mm512_store_ps(dst, _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(src))));
  }
  void configure(const tile_config& c) {
    fence(&c);
    _tile_loadconfig(&c);
  }
  void release() { _tile_release(); }
  void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }
  template <int T>
  void zero() {
    static_assert(T >= 0 && T < 8);
#define SY_TILE_ZERO(n) _tile_zero(n)
    SY_TILE_CHAIN(SY_TILE_ZERO)
#undef SY_TILE_ZERO
  }
  template <int T>
  void load(const void* p, int64_t stride) {
    static_assert(T >= 0 && T < 8);
    fence(p);
#define SY_TILE_LOAD(n) _tile_loadd(n, p, stride)
    SY_TILE_CHAIN(SY_TILE_LOAD)
#undef SY_TILE_LOAD
  }
  template <int T>
  void store(void* p, int64_t stride) {
    static_assert(T >= 0 && T < 8);
#define SY_TILE_STORE(n) _tile_stored(n, p, stride)
    SY_TILE_CHAIN(SY_TILE_STORE)
#undef SY_TILE_STORE
    fence(p);  // the asm does not declare the memory it writes: later reads must not be moved above it
  }
  // Only the combinations amx_loops.hpp uses; another one is a compile error, not a wrong tile.
  template <int C, int A, int B>
  void dot_bf16() {
    if constexpr (C == 0 && A == 4 && B == 6) {
      _tile_dpbf16ps(0, 4, 6);
    } else if constexpr (C == 1 && A == 4 && B == 7) {
      _tile_dpbf16ps(1, 4, 7);
    } else if constexpr (C == 2 && A == 5 && B == 6) {
      _tile_dpbf16ps(2, 5, 6);
    } else if constexpr (C == 3 && A == 5 && B == 7) {
      _tile_dpbf16ps(3, 5, 7);
    } else {
      static_assert(C < 0, "tile combination not listed in amx_tiles::dot_bf16");
    }
  }
  template <int C, int A, int B>
  void dot_s8u8() {
    if constexpr (C == 0 && A == 1 && B == 2) {
      _tile_dpbsud(0, 1, 2);  // signed A (activations), unsigned B (weights)
    } else if constexpr (C == 3 && A == 1 && B == 5) {
      _tile_dpbsud(3, 1, 5);
    } else if constexpr (C == 6 && A == 4 && B == 2) {
      _tile_dpbsud(6, 4, 2);
    } else if constexpr (C == 7 && A == 4 && B == 5) {
      _tile_dpbsud(7, 4, 5);
    } else if constexpr (C == 0 && A == 4 && B == 6) {  // integer panels: two token tiles x two panels
      _tile_dpbsud(0, 4, 6);
    } else if constexpr (C == 1 && A == 4 && B == 7) {
      _tile_dpbsud(1, 4, 7);
    } else if constexpr (C == 2 && A == 5 && B == 6) {
      _tile_dpbsud(2, 5, 6);
    } else if constexpr (C == 3 && A == 5 && B == 7) {
      _tile_dpbsud(3, 5, 7);
    } else {
      static_assert(C < 0, "tile combination not listed in amx_tiles::dot_s8u8");
    }
  }
  template <int C, int A, int B>
  void dot_s8s8() {
    if constexpr (C == 0 && A == 1 && B == 2) {
      _tile_dpbssd(0, 1, 2);  // signed A (activations), signed B (q6_K's high parts)
    } else if constexpr (C == 6 && A == 4 && B == 2) {
      _tile_dpbssd(6, 4, 2);
    } else {
      static_assert(C < 0, "tile combination not listed in amx_tiles::dot_s8s8");
    }
  }
};

#undef SY_TILE_CHAIN

}  // namespace

void gemm_panels_amx(const uint16_t* panels, int64_t k, int64_t p0, int64_t p1, const uint16_t* x, int64_t ldx,
                     int64_t n_tok, float* y, int64_t ldy) {
  amx_tiles tl;
  amx_gemm_panels(tl, panels, k, p0, p1, x, ldx, n_tok, y, ldy);
}

void gemv_int_panels_amx(weight_type t, const line64* panels, int64_t rows, int64_t p0, int64_t p1,
                         const q8_act_batch& a, float* y, int64_t ldy) {
  amx_tiles tl;
  amx_int_panels(tl, t, panels, rows, p0, p1, a, y, ldy);
}

void gemv_kq_panels_amx(weight_type t, const line64* panels, int64_t rows, int64_t k, int64_t p0, int64_t p1,
                        const block_q8_K* a, const int8_t* qs_by_block, int64_t n_tok, float* y, int64_t ldy) {
  amx_tiles tl;
  amx_kq_panels(tl, t, panels, rows, k, p0, p1, a, qs_by_block, n_tok, y, ldy);
}

}  // namespace sy::cpu
