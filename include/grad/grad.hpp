// grad: reverse-mode automatic differentiation on a define-by-run tape.
// Everything of the CPU library, in dependency order:
//
//   config.hpp       GRAD_HD, Tier                          (host and device)
//   tensor.hpp       Tensor<T>, Shape, Dims, broadcasting
//   ops/             one tag per op: GRAD_HD forward/backward functors and host loops;
//                    op_list.hpp lists them all (OpList, op_code, with_op)
//   isa.hpp          run-time instruction-set choice for host loops (with_best_isa, GRAD_ISA)
//   parallel.hpp     the thread pool (set_num_threads, parallel_ranges)
//   arena.hpp        the chunked allocator behind the tape
//   tape.hpp         Tape<T>, Var<T>: nodes, poisoning, requires-grad, mark/reset
//   ops.hpp          a + b, matmul(a, b), softmax(a, axis), ...: checks shapes, records a node
//   backward.hpp     the one reverse walk
//   opt.hpp          SGD, Adam: per-parameter L2, global-norm clipping
//   checkpoint.hpp   save/load parameters and optimizer state
//   nn.hpp           layers as tape builders, up to a Qwen2-style block with LoRA
//   random.hpp       a portable deterministic generator
//
// The device engine (capture, CPU and CUDA backends) links a library:
// #include <grad/device/device.hpp> and depend on grad_device_dep.
#pragma once

#include "grad/backward.hpp"
#include "grad/checkpoint.hpp"
#include "grad/config.hpp"
#include "grad/nn.hpp"
#include "grad/ops.hpp"
#include "grad/opt.hpp"
#include "grad/random.hpp"
#include "grad/tape.hpp"
#include "grad/tensor.hpp"
