// grad: reverse-mode automatic differentiation on a define-by-run tape.
// Everything of the CPU library, in dependency order:
//
//   config.hpp       GRAD_HD, max_rank, no_node                (host and device)
//   tensor.hpp       Tensor<T>, Shape, Dims, broadcasting
//   numerics/        what the host loops are built from: simd.hpp (vector packs),
//                    isa.hpp (run-time instruction set, GRAD_ISA), parallel.hpp
//                    (the thread pool), gemm.hpp, exact_math.hpp, fixed_order.hpp
//   tags/            one tag per op: its shape rule, GRAD_HD per-item bodies and
//                    host loops (contract.hpp says what a tag is; family.hpp the
//                    Unary/Binary families); op_list.hpp lists them (OpList, with_op)
//   arena.hpp        the chunked allocator behind the tape
//   tape.hpp         Tape<T>, Var<T>: nodes, poisoning, requires-grad, mark/reset
//   record.hpp       a + b, matmul(a, b), softmax(a, axis), ...: record_op<Op>, one node each
//   backward.hpp     the one reverse walk
//   opt.hpp          SGD, Adam, LrSchedule: per-parameter L2, global-norm clipping
//                    (element rules in update_rules.hpp, loops in update.hpp)
//   random.hpp       a portable deterministic generator
//   core.hpp         all of the above: what a training program needs
//   checkpoint.hpp   save/load parameters and optimizer state
//   nn.hpp           layers as tape builders, up to a Qwen2-style block with LoRA
//
// This header is core.hpp plus checkpoint.hpp and nn.hpp. A unit that needs
// neither can include <grad/core.hpp> (a little less to parse).
//
// The everyday training helpers are separate headers, included where used:
//   modules.hpp      nn::Linear, norms, LoRALinear, Sequential: parameters with names
//   model_file.hpp   save_model / load_model by name
//   classify.hpp     cross_entropy with integer labels, argmax, accuracy, confusion matrix
//   lm.hpp           a byte-level transformer language model: config, LoRA, merge, model files, KV-cache decoding
//   data.hpp         Batches (seeded shuffling, short-batch policy), predict under InferenceGuard
//   csv.hpp          read_csv / read_labeled_csv
//   print.hpp        operator<< for tensors and views
//   threading.hpp    threading_thresholds, threading_report
//   inspect.hpp      gradcheck, to_dot (Graphviz), summarize, the profiler's tables and Chrome
//                    trace (anomaly detection and NameScope are in tape.hpp; docs/inspect.md)
// docs/ARCHITECTURE.md has the layers, the op-tag and determinism contracts.
//
// Two modes, same results bit for bit: header-only (the default: every loop
// compiles in the consumer's units, on explicit vector code, so -O1/-O2 run
// as fast as -O3), or linked against the compiled kernel library
// (grad_kernels_dep / grad-kernels.pc define GRAD_COMPILED_KERNELS): the hot
// loops and the reverse walk come precompiled at -O3 (kernels_extern.hpp,
// core.hpp) and the consumer's units compile much faster.
//
// The device engine (capture -> plan -> replay -> launch on the CPU or CUDA
// backend, kernels/) links a library: #include <grad/device/device.hpp> and
// depend on grad_device_dep.
#pragma once

#include "grad/checkpoint.hpp"
#include "grad/core.hpp"
#include "grad/nn.hpp"
