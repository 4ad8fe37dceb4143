// What a tape keeps for the inspection tools (docs/inspect.md): name scopes,
// the first anomaly, and the profiler's events. Plain data, independent of
// T; Tape<T> holds one TapeInspection and touches it only when a watch is on
// (anomalies or profiling) or a NameScope opens or closes, so a tape that
// nobody inspects pays one predictable branch per recorded op and per
// backward step.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "grad/config.hpp"

namespace grad {

// The first node that made a non-finite value (forward) or gradient
// (backward) while anomaly detection was on; Tape::anomaly() returns it and
// the tape is poisoned with `message`. A captured device program reports the
// same (device::AnomalyError), and also a parameter its optimizer's step
// made non-finite (phase optimizer: `node` is the parameter, `operands` is
// empty, incoming_gradient_finite says whether its gradient was finite).
struct Anomaly {
  enum class Phase { forward, backward, optimizer };
  struct Operand {
    std::uint32_t node = no_node;
    std::string op;
    std::string shape;
    std::string scope;
    bool value_finite = true;
  };
  Phase phase = Phase::forward;
  std::uint32_t node = no_node;
  std::string op;
  std::string scope;   // the NameScope path active when the node was recorded ("" when none)
  std::string shape;   // of the node's output
  std::size_t element = 0;  // first non-finite element (of the value, or of the gradient handed down)
  double bad = 0;           // its value (nan, inf or -inf)
  std::vector<Operand> operands;
  // Backward only: which operand (0 or 1) received the non-finite
  // contribution, and whether what went in was finite; when both are true
  // this node made the first non-finite gradient.
  int gradient_to = -1;
  bool incoming_gradient_finite = true;
  std::string message;
};

// One profiled forward or backward step of one node. A recomputed event is
// a forward step computed again during backward (a recompute scope's node
// whose value a backward step reads, grad/recompute.hpp).
struct TraceEvent {
  std::uint32_t node = 0;
  std::uint8_t op = 0;
  bool backward = false;
  std::uint32_t scope = 0;
  std::uint64_t start_ns = 0, duration_ns = 0;  // start relative to when profiling was turned on
  std::uint64_t bytes = 0;                      // of the buffer the step wrote (value, or gradients handed down)
  bool recomputed = false;
};

namespace inspect_detail {

inline constexpr std::uint8_t watch_anomalies = 1, watch_profile = 2;

// Name scopes as an interned tree ("" is scope 0, the root) plus the points
// in the node sequence where the open scope changed. Nodes carry no scope
// field: a node's scope is found by binary search over `changes`, which grows
// by one entry per NameScope opened or closed, never per op.
struct Scopes {
  std::vector<std::string> names{std::string()};  // full dotted paths
  std::vector<std::uint32_t> parents{0};
  std::vector<std::vector<std::uint32_t>> children{{}};  // per scope: so a lookup reads only its siblings
  std::vector<std::uint32_t> stack;  // open scopes, innermost last
  struct Change {
    std::size_t first_node;
    std::uint32_t scope;
  };
  std::vector<Change> changes;

  std::uint32_t current() const { return stack.empty() ? 0 : stack.back(); }

  // Looks the scope up among its parent's children without building its
  // path, so reopening a known scope (every training step) allocates nothing
  // and costs a few comparisons, however many scopes a model has.
  std::uint32_t intern(std::uint32_t parent, std::string_view name) {
    const std::size_t length = (parent == 0 ? 0 : names[parent].size() + 1) + name.size();
    for (std::uint32_t i : children[parent])
      if (names[i].size() == length && std::string_view(names[i]).ends_with(name)) return i;
    std::string full = parent == 0 ? std::string(name) : names[parent] + "." + std::string(name);
    const auto id = static_cast<std::uint32_t>(names.size());
    names.push_back(std::move(full));
    parents.push_back(parent);
    children.emplace_back();
    children[parent].push_back(id);
    return id;
  }
  void enter(std::string_view name, std::size_t next_node) {
    stack.push_back(intern(current(), name));
    note(next_node);
  }
  void leave(std::size_t next_node) {
    if (!stack.empty()) stack.pop_back();
    note(next_node);
  }
  // Records that nodes from next_node on belong to the current scope.
  void note(std::size_t next_node) {
    while (!changes.empty() && changes.back().first_node >= next_node) changes.pop_back();
    const std::uint32_t before = changes.empty() ? 0 : changes.back().scope;
    if (before != current()) changes.push_back({next_node, current()});
  }
  std::uint32_t of(std::size_t node) const {
    auto it = std::upper_bound(changes.begin(), changes.end(), node,
                               [](std::size_t n, const Change& c) { return n < c.first_node; });
    return it == changes.begin() ? 0 : std::prev(it)->scope;
  }
};

}  // namespace inspect_detail

struct TapeInspection {
  inspect_detail::Scopes scopes;
  bool has_anomaly = false;
  Anomaly anomaly;
  std::vector<TraceEvent> events;
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
};

}  // namespace grad
