// Per-work-item kernel bodies of every op the device engine replays.
//
// `DeviceKernel<Op>` is the one table the CUDA kernels and the CPU backend
// both instantiate: work item w of a node computes whole output elements
// (forward) or whole input-gradient elements (backward, gather form: each
// dx element sums its own contributions from zero in ascending output
// index, the order the host loops in grad/ops/*.hpp follow). The element
// math is always the tag's own GRAD_HD functor; what lives here is only the
// index arithmetic that maps a work item onto the tag's loop.
//
// Families (Unary, Binary, MatrixProduct) are covered once for all their
// members; an op with no specialisation has no device kernel and capture
// refuses it by name (`has_device_kernel<Op>`).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "grad/ops/op_list.hpp"
#include "grad/opt.hpp"

namespace grad::device {

template <class Op>
struct DeviceKernel;  // no definition: the op has no device kernel

template <class Op>
concept has_device_kernel = requires {
  sizeof(DeviceKernel<Op>);
};

namespace kernel_detail {

GRAD_HD inline bool same_dims(const Dims& x, const Dims& y) {
  if (x.rank != y.rank) return false;
  for (std::size_t i = 0; i < x.rank; ++i)
    if (x.d[i] != y.d[i]) return false;
  return true;
}

// broadcast_strides (tensor.hpp), callable from device code.
GRAD_HD inline Dims strides_in(const Dims& in, const Dims& out) {
  Dims s;
  s.rank = out.rank;
  std::size_t stride = 1;
  for (std::size_t i = 0; i < out.rank; ++i) {
    const std::size_t ax = out.rank - 1 - i;
    const std::size_t n = i < in.rank ? in.d[in.rank - 1 - i] : 1;
    s.d[ax] = n == 1 ? 0 : stride;
    stride *= n;
  }
  return s;
}

template <class Op, class Base>
inline constexpr bool in_family = std::is_base_of_v<Base, Op>;

// How many items (device threads) a node's kernels take, unless its family
// says otherwise: one per output element forward, one per element of the
// input's gradient backward.
struct PerElementItems {
  template <class T>
  static std::size_t forward_items(const NodeArgs<T>& x) {
    return x.out.size();
  }
  template <int In, class T>
  static std::size_t backward_items(const NodeArgs<T>& x) {
    return (In == 0 ? x.a.dims : x.b.dims).size();
  }
};

}  // namespace kernel_detail

// y = f(x, scalar): item w is element w.
template <class Op>
requires kernel_detail::in_family<Op, Unary<Op>>
struct DeviceKernel<Op> : kernel_detail::PerElementItems {
  template <class T>
  GRAD_HD static void forward(const NodeArgs<T>& x, T* y, std::size_t w) {
    y[w] = Op::forward(x.a.data[w], x.scalar);
  }
  template <int In, class T>
  GRAD_HD static void backward(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t w) {
    dx[w] = Op::backward(x.a.data[w], y[w], g[w], x.scalar);
  }
};

// Broadcasting binary ops. An input of the output's exact shape stores its
// one contribution as is; a broadcast input's element w starts from zero and
// adds its contributions in ascending output index (Binary::backward_tensor).
template <class Op>
requires kernel_detail::in_family<Op, Binary<Op>>
struct DeviceKernel<Op> : kernel_detail::PerElementItems {
  template <class T>
  GRAD_HD static void forward(const NodeArgs<T>& x, T* y, std::size_t w) {
    const std::size_t ia = kernel_detail::same_dims(x.a.dims, x.out)
                               ? w
                               : broadcast_index(w, x.out, kernel_detail::strides_in(x.a.dims, x.out));
    const std::size_t ib = kernel_detail::same_dims(x.b.dims, x.out)
                               ? w
                               : broadcast_index(w, x.out, kernel_detail::strides_in(x.b.dims, x.out));
    y[w] = Op::forward(x.a.data[ia], x.b.data[ib]);
  }

  template <int In, class T>
  GRAD_HD static void backward(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t w) {
    // 32-bit index arithmetic whenever the output allows it: a 64-bit
    // division is a long software routine on the GPU.
    if (x.out.size() <= 0xffffffffu)
      backward_indexed<In, std::uint32_t>(x, y, g, dx, static_cast<std::uint32_t>(w));
    else
      backward_indexed<In, std::size_t>(x, y, g, dx, w);
  }

 private:
  template <int In, class I, class T>
  GRAD_HD static void backward_indexed(const NodeArgs<T>& x, const T* y, const T* g, T* dx, I w) {
    using kernel_detail::same_dims;
    auto contribution = [&](I j, I ia, I ib) {
      if constexpr (In == 0)
        return Op::backward_a(x.a.data[ia], x.b.data[ib], y[j], g[j]);
      else
        return Op::backward_b(x.a.data[ia], x.b.data[ib], y[j], g[j]);
    };
    const Dims sa = kernel_detail::strides_in(x.a.dims, x.out), sb = kernel_detail::strides_in(x.b.dims, x.out);
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
    if (same_dims(mine, x.out)) {
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
};

// Matmul and Bmm: every inner product from zero in ascending index, as
// gemm_nn / gemm_nt / gemm_tn (linalg.hpp) accumulate it.
template <class Op>
requires kernel_detail::in_family<Op, MatrixProduct<Op>>
struct DeviceKernel<Op> : kernel_detail::PerElementItems {
  struct Sizes {
    std::size_t m, k, n;
  };
  template <class T>
  GRAD_HD static Sizes sizes(const NodeArgs<T>& x) {
    return {x.a.dims.back(1), x.a.dims.back(), x.b.dims.back()};
  }
  template <class T>
  GRAD_HD static void forward(const NodeArgs<T>& x, T* y, std::size_t w) {
    const auto [m, k, n] = sizes(x);
    const std::size_t s = w / (m * n), i = w % (m * n) / n, j = w % n;
    const T* A = x.a.data + s * m * k + i * k;
    const T* B = x.b.data + s * k * n + j;
    T acc = T(0);
    for (std::size_t p = 0; p < k; ++p) acc = acc + A[p] * B[p * n];
    y[w] = acc;
  }
  template <int In, class T>
  GRAD_HD static void backward(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const auto [m, k, n] = sizes(x);
    T acc = T(0);
    if constexpr (In == 0) {  // dA[i,p] = sum_j G[i,j] B[p,j]
      const std::size_t s = w / (m * k), i = w % (m * k) / k, p = w % k;
      const T* G = g + s * m * n + i * n;
      const T* B = x.b.data + s * k * n + p * n;
      for (std::size_t j = 0; j < n; ++j) acc = acc + G[j] * B[j];
    } else {  // dB[p,j] = sum_i A[i,p] G[i,j]
      const std::size_t s = w / (k * n), p = w % (k * n) / n, j = w % n;
      const T* A = x.a.data + s * m * k + p;
      const T* G = g + s * m * n + j;
      for (std::size_t i = 0; i < m; ++i) acc = acc + A[i * k] * G[i * n];
    }
    dx[w] = acc;
  }
};

// sum and mean: one item computes the whole reduction in the documented
// order (sum_fixed, grad/ops/reduce.hpp); the CUDA backend runs the same
// order with a block of warps (block_sum_fixed below). Backward hands every
// element the same share.
template <class Op>
requires(std::same_as<Op, Sum> || std::same_as<Op, Mean>) struct DeviceKernel<Op> : kernel_detail::PerElementItems {
  template <class T>
  static std::size_t forward_items(const NodeArgs<T>&) {
    return 1;
  }
  template <class T>
  GRAD_HD static void forward(const NodeArgs<T>& x, T* y, std::size_t) {
    const std::size_t n = x.a.dims.size();
    if constexpr (std::same_as<Op, Mean>)
      y[0] = sum_fixed(x.a.data, n) / static_cast<T>(n);
    else
      y[0] = sum_fixed(x.a.data, n);
  }
  template <int In, class T>
  GRAD_HD static void backward(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    if constexpr (std::same_as<Op, Mean>)
      dx[w] = g[0] / static_cast<T>(x.a.dims.size());
    else
      dx[w] = g[0];
  }
};

// Swaps the last two axes (transpose_batches).
template <>
struct DeviceKernel<Transpose> : kernel_detail::PerElementItems {
  template <class T>
  GRAD_HD static void forward(const NodeArgs<T>& x, T* y, std::size_t w) {
    const std::size_t r = x.a.dims.back(1), c = x.a.dims.back(), s = w / (r * c), q = w % (r * c);
    y[w] = x.a.data[s * r * c + (q % r) * c + q / r];
  }
  template <int In, class T>
  GRAD_HD static void backward(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const std::size_t r = x.a.dims.back(1), c = x.a.dims.back(), s = w / (r * c), q = w % (r * c);
    dx[w] = g[s * r * c + (q % c) * r + q / c];
  }
};

template <>
struct DeviceKernel<Reshape> : kernel_detail::PerElementItems {
  template <class T>
  GRAD_HD static void forward(const NodeArgs<T>& x, T* y, std::size_t w) {
    y[w] = x.a.data[w];
  }
  template <int In, class T>
  GRAD_HD static void backward(const NodeArgs<T>&, const T*, const T* g, T* dx, std::size_t w) {
    dx[w] = g[w];
  }
};

// Slice: forward gathers from the input box; backward gives each input
// element its output's gradient inside the box and zero outside.
template <>
struct DeviceKernel<Slice> : kernel_detail::PerElementItems {
  template <class T>
  GRAD_HD static void forward(const NodeArgs<T>& x, T* y, std::size_t w) {
    std::size_t src = 0, in_stride = 1, rest = w;
    for (std::size_t ax = x.out.rank; ax-- > 0;) {
      src += (rest % x.out.d[ax] + x.extra[ax]) * in_stride;
      rest /= x.out.d[ax];
      in_stride *= x.a.dims.d[ax];
    }
    y[w] = x.a.data[src];
  }
  template <int In, class T>
  GRAD_HD static void backward(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    std::size_t j = 0, out_stride = 1, rest = w;
    for (std::size_t ax = x.a.dims.rank; ax-- > 0;) {
      const std::size_t at = rest % x.a.dims.d[ax];
      rest /= x.a.dims.d[ax];
      if (at < x.extra[ax] || at >= x.extra[ax] + x.out.d[ax]) {
        dx[w] = T(0);
        return;
      }
      j += (at - x.extra[ax]) * out_stride;
      out_stride *= x.out.d[ax];
    }
    dx[w] = g[j];
  }
};

// Concat: per outer index, a's block then b's block.
template <>
struct DeviceKernel<Concat> : kernel_detail::PerElementItems {
  struct Blocks {
    std::size_t a, b;
  };
  template <class T>
  GRAD_HD static Blocks blocks(const NodeArgs<T>& x) {
    Blocks k{1, 1};
    for (std::size_t i = x.axis; i < x.a.dims.rank; ++i) {
      k.a *= x.a.dims.d[i];
      k.b *= x.b.dims.d[i];
    }
    return k;
  }
  template <class T>
  GRAD_HD static void forward(const NodeArgs<T>& x, T* y, std::size_t w) {
    const Blocks k = blocks(x);
    const std::size_t o = w / (k.a + k.b), r = w % (k.a + k.b);
    y[w] = r < k.a ? x.a.data[o * k.a + r] : x.b.data[o * k.b + (r - k.a)];
  }
  template <int In, class T>
  GRAD_HD static void backward(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const Blocks k = blocks(x);
    const std::size_t width = In == 0 ? k.a : k.b, offset = In == 0 ? 0 : k.a;
    dx[w] = g[w / width * (k.a + k.b) + offset + w % width];
  }
};

// Softmax: item w is one whole lane, run by the tag's own lane functions.
template <>
struct DeviceKernel<Softmax> {
  struct Lane {
    std::size_t base, n, stride;
  };
  template <class T>
  GRAD_HD static Lane lane(const NodeArgs<T>& x, std::size_t w) {
    std::size_t inner = 1;
    for (std::size_t i = x.axis + 1; i < x.out.rank; ++i) inner *= x.out.d[i];
    const std::size_t n = x.out.d[x.axis];
    return {w / inner * n * inner + w % inner, n, inner};
  }
  template <class T>
  static std::size_t forward_items(const NodeArgs<T>& x) {
    return x.out.size() / x.out.d[x.axis];
  }
  template <class T>
  GRAD_HD static void forward(const NodeArgs<T>& x, T* y, std::size_t w) {
    const Lane l = lane(x, w);
    Softmax::forward_lane(x.a.data + l.base, y + l.base, l.n, l.stride);
  }
  template <int In, class T>
  static std::size_t backward_items(const NodeArgs<T>& x) {
    return x.out.size() / x.out.d[x.axis];
  }
  template <int In, class T>
  GRAD_HD static void backward(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t w) {
    const Lane l = lane(x, w);
    Softmax::backward_lane(y + l.base, g + l.base, dx + l.base, l.n, l.stride);
  }
};

// row_sum: item w is row w, run by the tag's own row functions.
template <>
struct DeviceKernel<RowSum> : kernel_detail::PerElementItems {
  template <class T>
  GRAD_HD static void forward(const NodeArgs<T>& x, T* y, std::size_t w) {
    const std::size_t n = x.a.dims.back();
    y[w] = RowSum::forward_row(x.a.data + w * n, n);
  }
  template <int In, class T>
  static std::size_t backward_items(const NodeArgs<T>& x) {
    return x.out.size();
  }
  template <int In, class T>
  GRAD_HD static void backward(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const std::size_t n = x.a.dims.back();
    RowSum::backward_row(g[w], dx + w * n, n);
  }
};

// What a fan-out input does with a later contribution (backward.hpp):
// the contribution was computed whole into scratch, then grad = grad + it.
template <class T>
GRAD_HD inline void accumulate_element(T* grad, const T* contribution, std::size_t w) {
  grad[w] = grad[w] + contribution[w];
}

// ---- launches: what the per-node replay, graph capture and fused kernels run ----

enum class LaunchKind : std::uint8_t { forward, backward_a, backward_b, accumulate };

// One launch resolved to backend pointers (plain data: fused kernels read an
// array of these from device memory). forward: y is the node's output.
// backward_a/b: y and g are the node's value and gradient, dx receives the
// input's contribution (its gradient, or scratch). accumulate: grad += dx.
template <class S>
struct Launch {
  LaunchKind kind = LaunchKind::forward;
  std::uint8_t op = 0;
  NodeArgs<S> x;
  S* y = nullptr;
  const S* g = nullptr;
  S* dx = nullptr;
  S* grad = nullptr;
  std::size_t items = 0;
};

// Ops a fused kernel can dispatch: the row-local families, activation·W, and
// sum/mean (the scalar tail and its backward). Only these are instantiated
// in the fused kernels' op table, which keeps nvcc's work small; every other
// op keeps its per-node kernel.
template <class Op>
inline constexpr bool fusable = kernel_detail::in_family<Op, Unary<Op>> || kernel_detail::in_family<Op, Binary<Op>> ||
                                std::same_as<Op, Matmul> || std::same_as<Op, Sum> || std::same_as<Op, Mean>;

// Work item w of a launch, through the op-code table: the same DeviceKernel
// body (so the same functor, the same inner-loop order) the per-node kernel
// runs for w. A fused kernel only changes which thread runs which item.
//
// Each op's item is its own function, not inlined on the device: ptxas then
// optimises many small functions instead of one that holds the whole table
// (which took it several times longer to build).
#ifdef __CUDACC__
#define GRAD_DEVICE_NOINLINE __noinline__
#else
#define GRAD_DEVICE_NOINLINE
#endif
template <class Op, class S>
GRAD_HD GRAD_DEVICE_NOINLINE void run_op_item(const Launch<S>& l, std::size_t w) {
  if (l.kind == LaunchKind::forward) {
#ifdef __CUDA_ARCH__
    // A sum or mean forward never reaches the item table: serial_segment gives
    // it to the whole block (block_reduce_forward). Not compiling its one-thread
    // form here keeps its 32 accumulators out of the fused kernel's registers.
    if constexpr (std::same_as<Op, Sum> || std::same_as<Op, Mean>)
      __trap();
    else
#endif
      DeviceKernel<Op>::forward(l.x, l.y, w);
  } else if (l.kind == LaunchKind::backward_a)
    DeviceKernel<Op>::template backward<0>(l.x, l.y, l.g, l.dx, w);
  else if constexpr (Op::arity > 1)
    DeviceKernel<Op>::template backward<1>(l.x, l.y, l.g, l.dx, w);
}

template <class S>
GRAD_HD inline void run_item(const Launch<S>& l, std::size_t w) {
  if (l.kind == LaunchKind::accumulate) {
    accumulate_element(l.grad, l.dx, w);
    return;
  }
  with_op(l.op, [&](auto op) {
    using Op = decltype(op);
    if constexpr (fusable<Op>) run_op_item<Op>(l, w);
  });
}

// The launch geometry both backends use: work item w = block *
// threads_per_block + thread (the CPU backend runs blocks and threads as loops).
inline constexpr std::size_t threads_per_block = 256;

// Blocks that cover `items` work items, `block_items` a block.
GRAD_HD constexpr std::size_t blocks_for(std::size_t items, std::size_t block_items = threads_per_block) {
  return (items + block_items - 1) / block_items;
}

// Row-local segment, block `row`, one launch: this thread's items of the
// row (the launch's items split evenly over `rows`). The caller puts a
// barrier after it (__syncthreads on CUDA; the end of the thread loop on the CPU).
template <class S>
GRAD_HD inline void row_segment_step(const Launch<S>& l, std::size_t rows, std::size_t row, std::size_t thread,
                                     std::size_t threads) {
  const std::size_t per_row = l.items / rows;
  for (std::size_t t = thread; t < per_row; t += threads) run_item(l, row * per_row + t);
}

// ---- one block cooperating: the full reductions ----
//
// A Block runs a kernel body's steps: step(f) calls f(thread, threads) on
// every thread of the block and then waits at a barrier; step_one(f) calls
// f() on thread 0 only, then the barrier. The CUDA backend's Block is the
// real block (__syncthreads); the CPU backend's runs the threads as a loop
// (in reverse when checking for races). Thread 0's locals carry state from
// one step to the next; what other threads share goes through `shared`.

// Chunks whose 32 lane sums sit in shared memory at once.
inline constexpr std::size_t block_sum_batch = 32;
// Values of `shared` that block_sum_fixed needs (8 KiB in double).
inline constexpr std::size_t block_sum_shared = block_sum_batch * fixed_order::lanes;

// sum_fixed(x, n, f) computed by a whole block: thread i of a step computes
// lane i % 32 of chunk i / 32 (lane_sum: 32 neighbouring threads read 32
// neighbouring elements), then one thread per chunk combines its lanes
// (combine_lanes), then thread 0 streams the chunk sums up the levels
// (LevelStream). The very functions sum_fixed is made of, so the same bits;
// only thread 0's return value is the sum.
template <class S, class F, class Block>
GRAD_HD S block_sum_fixed(const S* x, std::size_t n, F f, S* shared, Block& block) {
  using namespace fixed_order;
  const std::size_t chunks = (n + chunk - 1) / chunk;
  S total = S(0);
  if (chunks <= 1) {  // the common case (a loss over a minibatch): one warp's lanes, one tree, no levels
    block.step([&](std::size_t thread, std::size_t threads) {
      for (std::size_t i = thread; i < chunks * lanes; i += threads) shared[i] = lane_sum(x, n, i, f);
    });
    block.step_one([&] {
      if (chunks) total = combine_lanes(shared);
    });
    return total;
  }
  LevelStream<S> stream(n);
  for (std::size_t first = 0; first < chunks; first += block_sum_batch) {
    const std::size_t count = chunks - first < block_sum_batch ? chunks - first : block_sum_batch;
    block.step([&](std::size_t thread, std::size_t threads) {
      for (std::size_t i = thread; i < count * lanes; i += threads) {
        const std::size_t c = first + i / lanes;
        shared[i] = lane_sum(x + c * chunk, chunk_length(n, c), i % lanes, f);
      }
    });
    block.step([&](std::size_t thread, std::size_t threads) {
      for (std::size_t k = thread; k < count; k += threads) combine_lanes(shared + k * lanes);
    });
    block.step_one([&] {
      for (std::size_t k = 0; k < count; ++k) stream.push(1, shared[k * lanes]);
    });
  }
  block.step_one([&] { total = stream.result(); });
  return total;
}

// Is this launch a full reduction's forward (sum, mean), which a block runs together?
template <class S>
GRAD_HD inline bool block_reduction(const Launch<S>& l) {
  return l.kind == LaunchKind::forward && (l.op == op_code<Sum> || l.op == op_code<Mean>);
}

// sum / mean forward by a block: y[0] on thread 0.
template <class S, class Block>
GRAD_HD inline void block_reduce_forward(const NodeArgs<S>& x, S* y, std::uint8_t op, S* shared, Block& block) {
  const std::size_t n = x.a.dims.size();
  const S total = block_sum_fixed(x.a.data, n, fixed_order::Identity{}, shared, block);
  block.step_one([&] { y[0] = op == op_code<Mean> ? total / static_cast<S>(n) : total; });
}

// The scalar tail: thread 0 runs every launch's items in order, except a
// sum or mean, which the whole block reduces (a barrier after each launch).
template <class S, class Block>
GRAD_HD inline void serial_segment(const Launch<S>* launches, std::size_t count, S* shared, Block& block) {
  for (std::size_t k = 0; k < count; ++k) {
    const Launch<S>& l = launches[k];
    if (block_reduction(l))
      block_reduce_forward(l.x, l.y, l.op, shared, block);
    else
      block.step_one([&] {
        for (std::size_t w = 0; w < l.items; ++w) run_item(l, w);
      });
  }
}

// Independent launches sharing one grid (the reductions across rows): block
// b belongs to the launch whose block range holds it, `block_items` items a block.
template <class S>
GRAD_HD inline void batch_block(const Launch<S>* launches, std::size_t count, std::size_t block, std::size_t thread,
                                std::size_t block_items) {
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t blocks = blocks_for(launches[k].items, block_items);
    if (block < blocks) {
      const std::size_t w = block * block_items + thread;
      if (w < launches[k].items) run_item(launches[k], w);
      return;
    }
    block -= blocks;
  }
}

// The grid batch_block needs: every launch's blocks, side by side.
template <class S>
std::size_t batch_blocks(const Launch<S>* launches, std::size_t count) {
  std::size_t blocks = 0;
  for (std::size_t k = 0; k < count; ++k) blocks += blocks_for(launches[k].items);
  return blocks;
}

// ---- device optimizers: grad/opt.hpp's rules over the parameter buffers ----

template <class S>
struct ParamView {
  S* w = nullptr;
  const S* g = nullptr;
  S* m = nullptr;  // Adam moments (null for SGD)
  S* v = nullptr;
  std::size_t size = 0;
  S l2 = S(0);
};

template <class S>
struct OptimizerHyper {
  S lr, beta1, beta2, eps, clip;
  bool adam;
};

// Per-step values computed on the device, so that a step needs no host round trip.
template <class S>
struct OptimizerState {
  S scale = S(1);  // clip factor of this step
  S beta1_power = S(1), beta2_power = S(1);
  AdamStepConstants<S> constants{};
};

// The clip factor (opt.hpp's order: each parameter's squares in the fixed
// order, by the whole block; those shares in add order from zero), then
// Adam's per-step constants, on thread 0.
template <class S, class Block>
GRAD_HD inline void optimizer_prepare(const ParamView<S>* params, std::size_t count, const OptimizerHyper<S>& h,
                                      OptimizerState<S>* st, S* shared, Block& block) {
  S acc = S(0);
  if (h.clip != S(0))
    for (std::size_t k = 0; k < count; ++k) {
      const S share = block_sum_fixed(params[k].g, params[k].size, fixed_order::Square{}, shared, block);
      block.step_one([&] { acc = ClipRule::accumulate(acc, share); });
    }
  block.step_one([&] {
    st->scale = h.clip != S(0) ? ClipRule::scale(acc, h.clip) : S(1);
    if (h.adam) {
      AdamRule::advance(st->beta1_power, st->beta2_power, h.beta1, h.beta2);
      st->constants = AdamRule::constants(h.lr, h.beta1, h.beta2, st->beta1_power, st->beta2_power);
    }
  });
}

template <class S>
GRAD_HD inline void optimizer_update(const ParamView<S>& p, const OptimizerHyper<S>& h, const OptimizerState<S>& st,
                                     std::size_t i) {
  const S g = ClipRule::effective(p.g[i], p.w[i], st.scale, p.l2);
  if (h.adam)
    AdamRule::update(p.w[i], p.m[i], p.v[i], g, h.beta1, h.beta2, h.eps, st.constants);
  else
    p.w[i] = SgdRule::update(p.w[i], g, h.lr);
}

// Fused mode: every parameter's update in one grid, block b belonging to the
// parameter whose block range holds it (the per-parameter kernels' items).
template <class S>
GRAD_HD inline void optimizer_update_block(const ParamView<S>* params, std::size_t count, const OptimizerHyper<S>& h,
                                           const OptimizerState<S>& st, std::size_t block, std::size_t thread,
                                           std::size_t block_items) {
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t blocks = blocks_for(params[k].size, block_items);
    if (block < blocks) {
      const std::size_t i = block * block_items + thread;
      if (i < params[k].size) optimizer_update(params[k], h, st, i);
      return;
    }
    block -= blocks;
  }
}

// The grid optimizer_update_block needs: every parameter's blocks, side by side.
template <class S>
std::size_t update_blocks(const ParamView<S>* params, std::size_t count) {
  std::size_t blocks = 0;
  for (std::size_t k = 0; k < count; ++k) blocks += blocks_for(params[k].size);
  return blocks;
}

}  // namespace grad::device
