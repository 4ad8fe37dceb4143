// Optimizer<T>: what SGD and Adam share over tape parameters (the parameter
// list, per-parameter decay, global-norm clipping, the rate and its
// schedule, the checks before a step: NonFinite), apart from the update
// rules (opt/sgd.hpp, opt/adam.hpp). grad/opt.hpp documents one step exactly.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "grad/numerics/isa.hpp"
#include "grad/opt/schedule.hpp"
#include "grad/opt/settings.hpp"
#include "grad/tape.hpp"
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
    std::string name = {};  // the module's name for it ("fc2.weight"), for messages; empty when added by hand
  };

  // How messages name parameter i (from 0): "parameter 3 'fc2.weight'" where
  // it was added with a name, else "parameter 3".
  std::string parameter_name(std::size_t i) const {
    std::string who = "parameter " + std::to_string(i + 1);
    if (i < entries_.size() && !entries_[i].name.empty()) who += " '" + entries_[i].name + "'";
    return who;
  }

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
  // std::invalid_argument for a default Var. A name ("fc2.weight":
  // nn::add_parameters passes the module's) is how every message about the
  // parameter calls it, beside its node and shape.
  bool add(Var<T> param) { return add(param, default_decay()); }
  bool add(Var<T> param, std::string name) { return add(param, default_decay(), std::move(name)); }
  bool add(Var<T> param, T decay, std::string name = {}) {
    if (!param.tape())
      throw std::invalid_argument(std::string(kind_name()) + ".add: the parameter is a default-constructed Var");
    Tape<T>& tp = *param.tape();
    const std::string who = std::string(kind_name()) + ".add: parameter " + std::to_string(entries_.size() + 1) +
                            (name.empty() ? "" : " '" + name + "'");
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
    entries_.push_back({param, decoupled ? T(0) : decay, elements_, size, decoupled ? decay : T(0), std::move(name)});
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

  // The clip factor for the current gradients (1 when off), in the order
  // opt.hpp documents. Exposed so tests and the device engine can check it.
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
        return fail(*tape_, std::string(kind_) + ".step: " + parameter_name(i) + " " +
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
      fail(*tape_, std::string(kind_) + ".step: " + parameter_name(i) + " (node " +
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

}  // namespace grad
