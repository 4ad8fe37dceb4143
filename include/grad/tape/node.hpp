// Node<T>, the plain data of one recorded op, and the two things a tape
// hands out for it: Var<T>, the copyable handle, and View<T>, a borrowed
// look at a value or gradient. Apart from the Tape because they are its
// vocabulary, not its machinery: what a node is can be read here alone.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "grad/config.hpp"
#include "grad/numerics/held.hpp"
#include "grad/numerics/storage.hpp"
#include "grad/tensor.hpp"

namespace grad {

template <class T>
class Tape;

// A copyable handle: which tape, which node, and the node's serial number so
// that a handle outliving its node (dropped by reset_to) is detected.
template <class T>
class Var {
 public:
  Var() = default;
  Tape<T>* tape() const { return tape_; }
  std::uint32_t index() const { return index_; }
  // False for a default Var and for what an op returns on a poisoned tape.
  bool valid() const { return tape_ != nullptr && index_ != no_node; }

 private:
  friend class Tape<T>;
  Var(Tape<T>* tape, std::uint32_t index, std::uint64_t serial) : tape_(tape), index_(index), serial_(serial) {}
  Tape<T>* tape_ = nullptr;
  std::uint32_t index_ = no_node;
  std::uint64_t serial_ = 0;
};

// A borrowed look at a node's value or gradient.
template <class T>
struct View {
  std::span<const std::size_t> shape;
  std::span<const T> data;
  std::size_t rank() const { return shape.size(); }
  std::size_t size() const { return data.size(); }
  bool empty() const { return data.empty(); }
  const T& operator[](std::size_t i) const { return data[i]; }
  auto begin() const { return data.begin(); }
  auto end() const { return data.end(); }
  Tensor<T> tensor() const {
    return Tensor<T>(Shape(shape.begin(), shape.end()), std::vector<T>(data.begin(), data.end()));
  }
};

template <class T>
struct Node {
  std::uint8_t op = 0;
  bool requires_grad = false;  // some parameter is upstream: has a gradient buffer
  bool touched = false;        // the latest backward wrote into grad
  bool inference =
      false;  // recorded under an InferenceGuard (no gradient buffer, even below a parameter), or from such a node
  // Recorded inside a recompute scope (grad/recompute.hpp) and not one of its
  // outputs: value and gradient live in memory the next scope reuses, so
  // the reverse walk computes the value again before it needs it.
  bool transient = false;
  // bf16, f16: a constant whose value holds 16-bit floats; q8_0 ... q6_k:
  // quantized blocks (Tape::constant, numerics/held.hpp)
  Storage storage = Storage::native;
  bool transposed = false;  // a quantized matrix whose memory holds its transpose (Operand::transposed)
  std::uint32_t a = no_node, b = no_node;
  std::uint32_t axis = 0;
  std::uint32_t extra = no_node;  // offset of per-axis parameters in the tape's index pool
  T scalar = T(0);
  Dims dims;
  T* value = nullptr;
  T* grad = nullptr;  // null when !requires_grad
  std::uint64_t serial = 0;

  // Value element k (row-major) as T (a 16-bit or quantized constant's
  // widened, exactly).
  T value_at(std::size_t k) const {
    if (!narrow(storage)) return value[k];
    if (transposed) {  // element (i, j) of [rows, cols] lies at j * rows + i
      const std::size_t rows = dims.d[0], cols = dims.d[1];
      k = k % cols * rows + k / cols;
    }
    return held_value<T>(storage, value, dims.size() / held_row(), held_row(), k);
  }
  // The length of a narrow constant's memory rows: its last dimension, or
  // its first when it holds its transpose (numerics/held.hpp).
  std::size_t held_row() const { return transposed ? dims.d[0] : dims.back(); }
};

}  // namespace grad
