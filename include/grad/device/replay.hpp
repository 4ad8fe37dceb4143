// The per-node replay every backend shares: it resolves a Layout into a list
// of launches (op code, node arguments with backend pointers, work items)
// once, then forward()/backward() walk that list. A Launcher supplies the
// memory and runs one op's DeviceKernel over its work items: on the host
// (kernels/cpu_backend.cpp) or as CUDA kernels (kernels/cuda_backend.cu).
//
// Launcher interface:
//   U* allocate<U>(n)  (zeroed, freed by the launcher), upload/download(dst, src, bytes), sync()
//   forward<Op>(NodeArgs<S>, S* y, items)     backward<Op, In>(NodeArgs<S>, y, g, dx, items)
//   accumulate(S* grad, const S* scratch, n)
//   optimizer_prepare(const ParamView<S>* params, count, hyper, state*)
//   optimizer_update(ParamView<S>, hyper, const state*)
#pragma once

#include <cstring>
#include <vector>

#include "grad/device/engine.hpp"
#include "grad/device/kernels.hpp"

namespace grad::device {

template <class S, class Launcher>
class ReplayEngine final : public Engine<S> {
 public:
  explicit ReplayEngine(const Layout<S>& L) {
    values_ = run_.template allocate<S>(L.values.size());
    grads_ = run_.template allocate<S>(L.grad_size);
    scratch_ = run_.template allocate<S>(L.scratch_size);
    extras_ = run_.template allocate<std::size_t>(L.extras.size());
    run_.upload(values_, L.values.data(), L.values.size() * sizeof(S));
    run_.upload(extras_, L.extras.data(), L.extras.size() * sizeof(std::size_t));
    // The loss's own gradient is 1 for good: no captured node consumes the
    // loss, so nothing ever writes that slot again.
    const DeviceNode<S>& root = L.nodes[L.loss];
    if (root.grad != none) {
      const S one = S(1);
      run_.upload(grads_ + root.grad, &one, sizeof(S));
    }
    for (const DeviceNode<S>& n : L.nodes) {
      if (n.op == op_code<Param> || n.op == op_code<Const>) continue;
      const NodeArgs<S> x = args(L, n);
      forward_.push_back({n.op, x, values_ + n.value, with_op(n.op, [&](auto op) -> std::size_t {
                            using Op = decltype(op);
                            if constexpr (has_device_kernel<Op>) return DeviceKernel<Op>::forward_items(x);
                            return 0;
                          })});
    }
    for (const BackwardStep& s : L.backward) {
      const DeviceNode<S>& n = L.nodes[s.node];
      const DeviceNode<S>& in = L.nodes[s.input == 0 ? n.a : n.b];
      BackwardLaunch b;
      b.op = n.op;
      b.input = s.input;
      b.x = args(L, n);
      b.y = values_ + n.value;
      b.g = grads_ + n.grad;
      b.grad = grads_ + in.grad;
      b.dx = s.accumulate ? scratch_ : b.grad;
      b.size = s.accumulate ? in.dims.size() : 0;
      b.items = with_op(n.op, [&](auto op) -> std::size_t {
        using Op = decltype(op);
        if constexpr (has_device_kernel<Op>)
          return s.input == 0 ? DeviceKernel<Op>::template backward_items<0>(b.x)
                              : DeviceKernel<Op>::template backward_items<1>(b.x);
        return 0;
      });
      backward_.push_back(b);
    }
  }

  void write_values(std::size_t offset, std::span<const S> src) override {
    run_.upload(values_ + offset, src.data(), src.size_bytes());
  }
  void read_values(std::size_t offset, std::span<S> dst) override {
    run_.download(dst.data(), values_ + offset, dst.size_bytes());
  }
  void read_grads(std::size_t offset, std::span<S> dst) override {
    run_.download(dst.data(), grads_ + offset, dst.size_bytes());
  }

  void forward() override {
    for (const ForwardLaunch& f : forward_)
      with_op(f.op, [&](auto op) {
        using Op = decltype(op);
        if constexpr (has_device_kernel<Op>) run_.template forward<Op>(f.x, f.y, f.items);
      });
  }

  void backward() override {
    for (const BackwardLaunch& b : backward_) {
      with_op(b.op, [&](auto op) {
        using Op = decltype(op);
        if constexpr (has_device_kernel<Op>) {
          if (b.input == 0)
            run_.template backward<Op, 0>(b.x, b.y, b.g, b.dx, b.items);
          else if constexpr (Op::arity > 1)
            run_.template backward<Op, 1>(b.x, b.y, b.g, b.dx, b.items);
        }
      });
      if (b.size) run_.accumulate(b.grad, b.dx, b.size);
    }
  }

  void set_optimizer(std::span<const ParamSlot> params, bool adam) override {
    std::size_t moments = 0;
    for (const ParamSlot& p : params) moments += p.size;
    // State buffers are allocated once per program and grown if needed.
    if (adam && moments > moment_capacity_) {
      m_ = run_.template allocate<S>(moments);
      v_ = run_.template allocate<S>(moments);
      moment_capacity_ = moments;
    }
    if (adam) {
      std::vector<S> zeros(moments, S(0));
      run_.upload(m_, zeros.data(), moments * sizeof(S));
      run_.upload(v_, zeros.data(), moments * sizeof(S));
    }
    params_.clear();
    std::size_t at = 0;
    for (const ParamSlot& p : params) {
      ParamView<S> view;
      view.w = values_ + p.value;
      view.g = grads_ + p.grad;
      view.m = adam ? m_ + at : nullptr;
      view.v = adam ? v_ + at : nullptr;
      view.size = p.size;
      view.l2 = static_cast<S>(p.l2);
      params_.push_back(view);
      at += p.size;
    }
    if (params_.size() > views_capacity_) {
      views_ = run_.template allocate<ParamView<S>>(params_.size());
      views_capacity_ = params_.size();
    }
    if (!params_.empty()) run_.upload(views_, params_.data(), params_.size() * sizeof(ParamView<S>));
    if (!state_) state_ = run_.template allocate<OptimizerState<S>>(1);
    const OptimizerState<S> fresh{};
    run_.upload(state_, &fresh, sizeof fresh);
  }

  void optimizer_step(const OptimizerSettings& s) override {
    if (!state_) return;
    const OptimizerHyper<S> h{static_cast<S>(s.lr),  static_cast<S>(s.beta1), static_cast<S>(s.beta2),
                              static_cast<S>(s.eps), static_cast<S>(s.clip),  s.adam};
    run_.optimizer_prepare(views_, params_.size(), h, state_);
    for (const ParamView<S>& p : params_) run_.optimizer_update(p, h, state_);
  }

 private:
  struct ForwardLaunch {
    std::uint8_t op;
    NodeArgs<S> x;
    S* y;
    std::size_t items;
  };
  struct BackwardLaunch {
    std::uint8_t op = 0, input = 0;
    NodeArgs<S> x;
    const S* y = nullptr;
    const S* g = nullptr;
    S* dx = nullptr;    // the input's gradient, or scratch when it accumulates
    S* grad = nullptr;  // the input's gradient
    std::size_t items = 0;
    std::size_t size = 0;  // elements to accumulate from scratch (0: stored as is)
  };

  NodeArgs<S> args(const Layout<S>& L, const DeviceNode<S>& n) const {
    NodeArgs<S> x;
    if (n.a != no_node) x.a = {values_ + L.nodes[n.a].value, L.nodes[n.a].dims};
    if (n.b != no_node) x.b = {values_ + L.nodes[n.b].value, L.nodes[n.b].dims};
    x.out = n.dims;
    x.scalar = n.scalar;
    x.axis = n.axis;
    if (n.extra != none) x.extra = extras_ + n.extra;
    return x;
  }

  Launcher run_;  // first member destroyed last: owns every buffer below
  S* values_ = nullptr;
  S* grads_ = nullptr;
  S* scratch_ = nullptr;
  std::size_t* extras_ = nullptr;
  std::vector<ForwardLaunch> forward_;
  std::vector<BackwardLaunch> backward_;
  std::vector<ParamView<S>> params_;
  ParamView<S>* views_ = nullptr;
  std::size_t views_capacity_ = 0, moment_capacity_ = 0;
  S* m_ = nullptr;
  S* v_ = nullptr;
  OptimizerState<S>* state_ = nullptr;
};

}  // namespace grad::device
