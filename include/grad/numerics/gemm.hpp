// Host matrix products: C[m,n] = sum over p of A(i,p) B(p,j), in three
// layouts (nn: forward, nt: dA = G B^T, tn: dB = A^T G).
//
// The determinism contract fixes the order of every output element's sum:
// from zero, ascending p, acc = fma(a, b, acc): one explicit fused
// multiply-add per term, a single rounding (grad::fma_hd; the host is built
// with -ffp-contract=off, so nothing else is fused). Everything here is free
// to reorder *which* elements are computed when, never the terms of one
// element:
//   - a register-blocked micro-kernel holds an MR x NR tile of C in vector
//     registers, vectorised across output columns (each lane is one output
//     element running its own ascending sum), so nt vectorises across
//     output elements too, not along its contiguous sum; the columns past
//     the last whole tile are one narrower tile of whole and half vectors
//     (an attention head of 24 floats is 16 + 8 lanes on AVX-512), a
//     block's last rows two-row tiles;
//   - cache blocking splits the sum into KC-long runs in ascending order;
//     between runs the partial sum is stored to C and reloaded unchanged;
//   - threads take disjoint ranges of output columns (or rows), each
//     element computed whole by one thread;
//   - a single output row (a decoding step's x . W or x . W^T) skips the
//     packing and reads b where it lies (multiply_row, multiply_row_transposed);
//   - a b held in 16 bits (a frozen base, Storage::bf16 or f16) is widened
//     while it is packed, or (one row) as it is loaded: exact, so the
//     product's bits are those over the widened b.
// So the blocked kernels equal grad::reference::gemm_* bit for bit, on any
// instruction set and thread count (test_gemm checks it over many shapes).
//
// Instruction sets are chosen at run time (AVX-512, AVX2, else the
// baseline's 128-bit vectors), so one binary runs on any x86-64.
#pragma once

#include <algorithm>
#include <cstddef>
#if defined(__unix__)
#include <unistd.h>  // sysconf: the cache sizes
#endif
#include <cstdint>
#include <type_traits>
#include <vector>

#include "grad/config.hpp"
#include "grad/numerics/isa.hpp"
#include "grad/numerics/parallel.hpp"
#include "grad/numerics/simd.hpp"
#include "grad/numerics/storage.hpp"

// Full unrolling of the register tile's constant-trip loops. nvcc's front end
// (which sees this header through op_list.hpp) does not know GCC's pragma.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define GRAD_GEMM_UNROLL _Pragma("GCC unroll 16")
#else
#define GRAD_GEMM_UNROLL
#endif

namespace grad {

// The plain loops that define the order; kept as the reference the blocked
// kernels are tested against.
namespace reference {

// C[m,n] = A[m,k] B[k,n]. The i-p-j loop order keeps each C[i,j] summing in
// ascending p while the innermost loop runs along contiguous rows.
template <class T>
inline void gemm_nn(const T* A, const T* B, T* C, std::size_t m, std::size_t k, std::size_t n) {
  for (std::size_t i = 0; i < m; ++i) {
    T* c = C + i * n;
    for (std::size_t j = 0; j < n; ++j) c[j] = T(0);
    for (std::size_t p = 0; p < k; ++p) {
      const T a = A[i * k + p];
      const T* b = B + p * n;
      for (std::size_t j = 0; j < n; ++j) c[j] = fma_hd(a, b[j], c[j]);
    }
  }
}

// C[m,k] = G[m,n] B[k,n]^T: C[i,p] sums G[i,j] B[p,j] in ascending j.
template <class T>
inline void gemm_nt(const T* G, const T* B, T* C, std::size_t m, std::size_t n, std::size_t k) {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p) {
      const T* g = G + i * n;
      const T* b = B + p * n;
      T acc = T(0);
      for (std::size_t j = 0; j < n; ++j) acc = fma_hd(g[j], b[j], acc);
      C[i * k + p] = acc;
    }
}

// C[k,n] = A[m,k]^T G[m,n]: C[p,j] sums A[i,p] G[i,j] in ascending i.
template <class T>
inline void gemm_tn(const T* A, const T* G, T* C, std::size_t m, std::size_t k, std::size_t n) {
  for (std::size_t x = 0; x < k * n; ++x) C[x] = T(0);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p) {
      const T a = A[i * k + p];
      const T* g = G + i * n;
      T* c = C + p * n;
      for (std::size_t j = 0; j < n; ++j) c[j] = fma_hd(a, g[j], c[j]);
    }
}

}  // namespace reference

namespace gemm_detail {

// The instruction-set choice is shared with the elementwise loops (isa.hpp).
using grad::best_isa;
using grad::Isa;
using grad::supported;

// Element (r, c) of a matrix operand lives at p[r * rs + c * cs]; the three
// layouts differ only in these strides. b may be held in 16 bits (storage):
// p then points at its 16-bit elements, which only Terms reads (widened).
template <class T>
struct Strided {
  const T* p;
  std::size_t rs, cs;
  Storage storage = Storage::native;
};

// C (row-major, m x n) = sum over p < k of a(i, p) b(p, j); with
// `continued`, each element's sum goes on from what C holds (its chain of
// fmas continued, as a later cache block continues it) instead of from zero.
template <class T>
struct Problem {
  Strided<T> a, b;
  T* c;
  std::size_t m, n, k;
  bool continued = false;
  // Read a's row panels where they lie instead of packing a's blocks: set
  // by multiply when threads split the columns and would each pack the
  // same large a (multiply_block; the same fmas in the same order).
  bool a_in_place = false;
};

template <class T, std::size_t Lanes>
struct Vec {
  typedef T type __attribute__((vector_size(Lanes * sizeof(T))));
};

// Cache blocking: a KC x NC block of b stays in L2 while MC x KC blocks of
// a stream past it; one KC x NR micro-panel of b sits in L1. The sizes come
// from the machine's caches, read once at run time (sysconf; 48 KiB L1d and
// 1 MiB L2 where it does not say): kc in proportion to L1d (256 at 48 KiB,
// the best measured on Zen 4/5), nc so that the KC x NC block fills L2 (1,024
// floats or 512 doubles at 1 MiB). Blocking never changes a bit: a sum split
// into runs is stored and reloaded unchanged between them.
inline std::size_t cache_bytes(int level) {
#if defined(__unix__) && defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
  const long v = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE : _SC_LEVEL2_CACHE_SIZE);
  if (v > 0) return static_cast<std::size_t>(v);
#endif
  return level == 1 ? 48 * 1024 : 1024 * 1024;
}
struct CacheBlocking {
  std::size_t kc, nc_bytes, l2_bytes;
};
inline const CacheBlocking& cache_blocking() {
  static const CacheBlocking b = [] {
    const std::size_t l1 = std::clamp<std::size_t>(cache_bytes(1), 16 * 1024, 128 * 1024);
    const std::size_t l2 = std::clamp<std::size_t>(cache_bytes(2), 256 * 1024, 4 * 1024 * 1024);
    const std::size_t kc = std::clamp<std::size_t>(256 * l1 / (48 * 1024) / 16 * 16, 128, 512);
    return CacheBlocking{kc, l2 / kc, l2};
  }();
  return b;
}
template <class T>
struct Blocking {
  static constexpr std::size_t mc = 96;  // a multiple of every kernel's MR
  static std::size_t kc() { return cache_blocking().kc; }
  static std::size_t nc() { return std::max<std::size_t>(cache_blocking().nc_bytes / sizeof(T), 256); }
};

// Packed, zero-padded operand blocks; one pair per thread and element type,
// grown to the largest block seen and then reused (no steady-state allocation).
template <class T>
inline T* pack_buffer(std::size_t elements) {
  constexpr std::size_t line = 64 / sizeof(T);
  thread_local std::vector<T> storage;
  if (storage.size() < elements + line) storage.resize(elements + line);
  const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
  return storage.data() + (line - address / sizeof(T) % line) % line;
}

// Where a micro-kernel reads its MR x kc panel of a: packed (the MR values
// of each term side by side) or straight from the operand through its
// strides, which saves the copy when the panel is used for one strip only.
template <class T, std::size_t MR>
struct PackedPanel {
  const T* p;
  T at(std::size_t r, std::size_t q) const { return p[q * MR + r]; }
};
template <class T>
struct StridedPanel {
  const T* p;
  std::size_t rs, cs;
  T at(std::size_t r, std::size_t q) const { return p[r * rs + q * cs]; }
};

// The MR x (NV vectors, plus HV half vectors) tile of C at c (row stride
// ldc) after kc more terms: lane by lane acc = fma(a, b, acc) in ascending p,
// from zero or from what c holds (one vfmadd per vector in the AVX-512 and
// AVX2 copies). Term p's vectors of b are at bp + p * ldb: a packed strip's,
// or b's own row. The half vector (HV = 1) ends a tail strip whose width is
// an odd number of half vectors (e.g. 24 floats: 16 + 8), so that no lane of
// a padded vector computes a column only to drop it.
template <class T, std::size_t Lanes, std::size_t MR, std::size_t NV, std::size_t HV = 0, class Panel>
[[gnu::always_inline]] inline void micro_kernel(std::size_t kc, Panel ap, const T* __restrict bp, T* __restrict c,
                                                std::size_t ldc, bool accumulate,
                                                std::size_t ldb = NV * Lanes + HV * Lanes / 2) {
  using V = typename Vec<T, Lanes>::type;
  using H = typename Vec<T, (HV ? Lanes / 2 : Lanes)>::type;
  constexpr std::size_t nv = NV > 0 ? NV : 1;  // no zero-length arrays: a tail of one half vector has NV = 0
  V acc[MR][nv];
  H half[MR];
  GRAD_GEMM_UNROLL
  for (std::size_t r = 0; r < MR; ++r) {
    GRAD_GEMM_UNROLL
    for (std::size_t v = 0; v < NV; ++v) {
      if (accumulate)
        __builtin_memcpy(&acc[r][v], c + r * ldc + v * Lanes, sizeof(V));
      else
        acc[r][v] = V{};
    }
    if constexpr (HV != 0) {
      if (accumulate)
        __builtin_memcpy(&half[r], c + r * ldc + NV * Lanes, sizeof(H));
      else
        half[r] = H{};
    }
  }
  for (std::size_t p = 0; p < kc; ++p) {
    V b[nv];
    H bh;
    GRAD_GEMM_UNROLL
    for (std::size_t v = 0; v < NV; ++v) __builtin_memcpy(&b[v], bp + p * ldb + v * Lanes, sizeof(V));
    if constexpr (HV != 0) __builtin_memcpy(&bh, bp + p * ldb + NV * Lanes, sizeof(H));
    GRAD_GEMM_UNROLL
    for (std::size_t r = 0; r < MR; ++r) {
      const T ar = ap.at(r, p);
      const V a = simd::splat<V>(ar);
      GRAD_GEMM_UNROLL
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = simd::fma_lanes<T>(a, b[v], acc[r][v]);
      if constexpr (HV != 0) half[r] = simd::fma_lanes<T>(simd::splat<H>(ar), bh, half[r]);
    }
  }
  GRAD_GEMM_UNROLL
  for (std::size_t r = 0; r < MR; ++r) {
    GRAD_GEMM_UNROLL
    for (std::size_t v = 0; v < NV; ++v) __builtin_memcpy(c + r * ldc + v * Lanes, &acc[r][v], sizeof(V));
    if constexpr (HV != 0) __builtin_memcpy(c + r * ldc + NV * Lanes, &half[r], sizeof(H));
  }
}

// A partial tile (rows < MR or cols < the strip width) runs the same kernel
// on a local tile; only the valid part is read from and written to C.
template <class T, std::size_t Lanes, std::size_t MR, std::size_t NV, std::size_t HV, class Panel>
[[gnu::always_inline]] inline void edge_kernel(std::size_t kc, Panel ap, const T* bp, T* c, std::size_t ldc,
                                               bool accumulate, std::size_t rows, std::size_t cols) {
  constexpr std::size_t width = NV * Lanes + HV * Lanes / 2;
  alignas(64) T tile[MR * width] = {};
  if (accumulate)
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < cols; ++j) tile[r * width + j] = c[r * ldc + j];
  micro_kernel<T, Lanes, MR, NV, HV>(kc, ap, bp, tile, width, accumulate);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < cols; ++j) c[r * ldc + j] = tile[r * width + j];
}

// Strips of b: full ones NV vectors wide while that many columns are left,
// then one tail strip over the rest, rounded up to whole half vectors where
// a vector is 64 bytes (AVX-512: a 24-column tail is one vector and a half,
// not two vectors) and to whole vectors below that (a 16-byte half would
// run lane by lane).
template <class T, std::size_t Lanes>
inline constexpr std::size_t tail_unit = Lanes * sizeof(T) == 64 ? Lanes / 2 : Lanes;
template <class T, std::size_t Lanes, std::size_t NV>
inline std::size_t strip_width(std::size_t columns_left) {
  constexpr std::size_t nr = NV * Lanes, unit = tail_unit<T, Lanes>;
  return columns_left >= nr ? nr : (columns_left + unit - 1) / unit * unit;
}

// One rows x cols tile of a strip W columns wide, by the micro-kernel when
// the tile is whole.
template <class T, std::size_t Lanes, std::size_t MR, std::size_t W, class Panel>
[[gnu::always_inline]] inline void strip_tile(std::size_t kc, Panel ap, const T* bp, T* c, std::size_t ldc,
                                              bool accumulate, std::size_t rows, std::size_t cols) {
  constexpr std::size_t NV = W / Lanes, HV = W % Lanes != 0 ? 1 : 0;
  static_assert(W == NV * Lanes + HV * Lanes / 2, "a strip is whole vectors and at most one half vector");
  if (rows == MR && cols == W)
    micro_kernel<T, Lanes, MR, NV, HV>(kc, ap, bp, c, ldc, accumulate);
  else
    edge_kernel<T, Lanes, MR, NV, HV>(kc, ap, bp, c, ldc, accumulate, rows, cols);
}
// The strip width (a multiple of the tail unit up to W) as a template
// argument: the tail's widths one by one. A function, not a lambda over
// mp_with_index: at -O1 a lambda is not inlined into the instruction set's
// copy (see row_pass).
template <class T, std::size_t Lanes, std::size_t MR, std::size_t W, class Panel>
[[gnu::always_inline]] inline void tile(std::size_t kc, Panel ap, const T* bp, T* c, std::size_t ldc, bool accumulate,
                                        std::size_t rows, std::size_t cols, std::size_t width) {
  if constexpr (W > tail_unit<T, Lanes>) {
    constexpr std::size_t narrower = W - tail_unit<T, Lanes>;
    if (width != W) return tile<T, Lanes, MR, narrower>(kc, ap, bp, c, ldc, accumulate, rows, cols, width);
  }
  strip_tile<T, Lanes, MR, W>(kc, ap, bp, c, ldc, accumulate, rows, cols);
}

// The rows < MR of a block's last, packed (zero-padded) row panel, two at a
// time: an MR-row tile there would compute MR - rows rows only to drop them
// (a causal attention block of 32 rows is five 6-row panels and two rows:
// a sixth of its work). Each two-row tile reads its rows of the same panel.
template <class T, std::size_t Lanes, std::size_t MR, std::size_t W>
[[gnu::always_inline]] inline void partial_panel(std::size_t kc, const T* panel, const T* bp, T* c, std::size_t ldc,
                                                 bool accumulate, std::size_t rows, std::size_t cols,
                                                 std::size_t width) {
  for (std::size_t r = 0; r < rows; r += 2)
    tile<T, Lanes, 2, W>(kc, PackedPanel<T, MR>{panel + r}, bp, c + r * ldc, ldc, accumulate,
                         std::min<std::size_t>(2, rows - r), cols, width);
}

// dst[i * dst_stride + j] = src[j * src_stride + i] for a Lanes x Lanes
// square: Lanes vector loads, log2(Lanes) rounds of two-input shuffles (round
// d swaps the d-blocks across pairs of rows d apart), Lanes vector stores.
// Copies only: no value changes.
template <class T, std::size_t Lanes>
[[gnu::always_inline]] inline void transpose_square(const T* src, std::size_t src_stride, T* dst,
                                                    std::size_t dst_stride) {
#if GRAD_SIMD
  using V = typename Vec<T, Lanes>::type;
  using I = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
  typedef I M __attribute__((vector_size(Lanes * sizeof(T))));
  V r[Lanes];
  GRAD_GEMM_UNROLL
  for (std::size_t i = 0; i < Lanes; ++i) __builtin_memcpy(&r[i], src + i * src_stride, sizeof(V));
  GRAD_GEMM_UNROLL
  for (std::size_t d = Lanes / 2; d > 0; d /= 2) {
    M keep{}, swap{};  // lane l of row i: its own (bit d of l clear) or row i + d's lane l - d; row i + d the mirror
    GRAD_GEMM_UNROLL
    for (std::size_t l = 0; l < Lanes; ++l) {
      keep[l] = static_cast<I>(l & d ? Lanes + (l ^ d) : l);
      swap[l] = static_cast<I>(l & d ? Lanes + l : l ^ d);
    }
    GRAD_GEMM_UNROLL
    for (std::size_t i = 0; i < Lanes; ++i)
      if ((i & d) == 0) {
        const V a = r[i], b = r[i + d];
        r[i] = __builtin_shuffle(a, b, keep);
        r[i + d] = __builtin_shuffle(a, b, swap);
      }
  }
  GRAD_GEMM_UNROLL
  for (std::size_t i = 0; i < Lanes; ++i) __builtin_memcpy(dst + i * dst_stride, &r[i], sizeof(V));
#else
  for (std::size_t i = 0; i < Lanes; ++i)
    for (std::size_t j = 0; j < Lanes; ++j) dst[i * dst_stride + j] = src[j * src_stride + i];
#endif
}

// Where the kernels read b's elements: T itself (Format = T), or 16-bit
// values of a Format (Bf16, F16: a frozen base as its checkpoint holds it)
// widened to T exactly as they are loaded, so a 16-bit b streams half the
// bytes and gives the bits of the product over its widened values. Lanes
// terms as a vector, one term, a run of n, or a Lanes x Lanes square
// transposed (Lanes runs of Lanes terms, `stride` apart, become dst's rows).
template <class T, std::size_t Lanes, class Format = T>
struct Terms {
  static constexpr bool native = std::is_same_v<Format, T>;
  using Element = std::conditional_t<native, T, std::uint16_t>;
  using V = typename Vec<T, Lanes>::type;

  [[gnu::always_inline]] static V load(const Element* p) {
    V v;
    if constexpr (native) {
      __builtin_memcpy(&v, p, sizeof(V));
    } else {
#if GRAD_SIMD_X86_SQRT && GRAD_SIMD
      // AVX-512 (the only copy with 16 float lanes): one vcvtph2ps per
      // vector of halves (the same bits as F16::widen_lanes' six operations).
      if constexpr (std::is_same_v<Format, F16> && std::is_same_v<T, float> && sizeof(V) == 64) {
        typedef short Halves __attribute__((vector_size(32)));
        Halves h;
        __builtin_memcpy(&h, p, sizeof(h));
        return __builtin_ia32_vcvtph2ps512_mask(h, V{}, static_cast<unsigned short>(-1), 4);
      }
#endif
#if GRAD_SIMD
      typename Vec<std::uint16_t, Lanes>::type bits;
      __builtin_memcpy(&bits, p, sizeof(bits));
      using Floats = typename Vec<float, Lanes>::type;
      const Floats f = Format::template widen_lanes<Floats>(
          __builtin_convertvector(bits, typename Vec<std::uint32_t, Lanes>::type));
      if constexpr (std::is_same_v<T, float>)
        v = f;
      else
        v = __builtin_convertvector(f, V);
#else  // nvcc's front end and other compilers: lane by lane
      T lanes[Lanes];
      for (std::size_t l = 0; l < Lanes; ++l) lanes[l] = one(p + l);
      __builtin_memcpy(&v, lanes, sizeof(V));
#endif
    }
    return v;
  }
  [[gnu::always_inline]] static T one(const Element* p) {
    if constexpr (native)
      return *p;
    else
      return static_cast<T>(Format::widen(*p));
  }
  [[gnu::always_inline]] static void run(const Element* p, T* dst, std::size_t n) {
    if constexpr (native) {
      __builtin_memcpy(dst, p, n * sizeof(T));
    } else {
      std::size_t j = 0;
      for (; j + Lanes <= n; j += Lanes) {
        const V v = load(p + j);
        __builtin_memcpy(dst + j, &v, sizeof(V));
      }
      for (; j < n; ++j) dst[j] = one(p + j);
    }
  }
  [[gnu::always_inline]] static void square(const Element* p, std::size_t stride, T* dst, std::size_t dst_stride) {
    if constexpr (native) {
      transpose_square<T, Lanes>(p, stride, dst, dst_stride);
    } else {
      alignas(64) T rows[Lanes * Lanes];
      GRAD_GEMM_UNROLL
      for (std::size_t l = 0; l < Lanes; ++l) {
        const V row = load(p + l * stride);
        __builtin_memcpy(rows + l * Lanes, &row, sizeof(V));
      }
      transpose_square<T, Lanes>(rows, Lanes, dst, dst_stride);
    }
  }
};

// Strips of b's block, each kc x width (strip_width: NR, or the tail's),
// zero-padded past the last column.
template <class T, std::size_t Lanes, std::size_t NV, class Format>
[[gnu::always_inline]] inline void pack_b_from(const Strided<T>& b, std::size_t p0, std::size_t kc, std::size_t j0,
                                               std::size_t nc, T* out) {
  using E = Terms<T, Lanes, Format>;
  const auto* const e = reinterpret_cast<const typename E::Element*>(b.p);
  constexpr std::size_t nr = NV * Lanes;
  for (std::size_t jr = 0; jr < nc;) {
    const std::size_t width = strip_width<T, Lanes, NV>(nc - jr);
    const std::size_t cols = std::min(width, nc - jr);
    const std::size_t src = p0 * b.rs + (j0 + jr) * b.cs;
    if (b.cs == 1) {  // rows of b contiguous
      for (std::size_t p = 0; p < kc; ++p) {
        const std::size_t row = src + p * b.rs;
        T* dst = out + p * width;
        // Whole strips as fixed-size copies (vector moves at any -O level,
        // not left to the auto-vectoriser); a ragged last strip by element.
        if (cols == nr) {
          E::run(e + row, dst, nr);
        } else if (cols == width) {
          for (std::size_t j = 0; j < width; j += tail_unit<T, Lanes>)
            E::run(e + row + j, dst + j, tail_unit<T, Lanes>);
        } else {
          for (std::size_t j = 0; j < cols; ++j) dst[j] = E::one(e + row + j);
          for (std::size_t j = cols; j < width; ++j) dst[j] = T(0);
        }
      }
    } else {  // columns of b contiguous (b.rs == 1) or general strides
      // A transpose in squares of Lanes columns by Lanes terms (whole squares
      // in vector registers when b's terms are contiguous): each square reads
      // Lanes short runs of b's columns and writes whole vectors of the strip,
      // so b streams in order instead of missing its cache lines column by column.
      const std::size_t square_cols = b.rs == 1 ? cols / Lanes * Lanes : 0, square_terms = kc / Lanes * Lanes;
      for (std::size_t js = 0; js < square_cols; js += Lanes)
        for (std::size_t p = 0; p < square_terms; p += Lanes)
          E::square(e + src + js * b.cs + p, b.cs, out + p * width + js, width);
      for (std::size_t js = 0; js < cols; js += Lanes) {  // the rest, element by element
        const std::size_t je = std::min(cols, js + Lanes);
        for (std::size_t p = js < square_cols ? square_terms : 0; p < kc; ++p)
          for (std::size_t j = js; j < je; ++j) out[p * width + j] = E::one(e + src + j * b.cs + p * b.rs);
      }
      for (std::size_t p = 0; p < kc; ++p)
        for (std::size_t j = cols; j < width; ++j) out[p * width + j] = T(0);
    }
    out += kc * width;
    jr += width;
  }
}
template <class T, std::size_t Lanes, std::size_t NV>
[[gnu::always_inline]] inline void pack_b(const Strided<T>& b, std::size_t p0, std::size_t kc, std::size_t j0,
                                          std::size_t nc, T* out) {
  switch (b.storage) {
    case Storage::bf16: return pack_b_from<T, Lanes, NV, Bf16>(b, p0, kc, j0, nc, out);
    case Storage::f16: return pack_b_from<T, Lanes, NV, F16>(b, p0, kc, j0, nc, out);
    case Storage::native: break;
  }
  pack_b_from<T, Lanes, NV, T>(b, p0, kc, j0, nc, out);
}

// Row panels of a's block, each kc x MR (MR values per term), zero-padded.
template <class T, std::size_t MR>
[[gnu::always_inline]] inline void pack_a(const Strided<T>& a, std::size_t i0, std::size_t mc, std::size_t p0,
                                          std::size_t kc, T* out) {
  for (std::size_t ir = 0; ir < mc; ir += MR) {
    const std::size_t rows = std::min(MR, mc - ir);
    const T* src = a.p + (i0 + ir) * a.rs + p0 * a.cs;
    if (a.rs == 1) {  // columns of a contiguous: MR rows of one term side by side
      for (std::size_t p = 0; p < kc; ++p) {
        const T* col = src + p * a.cs;
        T* dst = out + p * MR;
        for (std::size_t r = 0; r < rows; ++r) dst[r] = col[r];
        for (std::size_t r = rows; r < MR; ++r) dst[r] = T(0);
      }
    } else {
      for (std::size_t r = 0; r < rows; ++r) {
        const T* row = src + r * a.rs;
        for (std::size_t p = 0; p < kc; ++p) out[p * MR + r] = row[p * a.cs];
      }
      for (std::size_t p = 0; p < kc; ++p)
        for (std::size_t r = rows; r < MR; ++r) out[p * MR + r] = T(0);
    }
    out += kc * MR;
  }
}

// Up to this many register strips an output row is narrow: its strips wait in
// registers (multiply_narrow_row), which beats streaming rows of b through it
// (measured on 896 x 128 and 4864 x 128: 2.5x; on 896 x 512, level).
inline constexpr std::size_t narrow_row_strips = 2;
// One narrow output row (no wider than a few register strips, e.g. a
// key/value projection's 128 columns) against b with contiguous rows: the
// row's strips wait in registers over KC terms of b, read where it lies.
// Each element's sum is the blocked kernel's: ascending p, from zero (or from
// C when continued), stored and reloaded unchanged between KC-long runs;
// columns past the last whole vector by scalar fma.
template <class T, std::size_t Lanes, std::size_t NV>
[[gnu::always_inline]] inline void multiply_narrow_row(const Problem<T>& pr, std::size_t i, std::size_t j0,
                                                       std::size_t j1) {
  constexpr std::size_t nr = NV * Lanes;
  const std::size_t KC = Blocking<T>::kc();
  const T* a = pr.a.p + i * pr.a.rs;
  T* c = pr.c + i * pr.n;
  for (std::size_t pc = 0; pc < pr.k; pc += KC) {
    const std::size_t kc = std::min(KC, pr.k - pc);
    const StridedPanel<T> ap{a + pc * pr.a.cs, 0, pr.a.cs};
    const T* b = pr.b.p + pc * pr.b.rs;
    const bool accumulate = pc > 0 || pr.continued;
    std::size_t j = j0;
    for (; j + nr <= j1; j += nr) micro_kernel<T, Lanes, 1, NV>(kc, ap, b + j, c + j, pr.n, accumulate, pr.b.rs);
    for (; j + Lanes <= j1; j += Lanes) micro_kernel<T, Lanes, 1, 1>(kc, ap, b + j, c + j, pr.n, accumulate, pr.b.rs);
    for (; j < j1; ++j) {
      T acc = accumulate ? c[j] : T(0);
      for (std::size_t p = 0; p < kc; ++p) acc = fma_hd(ap.at(0, p), b[p * pr.b.rs + j], acc);
      c[j] = acc;
    }
  }
}

// One pass of multiply_row: R rows of b from term p, added into c[j0, j1).
// A function, not a lambda: at -O1 a lambda is not inlined into the
// instruction set's copy, and its vector code would lack the target.
template <class T, std::size_t Lanes, std::size_t R, class Format>
[[gnu::always_inline]] inline void row_pass(const Problem<T>& pr, const T* a, T* c, std::size_t p, std::size_t j0,
                                            std::size_t vectors_end, std::size_t j1) {
  using V = typename Vec<T, Lanes>::type;
  const std::size_t rs = pr.b.rs;
  using E = Terms<T, Lanes, Format>;
  const auto* b = reinterpret_cast<const typename E::Element*>(pr.b.p) + p * rs;
  V splats[R];
  GRAD_GEMM_UNROLL
  for (std::size_t r = 0; r < R; ++r) splats[r] = simd::splat<V>(a[(p + r) * pr.a.cs]);
  for (std::size_t j = j0; j < vectors_end; j += Lanes) {
    V acc;
    __builtin_memcpy(&acc, c + j, sizeof(V));
    GRAD_GEMM_UNROLL
    for (std::size_t r = 0; r < R; ++r)
      acc = simd::fma_lanes<T>(splats[r], E::load(b + r * rs + j), acc);
    __builtin_memcpy(c + j, &acc, sizeof(V));
  }
  for (std::size_t j = vectors_end; j < j1; ++j)
    for (std::size_t r = 0; r < R; ++r) c[j] = fma_hd(a[(p + r) * pr.a.cs], E::one(b + r * rs + j), c[j]);
}
// One output row (a decoding step's matrix-vector product) against b with
// contiguous rows: b is read where it lies and in the order it lies, Rows
// whole rows per pass over the output row, which waits in cache between
// passes; neither the copy into packed strips nor the MR - 1 padded rows a
// register tile would compute and drop, nor the column strips that would
// read each row of b a few lines at a time. So the product runs at the speed
// b streams from memory (measured 1.3-2x the strip order on 896 x 4864).
// Each element's sum is the blocked kernel's: ascending p, one fma per term,
// from zero (or from what C holds when continued), stored and reloaded
// unchanged between passes; columns past the last whole vector by scalar fma.
// A 16-bit b (Format Bf16 or F16) is widened as it is loaded: half the
// bytes to stream, the same terms.
template <class T, std::size_t Lanes, class Format = T>
[[gnu::always_inline]] inline void multiply_row(const Problem<T>& pr, std::size_t i, std::size_t j0, std::size_t j1) {
  constexpr std::size_t Rows = 8;
  const T* a = pr.a.p + i * pr.a.rs;
  T* c = pr.c + i * pr.n;
  const std::size_t vectors_end = j0 + (j1 - j0) / Lanes * Lanes;
  if (!pr.continued) std::fill(c + j0, c + j1, T(0));
  std::size_t p = 0;
  for (; p + Rows <= pr.k; p += Rows) row_pass<T, Lanes, Rows, Format>(pr, a, c, p, j0, vectors_end, j1);
  for (; p < pr.k; ++p) row_pass<T, Lanes, 1, Format>(pr, a, c, p, j0, vectors_end, j1);
}

// One output row against b with contiguous columns (x . W^T with W [n, k],
// a decoding step's tied output layer): Lanes columns at a time, their terms
// turned into vectors by transpose_square in registers (no packed strip
// written and read back), each lane's sum ascending p from zero (or from C
// when continued); the terms
// past the last square and the columns past the last vector by scalar fma.
// A 16-bit b is widened as it is loaded (Terms::square: the square's rows
// first, then the same transpose).
template <class T, std::size_t Lanes, class Format = T>
[[gnu::always_inline]] inline void multiply_row_transposed(const Problem<T>& pr, std::size_t i, std::size_t j0,
                                                           std::size_t j1) {
  using V = typename Vec<T, Lanes>::type;
  const T* a = pr.a.p + i * pr.a.rs;
  T* c = pr.c + i * pr.n;
  using E = Terms<T, Lanes, Format>;
  const auto* const bp = reinterpret_cast<const typename E::Element*>(pr.b.p);
  const std::size_t terms = pr.k / Lanes * Lanes;
  std::size_t j = j0;
  for (; j + Lanes <= j1; j += Lanes) {
    const auto* b = bp + j * pr.b.cs;
    V acc = V{};
    if (pr.continued) __builtin_memcpy(&acc, c + j, sizeof(V));
    for (std::size_t p = 0; p < terms; p += Lanes) {
      alignas(64) T square[Lanes * Lanes];
      E::square(b + p, pr.b.cs, square, Lanes);
      GRAD_GEMM_UNROLL
      for (std::size_t q = 0; q < Lanes; ++q) {
        V terms_q;
        __builtin_memcpy(&terms_q, square + q * Lanes, sizeof(V));
        acc = simd::fma_lanes<T>(simd::splat<V>(a[(p + q) * pr.a.cs]), terms_q, acc);
      }
    }
    alignas(64) T out[Lanes];
    __builtin_memcpy(out, &acc, sizeof(V));
    for (std::size_t l = 0; l < Lanes; ++l)
      for (std::size_t p = terms; p < pr.k; ++p)
        out[l] = fma_hd(a[p * pr.a.cs], E::one(b + l * pr.b.cs + p), out[l]);
    __builtin_memcpy(c + j, out, sizeof(V));
  }
  for (; j < j1; ++j) {
    T acc = pr.continued ? c[j] : T(0);
    for (std::size_t p = 0; p < pr.k; ++p) acc = fma_hd(a[p * pr.a.cs], E::one(bp + j * pr.b.cs + p), acc);
    c[j] = acc;
  }
}

// One output row (a decoding step) where b lies in rows or in columns: read
// b where it lies, a 16-bit b widened as it is loaded (its narrow rows too:
// the register-strip kernel reads T). False when b is strided both ways.
template <class T, std::size_t Lanes, std::size_t NV, class Format>
[[gnu::always_inline]] inline bool multiply_one_row(const Problem<T>& pr, std::size_t i, std::size_t j0,
                                                    std::size_t j1) {
  if (pr.b.cs == 1) {
    if constexpr (std::is_same_v<Format, T>) {
      if (j1 - j0 <= narrow_row_strips * 2 * NV * Lanes) {
        multiply_narrow_row<T, Lanes, 2 * NV>(pr, i, j0, j1);
        return true;
      }
    }
    multiply_row<T, Lanes, Format>(pr, i, j0, j1);
    return true;
  }
  if (pr.b.rs == 1) {
    multiply_row_transposed<T, Lanes, Format>(pr, i, j0, j1);
    return true;
  }
  return false;
}

// Output rows [i0, i1) x columns [j0, j1) of the problem (k > 0).
template <class T, std::size_t Lanes, std::size_t MR, std::size_t NV>
[[gnu::always_inline]] inline void multiply_block(const Problem<T>& pr, std::size_t i0, std::size_t i1, std::size_t j0,
                                                  std::size_t j1) {
  if (i1 - i0 == 1) {
    bool done = false;
    switch (pr.b.storage) {
      case Storage::bf16: done = multiply_one_row<T, Lanes, NV, Bf16>(pr, i0, j0, j1); break;
      case Storage::f16: done = multiply_one_row<T, Lanes, NV, F16>(pr, i0, j0, j1); break;
      case Storage::native: done = multiply_one_row<T, Lanes, NV, T>(pr, i0, j0, j1); break;
    }
    if (done) return;
  }
  constexpr std::size_t nr = NV * Lanes;
  constexpr std::size_t MC = Blocking<T>::mc;
  const std::size_t KC = Blocking<T>::kc(), NC = std::max(Blocking<T>::nc() / nr * nr, nr);
  static_assert(MC % MR == 0, "MC must hold whole row panels");
  const std::size_t ldc = pr.n;
  const std::size_t kc_max = std::min(KC, pr.k);
  const std::size_t nc_max = (std::min(NC, j1 - j0) + Lanes - 1) / Lanes * Lanes;
  const std::size_t mc_max = (std::min(MC, i1 - i0) + MR - 1) / MR * MR;
  T* const bpack = pack_buffer<T>(kc_max * (nc_max + mc_max));
  T* const apack = bpack + kc_max * nc_max;
  for (std::size_t jc = j0; jc < j1; jc += NC) {
    const std::size_t nc = std::min(NC, j1 - jc);
    for (std::size_t pc = 0; pc < pr.k; pc += KC) {
      const std::size_t kc = std::min(KC, pr.k - pc);
      const bool accumulate = pc > 0 || pr.continued;  // later runs continue the stored partial sums
      pack_b<T, Lanes, NV>(pr.b, pc, kc, jc, nc, bpack);
      // Packing a's block pays off when its panels serve several strips
      // (and a is not read in place, Problem::a_in_place).
      const bool pack_whole_a = nc > nr && !pr.a_in_place;
      for (std::size_t ic = i0; ic < i1; ic += MC) {
        const std::size_t mc = std::min(MC, i1 - ic);
        if (pack_whole_a) pack_a<T, MR>(pr.a, ic, mc, pc, kc, apack);
        for (std::size_t jr = 0; jr < nc;) {
          const std::size_t width = strip_width<T, Lanes, NV>(nc - jr);
          const std::size_t cols = std::min(width, nc - jr);
          const T* bp = bpack + jr * kc;
          for (std::size_t ir = 0; ir < mc; ir += MR) {
            const std::size_t rows = std::min(MR, mc - ir);
            T* c = pr.c + (ic + ir) * ldc + jc + jr;
            if (rows < MR) {  // the last, partial panel: packed, so that its padding reads zeros
              const T* panel = apack + ir * kc;
              if (!pack_whole_a) {
                pack_a<T, MR>(pr.a, ic + ir, rows, pc, kc, apack);
                panel = apack;
              }
              partial_panel<T, Lanes, MR, nr>(kc, panel, bp, c, ldc, accumulate, rows, cols, width);
            } else if (pack_whole_a) {
              tile<T, Lanes, MR, nr>(kc, PackedPanel<T, MR>{apack + ir * kc}, bp, c, ldc, accumulate, rows, cols,
                                     width);
            } else {
              const StridedPanel<T> ap{pr.a.p + (ic + ir) * pr.a.rs + pc * pr.a.cs, pr.a.rs, pr.a.cs};
              tile<T, Lanes, MR, nr>(kc, ap, bp, c, ldc, accumulate, rows, cols, width);
            }
          }
          jr += width;
        }
      }
    }
  }
}

// One instantiation per instruction set. Register tiles: AVX-512 has 32
// vector registers (6 x 4 accumulators plus 4 operands; the fma reads a's
// value with an embedded broadcast; measured best of 8x2, 6x3, 12x2, 6x4,
// 4x4 on Zen 4/5 for both types, before the fma), AVX2 and the baseline 16.
// The narrow tails (strip_width, partial_panel) took tinylm's attention
// products at d 96 (hd 24, 32-row causal blocks) from 50-66 to 80-110
// GFLOP/s on Zen 4, where a 32-byte fma costs half a 64-byte one.
// The AVX-512 and AVX2 copies are compiled with FMA3 (isa.hpp): one vfmadd
// per accumulator and term; the baseline's is libm's fma per lane.
template <class T>
void multiply_baseline(const Problem<T>& pr, std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
  multiply_block<T, 16 / sizeof(T), 4, 2>(pr, i0, i1, j0, j1);
}
#if GRAD_HAS_ISA_TARGETS
template <class T>
GRAD_TARGET_AVX2 void multiply_avx2(const Problem<T>& pr, std::size_t i0, std::size_t i1, std::size_t j0,
                                    std::size_t j1) {
  multiply_block<T, 32 / sizeof(T), 4, 2>(pr, i0, i1, j0, j1);
}
template <class T>
GRAD_TARGET_AVX512 void multiply_avx512(const Problem<T>& pr, std::size_t i0, std::size_t i1, std::size_t j0,
                                        std::size_t j1) {
  multiply_block<T, 64 / sizeof(T), 6, 4>(pr, i0, i1, j0, j1);
}
#endif

template <class T>
void multiply_range(Isa isa, const Problem<T>& pr, std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
  (void)isa;
#if GRAD_HAS_ISA_TARGETS && defined(GRAD_ONLY_ISA)  // one copy (isa.hpp)
  if constexpr (only_isa == Isa::avx512)
    multiply_avx512(pr, i0, i1, j0, j1);
  else if constexpr (only_isa == Isa::avx2)
    multiply_avx2(pr, i0, i1, j0, j1);
  else
    multiply_baseline(pr, i0, i1, j0, j1);
#else
#if GRAD_HAS_ISA_TARGETS
  if (isa == Isa::avx512) return multiply_avx512(pr, i0, i1, j0, j1);
  if (isa == Isa::avx2) return multiply_avx2(pr, i0, i1, j0, j1);
#endif
  multiply_baseline(pr, i0, i1, j0, j1);
#endif
}

// Below this many multiply-adds a product runs on the calling thread: waking
// the pool would cost more than it saves.
inline constexpr std::size_t parallel_threshold = std::size_t{1} << 20;

template <class T>
struct Split {
  Isa isa;
  const Problem<T>* problem;
  std::size_t parts, units, unit;
  bool by_columns;
};

template <class T>
void run_part(void* context, std::size_t part) {
  const Split<T>& s = *static_cast<const Split<T>*>(context);
  const Problem<T>& pr = *s.problem;
  const std::size_t extent = s.by_columns ? pr.n : pr.m;
  const std::size_t lo = std::min(extent, part * s.units / s.parts * s.unit);
  const std::size_t hi = std::min(extent, (part + 1) * s.units / s.parts * s.unit);
  if (lo == hi) return;
  if (s.by_columns)
    multiply_range(s.isa, pr, 0, pr.m, lo, hi);
  else
    multiply_range(s.isa, pr, lo, hi, 0, pr.n);
}

// Whether threads that split the product's columns read a in place
// (Problem::a_in_place): when its rows are contiguous and it is larger than
// L2. Packed, such an a is one more pass over memory per thread, every
// thread copying the same rows (Qwen2.5-0.5B's down projection: a is 10 MB;
// the fused loss's dh product: 104 MB per chunk). Measured there (Zen 5, 2
// threads, L1 step, two runs of 6 interleaved rounds): 5.68 -> 5.39 s and
// 5.76 -> 5.52 s. One thread keeps packing: its copy is made once, and
// reading in place measured no faster there.
template <class T>
bool a_in_place_when_split(const Problem<T>& pr) {
  return pr.a.cs == 1 && pr.m * pr.k * sizeof(T) > cache_blocking().l2_bytes;
}

template <class T>
void multiply(Isa isa, const Problem<T>& pr) {
  if (pr.m == 0 || pr.n == 0) return;
  if (pr.k == 0) {  // empty sums: zero, or what C holds when continued
    if (pr.continued) return;
    std::fill(pr.c, pr.c + pr.m * pr.n, T(0));
    return;
  }
  const std::size_t threads = parallel_detail::free_threads();
  if (threads <= 1 || pr.m * pr.n * pr.k < parallel_threshold) return multiply_range(isa, pr, 0, pr.m, 0, pr.n);
  // Each thread packs the whole of the operand it does not split: split
  // the output so that the smaller operand is the one packed twice (columns
  // of C: a, m x k, is copied by every thread; rows: b, k x n), as long as
  // that side has a tile for every thread. Units are the widest register tile.
  constexpr std::size_t col_unit = 4 * 64 / sizeof(T), row_unit = 6;
  const std::size_t col_units = (pr.n + col_unit - 1) / col_unit, row_units = (pr.m + row_unit - 1) / row_unit;
  const bool by_columns = col_units >= threads && (pr.m <= pr.n || row_units < threads);
  const std::size_t units = by_columns ? col_units : row_units;
  // One part per thread where every part packs its own copy of the unsplit
  // operand: finer parts would pay that copy again (measured: 8 parts cost
  // ~30% more CPU time than 2 on workload B). Where a is read in place
  // nothing is copied twice, and four parts per thread let one that finishes
  // early take a slower one's last part (the pool hands each thread its own
  // parts first: parallel.hpp). Measured on 2 cores (Zen 5 VM), 2 threads:
  // 512x1024x2816 8.6 -> 8.0 ms, 512x2816x1024 8.4 -> 8.2, with one core
  // shared with a busy loop 17.6 -> 12.8 ms.
  Problem<T> split_problem = pr;
  split_problem.a_in_place = by_columns && a_in_place_when_split(pr);
  const std::size_t parts = split_problem.a_in_place ? 4 * threads : threads;
  Split<T> split{isa, &split_problem, std::min(parts, units), units, by_columns ? col_unit : row_unit, by_columns};
  parallel_for(split.parts, &run_part<T>, &split);
}

}  // namespace gemm_detail

// The kernels the matmul/bmm tags call: same arguments and results as the
// reference loops above.

// C[m,n] = A[m,k] B[k,n]; B may be held in 16 bits (b_storage: bf16 or f16;
// B then points at its 16-bit elements), widened exactly as it is read.
template <class T>
inline void gemm_nn(const T* A, const T* B, T* C, std::size_t m, std::size_t k, std::size_t n,
                    Storage b_storage = Storage::native) {
  gemm_detail::multiply<T>(gemm_detail::best_isa(), {{A, k, 1}, {B, n, 1, b_storage}, C, m, n, k});
}

// C[m,k] = G[m,n] B[k,n]^T (C[i,p] sums over j); B as gemm_nn's
template <class T>
inline void gemm_nt(const T* G, const T* B, T* C, std::size_t m, std::size_t n, std::size_t k,
                    Storage b_storage = Storage::native) {
  gemm_detail::multiply<T>(gemm_detail::best_isa(), {{G, n, 1}, {B, 1, n, b_storage}, C, m, k, n});
}

// C[k,n] = A[m,k]^T G[m,n] (C[p,j] sums over i)
template <class T>
inline void gemm_tn(const T* A, const T* G, T* C, std::size_t m, std::size_t k, std::size_t n) {
  gemm_detail::multiply<T>(gemm_detail::best_isa(), {{A, 1, k}, {G, n, 1}, C, k, n, m});
}

// C[k,n] continues each element's sum over i of A[i,k]^T G[i,n] from what C
// holds: gemm_tn over rows [0, m1) followed by gemm_tn_continue over rows
// [m1, m) gives gemm_tn's bits over all m rows (the same fma chain per
// element, stored and reloaded unchanged between the two calls).
template <class T>
inline void gemm_tn_continue(const T* A, const T* G, T* C, std::size_t m, std::size_t k, std::size_t n) {
  gemm_detail::multiply<T>(gemm_detail::best_isa(), {{A, 1, k}, {G, n, 1}, C, k, n, m, true});
}

}  // namespace grad
