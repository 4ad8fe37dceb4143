// linear_cross_entropy(h, W, ids, ignore): cross_entropy(h . W^T, ids,
// ignore) (or h . W with W stored [d, classes]) as one node that never holds
// the [rows, classes] logits: a language model's loss without its largest
// tensors (Qwen2.5-0.5B at 512 positions: 311 MB of logits and 311 MB of
// their gradient on the tape). The output is [1].
//
// Operands: a = h [rows, d]; b = W, read in place: [classes, d] (axis 0,
// matmul_nt's layout, a tied embedding) or [d, classes] (axis 1, matmul's, an
// untied head). A node has two operands, so the class ids live on the tape's
// index pool (`extra`, which slice's starts use): one entry per row, its
// class in [0, classes), or `classes` itself for a row whose id was the
// ignore id (it adds nothing and is not counted). The ids are read and
// checked when the node is recorded (record.hpp), as slice's starts are: an
// episode captured for a device keeps them. The scalar is unused.
//
// The bits are cross_entropy(matmul_nt(h, W), ids, ignore)'s (or matmul's),
// in the loss and in both gradients:
//   - every logit is the same inner product (from zero, ascending p, one fma
//     per term), whichever rows the gemm computes it with (gemm.hpp), and a
//     row's loss and its gradient read that row alone (CrossEntropy's row
//     bodies, called here);
//   - the rows' losses are summed in ascending row, chunk after chunk;
//   - dh's rows are independent; dW's elements each sum over rows in
//     ascending order, so the chunks continue each element's chain of fmas
//     (gemm_tn_continue): the one-pass gemm's bits.
// The host loops compute the logits a chunk of rows at a time into a scratch
// buffer (chunk_rows; the tape's idle recompute scope memory when it lends
// enough, NodeArgs::scratch) and turn them into their gradient in place. Nothing but
// the loss (and dh, below) outlives the forward pass, so dW recomputes them.
// For a frozen W (LoRA's tied embedding) that is the logits once in all;
// when W is trained as well, twice.
//
// dh in the forward pass. When h needs a gradient (training), the recording
// function asks for the node's second form (axis bit 1, keeps_dh): its output
// is [1 + rows * d], the loss and then dh for an upstream gradient of 1, and
// it returns slice(node, 0, 1). The forward pass turns each chunk's logits
// into their gradient right after their losses and multiplies by W, so
// backward, when its upstream gradient is exactly 1 (the loss is the root, as
// in every plain training step), copies dh instead of computing the logits a
// second time: two passes over W for a frozen W instead of three. Same bits:
// the scale g / count is 1 / count either way. Any other upstream gradient
// (a loss scaled for accumulation) takes the recomputing path.
//
// The per-item bodies (device engine) recompute every logit they need from h
// and W: correct and slow (a row's statistics per gradient element), meant
// for small graphs. Emitted code cannot hold one id per row (it keeps one
// extra per axis): emit refuses this op (keeps_row_ids).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "grad/numerics/gemm.hpp"
#include "grad/tags/cross_entropy.hpp"

namespace grad {

struct LinearCrossEntropy {
  static constexpr std::string_view name = "linear_cross_entropy";
  // extra: one class per row, `classes` for an ignored row (torch's ignore_index).
  // (axis >= 2, the form that keeps dh: the loss, then its gradient with respect to a)
  static constexpr std::string_view torch =
      "(lambda ce, l: torch.cat([ce(l).reshape(1), torch.autograd.grad(ce(l), a, create_graph=True)[0].reshape(-1)])"
      " if axis >= 2 else ce(l).reshape(1))("
      "lambda l: torch.nn.functional.cross_entropy(l, torch.tensor(extra), ignore_index=l.shape[1]), "
      "a @ b.transpose(-1, -2) if axis % 2 == 0 else a @ b)";
  static constexpr int arity = 2;
  // W may be a 16-bit constant (a frozen base's tied embedding): every
  // product reads it as the gemm's b, widened exactly while packed.
  static constexpr std::array<bool, 2> reads_narrow{false, true};
  static constexpr bool keeps_sizes = true;    // the rows' classes (OpAttrs::sizes), on the tape's index pool
  static constexpr bool keeps_row_ids = true;  // one extra per row of a, not one per axis

  // The shape rule (family.hpp): a single element, or 1 + rows * d in the
  // form that keeps dh. at.axis: bit 0 W's layout, bit 1 the form; at.sizes
  // holds one class per row (checked by the recording function).
  static constexpr std::uint32_t columns_bit = 1, keeps_dh_bit = 2;
  template <class T>
  GRAD_HD static bool stored_nt(const NodeArgs<T>& x) {
    return (x.axis & columns_bit) == 0;
  }
  template <class T>
  GRAD_HD static bool keeps_dh(const NodeArgs<T>& x) {
    return (x.axis & keeps_dh_bit) != 0;
  }

  static std::string output_dims(const Dims& h, const Dims& w, OpAttrs& at, Dims& out) {
    if (at.axis < 0 || at.axis > 3)
      return "axis " + std::to_string(at.axis) +
             ": expected 0 (W [classes, d]) or 1 (W [d, classes]), plus 2 for the form that keeps dh";
    const bool nt = (at.axis & columns_bit) == 0;
    if (h.rank != 2) return "h " + shape_string(h) + ": expected [rows, d]";
    const std::string want = nt ? "[classes, " + std::to_string(h[1]) + "] (stored [out, in], as matmul_nt takes it)"
                                : "[" + std::to_string(h[1]) + ", classes] (as matmul takes it)";
    if (w.rank != 2 || w[nt ? 1 : 0] != h[1] || w[nt ? 0 : 1] == 0)
      return "h " + shape_string(h) + " and W " + shape_string(w) + ": expected W " + want;
    if (at.sizes.size() != h[0])
      return "h " + shape_string(h) + " and " + std::to_string(at.sizes.size()) + " ids: expected ids [" +
             std::to_string(h[0]) + "] (one class id per row)";
    const bool with_dh = (at.axis & keeps_dh_bit) != 0;
    out = Dims::of(std::array<std::size_t, 1>{1 + (with_dh ? h[0] * h[1] : 0)});
    return "";
  }

  struct Sizes {
    std::size_t rows, d, classes;
  };
  template <class T>
  GRAD_HD static Sizes sizes(const NodeArgs<T>& x) {
    return {x.a.dims.d[0], x.a.dims.d[1], x.b.dims.d[stored_nt(x) ? 0 : 1]};
  }
  // Row r's class, or `classes` for an ignored row.
  template <class T>
  GRAD_HD static std::size_t class_of(const NodeArgs<T>& x, std::size_t r) {
    return x.extra[r];
  }
  template <class T>
  GRAD_HD static std::size_t counted(const NodeArgs<T>& x) {
    const auto [rows, d, classes] = sizes(x);
    std::size_t n = 0;
    for (std::size_t r = 0; r < rows; ++r) n += class_of(x, r) != classes;
    return n;
  }

  // ---- per-item bodies: every logit recomputed where it is needed ----

  // W's element (class j, feature p) in either layout.
  template <class T>
  GRAD_HD static T weight(const NodeArgs<T>& x, std::size_t j, std::size_t p) {
    const auto [rows, d, classes] = sizes(x);
    return stored_nt(x) ? x.b.data[j * d + p] : x.b.data[p * classes + j];
  }
  // Logit (r, j): matmul_nt's (matmul's) inner product, term for term.
  template <class T>
  GRAD_HD static T logit(const NodeArgs<T>& x, std::size_t r, std::size_t j) {
    const std::size_t d = x.a.dims.d[1];
    const T* hr = x.a.data + r * d;
    T acc = T(0);
    for (std::size_t p = 0; p < d; ++p) acc = fma_hd(hr[p], weight(x, j, p), acc);
    return acc;
  }
  // Row r's maximum and exp-sum: CrossEntropy::row_stats on logits computed one by one.
  template <class T>
  GRAD_HD static CrossEntropy::RowStats<T> row_stats(const NodeArgs<T>& x, std::size_t r) {
    const std::size_t classes = sizes(x).classes;
    T hi = logit(x, r, 0);
    for (std::size_t j = 1; j < classes; ++j) {
      const T v = logit(x, r, j);
      hi = v > hi ? v : hi;
    }
    T total = T(0);
    for (std::size_t j = 0; j < classes; ++j) total = total + exact_exp(logit(x, r, j) - hi);
    return {hi, total};
  }
  // The gradient of logit (r, j) given its row's stats and the scale
  // g / count: CrossEntropy::backward_row's element; 0 in an ignored row.
  template <class T>
  GRAD_HD static T dlogit(const NodeArgs<T>& x, std::size_t r, std::size_t j, const CrossEntropy::RowStats<T>& s,
                          T scale) {
    const std::size_t t = class_of(x, r);
    if (t == sizes(x).classes) return T(0);
    const T p = exact_exp(logit(x, r, j) - s.hi) / s.total;
    return (j == t ? p - T(1) : p) * scale;
  }

  // Element (r, p) of dh at scale g / count: matmul_nt's (matmul's) dA body
  // with the logits' gradient computed in place of reading it (ascending j).
  template <class T>
  GRAD_HD static T dh_item(const NodeArgs<T>& x, T scale, std::size_t w) {
    const auto [rows, d, classes] = sizes(x);
    const std::size_t r = w / d, p = w % d;
    const CrossEntropy::RowStats<T> s = class_of(x, r) == classes ? CrossEntropy::RowStats<T>{} : row_stats(x, r);
    T acc = T(0);
    for (std::size_t j = 0; j < classes; ++j) acc = fma_hd(dlogit(x, r, j, s, scale), weight(x, j, p), acc);
    return acc;
  }
  // g / count: the logits' gradient scale for an upstream gradient g (0 when every row is ignored).
  template <class T>
  GRAD_HD static T grad_scale(const NodeArgs<T>& x, T g) {
    const std::size_t count = counted(x);
    return count == 0 ? T(0) : g / static_cast<T>(count);
  }

  template <class T>
  GRAD_HD static std::size_t forward_items(const NodeArgs<T>& x) {
    return keeps_dh(x) ? 1 + x.a.dims.d[0] * x.a.dims.d[1] : 1;
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    if (w > 0) {  // the kept dh's element w - 1
      y[w] = dh_item(x, grad_scale(x, T(1)), w - 1);
      return;
    }
    const auto [rows, d, classes] = sizes(x);
    T total = T(0);
    std::size_t count = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t t = class_of(x, r);
      if (t == classes) continue;
      const CrossEntropy::RowStats<T> s = row_stats(x, r);
      total = total + (exact_log(s.total) - (logit(x, r, t) - s.hi));
      ++count;
    }
    y[0] = count == 0 ? T(0) : total / static_cast<T>(count);
  }

  // Item w of dh (r, p) sums over classes in ascending j; of dW (its element
  // in W's layout) over rows in ascending r: matmul_nt's (matmul's) bodies
  // with the logits' gradient computed in place of reading it.
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t w) {
    const auto [rows, d, classes] = sizes(x);
    if constexpr (In == 0) {
      dx[w] = keeps_dh(x) && g[0] == T(1) ? y[1 + w] : dh_item(x, grad_scale(x, g[0]), w);
    } else {
      const T scale = grad_scale(x, g[0]);
      T acc = T(0);
      const bool nt = stored_nt(x);
      const std::size_t j = nt ? w / d : w % classes, p = nt ? w % d : w / classes;
      for (std::size_t r = 0; r < rows; ++r) {
        const CrossEntropy::RowStats<T> s = class_of(x, r) == classes ? CrossEntropy::RowStats<T>{} : row_stats(x, r);
        acc = fma_hd(x.a.data[r * d + p], dlogit(x, r, j, s, scale), acc);
      }
      dx[w] = acc;
    }
  }

  // ---- host loops: the logits a chunk of rows at a time ----

  // Rows per chunk: at most 128, and at most 64 MiB of logits (one row when
  // a row alone is more). Every gemm call packs the whole of W again (545 MB
  // at Qwen2.5-0.5B), which costs about what 27 rows of the product do.
  // Measured there (bench_nn, f32, 512 rows, W frozen, one thread, CPU
  // time): 27-row chunks took 4.4x the unfused loss's forward + backward,
  // 110-row chunks (Qwen's vocabulary in f32) 2.0x (three gemms for two,
  // plus the packing), for 64 MiB of scratch in place of 622 MB on the tape.
  template <class T>
  static std::size_t chunk_rows(std::size_t classes) {
    constexpr std::size_t most_rows = 128, most_bytes = std::size_t{64} << 20;
    return std::clamp<std::size_t>(most_bytes / (classes * sizeof(T)), 1, most_rows);
  }
  // The logits of rows [r0, r0 + m) into `logits` [m, classes].
  template <class T>
  static void chunk_logits(const NodeArgs<T>& x, std::size_t r0, std::size_t m, T* logits) {
    const auto [rows, d, classes] = sizes(x);
    if (stored_nt(x))
      gemm_nt(x.a.data + r0 * d, x.b.data, logits, m, d, classes, x.b.storage, x.b.transposed);
    else
      gemm_nn(x.a.data + r0 * d, x.b.data, logits, m, d, classes, x.b.storage, x.b.transposed);
  }
  // Calls chunk(r0, m, logits) over the rows in ascending chunks, the
  // chunk's logits computed: in the scratch the tape lends when it is large
  // enough (an idle recompute scope's memory), else in a buffer of its own.
  // The chunks are as large as the lent scratch holds when that is more
  // than chunk_rows (fewer chunks, fewer passes over W: at Qwen2.5-0.5B's
  // sequence 512, three instead of five), and of even size.
  template <class T, class Chunk>
  static void each_chunk(const NodeArgs<T>& x, Chunk&& chunk) {
    const auto [rows, d, classes] = sizes(x);
    if (rows == 0) return;
    const std::size_t most = std::max(chunk_rows<T>(classes), x.scratch_size / std::max<std::size_t>(1, classes));
    const std::size_t chunks = (rows + most - 1) / most, step = (rows + chunks - 1) / chunks;
    std::vector<T> own;
    T* logits = x.scratch;
    if (x.scratch_size < step * classes) {
      own.resize(step * classes);
      logits = own.data();
    }
    for (std::size_t r0 = 0; r0 < rows; r0 += step) {
      const std::size_t m = std::min(step, rows - r0);
      chunk_logits(x, r0, m, logits);
      chunk(r0, m, logits);
    }
  }

  // Row r's logits (at `row`) become their gradient at `scale` (g / count)
  // in place (CrossEntropy's bodies); an ignored row's are zeros. Returns
  // the row's loss (row_loss_packs' bits; 0 for an ignored row).
  template <class P, class T>
  static T row_dlogits(const NodeArgs<T>& x, std::size_t r, T* row, T scale) {
    const std::size_t classes = sizes(x).classes, t = class_of(x, r);
    if (t == classes) {
      std::fill(row, row + classes, T(0));
      return T(0);
    }
    return CrossEntropy::counted_row_packs<P>(row, row, classes, t, scale);
  }
  // The chunk's logits become their gradient, row by row (row_dlogits).
  template <class T>
  static void chunk_dlogits(const NodeArgs<T>& x, std::size_t r0, std::size_t m, T* dlogits, T scale) {
    const std::size_t classes = sizes(x).classes;
    parallel_ranges(m, row_grain(classes), [&](std::size_t lo, std::size_t hi) {
      with_best_isa([&](auto width) {
        for (std::size_t i = lo; i < hi; ++i)
          row_dlogits<pack_for<T, decltype(width)>>(x, r0 + i, dlogits + i * classes, scale);
      });
    });
  }
  // dh's rows [r0, r0 + m) from the chunk's logit gradient: matmul_nt's dA (matmul's).
  template <class T>
  static void chunk_dh(const NodeArgs<T>& x, std::size_t r0, std::size_t m, const T* dlogits, T* dh) {
    const auto [rows, d, classes] = sizes(x);
    if (stored_nt(x))
      gemm_nn(dlogits, x.b.data, dh + r0 * d, m, classes, d, x.b.storage, x.b.transposed);
    else
      gemm_nt(dlogits, x.b.data, dh + r0 * d, m, classes, d, x.b.storage, x.b.transposed);
  }

  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const std::size_t classes = sizes(x).classes;
    const bool with_dh = keeps_dh(x);
    const std::size_t count = counted(x);
    const T scale = grad_scale(x, T(1));  // dh's: an upstream gradient of 1
    T total = T(0);
    std::vector<T> losses;
    each_chunk(x, [&](std::size_t r0, std::size_t m, T* logits) {
      // The rows' losses side by side over the pool, then summed in ascending
      // row. With dh, each row's loss and its logits' gradient in one visit
      // (counted_row_packs returns row_loss_packs' bits): the row is read
      // from memory once, not once for the loss and again for the gradient.
      losses.assign(m, T(0));
      parallel_ranges(m, row_grain(classes), [&](std::size_t lo, std::size_t hi) {
        with_best_isa([&](auto width) {
          using P = pack_for<T, decltype(width)>;
          for (std::size_t i = lo; i < hi; ++i) {
            T* row = logits + i * classes;
            if (with_dh) {
              losses[i] = row_dlogits<P>(x, r0 + i, row, scale);
            } else if (const std::size_t t = class_of(x, r0 + i); t != classes) {
              losses[i] = CrossEntropy::row_loss_packs<P>(row, classes, t);
            }
          }
        });
      });
      for (std::size_t i = 0; i < m; ++i)
        if (class_of(x, r0 + i) != classes) total = total + losses[i];
      if (with_dh) chunk_dh(x, r0, m, logits, y + 1);
    });
    y[0] = count == 0 ? T(0) : total / static_cast<T>(count);
  }

  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    const auto [rows, d, classes] = sizes(x);
    if constexpr (In == 0) {
      if (keeps_dh(x) && g[0] == T(1)) {  // the forward pass's dh, at this very scale
        std::copy(y + 1, y + 1 + rows * d, dx);
        return;
      }
    }
    if (In == 1 && rows == 0) std::fill(dx, dx + classes * d, T(0));  // the empty sums
    const T scale = grad_scale(x, g[0]);
    each_chunk(x, [&](std::size_t r0, std::size_t m, T* dlogits) {
      chunk_dlogits(x, r0, m, dlogits, scale);
      if constexpr (In == 0) {
        chunk_dh(x, r0, m, dlogits, dx);
      } else {  // dW's sums over rows, continued chunk after chunk
        const bool first = r0 == 0;
        if (stored_nt(x))
          (first ? gemm_tn<T> : gemm_tn_continue<T>)(dlogits, x.a.data + r0 * d, dx, m, classes, d);
        else
          (first ? gemm_tn<T> : gemm_tn_continue<T>)(x.a.data + r0 * d, dlogits, dx, m, d, classes);
      }
    });
  }
};

}  // namespace grad
