// LrSchedule: a learning rate per step (warm-up + cosine and torch's step,
// multi-step, exponential, one-cycle and reduce-on-plateau), computed in
// double from + - * / alone. Apart from the optimizers because it is plain
// data and needs no tape: the host and device optimizers, checkpoints and
// emitted programs all take their rate from LrSchedule::at.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "grad/opt/settings.hpp"

namespace grad {

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

}  // namespace grad
