// Attention's layouts: a projection's rows [B*t, n*hd] (one row per
// position, the n heads side by side) to heads-major [B*n, t, hd] (one
// [t, hd] matrix per sequence and head) and back, and RoPE applied on the
// way in. Each is one node and one pass where nn's attention recorded a
// composite (two reshapes and two transposes each way; slice, neg, slice,
// concat, two muls and an add for RoPE), with the composite's bits, values
// and gradients:
//
// HeadsMajor: a = rows [B*t, n*hd], at.sizes = {B, n}: out [B*n, t, hd],
//   element (b*n + h, p, c) = rows (b*t + p, h*hd + c). Copies both ways.
// RowsMajor: a = [B*n, t, hd], at.sizes = {B}: out [B*t, n*hd], the inverse
//   copy.
// RopeHeadsMajor: a = rows [B*t, n*hd], b = table [2, t, hd] (cos, then sin:
//   a node has two operands, so the two tables are one): out [B*n, t, hd],
//   heads-major h rotated, h * cos + rotate_half(h) * sin with rotate_half(h)
//   = [-h2, h1] for h = [h1, h2] split at hd / 2. Each product and the sum
//   are rounded apart (no fma: the composite had none). Backward to the rows
//   adds what the composite's tape walk added into h's gradient, in its
//   order (consumers in descending index): the h * cos product's g * cos,
//   then the slices' scatters, one of which is an exact zero there (so a
//   -0 becomes +0): (g * cos + rotated) + 0, rotated being g * sin from the
//   other half, negated for the second half. Backward to the table: per
//   element the sum over the B*n heads, ascending from zero, of g * h (cos)
//   and g * rotate_half(h) (sin).
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <string_view>

#include "grad/numerics/isa.hpp"
#include "grad/tags/contract.hpp"
#include "grad/tags/family.hpp"

namespace grad {

namespace heads_detail {

// The sizes of a heads-major tensor [B*n, t, hd] and its rows [B*t, n*hd].
struct Sizes {
  std::size_t heads, t, hd;  // n, t, hd; B is whatever the element count leaves

  GRAD_HD std::size_t width() const { return heads * hd; }
  // Where heads-major element w sits in the rows.
  GRAD_HD std::size_t row_index(std::size_t w) const {
    const std::size_t c = w % hd, p = w / hd % t, bh = w / (hd * t);
    return (bh / heads * t + p) * width() + bh % heads * hd + c;
  }
  // Where row element i sits in the heads-major tensor.
  GRAD_HD std::size_t heads_index(std::size_t i) const {
    const std::size_t r = i / width(), col = i % width();
    return ((r / t * heads + col / hd) * t + r % t) * hd + col % hd;
  }
};

// body(lo, hi) for ranges of the heads [lo, hi) (batch x heads) of a
// tensor of `count` elements, spread over the pool: runs of different heads
// write disjoint elements, and a thread takes the same heads every time
// (parallel.hpp), the heads whose columns its share of the projection
// before wrote and whose attention it computes after.
template <class Body>
inline void over_heads(std::size_t count, const Sizes& z, Body&& body) {
  parallel_ranges(count / (z.hd * z.t), row_grain(z.t * z.hd), body);
}

// f(heads_offset, rows_offset, p) for every run of hd elements (one head at
// one position) of the heads [lo, hi), heads-major order; p is the position.
template <class F>
inline void each_run(std::size_t lo, std::size_t hi, const Sizes& z, F&& f) {
  for (std::size_t bh = lo; bh < hi; ++bh) {
    const std::size_t row0 = bh / z.heads * z.t * z.width() + bh % z.heads * z.hd;
    for (std::size_t p = 0, k = bh * z.t; p < z.t; ++p, ++k) f(k * z.hd, row0 + p * z.width(), p);
  }
}

// The rows [R, W] become [R/t * W/hd, t, hd]; the reason when they cannot.
inline std::string heads_major_dims(const Dims& rows, std::size_t t, std::size_t hd, Dims& out) {
  if (rows.rank != 2 || t == 0 || hd == 0 || rows[0] == 0 || rows[1] == 0 || rows[0] % t != 0 || rows[1] % hd != 0)
    return "expected rows [batch*" + std::to_string(t) + ", heads*" + std::to_string(hd) + "] with batch, heads >= 1";
  out = Dims::of(std::array<std::size_t, 3>{rows[0] / t * (rows[1] / hd), t, hd});
  return {};
}

// The copy between the two layouts, shared by the two tags (Tag::sizes
// gives the heads-major sizes): ToHeads copies rows to heads-major (forward
// of HeadsMajor, backward of RowsMajor), else back. The per-item bodies copy
// an element, the host loops a run of head_dim.
template <class Tag, bool ToHeads>
struct LayoutCopy {
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const Sizes z = Tag::sizes(x);
    y[w] = x.a.data[ToHeads ? z.row_index(w) : z.heads_index(w)];
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const Sizes z = Tag::sizes(x);
    dx[w] = g[ToHeads ? z.heads_index(w) : z.row_index(w)];
  }
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    copy_runs<ToHeads>(x.out.size(), Tag::sizes(x), x.a.data, y);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    copy_runs<!ToHeads>(x.out.size(), Tag::sizes(x), g, dx);
  }

 private:
  template <bool RowsToHeads, class T>
  static void copy_runs(std::size_t count, const Sizes& z, const T* from, T* to) {
    over_heads(count, z, [&](std::size_t lo, std::size_t hi) {
      each_run(lo, hi, z, [&](std::size_t h, std::size_t r, std::size_t) {
        if constexpr (RowsToHeads)
          std::copy_n(from + r, z.hd, to + h);
        else
          std::copy_n(from + h, z.hd, to + r);
      });
    });
  }
};

}  // namespace heads_detail

struct HeadsMajor : heads_detail::LayoutCopy<HeadsMajor, true> {
  static constexpr std::string_view name = "heads_major";
  static constexpr std::string_view torch =
      "a.reshape(a.shape[0] // dims[1], dims[1], a.shape[1] // dims[2], dims[2]).transpose(1, 2).reshape(dims)";
  static constexpr int arity = 1;
  static std::string output_dims(const Dims& a, const Dims&, OpAttrs& at, Dims& out) {
    const std::size_t batch = at.sizes.size() == 2 ? at.sizes[0] : 0, heads = at.sizes.size() == 2 ? at.sizes[1] : 0;
    const std::string why = batch == 0 || heads == 0 || a.rank != 2 || a[0] % batch != 0 || a[1] % heads != 0
                                ? "expected [batch*t, heads*head_dim] with t, head_dim >= 1"
                                : heads_detail::heads_major_dims(a, a[0] / batch, a[1] / heads, out);
    if (why.empty()) return {};
    return "rows " + shape_string(a) + " with batch " + std::to_string(batch) + " and " + std::to_string(heads) +
           " heads: " + why;
  }
  template <class T>
  GRAD_HD static heads_detail::Sizes sizes(const NodeArgs<T>& x) {
    return {x.a.dims[1] / x.out[2], x.out[1], x.out[2]};
  }
};

struct RowsMajor : heads_detail::LayoutCopy<RowsMajor, false> {
  static constexpr std::string_view name = "rows_major";
  static constexpr std::string_view torch =
      "a.reshape(dims[0] // a.shape[1], a.shape[0] // (dims[0] // a.shape[1]), a.shape[1], a.shape[2])"
      ".transpose(1, 2).reshape(dims)";
  static constexpr int arity = 1;
  static std::string output_dims(const Dims& a, const Dims&, OpAttrs& at, Dims& out) {
    const std::size_t batch = at.sizes.size() == 1 ? at.sizes[0] : 0;
    if (batch == 0 || a.rank != 3 || a.size() == 0 || a[0] % batch != 0)
      return "heads-major " + shape_string(a) + " with batch " + std::to_string(batch) +
             ": expected [batch*heads, t, head_dim] with heads, t, head_dim >= 1";
    out = Dims::of(std::array<std::size_t, 2>{batch * a[1], a[0] / batch * a[2]});
    return {};
  }
  template <class T>
  GRAD_HD static heads_detail::Sizes sizes(const NodeArgs<T>& x) {
    return {x.out[1] / x.a.dims[2], x.a.dims[1], x.a.dims[2]};
  }
};

struct RopeHeadsMajor {
  static constexpr std::string_view name = "rope_heads_major";
  static constexpr std::string_view torch =
      "(lambda h: h * b[0] + torch.cat([-h[..., h.shape[-1] // 2:], h[..., :h.shape[-1] // 2]], -1) * b[1])("
      "a.reshape(a.shape[0] // dims[1], dims[1], a.shape[1] // dims[2], dims[2]).transpose(1, 2).reshape(dims))";
  static constexpr int arity = 2;
  static std::string output_dims(const Dims& a, const Dims& b, OpAttrs&, Dims& out) {
    const bool table = b.rank == 3 && b[0] == 2 && b[1] >= 1 && b[2] >= 2 && b[2] % 2 == 0;
    const std::string why =
        table ? heads_detail::heads_major_dims(a, b[1], b[2], out) : "expected a table [2, t, head_dim] (cos, sin)";
    if (why.empty()) return {};
    return "rows " + shape_string(a) + " and table " + shape_string(b) + ": " + why +
           (table ? "" : " with an even head_dim >= 2 and rows [batch*t, heads*head_dim]");
  }
  template <class T>
  GRAD_HD static heads_detail::Sizes sizes(const NodeArgs<T>& x) {
    return {x.a.dims[1] / x.out[2], x.out[1], x.out[2]};
  }

  // The per-item bodies. Output element w is h * cos + rotated * sin, with
  // rotated the other half's element (negated in the first half).
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const heads_detail::Sizes z = sizes(x);
    const std::size_t c = w % z.hd, half = z.hd / 2, at = w % (z.t * z.hd);
    const T* row = x.a.data + (z.row_index(w) - c);
    const T* cos = x.b.data;
    const T* sin = x.b.data + z.t * z.hd;
    const T rotated = c < half ? -row[c + half] : row[c - half];
    y[w] = row[c] * cos[at] + rotated * sin[at];
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const heads_detail::Sizes z = sizes(x);
    const std::size_t half = z.hd / 2, plane = z.t * z.hd;
    const T* cos = x.b.data;
    const T* sin = x.b.data + plane;
    if constexpr (In == 0) {
      const std::size_t c = w % z.hd, h = z.heads_index(w), at = h % plane;
      const T* gh = g + (h - c);           // the gradient of this head at this position
      const std::size_t at0 = at - c;      // where the position's table row starts
      const T rotated = c < half ? gh[c + half] * sin[at0 + c + half] : -(gh[c - half] * sin[at0 + c - half]);
      dx[w] = (g[h] * cos[at] + rotated) + T(0);
    } else {
      // A table element: its products with every head at its position, ascending.
      const std::size_t at = w % plane, c = at % z.hd, heads = x.out[0];
      const bool is_sin = w >= plane;
      T sum = T(0);
      for (std::size_t bh = 0; bh < heads; ++bh) {
        const std::size_t h = bh * plane + at;
        const T* row = x.a.data + (z.row_index(h) - c);
        const T factor = !is_sin ? row[c] : c < half ? -row[c + half] : row[c - half];
        sum = sum + g[h] * factor;
      }
      dx[w] = sum;
    }
  }

  // The host loops: a run of head_dim at a time, each half on packs of at
  // most 32 bytes (a head is often 16 or 24 wide); the per-item bodies'
  // operations on every element.
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const heads_detail::Sizes z = sizes(x);
    const std::size_t half = z.hd / 2, plane = z.t * z.hd;
    heads_detail::over_heads(x.out.size(), z, [&](std::size_t h0, std::size_t h1) {
      with_best_isa([&](auto width) {
        using P = pack_for<T, VectorWidth<std::min<std::size_t>(decltype(width)::bytes, 32)>>;
        using namespace kernels_detail;
        heads_detail::each_run(h0, h1, z, [&](std::size_t h, std::size_t r, std::size_t p) {
          const T* lo = x.a.data + r;
          const T* hi = lo + half;
          const T* cos = x.b.data + p * z.hd;
          const T* sin = cos + plane;
          T* out = y + h;
          for_packs<P, T>(half, [&](std::size_t i, auto v) {
            using V = decltype(v);
            const V l = load_as<V>(lo + i), u = load_as<V>(hi + i);
            store_as(l * load_as<V>(cos + i) + (-u) * load_as<V>(sin + i), out + i);
            store_as(u * load_as<V>(cos + half + i) + l * load_as<V>(sin + half + i), out + half + i);
          });
        });
      });
    });
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    if constexpr (In == 1) {
      ItemLoops<RopeHeadsMajor>::template backward_tensor<In>(x, y, g, dx);
    } else {
      const heads_detail::Sizes z = sizes(x);
      const std::size_t half = z.hd / 2, plane = z.t * z.hd;
      heads_detail::over_heads(x.out.size(), z, [&](std::size_t h0, std::size_t h1) {
        with_best_isa([&](auto width) {
          using P = pack_for<T, VectorWidth<std::min<std::size_t>(decltype(width)::bytes, 32)>>;
          using namespace kernels_detail;
          heads_detail::each_run(h0, h1, z, [&](std::size_t h, std::size_t r, std::size_t p) {
            const T* lo = g + h;
            const T* hi = lo + half;
            const T* cos = x.b.data + p * z.hd;
            const T* sin = cos + plane;
            T* out = dx + r;
            for_packs<P, T>(half, [&](std::size_t i, auto v) {
              using V = decltype(v);
              const V l = load_as<V>(lo + i), u = load_as<V>(hi + i);
              store_as((l * load_as<V>(cos + i) + u * load_as<V>(sin + half + i)) + V(T(0)), out + i);
              store_as((u * load_as<V>(cos + half + i) + -(l * load_as<V>(sin + i))) + V(T(0)), out + half + i);
            });
          });
        });
      });
    }
  }
};

}  // namespace grad
