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
// their captured graphs (Program::graph_captures() does not move).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "grad/device/capture.hpp"
#include "grad/opt.hpp"  // invalid_setting: the host optimizers' ranges

namespace grad::device {

template <class T>
class Optimizer {
 public:
  // A captured parameter (tape.param) with its own L2 coefficient. Throws
  // std::invalid_argument for anything else, a repeat, or l2 < 0, and
  // std::logic_error after the first step.
  void add(Var<T> param, T l2 = T(0)) {
    const std::string who = std::string(name_) + ".add";  // once per parameter, not per step
    if (steps_ > 0) throw std::logic_error("grad::device::" + who + ": add every parameter before the first step");
    ParamSlot slot = program_->param_slot(param, who);
    for (std::uint32_t i : added_)
      if (i == param.index())
        throw std::invalid_argument("grad::device::" + who + ": parameter (node " + std::to_string(i) +
                                    ") was already added");
    checked(".add", "l2", l2);
    added_.push_back(param.index());
    slot.l2 = static_cast<double>(l2);
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
    if (std::string why = schedule.invalid(); !why.empty())
      throw std::invalid_argument("grad::device::" + std::string(name_) + ".set_schedule: " + why);
    schedule_ = schedule;
  }
  void clear_schedule() {
    if (schedule_) settings_.lr = schedule_->at(steps_ + 1);
    schedule_.reset();
  }
  const std::optional<LrSchedule>& schedule() const { return schedule_; }
  // The rate the next step() uses.
  T lr() const { return static_cast<T>(schedule_ ? schedule_->at(steps_ + 1) : settings_.lr); }

  void step() {
    if (schedule_) settings_.lr = schedule_->at(steps_ + 1);
    program_->with_engine([&](auto& e, auto) {
      if (dirty_) e.set_optimizer(slots_, settings_.adam);
      e.optimizer_step(settings_);
    });
    dirty_ = false;
    ++steps_;
  }
  std::uint64_t steps() const { return steps_; }
  // The parameters a step updates (those the captured loss reaches), in add
  // order, where they lie in the program's buffers; and how many were added.
  std::span<const ParamSlot> slots() const { return slots_; }
  std::size_t added() const { return added_.size(); }
  Program<T>& program() const { return *program_; }

 protected:
  Optimizer(Program<T>& program, const char* name, bool adam, T lr) : program_(&program), name_(name) {
    settings_.adam = adam;
    settings_.lr = checked("", "lr", lr);
  }
  // `value` as the engine holds it, or std::invalid_argument naming the
  // optimizer, the call ("" for the constructor, ".set_lr", ...) and the value.
  double checked(std::string_view call, std::string_view setting, T value) const {
    if (std::string why = invalid_setting(setting, static_cast<double>(value)); !why.empty())
      throw std::invalid_argument("grad::device::" + std::string(name_) + std::string(call) + ": " + why);
    return static_cast<double>(value);
  }
  Program<T>* program_;
  const char* name_;
  OptimizerSettings settings_;
  std::optional<LrSchedule> schedule_;
  std::vector<ParamSlot> slots_;  // reached parameters, in add order
  std::vector<std::uint32_t> added_;
  bool dirty_ = true;
  std::uint64_t steps_ = 0;
};

template <class T>
class SGD : public Optimizer<T> {
 public:
  SGD(Program<T>& program, T lr) : Optimizer<T>(program, "sgd", false, lr) {}
};

template <class T>
class Adam : public Optimizer<T> {
 public:
  Adam(Program<T>& program, T lr, T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8))
      : Optimizer<T>(program, "adam", true, lr) {
    this->settings_.beta1 = this->checked("", "beta1", beta1);
    this->settings_.beta2 = this->checked("", "beta2", beta2);
    this->settings_.eps = this->checked("", "eps", eps);
  }
};

}  // namespace grad::device
