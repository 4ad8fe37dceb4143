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
// the same bits. The host loops below only decide which elements go
// through them, in which order.
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
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "grad/backward.hpp"
#include "grad/tape.hpp"
#include "grad/update.hpp"
#include "grad/update_rules.hpp"

namespace grad {

enum class OptimizerKind : std::uint32_t { sgd = 1, adam = 2, adamw = 3 };

// What step() does with a non-finite (NaN or infinite) gradient, found
// before anything changes:
//   refuse  (default) poison the tape with a message naming the parameter,
//           its shape and the first bad element; return false. A NaN
//           gradient is almost always a bug or a diverged run, and an
//           update would turn every weight it touches into NaN for good.
//   skip    change nothing, count the step in skipped_steps() and return
//           false: torch.cuda.amp.GradScaler's skip, for runs that expect
//           an occasional overflow (float32 with a large loss scale).
enum class NonFinite : unsigned char { refuse, skip };

// The ranges an optimizer's settings must lie in (what torch.optim refuses,
// plus NaN and infinities, which would only turn every weight into NaN).
// Constructors and setters throw std::invalid_argument with this message;
// load_checkpoint refuses a file whose settings fall outside them.
//   lr, eps, l2      finite and >= 0 (also a schedule's base_lr and min_lr)
//   beta1, beta2     0 <= beta < 1 (beta = 1 divides by 1 - beta^t = 0)
//   clip             >= 0; 0 turns clipping off, +inf never clips
//   beta1^t, beta2^t 0 <= power <= 1 (a checkpoint's running powers)
// Returns "" when `value` is fine for `setting`.
inline std::string invalid_setting(std::string_view setting, double value) {
  struct Rule {
    std::string_view name;
    bool (*ok)(double);
    std::string_view expected;
  };
  static constexpr Rule rules[] = {
      {"lr", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"base_lr", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"min_lr", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"eps", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"l2", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"beta1", [](double x) { return x >= 0 && x < 1; }, "0 <= beta1 < 1"},
      {"beta2", [](double x) { return x >= 0 && x < 1; }, "0 <= beta2 < 1"},
      {"clip", [](double x) { return x >= 0; }, "max_norm >= 0 (0 turns clipping off)"},
      {"beta1^t", [](double x) { return x >= 0 && x <= 1; }, "0 <= beta1^t <= 1"},
      {"beta2^t", [](double x) { return x >= 0 && x <= 1; }, "0 <= beta2^t <= 1"},
      {"momentum", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"dampening", [](double x) { return x >= 0 && x <= 1; }, "0 <= dampening <= 1"},
      {"weight_decay", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"gamma", [](double x) { return x > 0 && x <= 1; }, "0 < gamma <= 1 (a decay factor)"},
      {"factor", [](double x) { return x >= 0 && x < 1; }, "0 <= factor < 1"},
      {"threshold", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"div_factor", [](double x) { return std::isfinite(x) && x >= 1; }, "a finite value >= 1"},
      {"final_div_factor", [](double x) { return std::isfinite(x) && x >= 1; }, "a finite value >= 1"},
      {"pct_start", [](double x) { return x > 0 && x < 1; }, "0 < pct_start < 1"},
      {"schedule eps", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"metric", [](double x) { return std::isfinite(x); }, "a finite value"},
  };
  for (const Rule& r : rules) {
    if (r.name != setting) continue;
    if (r.ok(value)) return {};
    char number[32];
    std::snprintf(number, sizeof number, "%.17g", value);
    return std::string(setting) + " " + number + " is out of range: expected " + std::string(r.expected);
  }
  return "unknown setting '" + std::string(setting) + "'";
}

// invalid_setting for a value an optimizer holds as U (float or double):
// the value must be in range as given and as U. A float optimizer would
// otherwise accept base_lr 1e300 (finite as a double, an infinite rate as
// float) or beta2 0.999999999 (1 as float: a division by 1 - 1).
template <class U>
std::string invalid_setting_as(std::string_view setting, double value) {
  if (std::string why = invalid_setting(setting, value); !why.empty()) return why;
  // Tested before converting: an out-of-range conversion is undefined.
  const double as = std::abs(value) > static_cast<double>(std::numeric_limits<U>::max())
                        ? std::copysign(std::numeric_limits<double>::infinity(), value)
                        : static_cast<double>(static_cast<U>(value));
  std::string why = invalid_setting(setting, as);
  if (why.empty()) return why;
  char given[32], becomes[32];
  std::snprintf(given, sizeof given, "%.17g", value);
  std::snprintf(becomes, sizeof becomes, "%.9g", as);
  return std::string(setting) + " " + given + " is " + becomes + " as " +
         (std::is_same_v<U, float> ? "float32" : "float64") + ", " + why.substr(why.find("out of range"));
}

namespace detail {

// cos(pi * p) for 0 <= p <= 1, from + - * / alone: sin(x) at x = pi * (1/2 - p)
// in [-pi/2, pi/2] as its Taylor polynomial to x^23 (truncation below 1e-18),
// in Horner form. Within a few ulp of cos; no libm, whose cos may differ
// between machines or instruction sets (glibc picks an FMA variant at run
// time), so a schedule's rate is the same bits everywhere.
inline double cos_pi(double p) {
  const double x = 3.141592653589793 * (0.5 - p);
  const double x2 = x * x;
  double s = 1.0;
  for (int k = 11; k >= 1; --k) s = 1.0 - x2 / static_cast<double>((2 * k) * (2 * k + 1)) * s;
  return x * s;
}

// x^k by repeated squaring: multiplications alone, so the same bits on
// every machine (libm's pow may differ between them).
inline double power(double x, std::uint64_t k) {
  double result = 1.0;
  for (; k > 0; k >>= 1, x = x * x)
    if (k & 1) result = result * x;
  return result;
}

}  // namespace detail

// A learning-rate schedule, one of the shapes of torch.optim.lr_scheduler.
// Step t (the t-th step() call, t >= 1; t = steps() after that step) uses
// at(t), computed in double from + - * / alone (cos as detail::cos_pi,
// powers as detail::power), so host and device optimizers use the same bits
// on every machine.
//
// warmup_cosine (the default; grad's own): linear warm-up from 0, then a cosine decay
//   t <= warmup         base_lr * t / warmup  (base_lr / warmup at t = 1, base_lr at t = warmup)
//   warmup < t < total  min_lr + (base_lr - min_lr) * (0.5 * (1 + cos(pi * p))), p = (t - warmup) / (total - warmup)
//   t >= total          min_lr (constant after the decay; t > warmup)
//   warmup = 0: no warm-up, the decay starts at t = 1 (p = 1 / total);
//   warmup = total: no decay, min_lr after the warm-up.
// warmup_cosine_hf: Hugging Face transformers' get_cosine_schedule_with_warmup
//   (get_cosine_with_min_lr_schedule_with_warmup for min_lr > 0), whose
//   LambdaLR gives step t its lambda(t - 1): grad's shape one step later.
//   With u = t - 1:
//   u < warmup          base_lr * u / warmup  (0 at t = 1, base_lr at t = warmup + 1)
//   warmup <= u < total min_lr + (base_lr - min_lr) * (0.5 * (1 + cos(pi * p))), p = (u - warmup) / (total - warmup)
//   u >= total          min_lr (transformers' cosine would rise again past total)
// LrSchedule::warmup_cosine(base_lr, warmup, total, min_lr, start) makes either.
// The torch shapes count as torch does when scheduler.step() follows every
// optimizer.step(): step t runs at torch's last_epoch e = t - 1. Their
// periods (step_size, milestones, total) are in optimizer steps.
//   step          StepLR:        base_lr * gamma^(e / step_size)
//   multi_step    MultiStepLR:   base_lr * gamma^(milestones <= e)
//   exponential   ExponentialLR: base_lr * gamma^e
//   one_cycle     OneCycleLR (anneal 'cos', two phases, cycle_momentum=False):
//                 from base_lr / div_factor up to base_lr (the max) over the
//                 first pct_start * total steps, then down to
//                 base_lr / div_factor / final_div_factor at t = total;
//                 held there after (torch raises past total).
//   plateau       ReduceLROnPlateau: starts at base_lr; each
//                 opt.report_metric(value) (torch's scheduler.step(value))
//                 counts a bad report when the value is not better than the
//                 best by threshold (threshold_mode rel: best * (1 -+ threshold),
//                 abs: best -+ threshold; mode min or max); after more than
//                 patience bad reports in a row the rate becomes
//                 max(rate * factor, min_lr) (when that lowers it by more
//                 than eps), then cooldown reports count no bad ones. Its
//                 state (PlateauState) is the optimizer's and in checkpoints.
// Valid settings (invalid() says which one is not): base_lr and min_lr
// finite, 0 <= min_lr <= base_lr; warmup_cosine: total >= 1, warmup <= total;
// step: step_size >= 1; multi_step: milestones strictly ascending; gamma in
// (0, 1] (every rate stays within [0, base_lr]); one_cycle: total >= 1,
// pct_start in (0, 1) with pct_start * total > 1 (torch divides by zero
// otherwise), div factors >= 1; plateau: 0 <= factor < 1, threshold and
// eps finite >= 0.
//
//   grad::Adam opt(1e-3);
//   opt.set_schedule({.base_lr = 1e-3, .min_lr = 1e-5, .warmup = 100, .total = 10000});
//   opt.set_schedule(grad::LrSchedule::warmup_cosine(1e-3, 100, 10000, 1e-5, grad::WarmupStart::zero));
//   opt.set_schedule(grad::LrSchedule::step(0.1, /*step_size=*/30, /*gamma=*/0.1));
enum class LrShape : std::uint32_t {
  warmup_cosine = 0,
  step = 1,
  multi_step = 2,
  exponential = 3,
  one_cycle = 4,
  plateau = 5,
  warmup_cosine_hf = 6
};
// The rate of a warm-up + cosine schedule's first step.
enum class WarmupStart : std::uint32_t {
  one_step = 0,  // base_lr / warmup (grad's warmup_cosine): step t is at t / warmup of the warm-up
  zero = 1,      // 0, Hugging Face transformers' (warmup_cosine_hf): step t is at (t - 1) / warmup
};

// The most steps() an optimizer counts: 2^53, the integers a double (the
// schedules' arithmetic) counts exactly. A checkpoint claiming more is
// refused (at(steps + 1) would wrap at 2^64 - 1).
inline constexpr std::uint64_t max_steps = std::uint64_t(1) << 53;
enum class PlateauMode : std::uint32_t { min = 0, max = 1 };
enum class ThresholdMode : std::uint32_t { rel = 0, abs = 1 };

// A reduce-on-plateau schedule's running state (torch's attributes).
struct PlateauState {
  double lr = 0;                    // the current rate
  double best = 0;                  // the best reported metric (+inf / -inf before the first)
  std::uint64_t bad_reports = 0;    // num_bad_epochs
  std::uint64_t cooldown_left = 0;  // cooldown_counter
  std::uint64_t reports = 0;        // last_epoch: metrics reported so far
  bool operator==(const PlateauState&) const = default;
};

struct LrSchedule {
  double base_lr = 0;
  double min_lr = 0;
  std::uint64_t warmup = 0;
  std::uint64_t total = 1;
  LrShape shape = LrShape::warmup_cosine;
  double gamma = 0.1;                      // step, multi_step, exponential
  std::uint64_t step_size = 1;             // step
  std::vector<std::uint64_t> milestones = {};  // multi_step
  double pct_start = 0.3;                  // one_cycle
  double div_factor = 25;                  // one_cycle
  double final_div_factor = 1e4;           // one_cycle
  PlateauMode mode = PlateauMode::min;     // plateau
  double factor = 0.1;                     // plateau
  std::uint64_t patience = 10;             // plateau
  double threshold = 1e-4;                 // plateau
  ThresholdMode threshold_mode = ThresholdMode::rel;  // plateau
  std::uint64_t cooldown = 0;              // plateau
  double eps = 1e-8;                       // plateau: smaller reductions are ignored
  bool operator==(const LrSchedule&) const = default;

  // Linear warm-up over `warmup` steps, then a cosine decay to min_lr at
  // step `total`: grad's shape (WarmupStart::one_step) or Hugging Face's
  // (WarmupStart::zero, one step later: 0 at step 1).
  static LrSchedule warmup_cosine(double base_lr, std::uint64_t warmup, std::uint64_t total, double min_lr = 0,
                                  WarmupStart start = WarmupStart::one_step) {
    return {.base_lr = base_lr,
            .min_lr = min_lr,
            .warmup = warmup,
            .total = total,
            .shape = start == WarmupStart::zero ? LrShape::warmup_cosine_hf : LrShape::warmup_cosine};
  }
  static LrSchedule step(double base_lr, std::uint64_t step_size, double gamma = 0.1) {
    return {.base_lr = base_lr, .shape = LrShape::step, .gamma = gamma, .step_size = step_size};
  }
  static LrSchedule multi_step(double base_lr, std::vector<std::uint64_t> milestones, double gamma = 0.1) {
    return {.base_lr = base_lr, .shape = LrShape::multi_step, .gamma = gamma, .milestones = std::move(milestones)};
  }
  static LrSchedule exponential(double base_lr, double gamma) {
    return {.base_lr = base_lr, .shape = LrShape::exponential, .gamma = gamma};
  }
  static LrSchedule one_cycle(double max_lr, std::uint64_t total, double pct_start = 0.3, double div_factor = 25,
                              double final_div_factor = 1e4) {
    return {.base_lr = max_lr,
            .total = total,
            .shape = LrShape::one_cycle,
            .pct_start = pct_start,
            .div_factor = div_factor,
            .final_div_factor = final_div_factor};
  }
  static LrSchedule plateau(double base_lr, double factor = 0.1, std::uint64_t patience = 10) {
    return {.base_lr = base_lr, .shape = LrShape::plateau, .factor = factor, .patience = patience};
  }

  // The rate of step t (t >= 1). Only for a schedule whose invalid() is "";
  // a plateau schedule's rate is its state's (rate()), base_lr here.
  double at(std::uint64_t t) const {
    const std::uint64_t e = t - 1;
    switch (shape) {
      case LrShape::step:
        return base_lr * detail::power(gamma, e / step_size);
      case LrShape::multi_step:
        return base_lr * detail::power(gamma, static_cast<std::uint64_t>(std::upper_bound(milestones.begin(),
                                                                                        milestones.end(), e) -
                                                                       milestones.begin()));
      case LrShape::exponential:
        return base_lr * detail::power(gamma, e);
      case LrShape::one_cycle:
        return one_cycle_at(e);
      case LrShape::plateau:
        return base_lr;
      case LrShape::warmup_cosine_hf:
        return warmup_cosine_at(e, true);
      case LrShape::warmup_cosine:
        break;
    }
    return warmup_cosine_at(t, false);
  }
  // The rate of step t given a plateau schedule's state.
  double rate(std::uint64_t t, const PlateauState& state) const { return shape == LrShape::plateau ? state.lr : at(t); }

  // A plateau schedule's state before any report.
  PlateauState start() const {
    const double worst = mode == PlateauMode::min ? INFINITY : -INFINITY;
    return {.lr = base_lr, .best = worst};
  }
  // One reported metric (finite: the caller checks), torch's
  // ReduceLROnPlateau.step(metric) line by line.
  void report(PlateauState& s, double metric) const {
    ++s.reports;
    const bool rel = threshold_mode == ThresholdMode::rel;
    const bool better = mode == PlateauMode::min
                            ? metric < (rel ? s.best * (1.0 - threshold) : s.best - threshold)
                            : metric > (rel ? s.best * (threshold + 1.0) : s.best + threshold);
    if (better) {
      s.best = metric;
      s.bad_reports = 0;
    } else {
      ++s.bad_reports;
    }
    if (s.cooldown_left > 0) {
      --s.cooldown_left;
      s.bad_reports = 0;
    }
    if (s.bad_reports > patience) {
      const double lowered = std::max(s.lr * factor, min_lr);
      if (s.lr - lowered > eps) s.lr = lowered;
      s.cooldown_left = cooldown;
      s.bad_reports = 0;
    }
  }

  // "" when every setting is in range; otherwise what is wrong, as invalid_setting words it.
  std::string invalid() const {
    if (std::string why = invalid_setting("base_lr", base_lr); !why.empty()) return why;
    if (std::string why = invalid_setting("min_lr", min_lr); !why.empty()) return why;
    char a[32], b[32];
    if (min_lr > base_lr) {
      std::snprintf(a, sizeof a, "%.17g", min_lr);
      std::snprintf(b, sizeof b, "%.17g", base_lr);
      return std::string("min_lr ") + a + " is out of range: expected 0 <= min_lr <= base_lr (" + b + ")";
    }
    switch (shape) {
      case LrShape::warmup_cosine:
      case LrShape::warmup_cosine_hf:
        if (total < 1) return "total 0 is out of range: expected total >= 1 (the step at which the decay ends)";
        if (warmup > total)
          return "warmup " + std::to_string(warmup) + " is out of range: expected warmup <= total (" +
                 std::to_string(total) + ")";
        return {};
      case LrShape::step:
        if (step_size < 1) return "step_size 0 is out of range: expected step_size >= 1";
        return invalid_setting("gamma", gamma);
      case LrShape::multi_step:
        for (std::size_t k = 1; k < milestones.size(); ++k)
          if (milestones[k] <= milestones[k - 1])
            return "milestones are out of order: " + std::to_string(milestones[k]) + " after " +
                   std::to_string(milestones[k - 1]) + "; expected strictly ascending steps";
        return invalid_setting("gamma", gamma);
      case LrShape::exponential:
        return invalid_setting("gamma", gamma);
      case LrShape::one_cycle:
        if (total < 1) return "total 0 is out of range: expected total >= 1 (the steps of the cycle)";
        for (const auto& [name, value] :
             {std::pair{"pct_start", pct_start}, {"div_factor", div_factor}, {"final_div_factor", final_div_factor}})
          if (std::string why = invalid_setting(name, value); !why.empty()) return why;
        if (!(pct_start * static_cast<double>(total) > 1.0))
          return "pct_start * total is " + std::to_string(pct_start * static_cast<double>(total)) +
                 ": expected more than 1 step of warm-up";
        return {};
      case LrShape::plateau:
        for (const auto& [name, value] : {std::pair{"factor", factor}, {"threshold", threshold}, {"schedule eps", eps}})
          if (std::string why = invalid_setting(name, value); !why.empty()) return why;
        if (mode != PlateauMode::min && mode != PlateauMode::max) return "mode is neither min nor max";
        if (threshold_mode != ThresholdMode::rel && threshold_mode != ThresholdMode::abs)
          return "threshold_mode is neither rel nor abs";
        return {};
    }
    return "shape " + std::to_string(static_cast<std::uint32_t>(shape)) + " is not a schedule shape";
  }

 private:
  // warmup_cosine at t; from_zero: the Hugging Face form (u = t - 1 given as t).
  double warmup_cosine_at(std::uint64_t t, bool from_zero) const {
    if (from_zero ? t < warmup : t <= warmup) return base_lr * static_cast<double>(t) / static_cast<double>(warmup);
    if (t >= total) return min_lr;
    const double p = static_cast<double>(t - warmup) / static_cast<double>(total - warmup);
    return min_lr + (base_lr - min_lr) * (0.5 * (1.0 + detail::cos_pi(p)));
  }
  // OneCycleLR.get_lr at step_num = e (clamped to the last step), torch's
  // _annealing_cos(start, end, pct) = end + (start - end) / 2 * (cos(pi * pct) + 1).
  double one_cycle_at(std::uint64_t e) const {
    const double initial = base_lr / div_factor, final_lr = initial / final_div_factor;
    const double peak = pct_start * static_cast<double>(total) - 1.0;  // phase 1 ends at this step
    const double last = static_cast<double>(total) - 1.0;
    const double x = std::min(static_cast<double>(e), last);
    auto anneal = [](double start, double end, double pct) {
      return end + (start - end) / 2.0 * (detail::cos_pi(pct) + 1.0);
    };
    if (x <= peak) return anneal(initial, base_lr, x / peak);
    return anneal(base_lr, final_lr, (x - peak) / (last - peak));
  }
};

// What is wrong with `schedule` for an optimizer whose scalar is U ("" if
// nothing): a setting out of range (LrSchedule::invalid), or a rate that is
// not finite as U. Every rate lies in [0, base_lr] (they are computed in
// double and used as U), so base_lr and min_lr in range as U suffice: a
// float optimizer refuses base_lr 1e300 or 3.5e38, which float would make inf.
template <class U>
std::string schedule_invalid_as(const LrSchedule& schedule) {
  if (std::string why = schedule.invalid(); !why.empty()) return why;
  for (const auto& [setting, value] : {std::pair{"base_lr", schedule.base_lr}, std::pair{"min_lr", schedule.min_lr}})
    if (std::string why = invalid_setting_as<U>(setting, value); !why.empty()) return why;
  return {};
}

// "" when an optimizer may have taken `steps` steps (steps < max_steps);
// otherwise the field, the value and the bound.
inline std::string invalid_steps(std::uint64_t steps) {
  if (steps < max_steps) return {};
  return "steps " + std::to_string(steps) + " is out of range: expected steps < 2^53 (" + std::to_string(max_steps) +
         "), the step counts a schedule's rate at(steps + 1) is defined for";
}

// What SGD and Adam share: the parameter list, L2 coefficients, clipping,
// the schedule, and the checks before a step.
template <class T>
class Optimizer {
  static_assert(Scalar<T>, "optimizers are for T = float or double");

 public:
  using value_type = T;  // the parameters' element type

  struct Entry {
    Var<T> var;
    T l2;
    std::size_t offset;  // into the moment buffers (Adam) and momentum buffers (SGD); running element count
    std::size_t size;
    T weight_decay = T(0);  // AdamW's decoupled decay (0 for SGD and Adam)
  };

  // A parameter of another precision than the optimizer's: an error at the
  // caller's line rather than deep inside a template. grad::Adam opt(0.005)
  // deduces Adam<double> from the double literal; a float model needs
  // grad::Adam<float> opt(0.005f) (or grad::Adam opt(0.005f)).
  template <class U>
    requires(!std::is_same_v<U, T>)
  bool add(Var<U>, T = T(0)) {
    static_assert(std::is_same_v<U, T>,
                  "grad optimizer add(): the parameter's precision differs from the optimizer's (e.g. a float model "
                  "with grad::Adam opt(0.005), which is Adam<double>): declare grad::Adam<float> opt(0.005f)");
    return false;
  }

  // Adds a parameter (a tp.param leaf) with its own decay coefficient: an L2
  // term for SGD and Adam, the decoupled weight decay for AdamW (as torch's
  // weight_decay means in each; default 0, AdamW's its weight_decay()).
  // Returns false, poisoning the tape with a message, for a constant, a
  // computed node, a dropped Var, a parameter added twice or one from another
  // tape than the first, or a coefficient out of range; throws
  // std::invalid_argument for a default Var.
  bool add(Var<T> param) { return add(param, default_decay()); }
  bool add(Var<T> param, T decay) {
    if (!param.tape())
      throw std::invalid_argument(std::string(kind_name()) + ".add: the parameter is a default-constructed Var");
    Tape<T>& tp = *param.tape();
    const std::string who = std::string(kind_name()) + ".add: parameter " + std::to_string(entries_.size() + 1);
    if (!tp.accept(who, {param})) return false;
    if (tape_ && tape_ != &tp)
      return fail(tp, who + " belongs to a different tape than the parameters added before it");
    if (!tp.requires_grad(param) || tp.leaf_value(param).empty())
      return fail(tp, who + " (node " + std::to_string(param.index()) +
                          ") is not a parameter; expected a Var made by tape.param(tensor)");
    for (const Entry& e : entries_)
      if (e.var.index() == param.index())
        return fail(tp, who + " (node " + std::to_string(param.index()) + ") was already added");
    const bool decoupled = decouples_decay();
    if (const std::string why = invalid_setting(decoupled ? "weight_decay" : "l2", decay); !why.empty())
      return fail(tp, who + ": " + why);
    tape_ = &tp;
    tp.note_optimizer();
    const std::size_t size = tp.value(param).size();
    entries_.push_back({param, decoupled ? T(0) : decay, elements_, size, decoupled ? decay : T(0)});
    elements_ += size;
    on_add(size);
    return true;
  }

  // What step() does with a NaN or infinite gradient (NonFinite: refuse by
  // default, or skip); skipped_steps() counts the steps skipped so far.
  void set_nonfinite(NonFinite policy) { nonfinite_ = policy; }
  NonFinite nonfinite() const { return nonfinite_; }
  std::uint64_t skipped_steps() const { return skipped_steps_; }

  // Global-norm clipping threshold; 0 turns clipping off. Throws
  // std::invalid_argument for a negative or NaN threshold.
  void set_clip(T max_norm) { clip_ = checked("clip", max_norm); }
  T clip() const { return clip_; }
  // The rate the next step() uses (with a schedule: T(schedule.at(steps() + 1))).
  T lr() const { return lr_; }
  // A constant rate from now on, replacing any schedule. Throws
  // std::invalid_argument for a negative, infinite or NaN rate.
  void set_lr(T lr) {
    lr_ = checked("lr", lr);
    schedule_.reset();
  }
  // From now on step t (the step that makes steps() == t) uses
  // T(schedule.at(t)); a schedule attached after k steps continues at t = k + 1
  // (a plateau schedule starts at base_lr, its state fresh). Throws
  // std::invalid_argument naming the setting out of range
  // (LrSchedule::invalid). save_checkpoint stores it with its state;
  // load_checkpoint restores it, so a resumed run needs no re-attaching.
  void set_schedule(const LrSchedule& schedule) {
    if (std::string why = schedule_invalid_as<T>(schedule); !why.empty())
      throw std::invalid_argument(std::string(kind_) + ".set_schedule: " + why);
    schedule_ = schedule;
    plateau_ = schedule.start();
    lr_ = static_cast<T>(schedule_->rate(steps_ + 1, plateau_));
  }
  // Back to a constant rate: lr() as the schedule would have set the next step.
  void clear_schedule() { schedule_.reset(); }
  const std::optional<LrSchedule>& schedule() const { return schedule_; }
  // A plateau schedule's state (the rate, best metric, counters).
  const PlateauState& plateau_state() const { return plateau_; }
  // Feeds a plateau schedule one metric (torch's scheduler.step(metric));
  // lr() is then the rate of the next step. Throws std::logic_error without
  // a plateau schedule and std::invalid_argument for a NaN or infinite
  // metric (which torch would silently count as a bad report), changing nothing.
  void report_metric(double metric) {
    const std::string who = std::string(kind_) + ".report_metric: ";
    if (!schedule_ || schedule_->shape != LrShape::plateau)
      throw std::logic_error("grad: " + who + "the optimizer has no reduce-on-plateau schedule (LrShape::plateau)");
    if (std::string why = invalid_setting("metric", metric); !why.empty())
      throw std::invalid_argument("grad: " + who + why);
    schedule_->report(plateau_, metric);
    lr_ = static_cast<T>(plateau_.lr);
  }

  // "" for an update grad::emit writes (SGD without momentum, Adam in its
  // efficient form); otherwise the feature ("momentum", "the PyTorch form",
  // "decoupled weight decay"), which emit refuses by name rather than write
  // another rule.
  virtual std::string feature_not_emitted() const { return {}; }
  // Completed steps.
  std::uint64_t steps() const { return steps_; }

  std::span<const Entry> params() const { return entries_; }
  std::size_t elements() const { return elements_; }
  Tape<T>* tape() const { return tape_; }

  // The clip factor for the current gradients (1 when off), in the order the
  // header documents. Exposed so tests and the device engine can check it.
  T clip_scale() const {
    if (clip_ == T(0) || !tape_) return T(1);
    T acc = T(0);
    for (const Entry& e : entries_)
      if (tape_->has_grad(e.var)) {
        const View<T> g = tape_->grad(e.var);
        T share = T(0);
        // In the best instruction set's copy: each fma one vfmadd, not a libm call.
        with_best_isa([&] { share = ClipRule::squares(g.data.data(), g.size()); });
        acc = ClipRule::accumulate(acc, share);
      }
    return ClipRule::scale(acc, clip_);
  }

 protected:
  Optimizer(std::string_view kind, T lr) : kind_(kind), lr_(checked("lr", lr)) {}
  virtual ~Optimizer() = default;

  // `value`, or std::invalid_argument naming the optimizer and the range.
  T checked(std::string_view setting, T value) const {
    if (std::string why = invalid_setting(setting, value); !why.empty())
      throw std::invalid_argument(std::string(kind_) + ": " + why);
    return value;
  }

  // Before a step changes anything: at least one parameter was added (a
  // step of none is a mistake: std::logic_error, as torch refuses an empty
  // parameter list), the tape is healthy, every added parameter is still a
  // live node of it (a parameter dropped by reset_to poisons the tape:
  // skipping it silently would train a different model), and every reached
  // gradient is finite (NonFinite says what happens otherwise).
  //
  // A step on a poisoned tape changes nothing and returns false; it also says
  // so on stderr, once per optimizer ("grad: adam.step: the tape is
  // poisoned, no parameter was updated: <the tape's error>"), because a
  // training loop that ignores the result would otherwise keep printing NaN
  // losses with no hint of why. In exception mode (Tape::throw_on_error) the
  // op that poisoned the tape has already thrown.
  bool ready() {
    if (!tape_)
      throw std::logic_error("grad: " + std::string(kind_) +
                             ".step: the optimizer has no parameters; add them first (opt.add(param) or "
                             "grad::nn::add_parameters(opt, model))");
    if (!tape_->ok()) {
      if (!warned_poisoned_)
        std::fprintf(stderr, "grad: %s.step: the tape is poisoned, no parameter was updated: %s\n",
                     std::string(kind_).c_str(), tape_->error().c_str());
      warned_poisoned_ = true;
      return false;
    }
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (tape_->value(entries_[i].var).empty())
        return fail(*tape_, std::string(kind_) + ".step: parameter " + std::to_string(i + 1) + " " +
                                tape_->dropped_description(entries_[i].var) +
                                " was dropped by reset_to after it was added: take the mark after registering "
                                "parameters");
    return gradients_finite();
  }

  // The non-finite check, before anything changes.
  bool gradients_finite() {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (!tape_->has_grad(entries_[i].var)) continue;
      const View<T> g = tape_->grad(entries_[i].var);
      const T* p = g.data.data();
      bool finite = true;
      for (std::size_t k = 0; k < g.size(); ++k) finite = finite & std::isfinite(p[k]);  // no early exit: vectorizes
      if (finite) continue;
      if (nonfinite_ == NonFinite::skip) {
        ++skipped_steps_;
        tape_->note_step();  // the skipped gradients are consumed: the next accumulate starts afresh
        return false;
      }
      std::size_t k = 0;
      while (std::isfinite(p[k])) ++k;
      char value[32];
      std::snprintf(value, sizeof value, "%g", static_cast<double>(p[k]));
      fail(*tape_, std::string(kind_) + ".step: parameter " + std::to_string(i + 1) + " (node " +
                       std::to_string(entries_[i].var.index()) + ", shape " + shape_string(g.shape) +
                       ") has a non-finite gradient (element " + std::to_string(k) + " is " + value +
                       "); no parameter was updated (tp.detect_anomalies(true) names the first op that makes a "
                       "NaN or inf; opt.set_nonfinite(grad::NonFinite::skip) skips such steps instead)");
      // Said by the refusing step itself (a run whose last step refuses
      // still leaves the line), and not again by the steps after it.
      if (!warned_poisoned_) std::fprintf(stderr, "%s\n", tape_->error().c_str());
      warned_poisoned_ = true;
      return false;
    }
    return true;
  }
  virtual const char* kind_name() const = 0;
  virtual void on_add(std::size_t) {}
  // AdamW: add()'s coefficient is a decoupled weight decay, not L2.
  virtual bool decouples_decay() const { return false; }
  virtual T default_decay() const { return T(0); }

  // The rate of the step about to run (a schedule's value for t = steps() + 1).
  T begin_step() {
    if (schedule_) lr_ = static_cast<T>(schedule_->rate(steps_ + 1, plateau_));
    return lr_;
  }
  // Counts the step; lr() becomes the next step's rate.
  void end_step() {
    ++steps_;
    if (tape_) tape_->note_step();
    if (schedule_) lr_ = static_cast<T>(schedule_->rate(steps_ + 1, plateau_));
  }

  bool fail(Tape<T>& tp, std::string message) {
    tp.poison(std::move(message));
    return false;
  }

  // Calls f(entry, value span, grad span, clip scale) for every parameter
  // the latest backward reached. Call ready() first.
  template <class F>
  void for_each_reached(F&& f) {
    if (!tape_) return;
    const T scale = clip_scale();
    for (const Entry& e : entries_) {
      if (!tape_->has_grad(e.var)) continue;
      f(e, tape_->leaf_value(e.var), tape_->grad(e.var).data, scale);
    }
  }

  std::vector<Entry> entries_;
  std::size_t elements_ = 0;
  Tape<T>* tape_ = nullptr;
  std::string_view kind_;
  T lr_;
  T clip_ = T(0);
  std::optional<LrSchedule> schedule_;
  PlateauState plateau_;
  std::uint64_t steps_ = 0;
  std::uint64_t skipped_steps_ = 0;
  NonFinite nonfinite_ = NonFinite::refuse;
  bool warned_poisoned_ = false;  // the poisoned-step message is printed once

  template <class U, class Opt>
  friend struct CheckpointAccess;
};

template <class T>
class SGD : public Optimizer<T> {
 public:
  static constexpr OptimizerKind kind = OptimizerKind::sgd;
  // torch.optim.SGD(lr, momentum, dampening, nesterov), all off by default.
  // Throws std::invalid_argument for a setting outside invalid_setting's
  // range, and (as torch) for Nesterov without momentum or with dampening.
  explicit SGD(T lr, T momentum = T(0), T dampening = T(0), bool nesterov = false)
      : Optimizer<T>("sgd", lr),
        momentum_(this->checked("momentum", momentum)),
        dampening_(this->checked("dampening", dampening)),
        nesterov_(nesterov) {
    if (nesterov && (momentum == T(0) || dampening != T(0))) {
      char m[32], d[32];
      std::snprintf(m, sizeof m, "%.17g", static_cast<double>(momentum));
      std::snprintf(d, sizeof d, "%.17g", static_cast<double>(dampening));
      throw std::invalid_argument(std::string("sgd: Nesterov momentum requires momentum > 0 and dampening 0, got momentum ") +
                                  m + " and dampening " + d);
    }
  }

  // For every reached parameter, with d = grad * clip_scale + l2 * w:
  //   no momentum: w -= lr * d
  //   momentum:    buf = d at the parameter's first step, else
  //                buf = momentum * buf + (1 - dampening) * d;
  //                w -= lr * (nesterov ? d + momentum * buf : buf)
  // (SgdRule, SgdMomentumRule). False, changing nothing, when ready() refuses.
  bool step() {
    if (!this->ready()) return false;
    const T lr = this->begin_step();
    this->for_each_reached([&](const auto& e, std::span<T> w, std::span<const T> g, T scale) {
      if (momentum_ == T(0)) {
        parallel_ranges(e.size, elementwise_grain, [&](std::size_t lo, std::size_t hi) {  // elements are independent
          sgd_loop(w.data() + lo, g.data() + lo, hi - lo, scale, e.l2, lr);
        });
        return;
      }
      const std::size_t k = static_cast<std::size_t>(&e - this->entries_.data());
      const bool first = !started_[k];
      T* buf = buffers_.data() + e.offset;
      parallel_ranges(e.size, elementwise_grain, [&](std::size_t lo, std::size_t hi) {
        kernels::sgd_momentum_update<ClipRule, SgdMomentumRule>(w.data() + lo, buf + lo, g.data() + lo, hi - lo, scale,
                                                                e.l2, lr, momentum_, T(1) - dampening_, first,
                                                                nesterov_);
      });
      started_[k] = 1;
    });
    this->end_step();
    return true;
  }

  T momentum() const { return momentum_; }
  T dampening() const { return dampening_; }
  bool nesterov() const { return nesterov_; }
  // The momentum buffers of every parameter, in add order (Entry::offset);
  // empty without momentum.
  std::span<const T> momentum_buffers() const { return buffers_; }
  std::string feature_not_emitted() const override { return momentum_ == T(0) ? "" : "momentum"; }

 private:
  // Explicit vector code for the best instruction set (update.hpp; in the
  // compiled kernel library when the consumer links it).
  static void sgd_loop(T* w, const T* g, std::size_t n, T scale, T l2, T lr) {
    kernels::sgd_update<ClipRule, SgdRule>(w, g, n, scale, l2, lr);
  }
  const char* kind_name() const override { return "sgd"; }
  void on_add(std::size_t size) override {
    if (momentum_ == T(0)) return;
    buffers_.resize(buffers_.size() + size, T(0));
    started_.push_back(0);
  }

  T momentum_, dampening_;
  bool nesterov_;
  std::vector<T> buffers_;
  std::vector<std::uint8_t> started_;  // per parameter: its buffer holds a first gradient
  template <class U, class Opt>
  friend struct CheckpointAccess;
};

template <class T>
class Adam : public Optimizer<T> {
 public:
  static constexpr OptimizerKind kind = OptimizerKind::adam;
  // Throws std::invalid_argument for a setting outside invalid_setting's
  // range. `form` (update_rules.hpp): where eps is added; the header's step 3.
  explicit Adam(T lr, T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8), AdamForm form = AdamForm::efficient)
      : Adam("adam", lr, beta1, beta2, eps, form) {}

  // Takes the step's rate (step 0 of the header), advances the running
  // powers, updates every reached parameter, then counts the step. False,
  // changing nothing, when ready() refuses.
  bool step() {
    if (!this->ready()) return false;
    const T lr = this->begin_step();
    AdamRule::advance(beta1_power_, beta2_power_, beta1_, beta2_);
    const AdamStepConstants<T> c = AdamRule::constants(lr, beta1_, beta2_, beta1_power_, beta2_power_, form_);
    this->for_each_reached([&](const auto& e, std::span<T> w, std::span<const T> g, T scale) {
      T* m = m_.data() + e.offset;
      T* v = v_.data() + e.offset;
      const T decay = AdamRule::decay_factor(lr, e.weight_decay);  // 1 unless AdamW
      parallel_ranges(e.size, elementwise_grain, [&](std::size_t lo, std::size_t hi) {  // elements are independent
        adam_loop(w.data() + lo, m + lo, v + lo, g.data() + lo, hi - lo, scale, e.l2, beta1_, beta2_, eps_, c, decay);
      });
    });
    this->end_step();
    return true;
  }

  T beta1() const { return beta1_; }
  T beta2() const { return beta2_; }
  T eps() const { return eps_; }
  AdamForm form() const { return form_; }
  T beta1_power() const { return beta1_power_; }  // b1^steps()
  T beta2_power() const { return beta2_power_; }
  // First and second moments of every parameter, in add order (Entry::offset).
  std::span<const T> first_moments() const { return m_; }
  std::span<const T> second_moments() const { return v_; }
  std::string feature_not_emitted() const override {
    return form_ == AdamForm::efficient ? "" : "the PyTorch form (AdamForm::pytorch)";
  }

 protected:
  Adam(std::string_view name, T lr, T beta1, T beta2, T eps, AdamForm form)
      : Optimizer<T>(name, lr),
        beta1_(this->checked("beta1", beta1)),
        beta2_(this->checked("beta2", beta2)),
        eps_(this->checked("eps", eps)),
        form_(form) {
    if (form != AdamForm::efficient && form != AdamForm::pytorch)
      throw std::invalid_argument(std::string(name) + ": form " + std::to_string(static_cast<int>(form)) +
                                  " is not an AdamForm");
  }

 private:
  // Explicit vector code, as sgd_loop.
  static void adam_loop(T* w, T* m, T* v, const T* g, std::size_t n, T scale, T l2, T beta1, T beta2, T eps,
                        const AdamStepConstants<T>& c, T decay) {
    kernels::adam_update<ClipRule, AdamRule>(w, m, v, g, n, scale, l2, beta1, beta2, eps, c, decay);
  }
  const char* kind_name() const override { return "adam"; }
  void on_add(std::size_t size) override {
    m_.resize(m_.size() + size, T(0));
    v_.resize(v_.size() + size, T(0));
  }

  T beta1_, beta2_, eps_;
  AdamForm form_;
  T beta1_power_ = T(1), beta2_power_ = T(1);
  std::vector<T> m_, v_;
  template <class U, class Opt>
  friend struct CheckpointAccess;
};

// torch.optim.AdamW: Adam in the PyTorch form with decoupled weight decay,
// w = w * (1 - lr * weight_decay) before the Adam update (the gradient is
// not decayed; add()'s coefficient is that decay, not an L2 term).
// weight_decay is every add()'s default (torch's 0.01), and
// nn::add_parameters(opt, model)'s for every parameter; add(param, wd)
// gives one parameter its own, as a torch parameter group would (0 for
// biases and norm gains: nn::add_parameters(opt, model, {.others = 0})).
template <class T>
class AdamW : public Adam<T> {
 public:
  static constexpr OptimizerKind kind = OptimizerKind::adamw;
  // Throws std::invalid_argument for a setting outside invalid_setting's range.
  explicit AdamW(T lr, T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8), T weight_decay = T(0.01))
      : Adam<T>("adamw", lr, beta1, beta2, eps, AdamForm::pytorch),
        weight_decay_(this->checked("weight_decay", weight_decay)) {}

  T weight_decay() const { return weight_decay_; }
  std::string feature_not_emitted() const override { return "decoupled weight decay (AdamW)"; }

 private:
  const char* kind_name() const override { return "adamw"; }
  bool decouples_decay() const override { return true; }
  T default_decay() const override { return weight_decay_; }
  T weight_decay_;
  template <class U, class Opt>
  friend struct CheckpointAccess;
};

// grad::SGD opt(0.1) is SGD<double>; SGD opt(0.1f) is SGD<float>.
template <class T>
SGD(T) -> SGD<T>;
template <class T>
SGD(T, T) -> SGD<T>;
template <class T>
SGD(T, T, T) -> SGD<T>;
template <class T>
SGD(T, T, T, bool) -> SGD<T>;
template <class T>
Adam(T) -> Adam<T>;
template <class T>
Adam(T, T) -> Adam<T>;
template <class T>
Adam(T, T, T) -> Adam<T>;
template <class T>
Adam(T, T, T, T) -> Adam<T>;
template <class T>
Adam(T, T, T, T, AdamForm) -> Adam<T>;
template <class T>
AdamW(T) -> AdamW<T>;
template <class T>
AdamW(T, T) -> AdamW<T>;
template <class T>
AdamW(T, T, T) -> AdamW<T>;
template <class T>
AdamW(T, T, T, T) -> AdamW<T>;
template <class T>
AdamW(T, T, T, T, T) -> AdamW<T>;

}  // namespace grad
