// The replay every backend shares. It resolves a Layout's launch list
// (plan.hpp) into Launches with backend pointers once; then, by mode:
//
//   per_node  forward()/backward()/optimizer_step() launch at once, one
//             kernel per launch
//   graph     the calls are queued; at the next upload, read or optimizer
//             change the queued phases (forward, backward, optimizer: the
//             whole training step) run as one CUDA graph, captured the first
//             time that sequence is seen and replayed after
//   fused     as graph, but each phase runs the FusionPlan's segments: one
//             kernel per row run, serial tail or batch of reductions; the
//             optimizer's updates share one grid
//
// Uploads never happen inside a capture: they flush the queue first, so a
// replayed graph reads the fresh inputs from the buffers it captured. The
// optimizer's hyperparameters (OptimizerHyper: lr, betas, eps, clip) are
// such a buffer too, one record in device memory that the optimizer kernels
// read through a pointer: a new rate is an upload before the step, never a
// new graph (it flushes first only when a queued optimizer phase would read
// the record). What still re-captures: a new parameter set (set_optimizer
// drops the graphs), and a sequence of phases not seen before.
// graph_captures() counts the captures (the CPU backend emulates them).
//
// Anomaly mode (detect_anomalies) runs every phase at once, launch by launch
// (no graph, no fused segment: every mode lands on the same bits, so the
// values checked are the ones a fused step computes), and reads back each
// launch's output: the first non-finite element stops the replay with an
// AnomalyError naming that launch. Off, a launch costs one branch more.
//
// A capture (or fused launch) that fails falls back to per-node launches with
// a message on stderr and in fallback_reason(), never silently; a device
// fault (DeviceFault: an illegal address, a failed launch) is never a reason
// to fall back and propagates as is. With GRAD_REQUIRE_CUDA=1 in the
// environment a fallback throws instead (the device check wants no quiet
// degradation).
//
// Launcher interface:
//   U* allocate<U>(n)  (zeroed, freed by the launcher), upload/download(dst, src, bytes)
//   forward<Op>(NodeArgs<S>, S* y, items)     backward<Op, In>(NodeArgs<S>, y, g, dx, items)
//   accumulate(S* grad, const S* scratch, n)
//   rows(const Launch<S>* device, count, rows, threads)   serial(device, count)   batch(device, count, host copy)
//   optimizer_prepare(const ParamView<S>* params, count, const hyper*, state*)
//   optimizer_update(ParamView<S>, const hyper*, const state*)
//   optimizer_update_all(device views, count, host views, const hyper*, const state*)  (fused: one grid)
//   graph(key, record): runs record() under graph `key`, captured on its
//     first use since the last drop_graphs(), replayed after
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/device/engine.hpp"
#include "grad/device/launch.hpp"
#include "grad/device/plan.hpp"
#include "grad/inspect/finite.hpp"

namespace grad::device {

template <class S, class Launcher>
class ReplayEngine final : public Engine<S> {
 public:
  template <class... LauncherArgs>
  ReplayEngine(const Layout<S>& L, Mode mode, const FusionPlan& plan, bool fuse, LauncherArgs&&... launcher_args)
      : run_(std::forward<LauncherArgs>(launcher_args)...), mode_(mode) {
    const char* strict = std::getenv("GRAD_REQUIRE_CUDA");
    strict_ = strict && std::string(strict) == "1";
    values_ = run_.template allocate<S>(L.values.size());
    grads_ = run_.template allocate<S>(L.grad_size);
    scratch_ = run_.template allocate<S>(L.scratch_size);
    extras_ = run_.template allocate<std::size_t>(L.extras.size());
    run_.upload(values_, L.values.data(), L.values.size() * sizeof(S));
    run_.upload(extras_, L.extras.data(), L.extras.size() * sizeof(std::size_t));
    // The loss's own gradient is 1 for good: no captured node consumes the
    // loss, so nothing ever writes that slot again.
    const DeviceNode<S>& root = L.nodes[L.loss];
    if (root.grad != no_offset) {
      const S one = S(1);
      run_.upload(grads_ + root.grad, &one, sizeof(S));
    }
    for (const LaunchSpec& s : plan.forward) forward_.push_back(resolve(L, s));
    for (const LaunchSpec& s : plan.backward) backward_.push_back(resolve(L, s));
    forward_specs_ = plan.forward;
    backward_specs_ = plan.backward;
    for (std::uint32_t i = 0; i < L.nodes.size(); ++i) {
      grad_offsets_.push_back(L.nodes[i].grad);
      if (L.nodes[i].op == op_code<Param>) param_at_[L.nodes[i].value] = i;
    }
    if (fuse) build_units(plan);
  }

  void write_values(std::size_t offset, std::span<const S> src) override {
    flush();
    run_.upload(values_ + offset, src.data(), src.size_bytes());
  }
  void read_values(std::size_t offset, std::span<S> dst) override {
    flush();
    run_.download(dst.data(), values_ + offset, dst.size_bytes());
  }
  void read_grads(std::size_t offset, std::span<S> dst) override {
    flush();
    run_.download(dst.data(), grads_ + offset, dst.size_bytes());
  }
  void write_grads(std::size_t offset, std::span<const S> src) override {
    flush();
    run_.upload(grads_ + offset, src.data(), src.size_bytes());
  }
  S* grads_in_place() override {
    flush();
    return grads_;
  }

  void detect_anomalies(NameNonFinite name) override {
    flush();  // what was queued before runs as it was queued, unchecked
    name_ = std::move(name);
  }

  void forward() override { queue(Phase::forward); }
  void backward() override { queue(Phase::backward); }

  void set_optimizer(std::span<const ParamSlot> params, bool adam) override {
    // A queued optimizer phase runs with the old views and state; queued
    // forward and backward phases never read them and stay queued, so the
    // first step is still one graph.
    flush_if_optimizer_queued();
    drop_graphs();  // captured updates point at the old views
    std::size_t moments = 0;
    for (const ParamSlot& p : params) moments += p.size;
    // State buffers are allocated once per program and grown if needed.
    if (adam && moments > moment_capacity_) {
      m_ = run_.template allocate<S>(moments);
      v_ = run_.template allocate<S>(moments);
      moment_capacity_ = moments;
    }
    adam_ = adam;
    moments_ = moments;
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
      view.weight_decay = static_cast<S>(p.weight_decay);
      params_.push_back(view);
      at += p.size;
    }
    if (params_.size() > views_capacity_) {
      views_ = run_.template allocate<ParamView<S>>(params_.size());
      views_capacity_ = params_.size();
    }
    if (!params_.empty()) run_.upload(views_, params_.data(), params_.size() * sizeof(ParamView<S>));
    if (!state_) state_ = run_.template allocate<OptimizerState<S>>(1);
    if (!hyper_device_) hyper_device_ = run_.template allocate<OptimizerHyper<S>>(1);
    const OptimizerState<S> fresh{};
    run_.upload(state_, &fresh, sizeof fresh);
  }

  void optimizer_step(const OptimizerSettings& s) override {
    if (!state_) return;
    const OptimizerHyper<S> h{static_cast<S>(s.lr),  static_cast<S>(s.beta1), static_cast<S>(s.beta2),
                              static_cast<S>(s.eps), static_cast<S>(s.clip),  s.adam,
                              s.form};
    // The kernels read the record in device memory: a change is an upload,
    // and the graphs stay. A queued optimizer phase must still see the old
    // record, so it runs first; forward and backward never read it.
    const bool same = hyper_uploaded_ && h.lr == hyper_.lr && h.beta1 == hyper_.beta1 && h.beta2 == hyper_.beta2 &&
                      h.eps == hyper_.eps && h.clip == hyper_.clip && h.adam == hyper_.adam && h.form == hyper_.form;
    if (!same) {
      flush_if_optimizer_queued();
      run_.upload(hyper_device_, &h, sizeof h);
      hyper_ = h;
      hyper_uploaded_ = true;
    }
    queue(Phase::optimizer);
  }

  void read_optimizer_state(std::span<S> m, std::span<S> v, S& beta1_power, S& beta2_power) override {
    flush();
    check_state_spans(m.size(), v.size());
    if (!m.empty()) run_.download(m.data(), m_, m.size_bytes());
    if (!v.empty()) run_.download(v.data(), v_, v.size_bytes());
    OptimizerState<S> st;
    run_.download(&st, state_, sizeof st);
    beta1_power = st.beta1_power;
    beta2_power = st.beta2_power;
  }
  void write_optimizer_state(std::span<const S> m, std::span<const S> v, S beta1_power, S beta2_power) override {
    flush();
    check_state_spans(m.size(), v.size());
    if (!m.empty()) run_.upload(m_, m.data(), m.size_bytes());
    if (!v.empty()) run_.upload(v_, v.data(), v.size_bytes());
    OptimizerState<S> st{};
    st.beta1_power = beta1_power;  // the step's scale and constants are recomputed by the next step
    st.beta2_power = beta2_power;
    run_.upload(state_, &st, sizeof st);
  }

  const std::string& fallback_reason() const override { return fallback_; }
  std::uint64_t launches() const override { return launched_; }
  std::uint64_t graph_captures() const override { return captures_; }
  void flush() override {
    if (pending_.empty()) return;
    const std::vector<Phase> phases = std::move(pending_);
    pending_.clear();
    if (fallback_.empty()) {
      try {
        const std::size_t key = keys_.try_emplace(phases, keys_.size()).first->second;
        if (captured_.size() <= key) captured_.resize(key + 1, false);
        const bool capturing = !captured_[key];  // the launcher captures a key on its first use since a drop
        const std::uint64_t before = launched_;
        run_.graph(key, [&] {
          for (Phase p : phases) enqueue(p, fused_);
        });
        if (capturing) {
          captured_[key] = true;
          ++captures_;
        }
        // A replayed graph runs the kernels its capture counted.
        if (graph_kernels_.size() <= key) graph_kernels_.resize(key + 1, 0);
        if (launched_ != before)
          graph_kernels_[key] = launched_ - before;
        else
          launched_ += graph_kernels_[key];
        return;
      } catch (const DeviceFault&) {
        throw;  // the context is broken: per-node launches would only fail again
      } catch (const std::runtime_error& e) {
        fallback_ = "grad::device: " + std::string(mode_ == Mode::fused ? "fused" : "graph") +
                    " mode could not run the step as a graph (" + e.what() + "); falling back to per-node launches";
        std::fprintf(stderr, "%s\n", fallback_.c_str());
        if (strict_) throw std::runtime_error(fallback_ + " [refused: GRAD_REQUIRE_CUDA=1]");
        drop_graphs();
        keys_.clear();
        captured_.clear();
        graph_kernels_.clear();
      }
    }
    for (Phase p : phases) enqueue(p, false);
  }

 private:
  // A fused-mode kernel: a segment of the plan, over device_launches_[first, first + count).
  struct Unit {
    SegmentKind kind;
    std::size_t first, count, rows, threads;
  };

  void check_state_spans(std::size_t m, std::size_t v) const {
    if (!state_) throw std::logic_error("grad::device: the optimizer state is read or written before set_optimizer");
    const std::size_t want = adam_ ? moments_ : 0;
    if (m != want || v != want)
      throw std::invalid_argument("grad::device: optimizer state: " + std::to_string(m) + " and " + std::to_string(v) +
                                  " moments given, the optimizer has " + std::to_string(want) + " of each");
  }

  void flush_if_optimizer_queued() {
    if (std::find(pending_.begin(), pending_.end(), Phase::optimizer) != pending_.end()) flush();
  }

  // Drops every captured graph; each key is captured again on its next use.
  void drop_graphs() {
    run_.drop_graphs();
    captured_.assign(captured_.size(), false);
  }

  void queue(Phase phase) {
    if (mode_ == Mode::per_node || name_)
      enqueue(phase, false);
    else
      pending_.push_back(phase);
  }

  void enqueue(Phase phase, bool fused) {
    if (phase == Phase::optimizer) {
      if (!state_) return;
      run_.optimizer_prepare(views_, params_.size(), hyper_device_, state_);
      ++launched_;
      if (fused && params_.size() > 1) {
        run_.optimizer_update_all(views_, params_.size(), params_.data(), hyper_device_, state_);
        ++launched_;
      } else {
        for (const ParamView<S>& p : params_) {
          run_.optimizer_update(p, hyper_device_, state_);
          if (name_) [[unlikely]]
            check_update(p);
        }
        launched_ += params_.size();
      }
      return;
    }
    if (!fused) {
      const std::vector<Launch<S>>& launches = phase == Phase::forward ? forward_ : backward_;
      for (std::size_t k = 0; k < launches.size(); ++k) {
        launch(launches[k]);
        if (name_) [[unlikely]]
          check_launch(launches[k], (phase == Phase::forward ? forward_specs_ : backward_specs_)[k]);
      }
      return;
    }
    for (const Unit& u : phase == Phase::forward ? forward_units_ : backward_units_) {
      const Launch<S>* d = device_launches_ + u.first;
      ++launched_;
      switch (u.kind) {
        case SegmentKind::rows:
          run_.rows(d, u.count, u.rows, u.threads);
          break;
        case SegmentKind::serial:
          run_.serial(d, u.count);
          break;
        case SegmentKind::across_rows:
          if (u.count > 1) {
            run_.batch(d, u.count, host_launches_.data() + u.first);
            break;
          }
          [[fallthrough]];
        case SegmentKind::per_node:
          --launched_;  // launch() counts it
          launch(host_launches_[u.first]);
          break;
      }
    }
  }

  // One launch as its own kernel: the per-node path.
  void launch(const Launch<S>& l) {
    ++launched_;
    if (l.kind == LaunchKind::accumulate) {
      run_.accumulate(l.grad, l.dx, l.items);
      return;
    }
    with_op(l.op, [&](auto op) {
      using Op = decltype(op);
      if constexpr (has_item_bodies<Op>) {
        if (l.kind == LaunchKind::forward)
          run_.template forward<Op>(l.x, l.y, l.items);
        else if (l.kind == LaunchKind::backward_a)
          run_.template backward<Op, 0>(l.x, l.y, l.g, l.dx, l.items);
        else if constexpr (Op::arity > 1)
          run_.template backward<Op, 1>(l.x, l.y, l.g, l.dx, l.items);
      }
    });
  }

  // Anomaly mode: the first non-finite element of n elements at p (backend
  // memory), or n. Read through a host copy, as CUDA needs.
  std::size_t first_bad(const S* p, std::size_t n) {
    probe_.resize(n);
    run_.download(probe_.data(), p, n * sizeof(S));
    return inspect_detail::first_non_finite(probe_.data(), n);
  }
  bool finite(const S* p, std::size_t n) { return first_bad(p, n) == n; }

  // After launch l (spec s): stops the replay if it wrote a non-finite element.
  void check_launch(const Launch<S>& l, const LaunchSpec& s) {
    const std::size_t n = s.out.size();
    const S* out = s.kind == LaunchKind::forward      ? l.y
                   : s.kind == LaunchKind::accumulate ? l.grad
                                                      : l.dx;
    const std::size_t bad = first_bad(out, n);
    if (bad == n) return;
    NonFinite f;
    f.element = bad;
    f.bad = static_cast<double>(probe_[bad]);
    f.node = s.node;
    f.phase = s.kind == LaunchKind::forward ? Anomaly::Phase::forward : Anomaly::Phase::backward;
    f.input = s.input;
    if (l.x.a.data) f.operand_finite[0] = finite(l.x.a.data, l.x.a.dims.size());
    if (l.x.b.data) f.operand_finite[1] = finite(l.x.b.data, l.x.b.dims.size());
    if (s.kind != LaunchKind::forward) f.incoming_finite = finite(grads_ + grad_offsets_[s.node], l.x.out.size());
    throw AnomalyError(name_(f));
  }
  // After an optimizer update of p: stops the replay if the parameter went non-finite.
  void check_update(const ParamView<S>& p) {
    const std::size_t bad = first_bad(p.w, p.size);
    if (bad == p.size) return;
    NonFinite f;
    f.phase = Anomaly::Phase::optimizer;
    f.node = param_at_.at(static_cast<std::size_t>(p.w - values_));
    f.element = bad;
    f.bad = static_cast<double>(probe_[bad]);
    f.incoming_finite = finite(p.g, p.size);
    throw AnomalyError(name_(f));
  }

  Launch<S> resolve(const Layout<S>& L, const LaunchSpec& s) const {
    const DeviceNode<S>& n = L.nodes[s.node];
    Launch<S> l;
    l.kind = s.kind;
    l.op = s.op;
    l.items = s.items;
    l.x = args(L, n);
    if (s.kind == LaunchKind::forward) {
      l.y = values_ + n.value;
      return l;
    }
    S* in_grad = grads_ + L.nodes[s.input].grad;
    if (s.kind == LaunchKind::accumulate) {
      l.grad = in_grad;
      l.dx = scratch_;
      return l;
    }
    l.y = values_ + n.value;
    l.g = grads_ + n.grad;
    l.dx = s.to_scratch ? scratch_ : in_grad;
    return l;
  }

  // Lays the plan's launches out in segment order, once, in device memory.
  void build_units(const FusionPlan& plan) {
    constexpr std::size_t max_threads = 256;
    for (const Segment& seg : plan.segments) {
      const std::vector<Launch<S>>& from = seg.phase == Phase::forward ? forward_ : backward_;
      Unit u{seg.kind, host_launches_.size(), seg.launches.size(), seg.rows, 0};
      // Threads per block: the widest row, in whole warps, at most 256 (a row wider loops).
      u.threads = std::min(max_threads, (seg.width + 31) / 32 * 32);
      for (std::uint32_t i : seg.launches) host_launches_.push_back(from[i]);
      (seg.phase == Phase::forward ? forward_units_ : backward_units_).push_back(u);
    }
    device_launches_ = run_.template allocate<Launch<S>>(host_launches_.size());
    run_.upload(device_launches_, host_launches_.data(), host_launches_.size() * sizeof(Launch<S>));
    fused_ = true;
  }

  NodeArgs<S> args(const Layout<S>& L, const DeviceNode<S>& n) const {
    NodeArgs<S> x;
    if (n.a != no_node) x.a = {values_ + L.nodes[n.a].value, L.nodes[n.a].dims};
    if (n.b != no_node) x.b = {values_ + L.nodes[n.b].value, L.nodes[n.b].dims};
    x.out = n.dims;
    x.scalar = n.scalar;
    x.axis = n.axis;
    if (n.extra != no_offset) x.extra = extras_ + n.extra;
    return x;
  }

  Launcher run_;  // first member destroyed last: owns every buffer below
  Mode mode_;
  bool strict_ = false;
  S* values_ = nullptr;
  S* grads_ = nullptr;
  S* scratch_ = nullptr;
  std::size_t* extras_ = nullptr;
  std::vector<Launch<S>> forward_, backward_;
  // Anomaly mode: on while name_ is set; what a finding needs to say where it is.
  NameNonFinite name_;
  std::vector<LaunchSpec> forward_specs_, backward_specs_;
  std::vector<std::size_t> grad_offsets_;          // per node
  std::map<std::size_t, std::uint32_t> param_at_;  // value offset -> parameter node
  std::vector<S> probe_;                           // host copy of the buffer checked
  // Fused mode: the plan's launches in segment order (host copy and device copy) and its kernels.
  std::vector<Launch<S>> host_launches_;
  Launch<S>* device_launches_ = nullptr;
  std::vector<Unit> forward_units_, backward_units_;
  bool fused_ = false;
  // Graph and fused modes: phases queued since the last flush, graph key per sequence.
  std::vector<Phase> pending_;
  std::map<std::vector<Phase>, std::size_t> keys_;
  std::vector<std::uint64_t> graph_kernels_;  // kernels per graph key
  std::vector<bool> captured_;                // per graph key: captured since the last drop
  std::uint64_t launched_ = 0, captures_ = 0;
  std::string fallback_;
  OptimizerHyper<S> hyper_{};  // host copy of *hyper_device_ (valid once hyper_uploaded_)
  OptimizerHyper<S>* hyper_device_ = nullptr;
  bool hyper_uploaded_ = false;
  std::vector<ParamView<S>> params_;
  ParamView<S>* views_ = nullptr;
  std::size_t views_capacity_ = 0, moment_capacity_ = 0;
  std::size_t moments_ = 0;  // elements of each moment buffer in use (Adam)
  bool adam_ = false;
  S* m_ = nullptr;
  S* v_ = nullptr;
  OptimizerState<S>* state_ = nullptr;
};

}  // namespace grad::device
