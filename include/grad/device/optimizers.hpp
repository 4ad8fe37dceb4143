// device::SGD and device::Adam: grad::SGD / grad::Adam (grad/opt.hpp) over a
// captured Program's parameters, with their state on the program's backend.
// A step runs opt.hpp's rules there: clip factor, Adam's per-step constants
// and every update are computed on the backend, so a step reads nothing back.
//
// As on the tape, a parameter the loss's backward never reaches is skipped
// (no decay, no moments, no share of the clip norm). One optimizer drives a
// program at a time; add every parameter before the first step.
//
// The hyperparameters live in device memory: set_lr, set_clip and a
// learning-rate schedule (set_schedule, grad::LrSchedule: the same function
// and step numbering as grad::SGD / grad::Adam, so both use the same rate
// bits) upload the new values before the step; graph and fused modes keep
// their captured graphs (Program::graph_captures() does not move). Every
// LrSchedule shape works here, a plateau schedule fed by report_metric.
//
// device::Adam takes the same AdamForm as grad::Adam, and device::AdamW is
// grad::AdamW (the PyTorch form, decoupled weight decay per parameter): the
// same rule structs, so the same bits. SGD momentum has no device version
// yet: copy_to / copy_from refuse a host SGD with momentum by name rather
// than step it without.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "grad/checkpoint.hpp"  // CheckpointAccess: the host optimizers' state, for copy_to / copy_from
#include "grad/device/capture.hpp"
#include "grad/opt.hpp"  // invalid_setting: the host optimizers' ranges

namespace grad::device {

template <class T>
class Optimizer {
 public:
  // A captured parameter (tape.param) with its own L2 coefficient. Throws
  // std::invalid_argument for anything else, a repeat, or l2 < 0, and
  // std::logic_error after the first step.
  // The coefficient is L2, or for AdamW its decoupled weight decay (default
  // weight_decay), as grad::Optimizer::add.
  void add(Var<T> param) { add(param, static_cast<T>(weight_decay_)); }
  void add(Var<T> param, T l2) {
    const std::string who = std::string(name_) + ".add";  // once per parameter, not per step
    if (steps_ > 0) throw std::logic_error("grad::device::" + who + ": add every parameter before the first step");
    ParamSlot slot = program_->param_slot(param, who);
    for (std::uint32_t i : added_)
      if (i == param.index())
        throw std::invalid_argument("grad::device::" + who + ": parameter (node " + std::to_string(i) +
                                    ") was already added");
    checked(".add", kind_ == OptimizerKind::adamw ? "weight_decay" : "l2", l2);
    added_.push_back(param.index());
    // AdamW's coefficient is its decoupled decay, as on the host.
    (kind_ == OptimizerKind::adamw ? slot.weight_decay : slot.l2) = static_cast<double>(l2);
    if (slot.grad != no_offset) slots_.push_back(slot);
    dirty_ = true;
  }
  // Global-norm clipping threshold; 0 turns clipping off. Both setters throw
  // std::invalid_argument outside grad::invalid_setting's ranges, as
  // grad::Optimizer's do (the message is built only then: no allocation for
  // a valid value). set_lr sets a constant rate, replacing any schedule.
  void set_clip(T max_norm) { settings_.clip = checked(".set_clip", "clip", max_norm); }
  void set_lr(T lr) {
    settings_.lr = checked(".set_lr", "lr", lr);
    schedule_.reset();
  }
  // As grad::Optimizer::set_schedule: step t (steps() == t after it, the
  // first step() is t = 1) uses schedule.at(t), uploaded before the step.
  // Throws std::invalid_argument naming the setting out of range.
  void set_schedule(const LrSchedule& schedule) {
    std::string why = schedule.invalid();
    // Every rate lies in [min_lr, base_lr]: both in range as the device holds them.
    if (why.empty()) why = invalid_on_device("base_lr", schedule.base_lr);
    if (why.empty()) why = invalid_on_device("min_lr", schedule.min_lr);
    if (!why.empty()) throw std::invalid_argument("grad::device::" + std::string(name_) + ".set_schedule: " + why);
    schedule_ = schedule;
    plateau_ = schedule.start();
  }
  void clear_schedule() {
    if (schedule_) settings_.lr = schedule_->rate(steps_ + 1, plateau_);
    schedule_.reset();
  }
  const std::optional<LrSchedule>& schedule() const { return schedule_; }
  const PlateauState& plateau_state() const { return plateau_; }
  // As grad::Optimizer::report_metric: one metric for a plateau schedule.
  void report_metric(double metric) {
    const std::string who = "grad::device::" + std::string(name_) + ".report_metric: ";
    if (!schedule_ || schedule_->shape != LrShape::plateau)
      throw std::logic_error(who + "the optimizer has no reduce-on-plateau schedule (LrShape::plateau)");
    if (std::string why = invalid_setting("metric", metric); !why.empty()) throw std::invalid_argument(who + why);
    schedule_->report(plateau_, metric);
  }
  // The rate the next step() uses.
  T lr() const { return static_cast<T>(schedule_ ? schedule_->rate(steps_ + 1, plateau_) : settings_.lr); }

  void step() {
    if (schedule_) settings_.lr = schedule_->rate(steps_ + 1, plateau_);
    program_->with_engine([&](auto& e, auto) {
      if (dirty_) e.set_optimizer(slots_, settings_.adam);
      dirty_ = false;
      // Counted before it runs: an anomaly (Program::detect_anomalies) stops
      // it part way with the device's step count already advanced.
      ++steps_;
      e.optimizer_step(settings_);
    });
  }
  std::uint64_t steps() const { return steps_; }
  // The parameters a step updates (those the captured loss reaches), in add
  // order, where they lie in the program's buffers; and how many were added.
  std::span<const ParamSlot> slots() const { return slots_; }

  // Checkpoints go through a host optimizer of the same kind (grad::Adam<T>
  // for device::Adam, grad::SGD<T> for device::SGD) with the same parameters
  // added in the same order: copy_to fills it and the tape with this
  // optimizer's whole state (parameter values, settings, L2 coefficients,
  // step count, Adam's moments and powers), so grad::save_checkpoint writes
  // it; copy_from takes it back after grad::load_checkpoint. Every added
  // parameter must be reached by the captured loss. Throws
  // std::invalid_argument naming what differs.
  template <class HostOpt>
  void copy_to(Tape<T>& tape, HostOpt& host) {
    using Access = CheckpointAccess<T, HostOpt>;
    check_host(host, "copy_to");
    program_->sync_params_to(tape);
    typename Access::Settings st;
    st.steps = steps_;
    st.lr = static_cast<T>(settings_.lr);
    st.clip = static_cast<T>(settings_.clip);
    st.beta1 = static_cast<T>(settings_.beta1);
    st.beta2 = static_cast<T>(settings_.beta2);
    st.eps = static_cast<T>(settings_.eps);
    st.form = settings_.form;
    st.weight_decay = static_cast<T>(weight_decay_);
    st.schedule = schedule_;
    st.plateau = plateau_;
    program_->with_engine([&](auto& e, auto zero) {
      using S = decltype(zero);
      if (dirty_) e.set_optimizer(slots_, settings_.adam);  // never stepped: zero moments, b^0 = 1
      dirty_ = false;
      const std::size_t n = settings_.adam ? moment_count() : 0;
      std::vector<S> m(n), v(n);
      S p1 = S(1), p2 = S(1);
      e.read_optimizer_state(m, v, p1, p2);
      st.beta1_power = static_cast<T>(p1);
      st.beta2_power = static_cast<T>(p2);
      if constexpr (Access::is_adam) {
        std::transform(m.begin(), m.end(), Access::moments(host, 0)->begin(), [](S x) { return static_cast<T>(x); });
        std::transform(v.begin(), v.end(), Access::moments(host, 1)->begin(), [](S x) { return static_cast<T>(x); });
      }
    });
    Access::restore(host, st);
    auto& entries = Access::entries(host);
    for (std::size_t k = 0; k < slots_.size(); ++k) {
      entries[k].l2 = static_cast<T>(slots_[k].l2);
      entries[k].weight_decay = static_cast<T>(slots_[k].weight_decay);
    }
  }
  template <class HostOpt>
  void copy_from(const Tape<T>& tape, const HostOpt& host) {
    using Access = CheckpointAccess<T, HostOpt>;
    check_host(host, "copy_from");
    const auto st = Access::settings(host);
    program_->with_engine([&](auto& e, auto zero) {
      using S = decltype(zero);
      std::vector<S> staging;
      auto narrow = [&](std::span<const T> from) -> std::span<const S> {
        staging.resize(from.size());
        std::transform(from.begin(), from.end(), staging.begin(), [](T x) { return static_cast<S>(x); });
        return staging;
      };
      for (std::size_t k = 0; k < slots_.size(); ++k) {
        e.write_values(slots_[k].value, narrow(tape.value(host.params()[k].var).data));
        slots_[k].l2 = static_cast<double>(host.params()[k].l2);
        slots_[k].weight_decay = static_cast<double>(host.params()[k].weight_decay);
      }
      e.set_optimizer(slots_, settings_.adam);
      std::vector<S> m, v;
      if constexpr (Access::is_adam) {
        const auto to_s = [](T x) { return static_cast<S>(x); };
        m.resize(moment_count());
        v.resize(moment_count());
        std::transform(host.first_moments().begin(), host.first_moments().end(), m.begin(), to_s);
        std::transform(host.second_moments().begin(), host.second_moments().end(), v.begin(), to_s);
      }
      e.write_optimizer_state(m, v, static_cast<S>(st.beta1_power), static_cast<S>(st.beta2_power));
    });
    dirty_ = false;
    steps_ = st.steps;
    settings_.lr = static_cast<double>(st.lr);
    settings_.clip = static_cast<double>(st.clip);
    settings_.beta1 = static_cast<double>(st.beta1);
    settings_.beta2 = static_cast<double>(st.beta2);
    settings_.eps = static_cast<double>(st.eps);
    settings_.form = st.form;
    weight_decay_ = static_cast<double>(st.weight_decay);
    if (st.schedule) {
      schedule_ = st.schedule;
      plateau_ = st.plateau;
    }
  }
  std::size_t added() const { return added_.size(); }
  Program<T>& program() const { return *program_; }

 protected:
  Optimizer(Program<T>& program, const char* name, OptimizerKind kind, T lr)
      : program_(&program), name_(name), kind_(kind) {
    settings_.adam = kind != OptimizerKind::sgd;
    settings_.lr = checked("", "lr", lr);
  }
  // `value` as the engine holds it, or std::invalid_argument naming the
  // optimizer, the call ("" for the constructor, ".set_lr", ...) and the value.
  double checked(std::string_view call, std::string_view setting, T value) const {
    if (std::string why = invalid_on_device(setting, static_cast<double>(value)); !why.empty())
      throw std::invalid_argument("grad::device::" + std::string(name_) + std::string(call) + ": " + why);
    return static_cast<double>(value);
  }
  // invalid_setting for the value as the device holds it: float32 for an f32
  // capture of a double tape (lr 1e300 would be an infinite rate there).
  std::string invalid_on_device(std::string_view setting, double value) const {
    return program_->f32() ? invalid_setting_as<float>(setting, value) : invalid_setting_as<T>(setting, value);
  }
  std::size_t moment_count() const {
    std::size_t n = 0;
    for (const ParamSlot& p : slots_) n += p.size;
    return n;
  }
  template <class HostOpt>
  void check_host(const HostOpt& host, const char* call) const {
    const std::string who = "grad::device::" + std::string(name_) + "." + call + ": ";
    if (HostOpt::kind != kind_)
      throw std::invalid_argument(who +
                                  "the host optimizer is of another kind (grad::Adam for device::Adam, grad::AdamW for "
                                  "AdamW, grad::SGD for SGD)");
    if constexpr (CheckpointAccess<T, HostOpt>::is_sgd)
      if (host.momentum() != T(0))
        throw std::invalid_argument(who +
                                    "the host SGD uses momentum, which the device optimizers do not run yet; train "
                                    "momentum SGD on the tape");
    if (slots_.size() != added_.size())
      throw std::invalid_argument(who + std::to_string(added_.size() - slots_.size()) +
                                  " added parameter(s) are not reached by the captured loss");
    bool same = host.params().size() == added_.size();
    for (std::size_t k = 0; same && k < added_.size(); ++k) same = host.params()[k].var.index() == added_[k];
    if (!same)
      throw std::invalid_argument(who + "the host optimizer's parameters are not this optimizer's, in add order (" +
                                  std::to_string(host.params().size()) + " against " + std::to_string(added_.size()) +
                                  ")");
  }

  Program<T>* program_;
  const char* name_;
  OptimizerKind kind_;
  double weight_decay_ = 0;  // add()'s default coefficient: AdamW's weight_decay, else 0
  OptimizerSettings settings_;
  std::optional<LrSchedule> schedule_;
  PlateauState plateau_;
  std::vector<ParamSlot> slots_;  // reached parameters, in add order
  std::vector<std::uint32_t> added_;
  bool dirty_ = true;
  std::uint64_t steps_ = 0;
};

template <class T>
class SGD : public Optimizer<T> {
 public:
  SGD(Program<T>& program, T lr) : Optimizer<T>(program, "sgd", OptimizerKind::sgd, lr) {}
};

template <class T>
class Adam : public Optimizer<T> {
 public:
  // As grad::Adam, form included.
  Adam(Program<T>& program, T lr, T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8),
       AdamForm form = AdamForm::efficient)
      : Adam(program, "adam", OptimizerKind::adam, lr, beta1, beta2, eps, form) {}

 protected:
  Adam(Program<T>& program, const char* name, OptimizerKind kind, T lr, T beta1, T beta2, T eps, AdamForm form)
      : Optimizer<T>(program, name, kind, lr) {
    this->settings_.beta1 = this->checked("", "beta1", beta1);
    this->settings_.beta2 = this->checked("", "beta2", beta2);
    this->settings_.eps = this->checked("", "eps", eps);
    if (form != AdamForm::efficient && form != AdamForm::pytorch)
      throw std::invalid_argument("grad::device::" + std::string(name) + ": form " +
                                  std::to_string(static_cast<int>(form)) + " is not an AdamForm");
    this->settings_.form = form;
  }
};

// As grad::AdamW: the PyTorch form, add(param, wd) each parameter's
// decoupled weight decay (weight_decay by default).
template <class T>
class AdamW : public Adam<T> {
 public:
  AdamW(Program<T>& program, T lr, T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8), T weight_decay = T(0.01))
      : Adam<T>(program, "adamw", OptimizerKind::adamw, lr, beta1, beta2, eps, AdamForm::pytorch) {
    this->weight_decay_ = this->checked("", "weight_decay", weight_decay);
  }
};

}  // namespace grad::device
