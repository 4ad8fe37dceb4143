// Inverted dropout (torch.nn.functional.dropout in training): each element
// is kept with probability 1 - p and scaled by 1 / (1 - p), or zeroed.
//
// The mask is not stored and not drawn from a stateful generator: element w
// is kept when the w-th draw of SplitMix64 seeded with the node's key is at
// least p (the top 53 bits, compared exactly as integers scaled by 2^53).
// The key is a pure function of (seed, step, node) (dropout_key), so the
// tape, the device engine's backends and emitted code all compute the same
// mask from the same key, backward recomputes it instead of keeping it, and a
// run resumed at step k draws the masks an uninterrupted run draws.
//
// The key travels as the node's extras, padded with zeros to one entry per
// axis: every engine copies an op's extras per axis of its operand.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "grad/tags/family.hpp"

namespace grad {

// SplitMix64's output function: a bijection of 64-bit words.
GRAD_HD inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
inline constexpr std::uint64_t splitmix_gamma = 0x9e3779b97f4a7c15ULL;

// The mask key of one dropout node: its layer's seed, the training step and
// the node's index on the tape.
inline std::uint64_t dropout_key(std::uint64_t seed, std::uint64_t step, std::uint64_t node) {
  return mix64(mix64(mix64(seed + splitmix_gamma) + step) + node);
}

struct Dropout : ItemLoops<Dropout> {
  static constexpr std::string_view name = "dropout";
  // The same mask in Python integers: SplitMix64(extra[0])'s (w + 1)-th output.
  static constexpr std::string_view torch =
      "a * torch.tensor([0.0 if (lambda z: (lambda z: (lambda z: z ^ z >> 31)((z ^ z >> 27) * 0x94d049bb133111eb % "
      "2**64))((z ^ z >> 30) * 0xbf58476d1ce4e5b9 % 2**64))((extra[0] + (w + 1) * 0x9e3779b97f4a7c15) % 2**64) >> 11 "
      "< s * 2**53 else 1.0 / (1.0 - s) for w in range(a.numel())], dtype=torch.float64).reshape(a.shape)";
  static constexpr int arity = 1;
  static constexpr bool keeps_sizes = true;  // the key (then zeros), read by the items as x.extra[0]
  static std::string output_dims(const Dims& a, const Dims&, OpAttrs& at, Dims& out) {
    if (at.sizes.size() != a.rank)
      return "the key must be padded to one entry per axis of " + shape_string(a) + ", got " +
             std::to_string(at.sizes.size());
    out = a;
    return {};
  }

  // What element w is multiplied by: 1 / (1 - p) when kept, else 0 (so a NaN
  // or infinite input still shows, as in torch's x * mask).
  template <class T>
  GRAD_HD static T factor(const NodeArgs<T>& x, std::size_t w) {
    const std::uint64_t bits = mix64(static_cast<std::uint64_t>(x.extra[0]) + (w + 1) * splitmix_gamma) >> 11;
    const bool keep = static_cast<double>(bits) >= static_cast<double>(x.scalar) * 0x1p53;
    return keep ? T(1) / (T(1) - x.scalar) : T(0);
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    y[w] = x.a.data[w] * factor(x, w);
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    dx[w] = g[w] * factor(x, w);
  }
};

}  // namespace grad
