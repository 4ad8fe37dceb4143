// operator<< for tensors and tape views, abbreviated as torch prints them:
//
//   tensor([[ 0.1000, -0.2000,  0.3000],
//           [ 0.4000, -0.5000,  0.6000]], shape=[2, 3], dtype=float64)
//
// Values are printed with 4 decimals (or in scientific notation when some
// magnitude is >= 1e4 or a nonzero one < 1e-4), right-aligned to a common
// width. A tensor of more than 1,000 elements shows the first and last 3
// entries of every axis with "..." between them (torch's threshold and
// edgeitems). An empty view prints "tensor([], shape=[], dtype=...)" (an
// invalid or dropped Var reads as empty).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "grad/tape.hpp"
#include "grad/tensor.hpp"

namespace grad {

namespace print_detail {

inline constexpr std::size_t threshold = 1000, edge = 3;

template <class T>
void print(std::ostream& os, std::span<const std::size_t> shape, std::span<const T> data) {
  const char* dtype = std::is_same_v<T, double> ? "float64" : "float32";
  if (data.empty() || shape.empty()) {
    os << "tensor([], shape=" << shape_string(shape) << ", dtype=" << dtype << ")";
    return;
  }
  const bool abbreviate = data.size() > threshold;
  // Which indices of an axis are shown: all, or the first and last `edge`.
  auto shown = [&](std::size_t n, std::size_t i) { return !abbreviate || n <= 2 * edge || i < edge || i >= n - edge; };
  bool scientific = false;
  for (T v : data)
    if (std::isfinite(v) && (std::fabs(v) >= T(1e4) || (v != T(0) && std::fabs(v) < T(1e-4)))) scientific = true;
  auto format = [&](T v) {
    char buf[48];
    std::snprintf(buf, sizeof buf, scientific ? "%.4e" : "%.4f", static_cast<double>(v));
    return std::string(buf);
  };
  std::size_t width = 0;
  for (T v : data) width = std::max(width, format(v).size());
  std::vector<std::size_t> stride(shape.size(), 1);
  for (std::size_t a = shape.size() - 1; a-- > 0;) stride[a] = stride[a + 1] * shape[a + 1];
  const std::string indent_base = "tensor(";
  // Recursive over axes; `offset` is the flat index of the sub-tensor's first element.
  auto rec = [&](auto& self, std::size_t axis, std::size_t offset) -> void {
    os << '[';
    const std::size_t n = shape[axis];
    bool skipped = false;
    for (std::size_t i = 0; i < n; ++i) {
      if (!shown(n, i)) {
        if (!skipped) {
          os << (axis + 1 == shape.size() ? "..., " : "...,\n" + std::string(indent_base.size() + axis + 1, ' '));
          skipped = true;
        }
        continue;
      }
      if (axis + 1 == shape.size()) {
        const std::string s = format(data[offset + i]);
        os << std::string(width - s.size(), ' ') << s;
      } else {
        self(self, axis + 1, offset + i * stride[axis]);
      }
      if (i + 1 < n) {
        if (axis + 1 == shape.size())
          os << ", ";
        else
          os << ",\n" << std::string(shape.size() - axis - 2, '\n') << std::string(indent_base.size() + axis + 1, ' ');
      }
    }
    os << ']';
  };
  os << indent_base;
  rec(rec, 0, 0);
  os << ", shape=" << shape_string(shape) << ", dtype=" << dtype << ")";
}

}  // namespace print_detail

template <class T>
std::ostream& operator<<(std::ostream& os, const Tensor<T>& t) {
  print_detail::print<T>(os, std::span<const std::size_t>(t.shape()), t.data());
  return os;
}
template <class T>
std::ostream& operator<<(std::ostream& os, const View<T>& v) {
  print_detail::print<T>(os, v.shape, v.data);
  return os;
}

}  // namespace grad
