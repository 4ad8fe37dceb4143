// The runtime of emitted programs (grad/emit.hpp writes them): what a C++ or
// CUDA file written by grad::emit includes, and all it includes of grad.
//
// Boost-free and tape-free: config.hpp, the op tags (their GRAD_HD per-item
// bodies are the rounding source of truth) and the optimizers' element rules
// (update_rules.hpp). An emitted file compiles with
//
//   g++ -std=c++20 -O2 -I path/to/grad/include model.cpp
//
// (contraction is switched off below, whatever -ffp-contract says: see there)
//
// and links nothing of grad. Every node of an emitted program is one call of
// forward<Op, N> / backward<Op, In, N> below, N being the node's shapes as a
// compile-time constant (Node): a loop over the tag's items calling its
// bodies, exactly what the device engine's CPU backend runs for the node,
// so the same bits as the tape. Nodes with equal shapes share one
// instantiation. Nothing here allocates or throws.
//
// -DGRAD_EMITTED_HOST_LOOPS (host compilers only) runs each node through its
// tag's host loops instead (forward_tensor, backward_tensor: vector packs,
// blocked gemm), which test_op_cases checks bit for bit against the item
// bodies: the same bits, several times faster on the CPU, but no longer
// allocation-free (gemm keeps a thread_local packing buffer, allocated on
// its first call) and slower to compile.
#pragma once

// grad's own headers, as an emitted program includes them, are not the
// user's code: their warnings under a user's strict flags (-Wshadow,
// -Wconversion, ... with -Werror) are not reported here. The emitted code
// itself is checked clean under -Wall -Wextra -Wshadow -Wconversion -Werror
// (test_emit).
// Floating-point contraction off (a*b+c is never fused into an FMA: the tape
// rounds the product and the sum separately) for grad's headers and, as the
// emitted files repeat this, for the emitted code, whatever the command line
// says (g++ -std=gnu++20 and clang contract by default; with -march=native
// that changes bits). Undone at the end: the user's code keeps its own
// setting. GCC: push_options / optimize; clang: float_control push and
// `fp contract(off)`. nvcc's device code cannot be told so from the source:
// it needs --fmad=false on the command line (no macro shows it).
#if !defined(__CUDA_ARCH__)
#if defined(__clang__)
#pragma float_control(push)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC push_options
#if !defined(__CUDACC__)  // nvcc knows no optimize pragma (#1675-D): -Xcompiler=-ffp-contract=off
#pragma GCC optimize("fp-contract=off")
#endif
#endif
#endif

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wsign-conversion"
#pragma GCC diagnostic ignored "-Wfloat-conversion"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "grad/config.hpp"
#include "grad/numerics/fixed_order.hpp"
#include "grad/tags/contract.hpp"
// Every op tag (the tags of grad/tags/op_list.hpp, without its Boost.Mp11 list).
#include "grad/tags/attention.hpp"
#include "grad/tags/cross_entropy.hpp"
#include "grad/tags/dropout.hpp"
#include "grad/tags/elementwise.hpp"
#include "grad/tags/embedding.hpp"
#include "grad/tags/gated.hpp"
#include "grad/tags/heads.hpp"
#include "grad/tags/layer_norm.hpp"
#include "grad/tags/layout.hpp"
#include "grad/tags/linalg.hpp"
#include "grad/tags/log_softmax.hpp"
#include "grad/tags/piecewise.hpp"
#include "grad/tags/power.hpp"
#include "grad/tags/reduce.hpp"
#include "grad/tags/reduce_axis.hpp"
#include "grad/tags/rms_norm.hpp"
#include "grad/tags/row_sum.hpp"
#include "grad/tags/softmax.hpp"
#include "grad/tags/unary.hpp"
#include "grad/update_rules.hpp"
#if defined(GRAD_EMITTED_HOST_LOOPS) && !defined(__CUDACC__)
#include "grad/update.hpp"  // the tape's optimizer loops
#endif

namespace grad::emitted {

// The emitter's format version: an emitted file checks it (static_assert), so
// a file written by another grad fails to compile instead of miscomputing.
inline constexpr int format_version = 1;

// A value from its bits: how an emitted file writes a NaN (its sign and
// payload kept; a NaN has no literal). A constant expression.
template <class T>
GRAD_HD constexpr T from_bits(std::conditional_t<sizeof(T) == 8, std::uint64_t, std::uint32_t> bits) {
  static_assert(sizeof(T) == sizeof(bits));
  return __builtin_bit_cast(T, bits);
}

// n elements from src to dst (an emitted ParamStore::load, captured_x, a
// forward() output that is a leaf).
template <std::size_t N, class T>
GRAD_HD constexpr void copy(T* dst, const T* src) {
  for (std::size_t i = 0; i < N; ++i) dst[i] = src[i];
}

// ---- metadata: an emitted file's tables of parameters, inputs and outputs ----

inline constexpr std::size_t no_offset = static_cast<std::size_t>(-1);

// One tensor of an emitted program, for a caller that drives any emitted
// model from its tables alone (parameters[], inputs[], outputs[]).
template <class T>
struct TensorInfo {
  const char* name;         // as given to grad::emit, or its default (p<node>, in<node>, out<k>)
  const char* identifier;   // its spelling in the emitted code (name, or name_ for a keyword or macro)
  std::uint32_t node;       // in the recorded tape
  Dims shape;               // rank and extents
  std::size_t size;         // elements
  std::size_t offset;       // in its flat buffer: params_at / value_and_grad's x and g, inputs_at, forward_flat's out
  std::size_t grad_offset;  // parameters: in Workspace::grad after a step; no_offset if the loss does not reach it
  const T* init;            // the captured values (host memory); outputs: nullptr
};

// A node's static description: operand and output shapes, the axis (softmax,
// concat) and slice's starts. A structural type: a template argument.
struct Node {
  Dims a{}, b{}, out{};
  std::uint32_t axis = 0;
  std::array<std::size_t, max_rank> extra{};
};

// dims(200, 6): a Dims of rank 2.
template <class... N>
constexpr Dims dims(N... n) {
  Dims r{};
  r.rank = sizeof...(n);
  std::size_t i = 0;
  ((r.d[i++] = static_cast<std::size_t>(n)), ...);
  return r;
}

// What the tag's bodies see of node N (`extra` is the caller's copy of N.extra).
template <Node N, class T>
GRAD_HD inline NodeArgs<T> args(const T* a, const T* b, T scalar, const std::size_t* extra) {
  NodeArgs<T> x;
  x.a.data = a;
  x.a.dims = N.a;
  x.b.data = b;
  x.b.dims = N.b;
  x.out = N.out;
  x.scalar = scalar;
  x.axis = N.axis;
  x.extra = extra;
  return x;
}

// The two ways of running a node are distinct functions to the linker (an
// inline namespace each), so units built either way can share a program.
#if defined(GRAD_EMITTED_HOST_LOOPS) && !defined(__CUDACC__)
inline namespace host_loops {
#else
inline namespace item_loops {
#endif

// Node N's forward: every item of its output, in order.
template <class Op, Node N, class T>
GRAD_HD inline void forward(const T* a, const T* b, T scalar, T* y) {
  std::size_t extra[max_rank];
  for (std::size_t i = 0; i < max_rank; ++i) extra[i] = N.extra[i];
  const NodeArgs<T> x = args<N>(a, b, scalar, extra);
#if defined(GRAD_EMITTED_HOST_LOOPS) && !defined(__CUDACC__)
  Op::forward_tensor(x, y);
#else
  const std::size_t n = forward_items<Op>(x);
  for (std::size_t w = 0; w < n; ++w) Op::forward_item(x, y, w);
#endif
}

// Node N's contribution to operand In's gradient, whole, into dx.
template <class Op, int In, Node N, class T>
GRAD_HD inline void backward(const T* a, const T* b, T scalar, const T* y, const T* g, T* dx) {
  std::size_t extra[max_rank];
  for (std::size_t i = 0; i < max_rank; ++i) extra[i] = N.extra[i];
  const NodeArgs<T> x = args<N>(a, b, scalar, extra);
#if defined(GRAD_EMITTED_HOST_LOOPS) && !defined(__CUDACC__)
  Op::template backward_tensor<In>(x, y, g, dx);
#else
  const std::size_t n = backward_items<Op, In>(x);
  for (std::size_t w = 0; w < n; ++w) Op::template backward_item<In>(x, y, g, dx, w);
#endif
}

// A later contribution to a fan-out input: grad = grad + contribution.
template <std::size_t N, class T>
GRAD_HD inline void accumulate(T* grad, const T* contribution) {
  for (std::size_t i = 0; i < N; ++i) grad[i] = grad[i] + contribution[i];
}

// ---- the optimizer step (grad/opt.hpp documents it; update_rules.hpp's rules) ----

// The clip factor: each parameter's squares in the fixed order, those shares
// added in add order from zero (call share() per parameter, then scale()).
template <class T>
struct Clip {
  T acc = T(0);
  GRAD_HD void share(const T* g, std::size_t n) { acc = ClipRule::accumulate(acc, ClipRule::squares(g, n)); }
  GRAD_HD T scale(T max_norm) const { return max_norm != T(0) ? ClipRule::scale(acc, max_norm) : T(1); }
};

template <class T>
GRAD_HD inline void adam_element(T& w, T& m, T& v, T g, T scale, T l2, T beta1, T beta2, T eps,
                                 const AdamStepConstants<T>& c) {
  AdamRule::update(w, m, v, ClipRule::effective(g, w, scale, l2), beta1, beta2, eps, c);
}
template <class T>
GRAD_HD inline void sgd_element(T& w, T g, T scale, T l2, T lr) {
  w = SgdRule::update(w, ClipRule::effective(g, w, scale, l2), lr);
}

// One parameter's update: the rules element by element or, with host loops,
// the tape's own vectorised loops over the same rules (update.hpp).
template <std::size_t N, class T>
GRAD_HD inline void adam_update(T* w, T* m, T* v, const T* g, T scale, T l2, T beta1, T beta2, T eps,
                                const AdamStepConstants<T>& c) {
#if defined(GRAD_EMITTED_HOST_LOOPS) && !defined(__CUDACC__)
  kernels::adam_update<ClipRule, AdamRule>(w, m, v, g, N, scale, l2, beta1, beta2, eps, c, T(1));
#else
  for (std::size_t i = 0; i < N; ++i) adam_element(w[i], m[i], v[i], g[i], scale, l2, beta1, beta2, eps, c);
#endif
}
template <std::size_t N, class T>
GRAD_HD inline void sgd_update(T* w, const T* g, T scale, T l2, T lr) {
#if defined(GRAD_EMITTED_HOST_LOOPS) && !defined(__CUDACC__)
  kernels::sgd_update<ClipRule, SgdRule>(w, g, N, scale, l2, lr);
#else
  for (std::size_t i = 0; i < N; ++i) sgd_element(w[i], g[i], scale, l2, lr);
#endif
}

}  // inline namespace

#ifdef __CUDACC__
// ---- CUDA: the same bodies, one work item per thread ----

inline constexpr unsigned threads_per_block = 256;
constexpr unsigned blocks_for(std::size_t items) {
  return static_cast<unsigned>((items + threads_per_block - 1) / threads_per_block);
}
// Kernels take the node's shapes as a type S (S::node), not as a Node
// argument: nvcc's host stubs cannot spell a class-type template argument.
// One work item of node N (nothing past the node's items).
template <class Op, Node N, class T>
__device__ inline void forward_at(const T* a, const T* b, T scalar, T* y, std::size_t w) {
  std::size_t extra[max_rank];
  for (std::size_t i = 0; i < max_rank; ++i) extra[i] = N.extra[i];
  const NodeArgs<T> x = args<N>(a, b, scalar, extra);
  if (w < forward_items<Op>(x)) Op::forward_item(x, y, w);
}
template <class Op, int In, Node N, class T>
__device__ inline void backward_at(const T* a, const T* b, T scalar, const T* y, const T* g, T* dx, std::size_t w) {
  std::size_t extra[max_rank];
  for (std::size_t i = 0; i < max_rank; ++i) extra[i] = N.extra[i];
  const NodeArgs<T> x = args<N>(a, b, scalar, extra);
  if (w < backward_items<Op, In>(x)) Op::template backward_item<In>(x, y, g, dx, w);
}
template <class Op, class S, class T>
__global__ void forward_kernel(const T* a, const T* b, T scalar, T* y) {
  forward_at<Op, S::node>(a, b, scalar, y, std::size_t{blockIdx.x} * blockDim.x + threadIdx.x);
}
template <class Op, int In, class S, class T>
__global__ void backward_kernel(const T* a, const T* b, T scalar, const T* y, const T* g, T* dx) {
  backward_at<Op, In, S::node>(a, b, scalar, y, g, dx, std::size_t{blockIdx.x} * blockDim.x + threadIdx.x);
}
template <std::size_t N, class T>
__global__ void accumulate_kernel(T* grad, const T* contribution) {
  const std::size_t w = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (w < N) grad[w] = grad[w] + contribution[w];
}
template <class T>
__global__ void set_kernel(T* p, T value) {
  *p = value;
}

// Launches node S's forward / backward / an accumulation on `stream`.
template <class Op, class S, class T>
inline void launch_forward(cudaStream_t stream, const T* a, const T* b, T scalar, T* y) {
  const std::size_t items = forward_items<Op>(args<S::node, T>(a, b, scalar, nullptr));
  if (items > 0) forward_kernel<Op, S, T><<<blocks_for(items), threads_per_block, 0, stream>>>(a, b, scalar, y);
}
template <class Op, int In, class S, class T>
inline void launch_backward(cudaStream_t stream, const T* a, const T* b, T scalar, const T* y, const T* g, T* dx) {
  const std::size_t items = backward_items<Op, In>(args<S::node, T>(a, b, scalar, nullptr));
  if (items > 0)
    backward_kernel<Op, In, S, T><<<blocks_for(items), threads_per_block, 0, stream>>>(a, b, scalar, y, g, dx);
}
template <std::size_t N, class T>
inline void launch_accumulate(cudaStream_t stream, T* grad, const T* contribution) {
  if constexpr (N > 0) accumulate_kernel<N, T><<<blocks_for(N), threads_per_block, 0, stream>>>(grad, contribution);
}

// The optimizer on the device: the clip factor and Adam's constants on one
// thread (state: scale, b1^t, b2^t, step size, 1 - b1, 1 - b2), then one
// thread per element.
template <class T>
struct DeviceOptimizerState {
  T scale = T(1), beta1_power = T(1), beta2_power = T(1);
  AdamStepConstants<T> constants{};
};
template <std::size_t N, class T>
__global__ void adam_update_kernel(T* w, T* m, T* v, const T* g, T l2, T beta1, T beta2, T eps,
                                   const DeviceOptimizerState<T>* st) {
  const std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < N) adam_element(w[i], m[i], v[i], g[i], st->scale, l2, beta1, beta2, eps, st->constants);
}
template <std::size_t N, class T>
__global__ void sgd_update_kernel(T* w, const T* g, T l2, T lr, const DeviceOptimizerState<T>* st) {
  const std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < N) sgd_element(w[i], g[i], st->scale, l2, lr);
}
#endif

}  // namespace grad::emitted

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#if !defined(__CUDA_ARCH__)
#if defined(__clang__)
#pragma float_control(pop)
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
#endif
