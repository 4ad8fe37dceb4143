// grad::emit: one recorded episode of a tape as standalone source code, the
// same bits as the tape. From the capture the device engine uses (the
// Layout of device/capture.hpp and its launch list, device/plan.hpp) it
// writes
//
//   a C++ header   one namespace per program: every shape a compile-time
//                  constant, caller-provided buffers, no heap, no exceptions.
//                  forward(in, p, out_<name>..., ws)  inference: the nodes
//                                                  the outputs need only
//                  forward_flat(in, p, out, ws)    the same, the outputs
//                                                  concatenated (outputs[])
//                  step(in, p, [opt,] ws)          forward, backward and, with
//                                                  an optimizer, its update;
//                                                  returns the loss
//                  value_and_grad(in, x, g)        (optional) the loss and its
//                  value_and_grad(x, g)            gradient for the parameters
//                                                  concatenated in x and g, on
//                                                  the caller's inputs `in`
//                                                  (or the captured ones);
//                                                  GRAD_HD, serial
//                  parameters[], inputs[],         metadata (constexpr
//                  outputs[], *_elements           grad::emitted::TensorInfo):
//                                                  name as given, spelling,
//                                                  node, shape, size, offset
//                                                  in the flat buffer, gradient
//                                                  offset in ws.grad, captured
//                                                  values
//                  params_at(x), inputs_at(data)   Params / Inputs over one
//                                                  flat buffer (those offsets)
//                  size::<name>, init::<name>,     per leaf: size, captured
//                  grad_offset::<name>,            values, gradient offset,
//                  gradient::<name>(ws)            gradient after a step
//   a CUDA file    the same program as per-node __global__ kernels (one
//                  generic kernel per tag and shape), a host function that
//                  launches a step on a stream, and value_and_grad as a
//                  __host__ __device__ function to call from a user's kernel
//                  (each thread its own Inputs: inputs_at(its data)).
//
// Both include only grad/emitted.hpp (config, the op tags, the optimizers'
// element rules): no Boost, no tape, nothing to link. Each node is one call
// of grad::emitted::forward<Tag, shapes> / backward<Tag, In, shapes>: the
// emitter names the node's tag and writes its shapes, it has no per-op code.
// Values are written exactly: hex floats, infinities, NaNs by their bits
// (grad::emitted::from_bits, payload and sign kept), op scalars and leaves
// alike.
//
// Names: the members of Inputs / Params / ParamStore and the entries of
// size::, init::, grad_offset::, gradient:: are the names given (default
// p<node>, in<node>, out<k>), spelt as given or, for a C++ keyword or
// alternative token, a library or grad macro (NULL, errno, INFINITY,
// GRAD_HD, ...) and T, std, grad, load, view, Inputs, Params, ParamStore,
// with a trailing underscore
// (`int` -> `int_`); the tables keep both. Generated names never share a
// scope with user names, so none can collide ("x" next to "x_init",
// "x_size", "k", "ws", "step" is fine). An emitted header #errors if one of
// its spellings is a macro where it is included.
//
// Floating-point contraction: the emitted files (and emitted.hpp) switch it
// off for themselves (GCC: push_options + optimize("fp-contract=off"),
// clang: float_control(push) + fp contract(off)) and restore it at their end,
// so -std=gnu++20 -march=native gives the tape's bits without
// -ffp-contract=off (test_emit checks g++ with -ffp-contract=fast and clang).
// Not covered, and not detectable by any macro: clang's -ffp-contract=fast
// (it overrides the pragma) and nvcc's device code, which needs --fmad=false
// on the command line (the .cuh says so at its top); -ffast-math is #error.
//
// Refusals, like capture's (EmitError, naming the node and why): a poisoned
// tape, a loss that is not one element of this tape, a node whose tag has no
// per-item bodies, an output recorded after the loss, an optimizer over
// another tape or with a learning-rate schedule, a name that is not an
// identifier or that C++ reserves (a double underscore, or _ and a capital
// first), two names with the same spelling ("int" and "int_"), a namespace
// name that is a keyword, macro or std/grad/T. emit_files() builds both texts
// and checks every output path (not a directory, its directory writable, not
// the same file for both outputs through any spelling or link) before it
// writes anything, and writes each file atomically (checkpoint.hpp's
// write_atomically): a refusal or a failed write leaves no file, or the
// previous one, behind.
//
// Where (emit/): spelling.hpp how values and names are written as C++ tokens;
// source.hpp EmitPlan and emit(), the episode checked, laid out and written as both
// texts; files.hpp write_source and emit_files. This header includes all three.
#pragma once

#include "grad/emit/files.hpp"
#include "grad/emit/source.hpp"
#include "grad/emit/spelling.hpp"
