// Host matrix products: C[m,n] = sum over p of A(i,p) B(p,j), in three
// layouts (nn: forward, nt: dA = G B^T, tn: dB = A^T G).
//
// The determinism contract fixes the order of every output element's sum:
// from zero, ascending p, acc = fma(a, b, acc): one explicit fused
// multiply-add per term, a single rounding (grad::fma_hd; the host is built
// with -ffp-contract=off, so nothing else is fused). Everything here is free
// to reorder *which* elements are computed when, never the terms of one
// element:
//   - a register-blocked micro-kernel holds an MR x NR tile of C in vector
//     registers, vectorised across output columns (each lane is one output
//     element running its own ascending sum), so nt vectorises across
//     output elements too, not along its contiguous sum; the columns past
//     the last whole tile are one narrower tile of whole and half vectors
//     (an attention head of 24 floats is 16 + 8 lanes on AVX-512), a
//     block's last rows two-row tiles;
//   - cache blocking splits the sum into KC-long runs in ascending order;
//     between runs the partial sum is stored to C and reloaded unchanged;
//   - threads take disjoint ranges of output columns (or rows), each
//     element computed whole by one thread;
//   - a single output row (a decoding step's x . W or x . W^T) skips the
//     packing and reads b where it lies (multiply_row, multiply_row_transposed);
//   - a b held in 16 bits (a frozen base, Storage::bf16 or f16) is widened
//     while it is packed, or (one row) as it is loaded; a quantized b
//     (Storage::q8_0 ... q6_k) is dequantized 32 terms of sixteen outputs
//     at a time (its rows lie in groups of sixteen, numerics/quant_rows.hpp)
//     into a packed strip, or (one row) into an L1 strip the register tile
//     reads: exact, so the product's bits are those over the widened b.
// So the blocked kernels equal grad::reference::gemm_* bit for bit, on any
// instruction set and thread count (test_gemm checks it over many shapes).
//
// Instruction sets are chosen at run time (AVX-512, AVX2, else the
// baseline's 128-bit vectors), so one binary runs on any x86-64.
//
// Where (numerics/gemm/, in the order a product runs through them):
//   reference.hpp     the plain loops that define the order (grad::reference)
//   problem.hpp       a product by strides (Problem), the cache blocks
//   split.hpp         the split across threads (multiply)
//   blocked.hpp       one rectangle on one thread, a copy per instruction set
//   one_row.hpp       a single output row, b read where it lies
//   group_terms.hpp   a quantized b's row groups as terms of sixteen outputs
//   packing.hpp       a's panels and b's strips copied into packed buffers
//   terms.hpp         b's elements as T or widened from 16 bits
//   micro_kernel.hpp  the register tile and its fmas
// This header is the entry points the tags call (gemm_nn, gemm_nt, gemm_tn,
// gemm_tn_continue) and includes all of them.
#pragma once

#include <cstddef>

#include "grad/numerics/gemm/blocked.hpp"
#include "grad/numerics/gemm/micro_kernel.hpp"
#include "grad/numerics/gemm/one_row.hpp"
#include "grad/numerics/gemm/packing.hpp"
#include "grad/numerics/gemm/problem.hpp"
#include "grad/numerics/gemm/reference.hpp"
#include "grad/numerics/gemm/split.hpp"
#include "grad/numerics/gemm/terms.hpp"
#include "grad/numerics/isa.hpp"
#include "grad/numerics/storage.hpp"

namespace grad {

// The kernels the matmul/bmm tags call: same arguments and results as the
// reference loops (gemm/reference.hpp).

// C[m,n] = A[m,k] B[k,n]; B may be held in 16 bits (b_storage: bf16 or f16;
// B then points at its 16-bit elements) or quantized (B points at its
// blocks; b_transposed: the blocks hold B's transpose, [n, k] in memory),
// widened exactly as it is read.
template <class T>
inline void gemm_nn(const T* A, const T* B, T* C, std::size_t m, std::size_t k, std::size_t n,
                    Storage b_storage = Storage::native, bool b_transposed = false) {
  const gemm_detail::Strided<T> b = b_transposed ? gemm_detail::Strided<T>{B, 1, k, b_storage, n}
                                                 : gemm_detail::Strided<T>{B, n, 1, b_storage, k};
  gemm_detail::multiply<T>(gemm_detail::best_isa(), {{A, k, 1}, b, C, m, n, k});
}

// C[m,k] = G[m,n] B[k,n]^T (C[i,p] sums over j); B as gemm_nn's
// (b_transposed: B's transpose [n, k] in memory)
template <class T>
inline void gemm_nt(const T* G, const T* B, T* C, std::size_t m, std::size_t n, std::size_t k,
                    Storage b_storage = Storage::native, bool b_transposed = false) {
  const gemm_detail::Strided<T> b = b_transposed ? gemm_detail::Strided<T>{B, k, 1, b_storage, n}
                                                 : gemm_detail::Strided<T>{B, 1, n, b_storage, k};
  gemm_detail::multiply<T>(gemm_detail::best_isa(), {{G, n, 1}, b, C, m, k, n});
}

// C[k,n] = A[m,k]^T G[m,n] (C[p,j] sums over i)
template <class T>
inline void gemm_tn(const T* A, const T* G, T* C, std::size_t m, std::size_t k, std::size_t n) {
  gemm_detail::multiply<T>(gemm_detail::best_isa(), {{A, 1, k}, {G, n, 1}, C, k, n, m});
}

// C[k,n] continues each element's sum over i of A[i,k]^T G[i,n] from what C
// holds: gemm_tn over rows [0, m1) followed by gemm_tn_continue over rows
// [m1, m) gives gemm_tn's bits over all m rows (the same fma chain per
// element, stored and reloaded unchanged between the two calls).
template <class T>
inline void gemm_tn_continue(const T* A, const T* G, T* C, std::size_t m, std::size_t k, std::size_t n) {
  gemm_detail::multiply<T>(gemm_detail::best_isa(), {{A, 1, k}, {G, n, 1}, C, k, n, m, true});
}

}  // namespace grad
