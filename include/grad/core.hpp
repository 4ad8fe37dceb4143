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

// The reverse walk and the forward dispatch for element type T, prefixed by E
// (`extern` or nothing).
#define GRAD_WALK_INSTANCES(E, T)                    \
  E template bool grad::Tape<T>::walk(grad::Var<T>); \
  E template void grad::Tape<T>::forward_by_code(std::uint8_t, const grad::NodeArgs<T>&, T*);

#if defined(GRAD_COMPILED_KERNELS) && GRAD_SIMD
GRAD_WALK_INSTANCES(extern, float)
GRAD_WALK_INSTANCES(extern, double)
#endif
