// grad: reverse-mode automatic differentiation on a define-by-run tape.
//
//   config.hpp       GRAD_HD, Tier                  (host and device)
//   tensor.hpp       Tensor<T>, Shape, Dims, broadcasting
//   ops/             one tag per op: forward/backward functors; op_list.hpp lists them all
//   tape.hpp         Tape<T>, Var<T>: the arena, poisoning, mark/reset
//   ops.hpp          a + b, matmul(a, b), softmax(a, axis), ...: checks shapes, records a node
//   backward.hpp     the one reverse walk
#pragma once

#include "grad/backward.hpp"
#include "grad/checkpoint.hpp"
#include "grad/config.hpp"
#include "grad/nn.hpp"
#include "grad/ops.hpp"
#include "grad/opt.hpp"
#include "grad/tape.hpp"
#include "grad/tensor.hpp"
