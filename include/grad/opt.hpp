// Optimizers over tape parameters: SGD (with torch's momentum, dampening and
// Nesterov), Adam (grad's efficient form or PyTorch's) and AdamW, each
// parameter with its own decay coefficient, optional global-norm clipping,
// a learning-rate schedule (LrSchedule: warm-up + cosine and torch's step,
// multi-step, exponential, one-cycle and reduce-on-plateau).
//
//   grad::Adam opt(1e-3);                                  // Adam<double>; Adam<float> opt(1e-3f) for a float model
//   grad::Adam torch_adam(1e-3, 0.9, 0.999, 1e-8, grad::AdamForm::pytorch);
//   grad::AdamW opt(1e-3, 0.9, 0.999, 1e-8, /*weight_decay=*/0.01);
//   grad::SGD opt(0.1, /*momentum=*/0.9, /*dampening=*/0.0, /*nesterov=*/true);
//
// The per-element math lives in GRAD_HD rule structs (ClipRule, SgdRule,
// SgdMomentumRule, AdamRule, in update_rules.hpp, which needs no tape) so that
// the device engine calls the very same functions on the GPU and lands on
// the same bits. The host loops (opt/sgd.hpp, opt/adam.hpp) only decide
// which elements go through them, in which order.
//
// Before a step changes anything it checks (Optimizer::ready): parameters
// were added (else std::logic_error), the tape is healthy, every parameter
// is alive, and every reached gradient is finite: a NaN or infinity poisons
// the tape naming the parameter, its shape and the element (NonFinite::refuse,
// the default), or skips the step (NonFinite::skip, GradScaler's behaviour).
//
// One optimizer step, exactly:
//   0. The rate. Without a schedule it is lr (set_lr). With one
//      (set_schedule), the step that makes steps() == t uses
//      lr = T(schedule.at(t)): the first step() is t = 1. LrSchedule::at is
//      the one function that computes it (in double, from + - * / alone),
//      for these optimizers and the device ones alike, so both use the same
//      bits. lr() is always the rate the next step() will use.
//   1. Parameters the latest backward did not reach (tp.has_grad(w) false)
//      are skipped entirely: no decay, moments untouched, no norm share.
//   2. Clipping (when max_norm > 0) looks at the RAW gradients, before L2,
//      as torch.nn.utils.clip_grad_norm_ followed by an optimizer's
//      weight_decay does. Sum of squares in one order: each parameter's
//      g*g summed in the order of every full reduction, each square added
//      by one fma, acc = fma(g, g, acc) (sum_fixed with Square,
//      grad/numerics/fixed_order.hpp: 32 lanes, a fixed tree), then those per-parameter
//      sums in add order, acc = acc + s starting from zero; then
//      norm = sqrt(acc); scale = max_norm / norm if norm > max_norm, else 1.
//      (torch divides by norm + 1e-6; grad does not.)
//   3. Per element: g = fma(grad, scale, l2 * w), then the rule's update,
//      fma(a, b, c) being a*b + c with one rounding (grad::fma_hd):
//      SGD:  w = fma(-lr, g, w)                      (w - lr * g)
//      SGD with momentum (torch.optim.SGD; the buffer is per parameter):
//            buf = g at the parameter's first step, else
//            buf = fma(momentum, buf, (1 - dampening) * g)
//            w = fma(-lr, nesterov ? fma(momentum, buf, g) : buf, w)
//      Adam: m = fma(b1, m, (1 - b1) * g)
//            v = fma(b2, v, (1 - b2) * (g * g))
//            w = fma(-step_size, m / (sqrt(v) / root + eps), w * decay)
//            AdamForm::efficient (default): step_size = lr * sqrt(1 - b2^t) / (1 - b1^t), root = 1
//            AdamForm::pytorch (and AdamW):  step_size = lr / (1 - b1^t),  root = sqrt(1 - b2^t)
//            decay = 1 - lr * weight_decay for AdamW (torch's
//            w * (1 - lr * wd) before the update; l2 is then 0), else 1.
//            Dividing by root = 1 and multiplying by decay = 1 are exact,
//            so the efficient form has the bits it always had.
//      b1^t and b2^t are running products (b1p = b1p * b1 each step), not
//      pow(), so that host and device compute the same constants.
//
// The two forms of Adam: torch (and llm.c) add eps to the bias-corrected
// root, denom = sqrt(v) / sqrt(1 - b2^t) + eps; the efficient form (the
// Adam paper's, grad's default) folds the correction into the step size,
// so its eps equals torch's eps * sqrt(1 - b2^t) (at step 1 with b2 = 0.999,
// eps 1e-8 acts as torch's 3.16e-7: 31.6x larger). Early steps of a ported
// recipe therefore differ unless AdamForm::pytorch is chosen. The default
// stays the efficient form so that every existing run, checkpoint, emitted
// program and README figure keeps its bits; the two agree in exact
// arithmetic when torch's eps is set to eps / sqrt(1 - b2^t) at step t
// (test_optimizers does that). torch also keeps a step count per parameter
// that only advances when that parameter has a gradient; grad has one count
// that advances on every step() (SGD's momentum buffer, by contrast, starts
// at each parameter's own first gradient, as torch's).
//
// After add(), step() allocates nothing: the moments are sized at add().
//
// This header includes every part of the optimizers, each a header of its own:
//   opt/settings.hpp   invalid_setting: the ranges every setting must lie in
//   opt/schedule.hpp   LrSchedule, PlateauState: the rate of each step (no tape)
//   opt/optimizer.hpp  Optimizer<T>: parameters, decay, clipping, the checks before a step
//   opt/sgd.hpp        SGD<T>
//   opt/adam.hpp       Adam<T>, AdamW<T>
#pragma once

#include "grad/backward.hpp"
#include "grad/opt/adam.hpp"
#include "grad/opt/optimizer.hpp"
#include "grad/opt/schedule.hpp"
#include "grad/opt/settings.hpp"
#include "grad/opt/sgd.hpp"
#include "grad/tape.hpp"
#include "grad/update.hpp"
#include "grad/update_rules.hpp"
