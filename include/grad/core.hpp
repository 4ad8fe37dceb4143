// grad's CPU core without the extras: tensors, the tape, every op, the
// reverse walk, recompute scopes, the optimizers and the portable random
// generator. What a
// training program needs; grad/grad.hpp adds checkpoints and nn layers.
//
// With GRAD_COMPILED_KERNELS (grad_kernels_dep, grad-kernels.pc) the hot
// loops (kernels_extern.hpp), the reverse walk, Tape<T>::backward, which
// dispatches to every op's gradient, and Tape<T>::forward_by_code, which
// dispatches to every op's forward, are declared extern: the compiled
// kernel library holds them for float and double, so a consumer's unit
// compiles only the recording layer it uses.
#pragma once

#include "grad/backward.hpp"
#include "grad/config.hpp"
#include "grad/opt.hpp"
#include "grad/random.hpp"
#include "grad/recompute.hpp"
#include "grad/record.hpp"
#include "grad/tape.hpp"
#include "grad/tensor.hpp"

// What the compiled kernel library holds for element type T besides the
// hot loops, prefixed by E (`extern` or nothing): every member of the tape
// that is not a template (the reverse walk and the forward dispatch, which
// reach every op, but also allocation, errors, the inspection hooks), the
// optimizers' and Tensor<T>'s. A consumer's unit then compiles only what its
// own ops record (record<Op>, the ops' shape checks) and calls the library's
// copies of the rest: about a third of a one-op program's code generation.
// An explicit instantiation of a class leaves its member templates alone,
// so record<Op> and leaf<Op> stay in the unit that uses them.
#define GRAD_WALK_INSTANCES(E, T)     \
  E template class grad::Tensor<T>;   \
  E template class grad::Tape<T>;     \
  E template class grad::Optimizer<T>; \
  E template class grad::SGD<T>;      \
  E template class grad::Adam<T>;     \
  E template class grad::AdamW<T>;

#if defined(GRAD_COMPILED_KERNELS) && GRAD_SIMD
GRAD_WALK_INSTANCES(extern, float)
GRAD_WALK_INSTANCES(extern, double)
#endif
