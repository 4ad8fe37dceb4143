// The launch list of a captured episode and the fusion planner over it.
//
// launch_list() turns a Layout into the launches a per-node replay runs, in
// order (forward: one per computed node; backward: one per BackwardStep, and
// an accumulate after each contribution that goes through scratch). Every
// mode replays this list; plan_fusion() only groups its launches:
//
//   rows        maximal runs of row-local launches over the same [rows, cols]
//               split (elementwise, unary, broadcast-row, activation·W with W
//               not written in the run, backward of each): ONE kernel, block
//               per row, a barrier between launches
//   serial      the scalar tail (launches of one item: sum/mean, the loss
//               chain): one kernel, one thread, in order
//   across_rows reductions over the rows (dW = Xᵀ·G, a bias gradient):
//               each launch's own per-node body in the documented order;
//               the ones a row run passes are set aside and run after it,
//               together in one grid (they are independent of each other)
//   per_node    everything else (softmax, bmm, slice, concat, ...), with why
//
// Grouping never changes what a work item computes (the same per-item
// body, the same inner-loop order): only which thread runs it and where the
// barriers are, so every mode lands on the same bits. The planner checks each
// launch's buffers for hazards before it joins a group (a row may only read,
// from inside its run, the rows it owns; a launch set aside must not be
// overtaken by one that touches its buffers).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/device/engine.hpp"
#include "grad/device/launch.hpp"

namespace grad::device {

// The phases of a training step. A FusionPlan has forward and backward
// segments; the optimizer step is its own phase of the replay.
enum class Phase : std::uint8_t { forward, backward, optimizer };

// One launch of the per-node replay, as the planner sees it.
struct LaunchSpec {
  LaunchKind kind = LaunchKind::forward;
  std::uint8_t op = 0;      // the node's op (accumulate: the node whose contribution is added)
  std::uint32_t node = 0;   // the node run (forward) or differentiated (backward)
  std::uint32_t input = 0;  // backward / accumulate: the input receiving the gradient
  bool to_scratch = false;  // backward: the contribution goes to scratch (a later accumulate adds it)
  Dims out;                 // the tensor written: the node's value, or the input's gradient
  std::size_t items = 0;
};

enum class SegmentKind : std::uint8_t { rows, serial, across_rows, per_node };

struct Segment {
  SegmentKind kind = SegmentKind::per_node;
  Phase phase = Phase::forward;
  std::vector<std::uint32_t> launches;  // indices into the phase's launch list, in run order
  std::size_t rows = 0;                 // rows: blocks (one per row)
  std::size_t width = 0;                // rows: most items any launch has per row
  std::string why;                      // per_node / across_rows: why not fused
};

struct FusionPlan {
  std::vector<LaunchSpec> forward, backward;
  std::vector<Segment> segments;  // forward's, then backward's

  const std::vector<LaunchSpec>& launches(Phase p) const { return p == Phase::forward ? forward : backward; }
  // Kernels one phase runs under this plan (launches, per-node).
  std::size_t kernels(Phase p) const {
    return static_cast<std::size_t>(
        std::count_if(segments.begin(), segments.end(), [&](const Segment& s) { return s.phase == p; }));
  }
  // Launches that share a kernel with others (a row run, a serial tail, a grid of reductions).
  std::size_t fused_launches() const {
    std::size_t n = 0;
    for (const Segment& s : segments)
      if (s.launches.size() > 1) n += s.launches.size();
    return n;
  }
  // Is fusion worth running for speed? Only on CUDA, where launches cost
  // microseconds, and only when some kernel runs more than one launch. On the
  // CPU backend Mode::fused still runs the fused bodies, to verify bit-equality.
  bool worthwhile(Backend b) const { return b == Backend::cuda && fused_launches() > 0; }
  std::string describe() const;
};

namespace plan_detail {

template <class S>
NodeArgs<S> shapes_of(const Layout<S>& L, const DeviceNode<S>& n) {
  NodeArgs<S> x;  // data pointers stay null: only shapes are read
  if (n.a != no_node) x.a.dims = L.nodes[n.a].dims;
  if (n.b != no_node) x.b.dims = L.nodes[n.b].dims;
  x.out = n.dims;
  x.scalar = n.scalar;
  x.axis = n.axis;
  return x;
}

// Rows of a [rows, cols] view: everything but the last axis. 0: not row-shaped.
inline std::size_t rows_of(const Dims& d) { return d.rank >= 2 && d.back() > 0 ? d.size() / d.back() : 0; }

// One buffer access: value / gradient of a node, or scratch. A row-wise
// access (width > 0) reads or writes, for row r, exactly elements
// [r * width, (r + 1) * width); width 0 = any element.
// What a launch reads a buffer as.
enum class Role : std::uint8_t { a, b, value, grad, scratch };
struct Access {
  std::size_t buffer = 0, width = 0;
  Role role = Role::a;
};

struct Class {
  SegmentKind kind = SegmentKind::per_node;
  std::size_t rows = 0;
  Access write;
  std::vector<Access> reads;
  // The read in `role` (every launch kind has the roles the classifier asks for).
  Access& read(Role role) {
    for (Access& r : reads)
      if (r.role == role) return r;
    throw std::logic_error("plan: a launch has no read in the role asked for");
  }
  std::string why;
};

// Which family a fused kernel treats an op as.
enum class Family { none, unary, binary, matmul, reduce };
template <class Op>
constexpr Family family_of() {
  if constexpr (!fusable<Op>)
    return Family::none;
  else if constexpr (std::is_base_of_v<Unary<Op>, Op>)
    return Family::unary;
  else if constexpr (std::is_base_of_v<Binary<Op>, Op>)
    return Family::binary;
  else if constexpr (std::same_as<Op, Matmul>)
    return Family::matmul;
  else
    return Family::reduce;
}

template <class S>
Class classify(const Layout<S>& L, const LaunchSpec& s) {
  const std::size_t N = L.nodes.size(), scratch = 2 * N;
  auto V = [](std::uint32_t i) { return std::size_t{i}; };
  auto G = [&](std::uint32_t i) { return N + i; };
  const DeviceNode<S>& n = L.nodes[s.node];
  const std::string op{op_name(s.op)};
  Class c;
  if (s.kind == LaunchKind::accumulate) {
    c.write = {G(s.input), s.out.back()};
    c.reads = {{scratch, s.out.back(), Role::scratch}, {G(s.input), s.out.back(), Role::grad}};
  } else if (s.kind == LaunchKind::forward) {
    c.write = {V(s.node), 0};
    if (n.a != no_node) c.reads.push_back({V(n.a), 0, Role::a});
    if (n.b != no_node) c.reads.push_back({V(n.b), 0, Role::b});
  } else {
    c.write = {s.to_scratch ? scratch : G(s.input), 0};
    if (n.a != no_node) c.reads.push_back({V(n.a), 0, Role::a});
    if (n.b != no_node) c.reads.push_back({V(n.b), 0, Role::b});
    c.reads.push_back({V(s.node), 0, Role::value});
    c.reads.push_back({G(s.node), 0, Role::grad});
  }
  const Family f = with_op(s.op, [](auto o) { return family_of<decltype(o)>(); });
  if (s.items == 1 && (f != Family::none || s.kind == LaunchKind::accumulate)) {
    c.kind = SegmentKind::serial;
    return c;
  }
  const std::size_t rows = rows_of(s.out);
  if (s.kind == LaunchKind::accumulate) {
    if (!rows) {
      c.why = "accumulate into " + shape_string(s.out) + ": not a [rows, cols] tensor";
      return c;
    }
    c.kind = SegmentKind::rows;
    c.rows = rows;
    return c;
  }
  if (f == Family::none) {
    c.why = op + ": no fused form (not row-local)";
    return c;
  }
  // Gradients that sum over the rows, whatever the receiver's shape.
  if (f == Family::binary && s.kind != LaunchKind::forward && !(L.nodes[s.input].dims == n.dims)) {
    c.kind = SegmentKind::across_rows;
    c.why = op + " backward: broadcast input " + shape_string(L.nodes[s.input].dims) + " sums over the " +
            std::to_string(rows_of(n.dims)) + " rows of " + shape_string(n.dims);
    return c;
  }
  if (f == Family::matmul && s.kind == LaunchKind::backward_b) {
    c.kind = SegmentKind::across_rows;
    c.why = "matmul backward: dW = Aᵀ·G sums over the " + std::to_string(n.dims[0]) + " rows";
    return c;
  }
  if (!rows) {
    c.why = op + (s.kind == LaunchKind::forward ? "" : " backward") + ": writes " + shape_string(s.out) +
            ", not a [rows, cols] tensor";
    return c;
  }
  const std::size_t width = s.out.back();
  const Dims& out = n.dims;
  auto row_wise_if_same = [&](Role role, const Dims& d) {
    if (d == out) c.read(role).width = out.back();
  };
  switch (f) {
    case Family::unary:
      c.kind = SegmentKind::rows;
      for (Access& r : c.reads) r.width = out.back();  // a, y, g all have the output's shape
      break;
    case Family::binary: {
      row_wise_if_same(Role::a, L.nodes[n.a].dims);
      row_wise_if_same(Role::b, L.nodes[n.b].dims);
      if (s.kind != LaunchKind::forward) c.read(Role::value).width = c.read(Role::grad).width = out.back();
      c.kind = SegmentKind::rows;
      break;
    }
    case Family::matmul:
      if (s.kind == LaunchKind::forward) {
        c.read(Role::a).width = L.nodes[n.a].dims.back();  // activation row r; W read whole
      } else {
        c.read(Role::grad).width = out.back();  // dA row r = G row r · Wᵀ (dW was classified above)
      }
      c.kind = SegmentKind::rows;
      break;
    case Family::reduce:
      if (s.kind == LaunchKind::forward) {
        c.why = op + ": a reduction over the whole tensor, alone";  // items > 1 cannot happen; kept for safety
        return c;
      }
      c.kind = SegmentKind::rows;  // dx = g[0] (/ n): the scalar gradient read whole
      break;
    case Family::none:
      break;
  }
  c.rows = rows;
  c.write.width = width;
  return c;
}

// The run of row-local launches being built, with what it touched.
struct RowRun {
  std::vector<std::uint32_t> launches;
  std::size_t rows = 0, width = 0;
  std::map<std::size_t, std::size_t> row_width;  // buffer -> width of its row-wise accesses
  std::set<std::size_t> written, read_whole;

  bool admits(const Class& c) const {
    if (launches.empty()) return true;
    if (c.rows != rows) return false;
    auto width_ok = [&](const Access& a) {
      const auto it = row_width.find(a.buffer);
      return it == row_width.end() || it->second == a.width;
    };
    for (const Access& r : c.reads) {
      if (r.width == 0 && written.count(r.buffer)) return false;  // another block's rows
      if (r.width != 0 && !width_ok(r)) return false;             // a different row split
    }
    return !read_whole.count(c.write.buffer) && width_ok(c.write);
  }
  void add(std::uint32_t i, const Class& c, std::size_t items) {
    launches.push_back(i);
    rows = c.rows;
    width = std::max(width, items / c.rows);
    for (const Access& r : c.reads)
      if (r.width == 0)
        read_whole.insert(r.buffer);
      else
        row_width[r.buffer] = r.width;
    row_width[c.write.buffer] = c.write.width;
    written.insert(c.write.buffer);
  }
};

// Reductions across rows set aside while a row run continues past them.
struct SetAside {
  std::vector<std::uint32_t> launches;
  std::set<std::size_t> reads, writes;
  std::string why;

  bool conflicts(const Class& c) const {
    for (const Access& r : c.reads)
      if (writes.count(r.buffer)) return true;
    return reads.count(c.write.buffer) || writes.count(c.write.buffer);
  }
  void add(std::uint32_t i, const Class& c) {
    launches.push_back(i);
    for (const Access& r : c.reads) reads.insert(r.buffer);
    writes.insert(c.write.buffer);
    if (why.empty()) why = c.why;
  }
};

template <class S>
void plan_phase(const Layout<S>& L, Phase phase, const std::vector<LaunchSpec>& launches, FusionPlan& plan) {
  RowRun run;
  Segment serial{SegmentKind::serial, phase, {}, 0, 0, ""};
  SetAside aside;
  auto single = [&](std::uint32_t i, std::string why) {
    plan.segments.push_back({SegmentKind::per_node, phase, {i}, 0, 0, std::move(why)});
  };
  auto close = [&] {
    if (run.launches.size() == 1)
      single(run.launches[0], "row-local, but nothing next to it to fuse with");
    else if (!run.launches.empty())
      plan.segments.push_back({SegmentKind::rows, phase, run.launches, run.rows, run.width, ""});
    run = RowRun{};
    if (serial.launches.size() == 1)
      single(serial.launches[0], "a single-item launch with no scalar neighbours");
    else if (!serial.launches.empty())
      plan.segments.push_back(serial);
    serial.launches.clear();
    if (aside.launches.size() == 1)
      plan.segments.push_back({SegmentKind::across_rows, phase, aside.launches, 0, 0, aside.why});
    else if (!aside.launches.empty())
      plan.segments.push_back({SegmentKind::across_rows, phase, aside.launches, 0, 0,
                               "reductions over the rows, independent of each other: one grid"});
    aside = SetAside{};
  };
  for (std::uint32_t i = 0; i < launches.size(); ++i) {
    const Class c = classify(L, launches[i]);
    if (aside.conflicts(c)) close();
    switch (c.kind) {
      case SegmentKind::rows:
        if (!serial.launches.empty() || !run.admits(c)) close();
        run.add(i, c, launches[i].items);
        break;
      case SegmentKind::serial:
        if (!run.launches.empty()) close();
        serial.launches.push_back(i);
        break;
      case SegmentKind::across_rows:
        // Only a first contribution (written straight into the gradient) can
        // wait: one through scratch is added by the very next launch.
        if (launches[i].to_scratch) {
          close();
          plan.segments.push_back({SegmentKind::across_rows, phase, {i}, 0, 0, c.why});
        } else {
          if (!serial.launches.empty()) close();
          aside.add(i, c);
        }
        break;
      case SegmentKind::per_node:
        close();
        single(i, c.why);
        break;
    }
  }
  close();
}

inline std::string label(const LaunchSpec& s) {
  const std::string op{op_name(s.op)};
  switch (s.kind) {
    case LaunchKind::forward:
      return "#" + std::to_string(s.node) + " " + op;
    case LaunchKind::accumulate:
      return "d#" + std::to_string(s.input) + " += scratch";
    default:
      return "#" + std::to_string(s.node) + " " + op + "' -> d#" + std::to_string(s.input) +
             (s.to_scratch ? " (scratch)" : "");
  }
}

}  // namespace plan_detail

// The per-node launch list of a Layout, both phases.
template <class S>
std::pair<std::vector<LaunchSpec>, std::vector<LaunchSpec>> launch_list(const Layout<S>& L) {
  std::pair<std::vector<LaunchSpec>, std::vector<LaunchSpec>> out;
  for (std::uint32_t i = 0; i < L.nodes.size(); ++i) {
    const DeviceNode<S>& n = L.nodes[i];
    if (n.op == op_code<Param> || n.op == op_code<Const>) continue;
    const NodeArgs<S> x = plan_detail::shapes_of(L, n);
    LaunchSpec s;
    s.op = n.op;
    s.node = i;
    s.out = n.dims;
    s.items = with_op(n.op, [&](auto op) -> std::size_t {
      using Op = decltype(op);
      if constexpr (has_item_bodies<Op>) return forward_items<Op>(x);
      return 0;
    });
    out.first.push_back(s);
  }
  for (const BackwardStep& b : L.backward) {
    const DeviceNode<S>& n = L.nodes[b.node];
    const NodeArgs<S> x = plan_detail::shapes_of(L, n);
    LaunchSpec s;
    s.kind = b.input == 0 ? LaunchKind::backward_a : LaunchKind::backward_b;
    s.op = n.op;
    s.node = b.node;
    s.input = b.input == 0 ? n.a : n.b;
    s.to_scratch = b.accumulate;
    s.out = L.nodes[s.input].dims;
    s.items = with_op(n.op, [&](auto op) -> std::size_t {
      using Op = decltype(op);
      if constexpr (has_item_bodies<Op>) return b.input == 0 ? backward_items<Op, 0>(x) : backward_items<Op, 1>(x);
      return 0;
    });
    out.second.push_back(s);
    if (b.accumulate) {
      LaunchSpec a = s;
      a.kind = LaunchKind::accumulate;
      a.to_scratch = false;
      a.items = s.out.size();
      out.second.push_back(a);
    }
  }
  return out;
}

// Cuts the launch list into segments (see the top of this file). Every
// launch lands in exactly one segment; segments run in order.
template <class S>
FusionPlan plan_fusion(const Layout<S>& L) {
  FusionPlan plan;
  std::tie(plan.forward, plan.backward) = launch_list(L);
  plan_detail::plan_phase(L, Phase::forward, plan.forward, plan);
  plan_detail::plan_phase(L, Phase::backward, plan.backward, plan);
  return plan;
}

inline std::string FusionPlan::describe() const {
  std::string s = "fusion plan: forward " + std::to_string(forward.size()) + " launches -> " +
                  std::to_string(kernels(Phase::forward)) + " kernels, backward " + std::to_string(backward.size()) +
                  " launches -> " + std::to_string(kernels(Phase::backward)) + " kernels; " +
                  std::to_string(fused_launches()) +
                  " launches fused (worthwhile on cuda: " + (worthwhile(Backend::cuda) ? "yes" : "no") + ")\n";
  for (Phase p : {Phase::forward, Phase::backward}) {
    s += p == Phase::forward ? "forward:\n" : "backward:\n";
    for (const Segment& seg : segments) {
      if (seg.phase != p) continue;
      const std::string n = std::to_string(seg.launches.size());
      switch (seg.kind) {
        case SegmentKind::rows:
          s += "  fused rows   (" + n + " launches, " + std::to_string(seg.rows) + " blocks of " +
               std::to_string(seg.width) + " items):";
          break;
        case SegmentKind::serial:
          s += "  fused serial (" + n + " launches, one thread):";
          break;
        case SegmentKind::across_rows:
          s += "  across rows  (" + n + (seg.launches.size() > 1 ? " launches in one grid" : " launch") + "):";
          break;
        case SegmentKind::per_node:
          s += "  per-node    :";
          break;
      }
      for (std::uint32_t i : seg.launches) {  // appended piecewise: GCC 12's -Wrestrict misfires on " " + string
        s += ' ';
        s += plan_detail::label(launches(p)[i]);
        s += ';';
      }
      s.pop_back();
      if (!seg.why.empty()) s += "  [" + seg.why + "]";
      s += "\n";
    }
  }
  return s;
}

}  // namespace grad::device
