// The tape's side of recompute scopes (grad/recompute.hpp documents them):
// opening and closing a scope, keeping its outputs, and backward's replay
// of a scope, which computes again the values it needs in memory every
// scope shares, each buffer placed by its lifetime. Tape members defined
// out of the class, apart from the recording core because only recompute
// scopes use them. Included at the end of tape.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "grad/arena.hpp"
#include "grad/first_fit.hpp"
#include "grad/tape.hpp"

namespace grad {

template <class T>
bool Tape<T>::open_recompute() {
  if (!ok()) return false;
  if (open_scope_ != no_node)
    return fail("recompute: a scope is already open (opened at node " + std::to_string(open_scope_) +
                "); scopes do not nest");
  open_scope_ = static_cast<std::uint32_t>(nodes_.size());
  restart_scope_memory();
  return true;
}

template <class T>
bool Tape<T>::close_recompute(std::span<const Var<T>> outputs) {
  const std::uint32_t begin = open_scope_;
  open_scope_ = no_node;
  if (begin == no_node) return fail("recompute: no scope is open");
  const std::size_t end = nodes_.size();
  for (std::size_t i = begin; i < end; ++i)
    nodes_[i].transient = nodes_[i].op != op_code<Param> && nodes_[i].op != op_code<Const>;
  bool kept = true;
  for (std::size_t k = 0; k < outputs.size() && kept; ++k) {
    const Var<T>& v = outputs[k];
    if (!find(v))
      kept = fail("recompute: output " + std::to_string(k + 1) + " " +
                  (v.tape_ == this ? dropped_description(v) : std::string("(of another tape or none)")) +
                  " is not a live node of this tape");
    else if (v.index_ >= begin && nodes_[v.index_].transient)
      kept = keep(nodes_[v.index_]);
  }
  if (end > begin) scopes_.push_back({begin, static_cast<std::uint32_t>(end)});
  in_scope_memory_ = {begin, static_cast<std::uint32_t>(end)};
  return kept && ok();
}

// A recompute scope's output: its value moves to memory of its own (its
// gradient buffer too), so it outlives the scope.
template <class T>
bool Tape<T>::keep(Node<T>& n) {
  const std::size_t size = n.dims.size();
  const auto values_at = values_.position(), grads_at = grads_.position();
  try {
    T* value = values_.allocate(size);
    T* grad = n.requires_grad ? grads_.allocate(size) : nullptr;
    std::copy_n(n.value, size, value);
    n.value = value;
    n.grad = grad;
    n.transient = false;
    return true;
  } catch (const std::bad_alloc&) {
    values_.rewind(values_at);
    grads_.rewind(grads_at);
    return fail("recompute: out of memory keeping an output of " + std::to_string(size * sizeof(T)) + " bytes");
  }
}

// The transient nodes of the scope [first, end) up to `last`, in recording
// order, from the restarted scope memory (Arena::restart: every scope's
// pass is one block of it): a value for each that backward will read
// (replay_needed; the others are neither kept nor computed) and a gradient
// for each that takes one, placed by lifetime (place_scope_buffers), then
// the needed values computed again. False (poisoned) when memory runs out.
template <class T>
bool Tape<T>::replay(std::size_t first, std::size_t end, std::size_t last) {
  restart_scope_memory();
  in_scope_memory_ = {static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(last + 1)};
  replay_needed(first, end);
  if (!place_scope_buffers(first, last)) return false;
  for (std::size_t i = first; i <= last; ++i)
    if (nodes_[i].transient && replay_needed_[i - first]) {
      if (profiling()) [[unlikely]]
        replay_profiled(i);
      else
        (this->*replay_steps_[nodes_[i].op])(nodes_[i]);
      ++recomputed_nodes_;
    }
  return true;
}

// The values node n's backward step reads (ValueRead bits): its op's
// backward_reads for each operand that takes a gradient; none when n
// takes none (its step never runs).
template <class T>
std::uint8_t Tape<T>::backward_value_reads(const Node<T>& n) const {
  std::uint8_t reads = 0;
  if (n.requires_grad) {
    if (n.a != no_node && nodes_[n.a].requires_grad) reads |= replay_reads_[n.op][0];
    if (n.b != no_node && nodes_[n.b].requires_grad) reads |= replay_reads_[n.op][1];
  }
  return reads;
}

// Which of a scope's transient nodes the walk must compute again: those
// whose value a backward step inside the scope reads, and the values
// those are computed from. A LoRA layer's down projection, for one: its
// product with the frozen weight feeds add_scaled and then the residual
// add, neither of whose backward reads a value, and the layer's output is
// kept, so the product is not computed again. Under anomaly detection
// every value is (its reports read the operands' values).
template <class T>
void Tape<T>::replay_needed(std::size_t first, std::size_t end) {
  const bool all = (watch_ & inspect_detail::watch_anomalies) != 0;
  replay_needed_.assign(end - first, all);
  if (all) return;
  auto inside = [&](std::uint32_t i) { return i != no_node && i >= first && i < end; };
  for (std::size_t c = end; c-- > first;) {
    const Node<T>& n = nodes_[c];
    std::uint8_t reads = backward_value_reads(n);
    if (n.transient && (reads & reads_out)) replay_needed_[c - first] = 1;
    if (n.transient && replay_needed_[c - first]) reads |= reads_a | reads_b;  // computing it reads its operands
    if ((reads & reads_a) && inside(n.a)) replay_needed_[n.a - first] = 1;
    if ((reads & reads_b) && inside(n.b)) replay_needed_[n.b - first] = 1;
  }
}

// The needed values and the gradients of the transient nodes in [first,
// last], in one block of scope memory where two buffers share bytes when
// their lifetimes do not meet. Time runs through the replay (node i at step
// i - first) and then the walk (node i's backward at step n + last - i, n
// the nodes in [first, last]). A value lives from its replay to the last
// step that reads it: a later node's replay, or a backward step whose op
// reads it (backward_value_reads); under anomaly detection, whose reports
// read any value, to the walk's last step in the scope. A gradient lives
// from its last consumer's backward step, which writes it first, to its
// own, which reads it last. At each step the buffers that start there take
// space first and those that end there are given back after, so no two
// buffers one step touches share a byte. A LoRA projection's x.W and
// (x.A).B, for one, live only from their replay to add_scaled's, and their
// bytes then hold the MLP's gradients. The recording fixes the placement:
// the same every step. It changes no bit: every value and gradient is
// written whole before it is read.
template <class T>
bool Tape<T>::place_scope_buffers(std::size_t first, std::size_t last) {
  const std::size_t n = last - first + 1;
  auto inside = [&](std::uint32_t i) { return i != no_node && i >= first && i <= last && nodes_[i].transient; };
  auto walk_step = [&](std::size_t i) { return n + (last - i); };
  // Buffer 2k is node first + k's value, 2k + 1 its gradient; none where start is `none`.
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  std::vector<std::pair<std::size_t, std::size_t>>& life = scope_life_;  // (start, end) steps, per buffer
  life.assign(2 * n, {none, 0});
  const bool every_value_to_the_end = (watch_ & inspect_detail::watch_anomalies) != 0;
  auto read_at = [&](std::uint32_t i, std::size_t step) {
    if (inside(i) && life[2 * (i - first)].first != none)
      life[2 * (i - first)].second = std::max(life[2 * (i - first)].second, step);
  };
  for (std::size_t i = first; i <= last; ++i)  // values: from their replay, read by later replays
    if (nodes_[i].transient && replay_needed_[i - first]) {
      life[2 * (i - first)] = {i - first, every_value_to_the_end ? 2 * n - 1 : i - first};
      read_at(nodes_[i].a, i - first);
      read_at(nodes_[i].b, i - first);
    }
  for (std::size_t p = first; p <= last; ++p) {  // ... and by backward steps; gradients
    const Node<T>& node = nodes_[p];
    const std::uint8_t reads = backward_value_reads(node);
    if (reads & reads_out) read_at(static_cast<std::uint32_t>(p), walk_step(p));
    if (reads & reads_a) read_at(node.a, walk_step(p));
    if (reads & reads_b) read_at(node.b, walk_step(p));
    for (const std::uint32_t in : {node.a, node.b})  // p is a consumer of in: the latest one sets its start
      if (inside(in) && nodes_[in].requires_grad) life[2 * (in - first) + 1] = {walk_step(p), walk_step(in)};
  }
  // Each buffer's start and end as events in step order, starts first within a step.
  std::vector<std::pair<std::size_t, std::size_t>>& events = scope_events_;  // (2 step + ends, buffer)
  events.clear();
  for (std::size_t k = 0; k < 2 * n; ++k)
    if (life[k].first != none) {
      events.push_back({2 * life[k].first, k});
      events.push_back({2 * life[k].second + 1, k});
    }
  std::sort(events.begin(), events.end());
  auto length = [&](std::size_t k) { return Arena<T>::rounded(nodes_[first + k / 2].dims.size()); };
  std::vector<std::size_t>& offset = scope_offset_;
  offset.assign(2 * n, 0);
  scope_plan_.clear();
  for (const auto& [when, k] : events) {
    if (when % 2 == 0)
      offset[k] = scope_plan_.take(length(k));
    else
      scope_plan_.give(offset[k], length(k));
  }
  T* block = nullptr;
  try {
    block = scope_memory_.allocate(scope_plan_.extent());
  } catch (const std::bad_alloc&) {
    return fail("recompute: out of memory allocating " + std::to_string(scope_plan_.extent() * sizeof(T)) +
                " bytes for the values and gradients of a scope's nodes " + std::to_string(first) + " to " +
                std::to_string(last));
  }
  for (std::size_t k = 0; k < 2 * n; ++k) {
    Node<T>& node = nodes_[first + k / 2];
    if (life[k].first != none) (k % 2 == 0 ? node.value : node.grad) = block + offset[k];
  }
  return true;
}

// Hands the scope memory to another scope: the transient nodes whose
// buffers it held lose them (they read as empty anyway).
template <class T>
void Tape<T>::restart_scope_memory() {
  const std::size_t end = std::min<std::size_t>(in_scope_memory_.end, nodes_.size());
  for (std::size_t i = in_scope_memory_.begin; i < end; ++i)
    if (nodes_[i].transient) nodes_[i].value = nodes_[i].grad = nullptr;
  in_scope_memory_ = {};
  scope_memory_.restart();
}

}  // namespace grad
