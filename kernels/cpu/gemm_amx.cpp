// AMX kernels: the loops of amx_loops.hpp on the tile instructions. Compiled with -mamx-tile
// -mamx-bf16 -mamx-int8 and the AVX-512 flags (the f32 fold of the integer kernel vectorizes to
// them); only called when use_amx_kernels() says the CPU has AMX and Linux granted the tile state.
// Nothing from the standard library is instantiated here: an out-of-line copy compiled with these
// flags could be the one the linker keeps for every other caller.
#include <immintrin.h>

#include "kernels/cpu/amx_loops.hpp"
#include "kernels/cpu/gemm_kernels.hpp"

namespace sy::cpu {
namespace {

// The tile intrinsics are asm statements that name the tile by a literal (stringified) and do not
// tell the compiler which memory a load or ldtilecfg reads: `fence(p)` makes every store before it
// (p escaping) happen before the instruction, so a just-written scratch buffer or configuration is
// not reordered past it or dropped as dead.
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
  void configure(const tile_config& c) {
    fence(&c);
    _tile_loadconfig(&c);
  }
  void release() { _tile_release(); }
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
    } else {
      static_assert(C < 0, "tile combination not listed in amx_tiles::dot_s8u8");
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

}  // namespace sy::cpu
