// The families of op tags: Unary (y = f(x, s)) and Binary (numpy
// broadcasting), each giving its members the per-item bodies, the shape rule
// and the host loops (vector packs, rows, threads) from the members' GRAD_HD
// element functors. What a tag is: contract.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "grad/config.hpp"
#include "grad/numerics/isa.hpp"
#include "grad/numerics/parallel.hpp"
#include "grad/numerics/simd.hpp"
#include "grad/tags/contract.hpp"
#include "grad/tensor.hpp"

namespace grad {

// Elementwise loops at least twice this long are split over the pool (when
// set_num_threads > 1); each element is still computed by one thread.
inline constexpr std::size_t elementwise_grain = std::size_t{1} << 15;

// How many runs of `length` elements make up one elementwise grain.
inline std::size_t row_grain(std::size_t length) {
  return std::max<std::size_t>(1, elementwise_grain / std::max<std::size_t>(1, length));
}

// Rows (runs of the last axis) of an output shape; a scalar is one row of one.
inline std::size_t row_count(const Dims& out) { return out.rank == 0 ? 1 : out.size() / out.back(); }
inline std::size_t row_length(const Dims& out) { return out.rank == 0 ? 1 : out.back(); }

// Visits the rows [r0, r1) of `out` in ascending order, calling
// row(j, ia, ib) with the flat index j of the row's first element and where
// that row starts in the two broadcast inputs (strides from
// broadcast_strides). The row's columns are the caller's: it walks them with
// the inputs' last-axis strides, ascending.
template <class Row>
inline void broadcast_rows(const Dims& out, const Dims& sa, const Dims& sb, std::size_t r0, std::size_t r1, Row&& row) {
  if (out.rank == 0) {
    if (r0 < r1) row(std::size_t{0}, std::size_t{0}, std::size_t{0});
    return;
  }
  const std::size_t inner = out.back();
  if (inner == 0 || r0 >= r1) return;
  // The multi-index of row r0 over the leading axes, and where it starts in a and b.
  std::array<std::size_t, max_rank> idx{};
  std::size_t ia = 0, ib = 0;
  for (std::size_t ax = out.rank - 1, rest = r0; ax-- > 0;) {
    idx[ax] = rest % out.d[ax];
    rest /= out.d[ax];
    ia += idx[ax] * sa.d[ax];
    ib += idx[ax] * sb.d[ax];
  }
  for (std::size_t r = r0; r < r1; ++r) {
    row(r * inner, ia, ib);
    for (std::size_t ax = out.rank - 1; ax-- > 0;) {
      ++idx[ax];
      ia += sa.d[ax];
      ib += sb.d[ax];
      if (idx[ax] < out.d[ax]) break;
      ia -= sa.d[ax] * out.d[ax];
      ib -= sb.d[ax] * out.d[ax];
      idx[ax] = 0;
    }
  }
}

// A tag opts in to the pack loops with `static constexpr bool packs = true;`
// when its element functors are plain arithmetic and exact_math (which take
// a simd::Pack as well as a T). Other tags (a ?: or a libm call in a
// functor) run per element, in fixed-length blocks.
template <class Op>
concept PackFunctors = requires {
  requires Op::packs;
};

// The pack a with_best_isa copy of width W runs on (T itself where there
// is no vector code: nvcc, other compilers).
template <class T, class W>
using pack_for = std::conditional_t<GRAD_SIMD != 0, typename simd::pack_of<T, W::bytes>::type, T>;

// The largest of x[0], x[1], ..., x[n-1] as softmax and cross-entropy take
// it: serially, a later element replacing the maximum only when greater (a
// NaN after the first element never does).
template <class T>
GRAD_HD inline T running_max(const T* x, std::size_t n) {
  T hi = x[0];
  for (std::size_t j = 1; j < n; ++j) hi = x[j] > hi ? x[j] : hi;
  return hi;
}

namespace kernels_detail {

// f(i, v) over [0, n): v a P (a pack, default-constructed: its type says
// where to load) for whole packs, then a T for the tail. With load_as /
// store_as, one generic lambda serves both; each element sees the same
// operations either way, so a row-wise host loop built on it has the
// scalar body's bits.
template <class P, class T, class F>
GRAD_INLINE inline void for_packs(std::size_t n, F&& f) {
  constexpr std::size_t L = sizeof(P) / sizeof(T);
  std::size_t i = 0;
  if constexpr (L > 1)
    for (; i + L <= n; i += L) f(i, P{});
  for (; i < n; ++i) f(i, T{});
}
template <class V, class T>
GRAD_INLINE inline V load_as(const T* p) {
  if constexpr (std::is_same_v<V, T>)
    return *p;
  else
    return V::load(p);
}
template <class V, class T>
GRAD_INLINE inline void store_as(V v, T* p) {
  if constexpr (std::is_same_v<V, T>)
    *p = v;
  else
    v.store(p);
}

// Same-length runs: y[i] = f(ins[i]...) for i < n, as packs when the tag
// takes them, else element by element in blocks of a pack's length (a loop
// with a constant trip count, which even -O2 vectorises where it can).
template <class P, bool Packs, class T, class F, class... In>
[[gnu::always_inline]] inline void run_map(std::size_t n, T* __restrict y, F&& f, const In* __restrict... in) {
#if GRAD_SIMD
  if constexpr (Packs && simd::is_pack<P>) {
    simd::map_streams<P>(n, y, f, simd::Stream<P, true>{in}...);
    return;
  }
#endif
  constexpr std::size_t L = sizeof(P) / sizeof(T);
  std::size_t i = 0;
  for (; i + L <= n; i += L)
    for (std::size_t j = 0; j < L; ++j) y[i + j] = f(in[i + j]...);
  for (; i < n; ++i) y[i] = f(in[i]...);
}

#if GRAD_SIMD
// f's result added to what the output holds: acc + f(inputs...).
template <class F>
struct AddTo {
  F& f;
  template <class P, class... V>
  [[gnu::always_inline]] P operator()(P acc, V... v) const {
    return acc + f(v...);
  }
};

template <class P, bool Accumulate, bool AOne, bool BOne, class T, class F, class... Rest>
[[gnu::always_inline]] inline void row_packs(std::size_t len, T* __restrict out, F& f, const T* a, const T* b,
                                             const Rest*... rest) {
  if constexpr (Accumulate)
    simd::map_streams<P, true>(len, out, AddTo<F>{f}, simd::Stream<P, AOne>{a}, simd::Stream<P, BOne>{b},
                               simd::Stream<P, true>{rest}...);
  else
    simd::map_streams<P>(len, out, f, simd::Stream<P, AOne>{a}, simd::Stream<P, BOne>{b},
                         simd::Stream<P, true>{rest}...);
}
#endif

// One row of a broadcast op: out[c] = f(a[c * sa], b[c * sb], rest[c]...)
// for c < len (or out[c] = out[c] + f(...) with Accumulate), as packs where
// sa and sb are 0 or 1; other steps go element by element.
template <class P, bool Packs, bool Accumulate, class T, class F, class... Rest>
[[gnu::always_inline]] inline void run_row(std::size_t len, T* __restrict out, F& f, const T* a, std::size_t sa,
                                           const T* b, std::size_t sb, const Rest*... rest) {
#if GRAD_SIMD
  if constexpr (Packs && simd::is_pack<P>) {
    if (sa == 1 && sb == 1) return row_packs<P, Accumulate, true, true>(len, out, f, a, b, rest...);
    if (sa == 1 && sb == 0) return row_packs<P, Accumulate, true, false>(len, out, f, a, b, rest...);
    if (sa == 0 && sb == 1) return row_packs<P, Accumulate, false, true>(len, out, f, a, b, rest...);
  }
#endif
  for (std::size_t c = 0; c < len; ++c) {
    const T v = f(a[c * sa], b[c * sb], rest[c]...);
    if constexpr (Accumulate)
      out[c] = out[c] + v;
    else
      out[c] = v;
  }
}

}  // namespace kernels_detail

// The host loops of the elementwise families, one function template per
// (tag, type[, operand]) at namespace scope, not inline: the compiled kernel
// library (grad_kernels) instantiates them for float and double with the
// project's flags, and a consumer built with GRAD_COMPILED_KERNELS declares
// those instantiations extern (kernels_extern.hpp) and compiles none of them.
namespace kernels {

template <class Op, class T>
void unary_forward(const NodeArgs<T>& x, T* y);
template <class Op, class T>
void unary_backward(const NodeArgs<T>& x, const T* y, const T* g, T* dx);
template <class Op, class T>
void binary_forward(const NodeArgs<T>& x, T* y);
template <class Op, int In, class T>
void binary_backward(const NodeArgs<T>& x, const T* y, const T* g, T* dx);

}  // namespace kernels

// y = f(x, scalar) elementwise; the tag supplies forward(x, s) and
// backward(x, y, g, s) = dL/dx for one element.
template <class Derived>
struct Unary {
  static constexpr int arity = 1;

  static std::string output_dims(const Dims& a, const Dims&, OpAttrs&, Dims& out) {
    out = a;
    return {};
  }

  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    y[w] = Derived::forward(x.a.data[w], x.scalar);
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t w) {
    dx[w] = Derived::backward(x.a.data[w], y[w], g[w], x.scalar);
  }

  // The host loops: the same element bodies over packs and threads.

  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    kernels::unary_forward<Derived>(x, y);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    kernels::unary_backward<Derived>(x, y, g, dx);
  }
};

// y = f(a, b) with numpy broadcasting. Gradient of a broadcast input: each
// of its elements sums its contributions starting from zero in ascending
// flat output index (the documented broadcast-reduce order).
template <class Derived>
struct Binary {
  static constexpr int arity = 2;

  // numpy broadcasting.
  static std::string output_dims(const Dims& a, const Dims& b, OpAttrs&, Dims& out) {
    if (broadcast_dims(a, b, out)) return {};
    return "shapes " + shape_string(a) + " and " + shape_string(b) +
           " do not broadcast (aligned from the last axis, each pair of sizes must be equal or 1)";
  }

  // The per-item bodies. An input of the output's exact shape stores its
  // one contribution as is; a broadcast input's element w starts from zero
  // and adds its contributions in ascending output index.
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const std::size_t ia = x.a.dims == x.out ? w : broadcast_index(w, x.out, broadcast_strides(x.a.dims, x.out));
    const std::size_t ib = x.b.dims == x.out ? w : broadcast_index(w, x.out, broadcast_strides(x.b.dims, x.out));
    y[w] = value(x.a.data[ia], x.b.data[ib], x.scalar);
  }

  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t w) {
    // 32-bit index arithmetic whenever the output allows it: a 64-bit
    // division is a long software routine on the GPU.
    if (x.out.size() <= 0xffffffffu)
      backward_indexed<In, std::uint32_t>(x, y, g, dx, static_cast<std::uint32_t>(w));
    else
      backward_indexed<In, std::size_t>(x, y, g, dx, w);
  }

  // backward_item with index type I.
  template <int In, class I, class T>
  GRAD_HD static void backward_indexed(const NodeArgs<T>& x, const T* y, const T* g, T* dx, I w) {
    auto contribution = [&](I j, I ia, I ib) { return gradient<In>(x.a.data[ia], x.b.data[ib], y[j], g[j], x.scalar); };
    const Dims sa = broadcast_strides(x.a.dims, x.out), sb = broadcast_strides(x.b.dims, x.out);
    const Dims& mine = In == 0 ? x.a.dims : x.b.dims;
    const Dims& s = In == 0 ? sa : sb;
    // Element w's coordinates on the axes it spans give the first output j
    // that reads it (and the other operand's index there); the broadcast
    // (stride 0) axes are enumerated row-major, so that j ascends, by an
    // odometer whose strides are gathered once here: no division per term.
    I j = 0, ia = 0, ib = 0, ostride = 1;
    I size[max_rank], step_j[max_rank], step_a[max_rank], step_b[max_rank];
    std::size_t free = 0;
    for (std::size_t ax = x.out.rank; ax-- > 0;) {
      const I n = static_cast<I>(x.out.d[ax]);
      if (s.d[ax] != 0) {
        const I c = w / static_cast<I>(s.d[ax]) % n;
        j += c * ostride;
        ia += c * static_cast<I>(sa.d[ax]);
        ib += c * static_cast<I>(sb.d[ax]);
      } else if (n > 1) {  // innermost first
        size[free] = n;
        step_j[free] = ostride;
        step_a[free] = static_cast<I>(sa.d[ax]);
        step_b[free] = static_cast<I>(sb.d[ax]);
        ++free;
      }
      ostride *= n;
    }
    if (mine == x.out) {
      dx[w] = contribution(w, ia, ib);
      return;
    }
    T acc = T(0);
    if (free == 1) {  // the common case (a bias over rows): one stride, all in registers
      for (I k = 0; k < size[0]; ++k, j += step_j[0], ia += step_a[0], ib += step_b[0])
        acc = acc + contribution(j, ia, ib);
      dx[w] = acc;
      return;
    }
    I at[max_rank] = {};
    for (;;) {
      acc = acc + contribution(j, ia, ib);
      std::size_t k = 0;
      for (; k < free; ++k) {
        j += step_j[k];
        ia += step_a[k];
        ib += step_b[k];
        if (++at[k] < size[k]) break;
        j -= size[k] * step_j[k];
        ia -= size[k] * step_a[k];
        ib -= size[k] * step_b[k];
        at[k] = 0;
      }
      if (k == free) break;
    }
    dx[w] = acc;
  }

  // The host loops: the same element functors over packs, rows and threads.
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    kernels::binary_forward<Derived>(x, y);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    kernels::binary_backward<Derived, In>(x, y, g, dx);
  }
  // The tag's value and its gradient for operand In from one output
  // element (T or a pack), with the node's scalar s for a tag whose functors
  // take one (add_scaled: a + b * s).
  template <class V>
  GRAD_HD GRAD_INLINE static V value(V a, V b, V s) {
    if constexpr (requires { Derived::forward(a, b, s); })
      return Derived::forward(a, b, s);
    else
      return Derived::forward(a, b);
  }
  template <int In, class V>
  GRAD_HD GRAD_INLINE static V gradient(V a, V b, V y, V g, V s) {
    if constexpr (In == 0) {
      if constexpr (requires { Derived::backward_a(a, b, y, g, s); })
        return Derived::backward_a(a, b, y, g, s);
      else
        return Derived::backward_a(a, b, y, g);
    } else {
      if constexpr (requires { Derived::backward_b(a, b, y, g, s); })
        return Derived::backward_b(a, b, y, g, s);
      else
        return Derived::backward_b(a, b, y, g);
    }
  }
};

namespace kernels {

// Every loop below runs compiled for the best instruction set
// (with_best_isa) on packs of that set's width: the exact_math functors
// (tanh, exp, ...) are branchless, so they run 8 or 16 wide under AVX-512
// instead of 2 wide at the x86-64 baseline. Same operations in the same
// order: same bits. A node's output and gradient buffers never overlap its
// inputs.
template <class Op, class T>
void unary_forward(const NodeArgs<T>& x, T* y) {
  const T* a = x.a.data;
  const T s = x.scalar;
  parallel_ranges(x.out.size(), elementwise_grain, [&](std::size_t lo, std::size_t hi) {
    with_best_isa([&](auto width) {
      using P = pack_for<T, decltype(width)>;
      // A tag may bring a host loop of its own for a whole run of float
      // or double (forward_array), which must give every element
      // forward()'s bits.
      if constexpr (Scalar<T> && requires { Op::template forward_array<P>(a, y, hi, s); })
        Op::template forward_array<P>(a + lo, y + lo, hi - lo, s);
      else
        kernels_detail::run_map<P, PackFunctors<Op>>(
            hi - lo, y + lo, [s](auto v) GRAD_INLINE { return Op::forward(v, decltype(v)(s)); }, a + lo);
    });
  });
}

template <class Op, class T>
void unary_backward(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
  const T* a = x.a.data;
  const T s = x.scalar;
  parallel_ranges(x.out.size(), elementwise_grain, [&](std::size_t lo, std::size_t hi) {
    with_best_isa([&](auto width) {
      using P = pack_for<T, decltype(width)>;
      kernels_detail::run_map<P, PackFunctors<Op>>(
          hi - lo, dx + lo,
          [s](auto av, auto yv, auto gv) GRAD_INLINE { return Op::backward(av, yv, gv, decltype(av)(s)); }, a + lo,
          y + lo, g + lo);
    });
  });
}

template <class Op, class T>
void binary_forward(const NodeArgs<T>& x, T* y) {
  const T* a = x.a.data;
  const T* b = x.b.data;
  const T s = x.scalar;
  auto f = [s](auto av, auto bv) GRAD_INLINE { return Binary<Op>::value(av, bv, decltype(av)(s)); };
  if (x.a.dims == x.out && x.b.dims == x.out) {
    parallel_ranges(x.out.size(), elementwise_grain, [&](std::size_t lo, std::size_t hi) {
      with_best_isa([&](auto width) {
        kernels_detail::run_map<pack_for<T, decltype(width)>, PackFunctors<Op>>(hi - lo, y + lo, f, a + lo, b + lo);
      });
    });
    return;
  }
  const Dims sa = broadcast_strides(x.a.dims, x.out), sb = broadcast_strides(x.b.dims, x.out);
  const std::size_t inner = row_length(x.out), a_step = x.out.rank ? sa.back() : 0, b_step = x.out.rank ? sb.back() : 0;
  parallel_ranges(row_count(x.out), row_grain(inner), [&](std::size_t r0, std::size_t r1) {
    with_best_isa([&](auto width) {
      using P = pack_for<T, decltype(width)>;
      broadcast_rows(x.out, sa, sb, r0, r1, [&](std::size_t j, std::size_t ia, std::size_t ib) {
        kernels_detail::run_row<P, PackFunctors<Op>, false>(inner, y + j, f, a + ia, a_step, b + ib, b_step);
      });
    });
  });
}

template <class Op, int In, class T>
void binary_backward(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
  // A value this gradient does not read (the tag's backward_reads) may have
  // no memory: a recompute scope's replay computes only the values backward
  // reads (tape.hpp). g stands in for it: the loops below load every operand
  // (the loads are dead), and g is at least as long as any of them.
  constexpr std::uint8_t reads = backward_reads<Op>(In);
  const T* a = reads & reads_a ? x.a.data : g;
  const T* b = reads & reads_b ? x.b.data : g;
  if (!(reads & reads_out)) y = g;
  const Dims& mine = In == 0 ? x.a.dims : x.b.dims;
  // Operands in the order the tag's gradient takes them: a, b, y, g.
  const T s = x.scalar;
  auto contribution = [s](auto av, auto bv, auto yv, auto gv)
                          GRAD_INLINE { return Binary<Op>::template gradient<In>(av, bv, yv, gv, decltype(av)(s)); };
  if (x.a.dims == x.out && x.b.dims == x.out) {
    parallel_ranges(x.out.size(), elementwise_grain, [&](std::size_t lo, std::size_t hi) {
      with_best_isa([&](auto width) {
        kernels_detail::run_map<pack_for<T, decltype(width)>, PackFunctors<Op>>(hi - lo, dx + lo, contribution, a + lo,
                                                                                b + lo, y + lo, g + lo);
      });
    });
    return;
  }
  const Dims sa = broadcast_strides(x.a.dims, x.out), sb = broadcast_strides(x.b.dims, x.out);
  const std::size_t rows = row_count(x.out), inner = row_length(x.out);
  const std::size_t a_step = x.out.rank ? sa.back() : 0, b_step = x.out.rank ? sb.back() : 0;
  if (mine == x.out) {
    parallel_ranges(rows, row_grain(inner), [&](std::size_t r0, std::size_t r1) {
      with_best_isa([&](auto width) {
        using P = pack_for<T, decltype(width)>;
        broadcast_rows(x.out, sa, sb, r0, r1, [&](std::size_t j, std::size_t ia, std::size_t ib) {
          kernels_detail::run_row<P, PackFunctors<Op>, false>(inner, dx + j, contribution, a + ia, a_step, b + ib,
                                                              b_step, y + j, g + j);
        });
      });
    });
    return;
  }
  // A broadcast input: each of its elements sums its contributions over the
  // rows, ascending (rows are the outer loop; a row adds one contribution to
  // each of its columns' elements). When it is not broadcast along the last
  // axis, distinct columns feed distinct elements, so column ranges may run
  // on different threads, and a row's columns are a vector of independent
  // sums; otherwise (a per-row scalar) one thread walks everything in order.
  const std::size_t my_step = In == 0 ? a_step : b_step;
  const std::size_t m = mine.size();
  for (std::size_t i = 0; i < m; ++i) dx[i] = T(0);
  if (my_step == 1) {
    parallel_ranges(inner, row_grain(rows), [&](std::size_t c0, std::size_t c1) {
      with_best_isa([&](auto width) {
        using P = pack_for<T, decltype(width)>;
        broadcast_rows(x.out, sa, sb, 0, rows, [&](std::size_t j, std::size_t ia, std::size_t ib) {
          T* d = dx + (In == 0 ? ia : ib) + c0;
          kernels_detail::run_row<P, PackFunctors<Op>, true>(c1 - c0, d, contribution, a + ia + c0 * a_step, a_step,
                                                             b + ib + c0 * b_step, b_step, y + j + c0, g + j + c0);
        });
      });
    });
    return;
  }
  with_best_isa([&] {
    broadcast_rows(x.out, sa, sb, 0, rows, [&](std::size_t j, std::size_t ia, std::size_t ib) {
      for (std::size_t c = 0; c < inner; ++c) {
        T& d = dx[In == 0 ? ia + c * a_step : ib + c * b_step];
        d = d + contribution(a[ia + c * a_step], b[ib + c * b_step], y[j + c], g[j + c]);
      }
    });
  });
}

}  // namespace kernels

}  // namespace grad

// With GRAD_COMPILED_KERNELS: the loops above for float and double are the
// compiled library's (declared extern there).
#include "grad/kernels_extern.hpp"
