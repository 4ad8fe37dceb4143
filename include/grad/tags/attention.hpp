// Causal attention without a materialised mask or repeated keys/values.
//
// CausalAttentionProbs: a = q [N, G*t, hd], b = k [N, t, hd], the node's
// scalar the scale; output p [N, G*t, t], per row the softmax of
// scale * q.k over the key positions up to the query's own. N is batch *
// key/value heads; the G query heads of one key/value group are stacked
// along the rows (the heads-major query [N*G, t, hd] reshaped), so query
// row r sits at position r % t and every head of the group reads the one k.
//
// AttentionContext: a = p [N, G*t, t], b = v [N, t, hd]: the context
// p . v [N, G*t, hd] (every head of a group reads the one v). Axis 1 says p
// is causal_attention_probs' output (the recording function sets it), whose
// masked probabilities are exactly +0: the host loops then leave out the
// products' masked terms (the context's last terms per row, v's gradient's
// first per key), as CausalAttentionProbs' own products do, about half of
// their work. p's gradient stays whole (g . v^T at every position: p is a
// node whose gradient a user can read, and there it is not zero).
//
// Both give the bits of the unfused sequence they replace:
//   scores = bmm(q, transpose(k)) * scale + mask   (mask: 0, or -1e9 above the diagonal)
//   p = softmax(scores, -1);  context = bmm(p, v)
// with k and v repeated once per query head of the group by concat:
//   - a score is the inner product from zero in ascending index (fma_hd),
//     times the scale, plus the mask's 0 (which turns -0 into +0);
//   - softmax's max, exact_exp(x - max), the sum in ascending index and the
//     division, over the unmasked positions: a masked score (about -1e9)
//     never is the max, its exact_exp is exactly 0, and adding an exact 0
//     changes no sum, so leaving it out gives the same bits (this assumes
//     |scores| far below 1e9, as any real attention has);
//   - backward to q: softmax's dot `<g, p>` ascending, ds = p * (g - dot)
//     (mul_scalar's backward then scales it), and bmm's inner products
//     ascending over the key positions; a masked ds is +-0 and
//     fma(+-0, x, acc) == acc for finite x, so masked terms are skipped;
//   - backward to k (and to v): each head's inner products ascending over
//     its rows, as bmm gave them per repeated head, then the group's heads
//     summed in the order the tape added the repeat's concat contributions:
//     heads G-1, G-2, ..., 2, then 0, then 1 (backward.hpp: consumers in
//     descending index, operand a before operand b).
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "grad/numerics/exact_math.hpp"
#include "grad/numerics/gemm.hpp"
#include "grad/numerics/isa.hpp"
#include "grad/tags/contract.hpp"
#include "grad/tags/family.hpp"

namespace grad {

namespace attention_detail {

// The sizes of a grouped attention node: N slices of `rows` = group * t
// query rows, t key positions, `width` columns of operand b.
struct Sizes {
  std::size_t slices, rows, t, width, group;
};

// Which head of the group the n-th contribution to a key/value gradient
// comes from: G-1, G-2, ..., 2, then 0, then 1 (see the file comment).
GRAD_HD inline std::size_t head_in_sum_order(std::size_t n, std::size_t group) {
  if (group == 1) return 0;
  if (n + 2 < group) return group - 1 - n;
  return n + 2 - group;
}

// The backward passes' scratch (one head's ds, [t, t]; one head's
// key/value gradient), kept by the thread between calls: at Qwen2.5-0.5B's
// sizes and sequence 1024 ds is 4 MiB, which a fresh vector zeroed on the
// calling thread (and the kernel faulted in) twice a layer, while the other
// threads waited.
// Every element is written before it is read. Which = which buffer.
template <class T, int Which>
T* scratch(std::size_t elements) {
  thread_local std::vector<T> storage;
  if (storage.size() < elements) storage.resize(elements);
  return storage.data();
}
inline constexpr int score_gradients = 0, head_gradient = 1;

// Adds one head's contribution `part` to a gradient: stored as is when it
// is the first (n == 0), as the tape stores a first contribution.
template <class T>
GRAD_HD void add_head(T& total, T part, std::size_t n) {
  total = n == 0 ? part : total + part;
}

// CausalAttentionProbs' products on the gemm (numerics/gemm.hpp), a block
// of causal_block positions of one head at a time, each only as far as the
// causal mask lets any of them see: about half the square products' work
// at t = 256. What is left out is masked: scores that softmax overwrites
// with 0, and terms with a masked ds, an exact zero: the last terms of a
// row's ascending sum (ds . k) or the first of a key's (ds^T . q).
// (AttentionContext's p is any [N, G*t, t]: its products skip the masked terms only when p comes from
// CausalAttentionProbs, axis 1.) fma(+-0, x, acc) == acc for finite x and an
// accumulator that starts at +0 (it never is -0), so either way the sum
// keeps its bits.
inline constexpr std::size_t causal_block = 32;

// f(s, first, count, end) for every block: rows [first, first + count) of
// slice s are one head's positions [end - count, end). Blocks run over the
// pool when the product (`row_work` multiply-adds per row) is large. A
// block's work grows (or shrinks) with its position, so a head's blocks are
// taken alternately from its two ends: a contiguous range of them, one
// thread's share, then holds short and long blocks alike (in position
// order, one head's second half would be three times its first's work).
// Which thread computes a block changes no bit.
template <class F>
void causal_blocks(const Sizes& z, std::size_t row_work, F&& f) {
  const std::size_t per_head = (z.t + causal_block - 1) / causal_block, blocks = z.slices * z.group * per_head;
  const std::size_t grain =
      std::max<std::size_t>(1, (std::size_t{1} << 20) / std::max<std::size_t>(1, causal_block * row_work));
  parallel_ranges(blocks, grain, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t b = lo; b < hi; ++b) {
      const std::size_t head = b / per_head, q = b % per_head;
      const std::size_t p0 = (q % 2 == 0 ? q / 2 : per_head - 1 - q / 2) * causal_block;
      const std::size_t count = std::min(causal_block, z.t - p0);
      f(head / z.group, head % z.group * z.t + p0, count, p0 + count);
    }
  });
}

// Per slice, c [rows, t] = a [rows, width] . b [t, width]^T, each row's
// scores up to its block's last position (the rest is left as it was).
template <class T>
void causal_scores(const T* a, const T* b, T* c, const Sizes& z) {
  const gemm_detail::Isa isa = gemm_detail::best_isa();
  causal_blocks(z, z.t * z.width, [&](std::size_t s, std::size_t first, std::size_t count, std::size_t end) {
    const gemm_detail::Problem<T> pr{{a + s * z.rows * z.width, z.width, 1}, {b + s * z.t * z.width, 1, z.width},
                                     c + s * z.rows * z.t, z.rows, z.t, z.width};
    gemm_detail::multiply_range(isa, pr, first, first + count, 0, end);
  });
}

// Per slice, c [rows, width] = a [rows, t] . b [t, width], a lower-triangular
// per head (ds): each row's sum over the keys up to its block's end.
template <class T>
void causal_rows(const T* a, const T* b, T* c, const Sizes& z) {
  const gemm_detail::Isa isa = gemm_detail::best_isa();
  causal_blocks(z, z.t * z.width, [&](std::size_t s, std::size_t first, std::size_t count, std::size_t end) {
    const gemm_detail::Problem<T> pr{{a + s * z.rows * z.t, z.t, 1}, {b + s * z.t * z.width, z.width, 1},
                                     c + s * z.rows * z.width, z.rows, z.width, end};
    gemm_detail::multiply_range(isa, pr, first, first + count, 0, z.width);
  });
}

// c [t, width] = a_h^T . b_h for one head (a_h [t, t] lower-triangular, b_h
// [t, width]): each key's sum over the rows from its block's first position.
template <class T>
void causal_keys(const T* a, const T* b, T* c, const Sizes& z) {
  const gemm_detail::Isa isa = gemm_detail::best_isa();
  const Sizes one{1, z.t, z.t, z.width, 1};
  causal_blocks(one, z.t * z.width, [&](std::size_t, std::size_t p0, std::size_t count, std::size_t) {
    const gemm_detail::Problem<T> pr{{a + p0 * z.t, 1, z.t}, {b + p0 * z.width, z.width, 1}, c, z.t, z.width,
                                     z.t - p0};
    gemm_detail::multiply_range(isa, pr, p0, p0 + count, 0, z.width);
  });
}

// Calls f(i) for i in [0, items): one item (a head, or a key/value group)
// per part of the pool when there are at least as many items as threads, so
// each runs whole on one thread, its products serial there (heads are even
// work; the positions of one causal head are not); else one after another,
// each product spreading over the pool itself.
template <class F>
void each_head(std::size_t items, F&& f) {
  if (items >= num_threads())
    parallel_each(items, f);
  else
    for (std::size_t i = 0; i < items; ++i) f(i);
}

// A key/value gradient d [N, t, width] on the host: per slice, the group's
// heads in the tape's order, head_term(row, head) writing a head's term
// [t, width] into `head` (row: the head's first row in the node's
// [N, G*t, ...] operands), added into the slice's d as add_head adds it.
// Slices run over the pool (each_head).
template <class T, class HeadTerm>
void sum_heads(const Sizes& z, T* d, HeadTerm&& head_term) {
  each_head(z.slices, [&](std::size_t s) {
    T* const head = scratch<T, head_gradient>(z.t * z.width);  // this thread's
    T* const slice_d = d + s * z.t * z.width;
    for (std::size_t n = 0; n < z.group; ++n) {
      head_term(s * z.rows + head_in_sum_order(n, z.group) * z.t, head);
      // add_head's choice made once per head, not per element: both loops
      // then vectorise at -O2 too (which does not unswitch loops).
      const std::size_t size = z.t * z.width;
      if (n == 0)
        for (std::size_t e = 0; e < size; ++e) add_head(slice_d[e], head[e], 0);
      else
        for (std::size_t e = 0; e < size; ++e) add_head(slice_d[e], head[e], 1);
    }
  });
}

// Shape rule shared by both tags: a [N, G*t, a2], b [N, t, b2].
inline std::string grouped_dims(const Dims& a, const Dims& b, std::string_view a_name, std::string_view b_name,
                                 bool a_width_is_t, bool same_width) {
  const std::string got = ", got " + std::string(a_name) + " " + shape_string(a) + " and " + std::string(b_name) +
                          " " + shape_string(b);
  if (a.rank != 3 || b.rank != 3) return "expected rank-3 operands" + got;
  if (a[0] != b[0]) return "expected the same leading size N (batch * key/value heads)" + got;
  if (b[1] == 0 || a[1] == 0 || a[1] % b[1] != 0)
    return "expected " + std::string(a_name) + "'s rows to be a whole number G of " + std::string(b_name) +
           "'s t rows (G query heads per key/value head)" + got;
  if (a_width_is_t && a[2] != b[1]) return "expected " + std::string(a_name) + " [N, G*t, t]" + got;
  if (same_width && a[2] != b[2]) return "expected the same head width (last axis)" + got;
  return {};
}

}  // namespace attention_detail

struct CausalAttentionProbs {
  static constexpr std::string_view name = "causal_attention_probs";
  static constexpr std::string_view torch =
      "torch.softmax((a.reshape(a.shape[0], -1, b.shape[1], a.shape[2]) @ b.unsqueeze(1).transpose(-1, -2) * s)"
      ".masked_fill(torch.ones(b.shape[1], b.shape[1], dtype=torch.bool).triu(1), float('-inf')), -1)"
      ".reshape(dims)";
  static constexpr int arity = 2;
  static std::string output_dims(const Dims& a, const Dims& b, OpAttrs&, Dims& out) {
    const std::string why = attention_detail::grouped_dims(a, b, "q", "k", false, true);
    if (!why.empty()) return why + " (q [N, G*t, hd], k [N, t, hd])";
    out = Dims::of(std::array<std::size_t, 3>{a[0], a[1], b[1]});
    return {};
  }

  template <class T>
  GRAD_HD static attention_detail::Sizes sizes(const NodeArgs<T>& x) {
    const std::size_t t = x.b.dims.d[1];
    return {x.a.dims.d[0], x.a.dims.d[1], t, x.a.dims.d[2], x.a.dims.d[1] / t};
  }

  // Item w: query row w (all its probabilities).
  template <class T>
  GRAD_HD static std::size_t forward_items(const NodeArgs<T>& x) {
    return x.a.dims.d[0] * x.a.dims.d[1];
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const auto z = sizes(x);
    const std::size_t last = w % z.rows % z.t;  // the query's position: keys 0..last are seen
    const T* q = x.a.data + w * z.width;
    const T* k = x.b.data + w / z.rows * z.t * z.width;
    T* p = y + w * z.t;
    for (std::size_t j = 0; j <= last; ++j) {
      T acc = T(0);
      for (std::size_t c = 0; c < z.width; ++c) acc = fma_hd(q[c], k[j * z.width + c], acc);
      p[j] = acc * x.scalar + T(0);  // + T(0): the mask's zero
    }
    softmax_row(p, last);
    for (std::size_t j = last + 1; j < z.t; ++j) p[j] = T(0);
  }
  // Softmax's lane body over the scores p[0..last], in place.
  template <class T>
  GRAD_HD static void softmax_row(T* p, std::size_t last) {
    T hi = p[0];
    for (std::size_t j = 1; j <= last; ++j) hi = p[j] > hi ? p[j] : hi;
    T total = T(0);
    for (std::size_t j = 0; j <= last; ++j) {
      p[j] = exact_exp(p[j] - hi);
      total = total + p[j];
    }
    for (std::size_t j = 0; j <= last; ++j) p[j] = p[j] / total;
  }

  // Softmax's dot `<g, p>` of one row, ascending.
  template <class T>
  GRAD_HD static T row_dot(const T* p, const T* g, std::size_t last) {
    T dot = T(0);
    for (std::size_t j = 0; j <= last; ++j) dot = fma_hd(g[j], p[j], dot);
    return dot;
  }
  // The gradient of a scaled score: softmax's backward, then mul_scalar's.
  template <class T>
  GRAD_HD static T score_gradient(T p, T g, T dot, T scale) {
    return (p * (g - dot)) * scale;
  }

  // Backward items: In 0, query row w (hd elements); In 1, element w of k,
  // which sums over every query row of its group (the host loop below
  // shares the rows' dots instead of recomputing them per element).
  template <int In, class T>
  GRAD_HD static std::size_t backward_items(const NodeArgs<T>& x) {
    if constexpr (In == 0)
      return x.a.dims.d[0] * x.a.dims.d[1];
    else
      return x.b.dims.size();
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t w) {
    const auto z = sizes(x);
    if constexpr (In == 0) {
      const std::size_t last = w % z.rows % z.t;
      const T *p = y + w * z.t, *gr = g + w * z.t, *k = x.b.data + w / z.rows * z.t * z.width;
      T* d = dx + w * z.width;
      const T dot = row_dot(p, gr, last);
      for (std::size_t c = 0; c < z.width; ++c) d[c] = T(0);
      for (std::size_t j = 0; j <= last; ++j) {
        const T ds = score_gradient(p[j], gr[j], dot, x.scalar);
        for (std::size_t c = 0; c < z.width; ++c) d[c] = fma_hd(ds, k[j * z.width + c], d[c]);
      }
    } else {
      const std::size_t s = w / (z.t * z.width), j = w % (z.t * z.width) / z.width, c = w % z.width;
      T total = T(0);
      for (std::size_t n = 0; n < z.group; ++n) {
        const std::size_t first = s * z.rows + attention_detail::head_in_sum_order(n, z.group) * z.t;
        T acc = T(0);
        for (std::size_t i = j; i < z.t; ++i) {  // rows before position j do not see key j
          const std::size_t r = first + i;
          const T ds = score_gradient(y[r * z.t + j], g[r * z.t + j], row_dot(y + r * z.t, g + r * z.t, i), x.scalar);
          acc = fma_hd(x.a.data[r * z.width + c], ds, acc);
        }
        attention_detail::add_head(total, acc, n);
      }
      dx[w] = total;
    }
  }

  // The host loops: the same operations in the same order per element, the
  // inner products on the project's gemm (numerics/gemm.hpp: each output
  // from zero, one fma per term in ascending index). The gemm also computes
  // the masked scores, which are then overwritten, and runs the gradients
  // over the masked positions' exact-zero ds: fma(0, x, acc) == acc for
  // finite x (and an accumulator that starts at +0 stays +0), so every kept
  // element has the per-item bodies' bits. A row's scale and exps run on
  // packs, its max and sums serially, as the bodies order them (eight rows'
  // chains side by side).
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const auto z = sizes(x);
    attention_detail::causal_scores(x.a.data, x.b.data, y, z);
    parallel_ranges(z.slices * z.rows, row_grain(z.t), [&](std::size_t lo, std::size_t hi) {
      with_best_isa([&](auto width) {
        using P = pack_for<T, decltype(width)>;
        using namespace kernels_detail;
        // Rows chain_rows at a time: each row's max and sum stay serial and
        // ascending, as softmax_row orders them, but the rows' chains run
        // side by side (row_chains) instead of one latency after another.
        for (std::size_t w0 = lo; w0 < hi; w0 += chain_rows) {
          const std::size_t count = std::min(chain_rows, hi - w0);
          std::array<T, chain_rows> his{}, totals{};
          for (std::size_t i = 0; i < count; ++i) {
            T* p = y + (w0 + i) * z.t;
            for_packs<P, T>((w0 + i) % z.t + 1, [&](std::size_t j, auto v) {
              using V = decltype(v);
              store_as(load_as<V>(p + j) * V(x.scalar) + V(T(0)), p + j);  // + 0: the mask's zero
            });
            his[i] = p[0];
          }
          row_chains(w0, count, z.t, 1, his, [y](T hi_score, std::size_t at) {
            return y[at] > hi_score ? y[at] : hi_score;
          });
          for (std::size_t i = 0; i < count; ++i) {
            T* p = y + (w0 + i) * z.t;
            const T hi_score = his[i];
            for_packs<P, T>((w0 + i) % z.t + 1, [&](std::size_t j, auto v) {
              using V = decltype(v);
              store_as(exact_exp(load_as<V>(p + j) - V(hi_score)), p + j);
            });
          }
          row_chains(w0, count, z.t, 0, totals, [y](T total, std::size_t at) { return total + y[at]; });
          for (std::size_t i = 0; i < count; ++i) {
            const std::size_t last = (w0 + i) % z.t;
            T* p = y + (w0 + i) * z.t;
            const T total = totals[i];
            for_packs<P, T>(last + 1, [&](std::size_t j, auto v) {
              using V = decltype(v);
              store_as(load_as<V>(p + j) / V(total), p + j);
            });
            std::fill(p + last + 1, p + z.t, T(0));
          }
        }
      });
    });
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    using namespace attention_detail;
    const auto z = sizes(x);
    // One head's ds [t, t] at a time (4 MiB at Qwen2.5-0.5B's sequence 1024,
    // where the group's took 29), in the scratch of the thread that computes
    // the head, then its product: dq's rows for the head (ds . k), or the
    // head's term of dk (ds^T . q) summed as the tape summed the repeated k's.
    const auto head_ds = [&](std::size_t row) {
      T* const ds = scratch<T, attention_detail::score_gradients>(z.t * z.t);
      score_gradients(x, y + row * z.t, g + row * z.t, z.t, ds);
      return ds;
    };
    if constexpr (In == 0) {  // heads are independent: dq = ds . k
      const Sizes one{1, z.t, z.t, z.width, 1};
      each_head(z.slices * z.group, [&](std::size_t h) {
        causal_rows(head_ds(h * z.t), x.b.data + h / z.group * z.t * z.width, dx + h * z.t * z.width, one);
      });
    } else {
      sum_heads(z, dx, [&](std::size_t row, T* head) { causal_keys(head_ds(row), x.a.data + row * z.width, head, z); });
    }
  }

 private:
  // ds [t, t] of one head from its rows of p (y) and of their gradient (g),
  // exact zeros at the masked positions: the rows' dots eight at a time
  // (each its own ascending chain), ds on packs.
  template <class T>
  static void score_gradients(const NodeArgs<T>& x, const T* y, const T* g, std::size_t t, T* ds) {
    parallel_ranges(t, row_grain(t), [&](std::size_t lo, std::size_t hi) {
      with_best_isa([&](auto width) {
        using P = pack_for<T, decltype(width)>;
        using namespace kernels_detail;
        for (std::size_t r0 = lo; r0 < hi; r0 += chain_rows) {
          std::array<T, chain_rows> dots{};  // row_dot's: from zero, one fma per term
          row_chains(r0, std::min(chain_rows, hi - r0), t, 0, dots,
                     [y, g](T dot, std::size_t at) { return fma_hd(g[at], y[at], dot); });
          for (std::size_t r = r0; r < std::min(r0 + chain_rows, hi); ++r) {
            const T *p = y + r * t, *gr = g + r * t;
            const T dot = dots[r - r0];
            T* d = ds + r * t;
            for_packs<P, T>(r + 1, [&](std::size_t i, auto v) {  // score_gradient's operations
              using V = decltype(v);
              store_as((load_as<V>(p + i) * (load_as<V>(gr + i) - V(dot))) * V(x.scalar), d + i);
            });
            std::fill(d + r + 1, d + t, T(0));
          }
        }
      });
    });
  }
  // Serial chains of `count` (at most chain_rows) consecutive rows from r0
  // of a [rows, t] block whose row r sees positions 0..r % t: acc[i] =
  // step(acc[i], at) for at = (r0 + i) * t + j, j from `from` up to the
  // row's last, ascending. The rows' common prefix runs interleaved (while
  // all chain_rows run: independent chains, the same operations in the same
  // order, without waiting on one latency at a time), then each row's rest.
  static constexpr std::size_t chain_rows = 8;
  template <class T, class Step>
  GRAD_INLINE static void row_chains(std::size_t r0, std::size_t count, std::size_t t, std::size_t from,
                                     std::array<T, chain_rows>& acc, Step step) {
    std::size_t common = from;
    if (count == chain_rows) {
      std::size_t shortest = t;
      for (std::size_t i = 0; i < count; ++i) shortest = std::min(shortest, (r0 + i) % t + 1);
      for (std::size_t j = from; j < shortest; ++j) {
        GRAD_GEMM_UNROLL
        for (std::size_t i = 0; i < chain_rows; ++i) acc[i] = step(acc[i], (r0 + i) * t + j);
      }
      common = std::max(shortest, from);
    }
    for (std::size_t i = 0; i < count; ++i)
      for (std::size_t j = common, last = (r0 + i) % t; j <= last; ++j) acc[i] = step(acc[i], (r0 + i) * t + j);
  }
};

struct AttentionContext {
  static constexpr std::string_view name = "attention_context";
  static constexpr std::string_view torch =
      "(a.reshape(a.shape[0], -1, b.shape[1], b.shape[1]) @ b.unsqueeze(1)).reshape(dims)";
  static constexpr int arity = 2;
  static std::string output_dims(const Dims& a, const Dims& b, OpAttrs& at, Dims& out) {
    if (at.axis != 0 && at.axis != 1)
      return "axis " + std::to_string(at.axis) + ": expected 0 (any p) or 1 (p from causal_attention_probs)";
    const std::string why = attention_detail::grouped_dims(a, b, "p", "v", true, false);
    if (!why.empty()) return why + " (p [N, G*t, t], v [N, t, hd])";
    out = Dims::of(std::array<std::size_t, 3>{a[0], a[1], b[2]});
    return {};
  }

  template <class T>
  GRAD_HD static attention_detail::Sizes sizes(const NodeArgs<T>& x) {
    const std::size_t t = x.b.dims.d[1];
    return {x.a.dims.d[0], x.a.dims.d[1], t, x.b.dims.d[2], x.a.dims.d[1] / t};
  }

  // Output element w: bmm's inner product over all t positions, ascending
  // (a masked probability is an exact 0, its fma changes nothing, and bmm
  // did it too).
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const auto z = sizes(x);
    const std::size_t row = w / z.width, c = w % z.width;
    const T* p = x.a.data + row * z.t;
    const T* v = x.b.data + row / z.rows * z.t * z.width + c;
    T acc = T(0);
    for (std::size_t j = 0; j < z.t; ++j) acc = fma_hd(p[j], v[j * z.width], acc);
    y[w] = acc;
  }
  // In 0: element w of p, bmm's dA; In 1: element w of v, each head's bmm
  // dB summed over the group in the repeat's order.
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const auto z = sizes(x);
    if constexpr (In == 0) {
      const std::size_t row = w / z.t, j = w % z.t;
      const T* G = g + row * z.width;
      const T* v = x.b.data + row / z.rows * z.t * z.width + j * z.width;
      T acc = T(0);
      for (std::size_t c = 0; c < z.width; ++c) acc = fma_hd(G[c], v[c], acc);
      dx[w] = acc;
    } else {
      const std::size_t s = w / (z.t * z.width), j = w % (z.t * z.width) / z.width, c = w % z.width;
      T total = T(0);
      for (std::size_t n = 0; n < z.group; ++n) {
        const std::size_t first = s * z.rows + attention_detail::head_in_sum_order(n, z.group) * z.t;
        T acc = T(0);
        for (std::size_t i = 0; i < z.t; ++i)
          acc = fma_hd(x.a.data[(first + i) * z.t + j], g[(first + i) * z.width + c], acc);
        attention_detail::add_head(total, acc, n);
      }
      dx[w] = total;
    }
  }

  // The host loops: the same inner products on the project's gemm (each
  // output from zero, one fma per term in ascending index: the bodies' bits;
  // with a causal p, without the masked terms: the same bits for finite v
  // and g, see causal_block).
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const auto z = sizes(x);
    if (x.axis == 1) return attention_detail::causal_rows(x.a.data, x.b.data, y, z);
    for (std::size_t s = 0; s < z.slices; ++s)
      gemm_nn(x.a.data + s * z.rows * z.t, x.b.data + s * z.t * z.width, y + s * z.rows * z.width, z.rows, z.t,
              z.width);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const auto z = sizes(x);
    if constexpr (In == 0) {  // dp = g . v^T
      for (std::size_t s = 0; s < z.slices; ++s)
        gemm_nt(g + s * z.rows * z.width, x.b.data + s * z.t * z.width, dx + s * z.rows * z.t, z.rows, z.width, z.t);
    } else {  // dv = per head p^T . g, then the heads in the tape's order
      attention_detail::sum_heads(z, dx, [&](std::size_t row, T* head) {
        const T *p = x.a.data + row * z.t, *gh = g + row * z.width;
        if (x.axis == 1)
          attention_detail::causal_keys(p, gh, head, z);
        else
          gemm_tn(p, gh, head, z.t, z.t, z.width);
      });
    }
  }
};

}  // namespace grad
