// grad: reverse-mode automatic differentiation on a define-by-run tape.
// Everything of the CPU library, in dependency order:
//
//   config.hpp       GRAD_HD, max_rank, no_node                (host and device)
//   tensor.hpp       Tensor<T>, Shape, Dims, broadcasting
//   numerics/        what the host loops are built from: simd.hpp (vector packs),
//                    isa.hpp (run-time instruction set, GRAD_ISA), parallel.hpp
//                    (the thread pool), gemm.hpp (its stages in gemm/: reference,
//                    problem, split, blocked, one_row, group_terms, packing, terms,
//                    micro_kernel), exact_math.hpp, fixed_order.hpp, quant.hpp and
//                    quant_rows.hpp (llama.cpp's blocks; a matrix's rows in groups
//                    of sixteen), held.hpp (a constant held in 16 bits or blocks)
//   tags/            one tag per op: its shape rule, GRAD_HD per-item bodies and
//                    host loops (contract.hpp says what a tag is; family.hpp the
//                    Unary/Binary families); op_list.hpp lists them (OpList, with_op)
//   arena.hpp        the chunked allocator behind the tape
//   first_fit.hpp    FirstFit: buffers placed by lifetime (a recompute scope's replay)
//   warn.hpp         grad::warn and set_warning_handler (the tape's one-time warnings)
//   tape.hpp         Tape<T>, Var<T>: nodes, poisoning, requires-grad, mark/reset
//                    (tape/node.hpp: Node, Var, View; tape/recompute_scopes.hpp: the
//                    tape's side of recompute scopes, backward's replay)
//   record.hpp       a + b, matmul(a, b), softmax(a, axis), ...: record_op<Op>, one node each
//   backward.hpp     the one reverse walk
//   recompute.hpp    grad::recompute(tp, block): activation recompute (a block's
//                    nodes computed again in backward instead of kept)
//   opt.hpp          SGD (momentum, Nesterov), Adam (efficient or PyTorch form), AdamW,
//                    LrSchedule (warm-up + cosine, step, multi-step, exponential,
//                    one-cycle, plateau): per-parameter decay, global-norm clipping,
//                    non-finite gradients refused (element rules in update_rules.hpp,
//                    loops in update.hpp); it includes opt/settings.hpp (the settings'
//                    ranges), opt/schedule.hpp (LrSchedule), opt/optimizer.hpp (the
//                    Optimizer<T> base), opt/sgd.hpp and opt/adam.hpp (Adam, AdamW)
//   random.hpp       a portable deterministic generator
//   core.hpp         all of the above: the lean header a training program can live on
//   checkpoint.hpp   save/load parameters, optimizer and schedule state, notes
//   loop_state.hpp   LoopState: epoch, best loss, batch position, generator state as notes
//   tensor_math.hpp  eager Tensor math for data pipelines: + - * /, mean, stddev,
//                    standardize, slice_rows, concat
//   nn.hpp           layers as tape builders, up to a Qwen2-style block with LoRA
//                    (nn::cross_entropy_onehot: one-hot targets as a Var)
//   modules.hpp      nn::Linear, norms, LoRALinear, Dropout, Sequential: parameters with
//                    names, train()/eval(), freeze()
//   model_file.hpp   save_model / load_model by name
//   classify.hpp     cross_entropy with integer labels (any integral type), argmax,
//                    accuracy, confusion matrix
//   data.hpp         Batches (seeded shuffling, short-batch policy), predict under InferenceGuard
//   csv.hpp          read_csv / read_labeled_csv
//   lm.hpp           a byte-level transformer language model: config, LoRA, merge, model files, KV-cache decoding
//   print.hpp        operator<< for tensors and views
//   threading.hpp    threading_thresholds, threading_report
//   inspect.hpp      gradcheck, to_dot (Graphviz), summarize, the profiler's tables and Chrome
//                    trace (anomaly detection and NameScope are in tape.hpp; docs/inspect.md)
//   emit.hpp         grad::emit: a recorded step as standalone C++/CUDA source (emit/:
//                    spelling.hpp the tokens, source.hpp EmitPlan and emit(), files.hpp
//                    write_source and emit_files)
//
// Second-order derivatives are opt-in, so a program that names no dual type
// compiles no dual code: <grad/func.hpp> (grad::func::jvp, hvp, hessian,
// jacobian, mixed over Tape<Dual<T>>; numerics/dual.hpp, dual.hpp;
// docs/second_order.md).
//
// This header is all of them: every header-only public header. <grad/core.hpp>
// is the lean one (about 2/3 of the parse time). Not here, because they link a
// library: the device engine (<grad/device/device.hpp>, grad_device_dep) and
// grad::dist (<grad/dist.hpp>, grad_dist_dep for MPI; dist_nccl.hpp for NCCL), and
// grad::hf (<grad/hf/*.hpp>, grad_hf_dep: Hugging Face checkpoints, tokenizers,
// GGUF export; it needs nlohmann-json and PCRE2).
//
// Three losses, by what the targets are (each name says it; the overloads of
// plain cross_entropy are kept for programs written against them):
//   cross_entropy_labels(logits, labels)  integer class ids on the host (a std::vector
//                                         or span of any integral type): classify.hpp
//   cross_entropy_ids(logits, ids, ignore) ids as a constant Var, rows equal to ignore
//                                         left out; one node (the LM's): record.hpp
//   nn::cross_entropy_onehot(logits, onehot) one-hot targets as a Var: nn.hpp
// docs/ARCHITECTURE.md has the layers, the op-tag and determinism contracts.
//
// Two modes, same results bit for bit: header-only (the default: every loop
// compiles in the consumer's units, on explicit vector code, so -O1/-O2 run
// as fast as -O3), or linked against the compiled kernel library
// (grad_kernels_dep / grad-kernels.pc define GRAD_COMPILED_KERNELS): the hot
// loops and the reverse walk come precompiled (kernels_extern.hpp,
// core.hpp) and the consumer's units compile much faster.
//
// The device engine (capture -> plan -> replay -> launch on the CPU or CUDA
// backend, kernels/) links a library: #include <grad/device/device.hpp> and
// depend on grad_device_dep.
#pragma once

#include "grad/core.hpp"

#include "grad/checkpoint.hpp"
#include "grad/classify.hpp"
#include "grad/csv.hpp"
#include "grad/data.hpp"
#include "grad/emit.hpp"
#include "grad/inspect.hpp"
#include "grad/lm.hpp"
#include "grad/loop_state.hpp"
#include "grad/model_file.hpp"
#include "grad/modules.hpp"
#include "grad/nn.hpp"
#include "grad/print.hpp"
#include "grad/tensor_math.hpp"
#include "grad/threading.hpp"
