// Tensor<T>: an owning, row-major, contiguous array; Dims: the same shape as
// plain data (what tape nodes and kernels carry); numpy broadcasting rules.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "grad/config.hpp"

namespace grad {

using Shape = std::vector<std::size_t>;

// The largest element count any shape may have: its bytes (at 8 per element,
// rounded up to a cache line by the arena) must fit a signed size, which is
// what std::vector and every allocator can address.
inline constexpr std::size_t max_elements =
    static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()) / sizeof(double) - 64;

// The element count of a shape, or nullopt when it exceeds max_elements (every
// multiplication is checked, so a count that would wrap around is caught).
inline std::optional<std::size_t> checked_element_count(std::span<const std::size_t> shape) {
  std::size_t n = 1;
  bool overflow = false, empty = false;
  for (std::size_t d : shape) {
    overflow |= __builtin_mul_overflow(n, d, &n);
    empty |= d == 0;
  }
  if (empty) return 0;  // whatever the other axes: a wrapped product could also read 0
  if (overflow || n > max_elements) return std::nullopt;
  return n;
}

// The element count of a shape that is known to be valid (a Tensor's, a node's).
inline std::size_t element_count(std::span<const std::size_t> shape) {
  std::size_t n = 1;
  for (std::size_t d : shape) n *= d;
  return n;
}

// "[2, 3]": how every error message prints a shape.
inline std::string shape_string(std::span<const std::size_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// A shape of at most max_rank axes, stored inline (trivially copyable).
struct Dims {
  std::array<std::size_t, max_rank> d{};
  std::size_t rank = 0;

  GRAD_HD std::size_t operator[](std::size_t i) const { return d[i]; }
  GRAD_HD std::size_t size() const {
    std::size_t n = 1;
    for (std::size_t i = 0; i < rank; ++i) n *= d[i];
    return n;
  }
  GRAD_HD std::size_t back(std::size_t i = 0) const { return d[rank - 1 - i]; }
  std::span<const std::size_t> span() const { return {d.data(), rank}; }
  Shape shape() const { return Shape(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(rank)); }
  GRAD_HD friend bool operator==(const Dims& x, const Dims& y) {
    if (x.rank != y.rank) return false;
    for (std::size_t i = 0; i < x.rank; ++i)
      if (x.d[i] != y.d[i]) return false;
    return true;
  }
  static Dims of(std::span<const std::size_t> s) {
    Dims r;
    r.rank = s.size();
    std::copy(s.begin(), s.end(), r.d.begin());
    return r;
  }
};

inline std::string shape_string(const Dims& d) { return shape_string(d.span()); }

// numpy broadcasting: align trailing axes; each pair must be equal or 1.
// Returns false (and leaves out untouched) when the shapes are incompatible.
inline bool broadcast_dims(const Dims& a, const Dims& b, Dims& out) {
  Dims r;
  r.rank = std::max(a.rank, b.rank);
  for (std::size_t i = 0; i < r.rank; ++i) {
    std::size_t x = i < a.rank ? a.back(i) : 1;
    std::size_t y = i < b.rank ? b.back(i) : 1;
    if (x != y && x != 1 && y != 1) return false;
    r.d[r.rank - 1 - i] = x == 1 ? y : x;
  }
  out = r;
  return true;
}

// Strides of `in` seen through the broadcast shape `out`: 0 on broadcast axes.
GRAD_HD inline Dims broadcast_strides(const Dims& in, const Dims& out) {
  Dims s;
  s.rank = out.rank;
  std::size_t stride = 1;
  for (std::size_t i = 0; i < out.rank; ++i) {
    std::size_t ax = out.rank - 1 - i;
    std::size_t n = i < in.rank ? in.back(i) : 1;
    s.d[ax] = n == 1 ? 0 : stride;
    stride *= n;
  }
  return s;
}

// Flat index into a broadcast input for flat output index j.
GRAD_HD inline std::size_t broadcast_index(std::size_t j, const Dims& out, const Dims& strides) {
  std::size_t idx = 0;
  for (std::size_t ax = out.rank; ax-- > 0;) {
    idx += (j % out.d[ax]) * strides.d[ax];
    j /= out.d[ax];
  }
  return idx;
}

template <class T>
class Tensor {
 public:
  Tensor() = default;
  // Both constructors throw std::invalid_argument for a shape whose element
  // count overflows (more than max_elements), before allocating anything.
  explicit Tensor(Shape shape) : shape_(std::move(shape)), data_(checked_size(shape_), T(0)) {}
  Tensor(Shape shape, std::vector<T> data) : shape_(std::move(shape)), data_(std::move(data)) {
    if (data_.size() != checked_size(shape_))
      throw std::invalid_argument("Tensor: shape " + shape_string(shape_) + " holds " +
                                  std::to_string(element_count(shape_)) + " elements but " +
                                  std::to_string(data_.size()) + " values were given");
  }
  static Tensor zeros(Shape shape) { return Tensor(std::move(shape)); }
  static Tensor ones(Shape shape) { return full(std::move(shape), T(1)); }
  static Tensor full(Shape shape, T value) {
    Tensor t(std::move(shape));
    std::fill(t.data_.begin(), t.data_.end(), value);
    return t;
  }

  const Shape& shape() const { return shape_; }
  std::size_t rank() const { return shape_.size(); }
  std::size_t size() const { return data_.size(); }
  std::span<T> data() { return data_; }
  std::span<const T> data() const { return data_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  static std::size_t checked_size(const Shape& shape) {
    const std::optional<std::size_t> n = checked_element_count(shape);
    if (!n)
      throw std::invalid_argument("Tensor: shape " + shape_string(shape) +
                                  " has more elements than can be stored (at most " + std::to_string(max_elements) +
                                  ")");
    return *n;
  }

  Shape shape_;
  std::vector<T> data_;
};

}  // namespace grad
