// The tape's inspection hooks (anomaly detection, profiling) and NameScope.
// Included at the end of tape.hpp; entered only when Tape::watch_ is not
// zero, so the unwatched paths in record() and backward() stay as they were.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

#include "grad/inspect/finite.hpp"
#include "grad/tape.hpp"

namespace grad {

namespace inspect_detail {

inline std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// A string as the inside of a JSON (or DOT) string literal.
inline std::string json_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

inline std::uint64_t since(std::chrono::steady_clock::time_point epoch, std::chrono::steady_clock::time_point t) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t - epoch).count());
}

// The report's words. `outside` says where a non-finite input can have come
// from when every recorded op is checked (the tape and a device replay differ).
inline std::string anomaly_message(const Anomaly& a, std::string_view outside) {
  const bool backward = a.phase == Anomaly::Phase::backward, optimizer = a.phase == Anomaly::Phase::optimizer;
  std::string m = std::string("anomaly: ") + (backward ? "backward" : optimizer ? "optimizer step" : "forward") +
                  ": node " + std::to_string(a.node) + " (" + a.op + (a.scope.empty() ? "" : " in '" + a.scope + "'") +
                  ", " + (optimizer ? "" : "output ") + a.shape + ") ";
  const std::string where = " (" + number(a.bad) + " at element " + std::to_string(a.element) + ")";
  if (optimizer)
    return m + "became non-finite in the optimizer's step" + where + "; its gradient was " +
           (a.incoming_gradient_finite ? "finite: the update itself overflowed (learning rate, moments or clipping)"
                                       : "NOT finite: the backward pass that made it was not checked");
  if (backward)
    m += "handed a non-finite gradient" + where + " to operand " + std::to_string(a.gradient_to + 1) + " (node " +
         std::to_string(a.operands[static_cast<std::size_t>(a.gradient_to)].node) + "); its incoming gradient was " +
         (a.incoming_gradient_finite ? "finite" : "NOT finite");
  else
    m += "produced a non-finite value" + where;
  bool operands_finite = true;
  for (std::size_t k = 0; k < a.operands.size(); ++k) {
    const Anomaly::Operand& o = a.operands[k];
    operands_finite = operands_finite && o.value_finite;
    m += std::string(k == 0 ? "; operands: " : ", ") + std::to_string(k + 1) + " = node " + std::to_string(o.node) +
         " (" + o.op + " " + o.shape + (o.scope.empty() ? "" : " in '" + o.scope + "'") + ", " +
         (o.value_finite ? "finite" : "already NOT finite") + ")";
  }
  if (operands_finite && a.incoming_gradient_finite)
    m += backward ? "; this node made the first non-finite gradient" : "; this node made the first non-finite value";
  else
    m += "; the non-finite input came from outside the watched recording (" + std::string(outside) + ")";
  return m;
}

}  // namespace inspect_detail

// Opens a name scope on the tape for its lifetime: every node recorded
// meanwhile belongs to it (the anomaly report, the DOT clusters, the summary
// and the profiler's per-scope rows use it). Scopes nest into dotted paths:
//
//   grad::NameScope encoder(tp, "encoder");
//   { grad::NameScope layer(tp, "0"); h = lin(x); }   // scope "encoder.0"
//
// Costs a short string lookup when opened, nothing per op.
template <class T>
class NameScope {
 public:
  NameScope(Tape<T>& tp, std::string_view name) : tp_(&tp) { tp_->push_scope(name); }
  ~NameScope() { tp_->pop_scope(); }
  NameScope(const NameScope&) = delete;
  NameScope& operator=(const NameScope&) = delete;

 private:
  Tape<T>* tp_;
};

// Anomaly detection for one scope (torch.autograd.detect_anomaly): on while
// the guard lives, then back to what it was.
template <class T>
class AnomalyGuard {
 public:
  explicit AnomalyGuard(Tape<T>& tp) : tp_(&tp), was_(tp.detects_anomalies()) { tp.detect_anomalies(true); }
  ~AnomalyGuard() { tp_->detect_anomalies(was_); }
  AnomalyGuard(const AnomalyGuard&) = delete;
  AnomalyGuard& operator=(const AnomalyGuard&) = delete;

 private:
  Tape<T>* tp_;
  bool was_;
};

template <class T>
Anomaly Tape<T>::describe(Anomaly::Phase phase, std::size_t i) const {
  const Node<T>& n = nodes_[i];
  Anomaly a;
  a.phase = phase;
  a.node = static_cast<std::uint32_t>(i);
  a.op = std::string(op_name(n.op));
  a.scope = scope_name(i);
  a.shape = shape_string(n.dims);
  for (std::uint32_t in : {n.a, n.b}) {
    if (in == no_node) continue;
    const Node<T>& x = nodes_[in];
    Anomaly::Operand o;
    o.node = in;
    o.op = std::string(op_name(x.op));
    o.shape = shape_string(x.dims);
    o.scope = scope_name(in);
    o.value_finite = inspect_detail::first_non_finite(x.value, x.dims.size()) == x.dims.size();
    a.operands.push_back(std::move(o));
  }
  return a;
}

// Words the report, keeps it, poisons the tape (which throws in exception mode).
template <class T>
bool Tape<T>::report_anomaly(Anomaly a) {
  std::string m = inspect_detail::anomaly_message(
      a, "a leaf's value, or an op recorded before anomaly detection was on");
  a.message = m;
  inspection_.anomaly = std::move(a);
  inspection_.has_anomaly = true;
  poison(std::move(m));  // may throw TapeError: the report is kept first
  return false;
}

template <class T>
template <class Op>
Var<T> Tape<T>::record_watched(Node<T>& n) {
  using clock = std::chrono::steady_clock;
  const bool timed = profiling();
  const clock::time_point start = timed ? clock::now() : clock::time_point{};
  forward<Op>(forward_args(n), n.value);
  const clock::time_point stop = timed ? clock::now() : clock::time_point{};
  learn_backward<Op>();
  return finish_watched(n, start, stop);
}

// The rest of record_watched, the same for every op: keeps the node, its
// profile event, its anomaly check.
template <class T>
Var<T> Tape<T>::finish_watched(Node<T>& n, std::chrono::steady_clock::time_point start,
                               std::chrono::steady_clock::time_point stop) {
  Var<T> v = push(n);
  const std::size_t i = nodes_.size() - 1, size = n.dims.size();
  if (profiling())
    inspection_.events.push_back({static_cast<std::uint32_t>(i), n.op, false, inspection_.scopes.of(i),
                                  inspect_detail::since(inspection_.epoch, start),
                                  inspect_detail::since(inspection_.epoch, stop) -
                                      inspect_detail::since(inspection_.epoch, start),
                                  size * sizeof(T)});
  if (detects_anomalies()) {
    const std::size_t bad = inspect_detail::first_non_finite(n.value, size);
    if (bad < size) {
      Anomaly a = describe(Anomaly::Phase::forward, i);
      a.element = bad;
      a.bad = static_cast<double>(n.value[bad]);
      report_anomaly(std::move(a));
      return rejected();  // as every poisoned op: the node stays on the tape for inspection
    }
  }
  return v;
}

template <class T>
Var<T> Tape<T>::check_leaf(Var<T> v) {
  const Node<T>& n = nodes_[v.index_];
  const std::size_t size = n.dims.size();
  std::size_t bad = 0;
  T value = T(0);
  if (narrow(n.storage)) {  // its widened values
    while (bad < size && std::isfinite(n.value_at(bad))) ++bad;
    if (bad < size) value = n.value_at(bad);
  } else {
    bad = inspect_detail::first_non_finite(n.value, size);
    if (bad < size) value = n.value[bad];
  }
  if (bad == size) return v;
  Anomaly a = describe(Anomaly::Phase::forward, v.index_);
  a.element = bad;
  a.bad = static_cast<double>(value);
  report_anomaly(std::move(a));
  return rejected();
}

// A recompute scope's node computed again, timed (Tape::replay while profiling).
template <class T>
void Tape<T>::replay_profiled(std::size_t i) {
  using clock = std::chrono::steady_clock;
  Node<T>& n = nodes_[i];
  const clock::time_point start = clock::now();
  (this->*replay_steps_[n.op])(n);
  const clock::time_point stop = clock::now();
  const std::uint64_t t0 = inspect_detail::since(inspection_.epoch, start);
  inspection_.events.push_back({static_cast<std::uint32_t>(i), n.op, false, inspection_.scopes.of(i), t0,
                                inspect_detail::since(inspection_.epoch, stop) - t0, n.dims.size() * sizeof(T), true});
}

template <class T>
bool Tape<T>::backward_watched(std::size_t i) {
  using clock = std::chrono::steady_clock;
  Node<T>& n = nodes_[i];
  const bool checked = detects_anomalies();
  const std::size_t size = n.dims.size();
  const bool incoming_finite = !checked || inspect_detail::first_non_finite(n.grad, size) == size;
  const bool timed = profiling();
  const clock::time_point start = timed ? clock::now() : clock::time_point{};
  (this->*backward_steps_[n.op])(n);
  if (timed) {
    const clock::time_point stop = clock::now();
    std::uint64_t bytes = 0;
    for (std::uint32_t in : {n.a, n.b})
      if (in != no_node && nodes_[in].grad) bytes += nodes_[in].dims.size() * sizeof(T);
    const std::uint64_t t0 = inspect_detail::since(inspection_.epoch, start);
    inspection_.events.push_back({static_cast<std::uint32_t>(i), n.op, true, inspection_.scopes.of(i), t0,
                                  inspect_detail::since(inspection_.epoch, stop) - t0, bytes});
  }
  if (!checked) return true;
  const std::uint32_t inputs[2] = {n.a, n.b};
  for (int k = 0; k < 2; ++k) {
    const std::uint32_t in = inputs[k];
    if (in == no_node || !nodes_[in].grad) continue;
    const Node<T>& x = nodes_[in];
    const std::size_t bad = inspect_detail::first_non_finite(x.grad, x.dims.size());
    if (bad == x.dims.size()) continue;
    Anomaly a = describe(Anomaly::Phase::backward, i);
    a.gradient_to = k;
    a.element = bad;
    a.bad = static_cast<double>(x.grad[bad]);
    a.incoming_gradient_finite = incoming_finite;
    return report_anomaly(std::move(a));
  }
  return true;
}

}  // namespace grad
