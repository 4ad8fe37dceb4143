// Optimizers over tape parameters: SGD and Adam, each parameter with its own
// L2 coefficient, optional global-norm clipping.
//
// The per-element math lives in GRAD_HD rule structs (ClipRule, SgdRule,
// AdamRule, in update_rules.hpp, which needs no tape) so that the device engine calls the very same functions on the
// GPU and lands on the same bits. The host loops below only decide which
// elements go through them, in which order.
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
//      g*g summed in the order of every full reduction (sum_fixed,
//      grad/numerics/fixed_order.hpp: 32 lanes, a fixed tree), then those per-parameter
//      sums in add order, acc = acc + s starting from zero; then
//      norm = sqrt(acc); scale = max_norm / norm if norm > max_norm, else 1.
//      (torch divides by norm + 1e-6; grad does not.)
//   3. Per element: g = fma(grad, scale, l2 * w), then the rule's update,
//      fma(a, b, c) being a*b + c with one rounding (grad::fma_hd):
//      SGD:  w = fma(-lr, g, w)                      (w - lr * g)
//      Adam: m = fma(b1, m, (1 - b1) * g)
//            v = fma(b2, v, (1 - b2) * (g * g))
//            w = fma(-step_size, m / (sqrt(v) + eps), w),
//            step_size = lr * sqrt(1 - b2^t) / (1 - b1^t)
//      b1^t and b2^t are running products (b1p = b1p * b1 each step), not
//      pow(), so that host and device compute the same constants.
//
// How Adam differs from torch.optim.Adam: torch adds eps to the
// bias-corrected root, denom = sqrt(v) / sqrt(1 - b2^t) + eps. Folding the
// correction into the step size (the Adam paper's "efficient" form) makes
// grad's eps equal to torch's eps * sqrt(1 - b2^t): the two agree exactly
// in exact arithmetic when torch's eps is set to eps / sqrt(1 - b2^t) at
// step t (test_optimizers does that). torch also keeps a step count per
// parameter that only advances when that parameter has a gradient; grad
// has one count that advances on every step().
//
// After add(), step() allocates nothing: the moments are sized at add().
#pragma once

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

enum class OptimizerKind : std::uint32_t { sgd = 1, adam = 2 };

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

}  // namespace detail

// A learning-rate schedule: linear warm-up from 0, then a cosine decay.
// Step t (the t-th step() call, t >= 1; t = steps() after that step) uses
//   t <= warmup         base_lr * t / warmup  (base_lr / warmup at t = 1, base_lr at t = warmup)
//   warmup < t < total  min_lr + (base_lr - min_lr) * (0.5 * (1 + cos(pi * p))), p = (t - warmup) / (total - warmup)
//   t >= total          min_lr (constant after the decay; t > warmup)
// all in double (cos as detail::cos_pi). warmup = 0: no warm-up, the decay
// starts at t = 1 (p = 1 / total); warmup = total: no decay, min_lr after
// the warm-up. Valid settings (invalid() says which one is not): base_lr and
// min_lr finite, 0 <= min_lr <= base_lr; total >= 1; warmup <= total.
//
//   grad::Adam opt(1e-3);
//   opt.set_schedule({.base_lr = 1e-3, .min_lr = 1e-5, .warmup = 100, .total = 10000});
struct LrSchedule {
  double base_lr = 0;
  double min_lr = 0;
  std::uint64_t warmup = 0;
  std::uint64_t total = 1;

  // The rate of step t (t >= 1). Only for a schedule whose invalid() is "".
  double at(std::uint64_t t) const {
    if (t <= warmup) return base_lr * static_cast<double>(t) / static_cast<double>(warmup);
    if (t >= total) return min_lr;
    const double p = static_cast<double>(t - warmup) / static_cast<double>(total - warmup);
    return min_lr + (base_lr - min_lr) * (0.5 * (1.0 + detail::cos_pi(p)));
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
    if (total < 1) return "total 0 is out of range: expected total >= 1 (the step at which the decay ends)";
    if (warmup > total)
      return "warmup " + std::to_string(warmup) + " is out of range: expected warmup <= total (" +
             std::to_string(total) + ")";
    return {};
  }
};

// What SGD and Adam share: the parameter list, L2 coefficients, clipping.
template <class T>
class Optimizer {
  static_assert(Scalar<T>, "optimizers are for T = float or double");

 public:
  struct Entry {
    Var<T> var;
    T l2;
    std::size_t offset;  // into the moment buffers (Adam); running element count
    std::size_t size;
  };

  // Adds a parameter (a tp.param leaf) with its own L2 coefficient. Returns
  // false, poisoning the tape with a message, for a constant, a computed
  // node, a dropped Var, a parameter added twice or one from another tape
  // than the first; throws std::invalid_argument for a default Var.
  bool add(Var<T> param, T l2 = T(0)) {
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
    if (const std::string why = invalid_setting("l2", l2); !why.empty()) return fail(tp, who + ": " + why);
    tape_ = &tp;
    tp.note_optimizer();
    const std::size_t size = tp.value(param).size();
    entries_.push_back({param, l2, elements_, size});
    elements_ += size;
    on_add(size);
    return true;
  }

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
  // T(schedule.at(t)); a schedule attached after k steps continues at t = k + 1.
  // Throws std::invalid_argument naming the setting out of range
  // (LrSchedule::invalid). Not saved by save_checkpoint: attach the same
  // schedule to the optimizer a checkpoint is loaded into (before or after
  // loading); it continues from the restored step count.
  void set_schedule(const LrSchedule& schedule) {
    if (std::string why = schedule.invalid(); !why.empty())
      throw std::invalid_argument(std::string(kind_) + ".set_schedule: " + why);
    // The rates are computed in double and used as T: every one lies in
    // [min_lr, base_lr], so both ends must be in range as T.
    for (const auto& [setting, value] : {std::pair{"base_lr", schedule.base_lr}, std::pair{"min_lr", schedule.min_lr}})
      if (std::string why = invalid_setting_as<T>(setting, value); !why.empty())
        throw std::invalid_argument(std::string(kind_) + ".set_schedule: " + why);
    schedule_ = schedule;
    lr_ = static_cast<T>(schedule.at(steps_ + 1));
  }
  // Back to a constant rate: lr() as the schedule would have set the next step.
  void clear_schedule() { schedule_.reset(); }
  const std::optional<LrSchedule>& schedule() const { return schedule_; }
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
        acc = ClipRule::accumulate(acc, ClipRule::squares(g.data.data(), g.size()));
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

  // Before a step changes anything: the tape is healthy and every added
  // parameter is still a live node of it. A parameter dropped by reset_to
  // poisons the tape (skipping it silently would train a different model).
  //
  // A step on a poisoned tape changes nothing and returns false; it also says
  // so on stderr, once per optimizer ("grad: adam.step: the tape is
  // poisoned, no parameter was updated: <the tape's error>"), because a
  // training loop that ignores the result would otherwise keep printing NaN
  // losses with no hint of why. In exception mode (Tape::throw_on_error) the
  // op that poisoned the tape has already thrown.
  bool ready() {
    if (!tape_) return true;
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
    return true;
  }
  virtual const char* kind_name() const = 0;
  virtual void on_add(std::size_t) {}

  // The rate of the step about to run (a schedule's value for t = steps() + 1).
  T begin_step() {
    if (schedule_) lr_ = static_cast<T>(schedule_->at(steps_ + 1));
    return lr_;
  }
  // Counts the step; lr() becomes the next step's rate.
  void end_step() {
    ++steps_;
    if (tape_) tape_->note_step();
    if (schedule_) lr_ = static_cast<T>(schedule_->at(steps_ + 1));
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
  std::uint64_t steps_ = 0;
  bool warned_poisoned_ = false;  // the poisoned-step message is printed once

  template <class U, class Opt>
  friend struct CheckpointAccess;
};

template <class T>
class SGD : public Optimizer<T> {
 public:
  static constexpr OptimizerKind kind = OptimizerKind::sgd;
  // Throws std::invalid_argument for a rate outside invalid_setting's range.
  explicit SGD(T lr) : Optimizer<T>("sgd", lr) {}

  // w -= lr * (grad * clip_scale + l2 * w) for every reached parameter.
  // False on a poisoned tape, or one that dropped a parameter (nothing changes).
  bool step() {
    if (!this->ready()) return false;
    const T lr = this->begin_step();
    this->for_each_reached([&](const auto& e, std::span<T> w, std::span<const T> g, T scale) {
      parallel_ranges(e.size, elementwise_grain, [&](std::size_t lo, std::size_t hi) {  // elements are independent
        sgd_loop(w.data() + lo, g.data() + lo, hi - lo, scale, e.l2, lr);
      });
    });
    this->end_step();
    return true;
  }

 private:
  // Explicit vector code for the best instruction set (update.hpp; in the
  // compiled kernel library when the consumer links it).
  static void sgd_loop(T* w, const T* g, std::size_t n, T scale, T l2, T lr) {
    kernels::sgd_update<ClipRule, SgdRule>(w, g, n, scale, l2, lr);
  }
  const char* kind_name() const override { return "sgd"; }
  template <class U, class Opt>
  friend struct CheckpointAccess;
};

template <class T>
class Adam : public Optimizer<T> {
 public:
  static constexpr OptimizerKind kind = OptimizerKind::adam;
  // Throws std::invalid_argument for a setting outside invalid_setting's range.
  explicit Adam(T lr, T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8))
      : Optimizer<T>("adam", lr),
        beta1_(this->checked("beta1", beta1)),
        beta2_(this->checked("beta2", beta2)),
        eps_(this->checked("eps", eps)) {}

  // Takes the step's rate (step 0 of the header), advances the running
  // powers, updates every reached parameter, then counts the step. False on a poisoned tape, or one that dropped a
  // parameter (nothing changes).
  bool step() {
    if (!this->ready()) return false;
    const T lr = this->begin_step();
    AdamRule::advance(beta1_power_, beta2_power_, beta1_, beta2_);
    const AdamStepConstants<T> c = AdamRule::constants(lr, beta1_, beta2_, beta1_power_, beta2_power_);
    this->for_each_reached([&](const auto& e, std::span<T> w, std::span<const T> g, T scale) {
      T* m = m_.data() + e.offset;
      T* v = v_.data() + e.offset;
      parallel_ranges(e.size, elementwise_grain, [&](std::size_t lo, std::size_t hi) {  // elements are independent
        adam_loop(w.data() + lo, m + lo, v + lo, g.data() + lo, hi - lo, scale, e.l2, beta1_, beta2_, eps_, c);
      });
    });
    this->end_step();
    return true;
  }

  T beta1() const { return beta1_; }
  T beta2() const { return beta2_; }
  T eps() const { return eps_; }
  T beta1_power() const { return beta1_power_; }  // b1^steps()
  T beta2_power() const { return beta2_power_; }
  // First and second moments of every parameter, in add order (Entry::offset).
  std::span<const T> first_moments() const { return m_; }
  std::span<const T> second_moments() const { return v_; }

 private:
  // Explicit vector code, as sgd_loop.
  static void adam_loop(T* w, T* m, T* v, const T* g, std::size_t n, T scale, T l2, T beta1, T beta2, T eps,
                        const AdamStepConstants<T>& c) {
    kernels::adam_update<ClipRule, AdamRule>(w, m, v, g, n, scale, l2, beta1, beta2, eps, c);
  }
  const char* kind_name() const override { return "adam"; }
  void on_add(std::size_t size) override {
    m_.resize(m_.size() + size, T(0));
    v_.resize(v_.size() + size, T(0));
  }

  T beta1_, beta2_, eps_;
  T beta1_power_ = T(1), beta2_power_ = T(1);
  std::vector<T> m_, v_;
  template <class U, class Opt>
  friend struct CheckpointAccess;
};

// grad::SGD opt(0.1) is SGD<double>; SGD opt(0.1f) is SGD<float>.
template <class T>
SGD(T) -> SGD<T>;
template <class T>
Adam(T) -> Adam<T>;
template <class T>
Adam(T, T) -> Adam<T>;
template <class T>
Adam(T, T, T) -> Adam<T>;
template <class T>
Adam(T, T, T, T) -> Adam<T>;

}  // namespace grad
