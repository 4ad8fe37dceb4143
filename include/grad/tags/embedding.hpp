// embedding(table, ids): rows of a [vocab, d] table gathered by integer token
// ids. Operand a is the table, operand b the ids: a constant whose values are
// exact integers held in T (so every id below 2^24 is exact in float, below
// 2^53 in double), any shape; the output is ids' shape with d appended.
//
// Backward (to the table): element (v, c) of the table's gradient is the sum,
// from zero, of g at (p, c) over the positions p holding id v, in ascending
// p. An item is one table row (the gather form: it walks every position);
// the host loop is the scatter form (zero the gradient, then add each
// position's row in ascending p), which gives every element the same terms in
// the same order: the same bits on every backend. The ids get no gradient
// (they are a constant; backward_item<1> writes zeros should anyone ask).
//
// The recorder (grad::embedding in record.hpp) checks each id's value when it
// records; an id that a device program's set_input made invalid later gives a
// NaN row rather than a read out of bounds.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

#include "grad/numerics/held.hpp"
#include "grad/tags/family.hpp"

namespace grad {

struct Embedding {
  static constexpr std::string_view name = "embedding";
  static constexpr std::string_view torch = "torch.nn.functional.embedding(b.long(), a)";
  static constexpr int arity = 2;
  // The table may be a 16-bit constant (a frozen base's embedding): its
  // rows are widened, exactly, as they are gathered.
  static constexpr std::array<bool, 2> reads_narrow{true, false};

  // The shape rule (family.hpp): ids' shape with d appended.
  static std::string output_dims(const Dims& table, const Dims& ids, OpAttrs&, Dims& out) {
    if (table.rank != 2 || table[0] == 0 || table[1] == 0)
      return "table " + shape_string(table) + ": expected [vocab, d]";
    if (ids.rank + 1 > max_rank)
      return "ids " + shape_string(ids) + " have rank " + std::to_string(ids.rank) + "; at most " +
             std::to_string(max_rank - 1) + " (the output appends d)";
    out = ids;
    out.d[out.rank++] = table[1];
    return "";
  }

  // The value rule, checked when recorded (record.hpp): every id an exact
  // integer in [0, vocab); "" or the first offender, by position. T's
  // integers are exact up to 2^(digits): a larger vocabulary is refused.
  template <class T>
  static std::string check_ids(const T* ids, std::size_t n, std::size_t vocab) {
    constexpr double exact = static_cast<double>(std::uint64_t{1} << std::numeric_limits<T>::digits);
    if (static_cast<double>(vocab) > exact)
      return "a vocabulary of " + std::to_string(vocab) +
             " ids cannot be held exactly in this element type (at most 2^" +
             std::to_string(std::numeric_limits<T>::digits) + ")";
    for (std::size_t p = 0; p < n; ++p) {
      const T id = ids[p];
      if (!(id >= T(0) && id < static_cast<T>(vocab) && static_cast<T>(static_cast<std::uint64_t>(id)) == id))
        return "id " + number(id) + " at position " + std::to_string(p) +
               " is out of range: expected an integer in [0, " + std::to_string(vocab) + ")";
    }
    return "";
  }

  template <class T>
  static std::string number(T v) {
    if (v == v && v > T(-1e15) && v < T(1e15) && static_cast<T>(static_cast<long long>(v)) == v)
      return std::to_string(static_cast<long long>(v));
    return std::to_string(static_cast<double>(v));
  }

  // The table row an id names, or vocab for an invalid one.
  template <class T>
  GRAD_HD static std::size_t row_of(T id, std::size_t vocab) {
    if (!(id >= T(0) && id < static_cast<T>(vocab))) return vocab;
    const std::size_t v = static_cast<std::size_t>(id);
    return static_cast<T>(v) == id ? v : vocab;
  }

  // ---- per-item bodies ----
  // Forward: item w is one output element.
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const std::size_t vocab = x.a.dims.d[0], d = x.a.dims.d[1];
    const std::size_t v = row_of(x.b.data[w / d], vocab);
    y[w] = v < vocab ? x.a.data[v * d + w % d] : quiet_nan<T>();
  }
  template <class T>
  GRAD_HD static T quiet_nan() {
    return std::numeric_limits<T>::quiet_NaN();
  }

  // Backward to the table: item w is table row w; backward to the ids: one
  // element each, zero.
  template <int In, class T>
  GRAD_HD static std::size_t backward_items(const NodeArgs<T>& x) {
    return In == 0 ? x.a.dims.d[0] : x.b.dims.size();
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    if constexpr (In == 0) {
      const std::size_t vocab = x.a.dims.d[0], d = x.a.dims.d[1], n = x.b.dims.size();
      T* row = dx + w * d;
      for (std::size_t c = 0; c < d; ++c) row[c] = T(0);
      for (std::size_t p = 0; p < n; ++p)
        if (row_of(x.b.data[p], vocab) == w)
          for (std::size_t c = 0; c < d; ++c) row[c] = row[c] + g[p * d + c];
    } else {
      dx[w] = T(0);
    }
  }

  // ---- host loops: the same bits, faster ----
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const std::size_t vocab = x.a.dims[0], d = x.a.dims[1], n = x.b.dims.size();
    for (std::size_t p = 0; p < n; ++p) {
      const std::size_t v = row_of(x.b.data[p], vocab);
      if (v < vocab && narrow(x.a.storage) && !x.a.transposed)
        read_held(x.a.storage, x.a.data, vocab, d, v * d, d, y + p * d);
      else if (v < vocab && narrow(x.a.storage))  // a table held transposed: row v is its memory's column v
        for (std::size_t c = 0; c < d; ++c)
          y[p * d + c] = held_value<T>(x.a.storage, x.a.data, d, vocab, c * vocab + v);
      else if (v < vocab)
        std::memcpy(y + p * d, x.a.data + v * d, d * sizeof(T));
      else
        for (std::size_t c = 0; c < d; ++c) y[p * d + c] = quiet_nan<T>();
    }
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    if constexpr (In == 0) {
      // The scatter form: each table element starts from zero and adds its
      // positions' terms in ascending position, as the gather-form item does.
      const std::size_t vocab = x.a.dims[0], d = x.a.dims[1], n = x.b.dims.size();
      for (std::size_t i = 0; i < vocab * d; ++i) dx[i] = T(0);
      for (std::size_t p = 0; p < n; ++p) {
        const std::size_t v = row_of(x.b.data[p], vocab);
        if (v >= vocab) continue;
        T* __restrict row = dx + v * d;
        const T* __restrict gp = g + p * d;
        for (std::size_t c = 0; c < d; ++c) row[c] = row[c] + gp[c];
      }
    } else {
      for (std::size_t i = 0, n = x.b.dims.size(); i < n; ++i) dx[i] = T(0);
    }
  }
};

}  // namespace grad
