// A captured device program as a Graphviz picture: what the device runs,
// grouped as the fusion planner cut it (plan.hpp). Each phase (forward,
// backward) is a cluster; inside it every fused segment, the kernel that
// Mode::fused runs it as (a row run, the serial tail, a grid of reductions),
// is a cluster of its launches labelled with its kind and size; a launch
// that runs as its own kernel stands alone, its tooltip saying why.
//
//   auto prog = grad::device::capture(tp, loss, {.mode = grad::device::Mode::fused});
//   grad::render_svg(grad::device::to_dot(prog), "program.svg");
//
// Forward: one box per captured node ("#index op", shape, name scope),
// parameters and constants as ellipses, edges from operands. Backward: one
// box per launch ("#7 tanh' -> d#6": node 7's contribution to node 6's
// gradient; "d#3 += scratch": an accumulation), edges from the launches that
// complete a gradient to the launches that read it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "grad/device/capture.hpp"
#include "grad/inspect/graph_dot.hpp"

namespace grad::device {

struct ProgramDotOptions {
  bool backward = true;  // draw the backward launches too
};

namespace program_dot_detail {

inline std::string segment_label(const Segment& s, std::size_t kernel) {
  const std::string n = std::to_string(s.launches.size());
  std::string what;
  switch (s.kind) {
    case SegmentKind::rows:
      what = "fused rows: " + n + " launches, " + std::to_string(s.rows) + " blocks of " + std::to_string(s.width) +
             " items";
      break;
    case SegmentKind::serial:
      what = "fused serial: " + n + " launches, one thread";
      break;
    case SegmentKind::across_rows:
      what = "across rows: " + n + (s.launches.size() > 1 ? " launches in one grid" : " launch");
      break;
    case SegmentKind::per_node:
      what = "per-node";
      break;
  }
  return "kernel " + std::to_string(kernel) + ": " + what;
}

}  // namespace program_dot_detail

template <class T>
std::string to_dot(const Program<T>& p, const ProgramDotOptions& options = {}) {
  using inspect_detail::dot_escape;
  const FusionPlan& plan = p.plan();
  std::string out = "digraph grad_program {\n  rankdir=TB;\n"
                    "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10, "
                    "fillcolor=\"#d7e8fb\"];\n  edge [arrowsize=0.6];\n";
  out += "  label=\"captured program: " + std::string(mode_name(p.mode())) + " mode, " +
         (p.fused() ? "fused segments run as drawn" : "the plan's segments (not run fused in this mode)") +
         "\"; labelloc=t; fontname=\"Helvetica\";\n";
  // A forward node: "n<i> [attributes" (the caller closes the bracket).
  auto node_open = [&](std::uint32_t i) {
    const CapturedNode& n = p.node(i);
    std::string label = "#" + std::to_string(i) + " " + dot_escape(op_name(n.op)) + "\\n" + shape_string(n.dims);
    if (!n.scope.empty()) label += "\\n" + dot_escape(n.scope);
    std::string style;
    if (n.op == op_code<Param>) style = ", fillcolor=\"#ffe08a\", shape=ellipse";
    if (n.op == op_code<Const>) style = ", fillcolor=\"#e6e6e6\", shape=ellipse, style=\"filled,dashed\"";
    return "n" + std::to_string(i) + " [label=\"" + label + "\"" + style;
  };
  // Launch k of a phase: its forward node, or a backward launch "b<k>".
  auto launch_line = [&](Phase phase, std::uint32_t k, const std::string& why) {
    const LaunchSpec& s = plan.launches(phase)[k];
    std::string line = phase == Phase::forward ? node_open(s.node)
                                               : "b" + std::to_string(k) + " [label=\"" +
                                                     dot_escape(plan_detail::label(s)) + "\\n" + shape_string(s.out) +
                                                     "\", fillcolor=\"#f6d5d5\"";
    if (!why.empty()) line += ", tooltip=\"" + dot_escape(why) + "\"";
    return line + "];\n";
  };

  // Leaves: the inputs and weights every phase reads.
  for (std::uint32_t i = 0; i < p.nodes(); ++i)
    if (p.node(i).op == op_code<Param> || p.node(i).op == op_code<Const>) out += "  " + node_open(i) + "];\n";

  for (Phase phase : {Phase::forward, Phase::backward}) {
    if (phase == Phase::backward && !options.backward) break;
    const bool fwd = phase == Phase::forward;
    out += std::string("  subgraph cluster_") + (fwd ? "forward" : "backward") + " {\n    label=\"" +
           (fwd ? "forward: " : "backward: ") + std::to_string(plan.launches(phase).size()) + " launches, " +
           std::to_string(plan.kernels(phase)) + " kernels\"; style=rounded; color=\"#666666\";\n";
    std::size_t kernel = 0;
    for (std::size_t s = 0; s < plan.segments.size(); ++s) {
      const Segment& seg = plan.segments[s];
      if (seg.phase != phase) continue;
      const std::string label = program_dot_detail::segment_label(seg, kernel++);
      if (seg.launches.size() == 1) {  // a kernel of its own: no cluster
        out += "    " + launch_line(phase, seg.launches[0], label + (seg.why.empty() ? "" : " (" + seg.why + ")"));
        continue;
      }
      out += "    subgraph cluster_segment" + std::to_string(s) + " {\n      label=\"" + dot_escape(label) +
             "\"; style=\"rounded,filled\"; fillcolor=\"#f3f3f3\"; color=\"#2ca02c\"; penwidth=2;\n";
      if (!seg.why.empty()) out += "      tooltip=\"" + dot_escape(seg.why) + "\";\n";
      for (std::uint32_t k : seg.launches) out += "      " + launch_line(phase, k, "");
      out += "    }\n";
    }
    out += "  }\n";
  }

  // Forward edges: operands to the node.
  for (std::uint32_t i = 0; i < p.nodes(); ++i)
    for (std::uint32_t in : {p.node(i).a, p.node(i).b})
      if (in != no_node) out += "  n" + std::to_string(in) + " -> n" + std::to_string(i) + ";\n";
  if (!options.backward) return out + "}\n";

  // Backward edges: node i's launches read its gradient, complete once every
  // launch writing it has run (a first contribution, or an accumulation);
  // an accumulation reads the scratch the launch before it wrote.
  const std::vector<LaunchSpec>& back = plan.backward;
  std::map<std::uint32_t, std::vector<std::uint32_t>> writers;  // node -> launches writing its gradient
  for (std::uint32_t k = 0; k < back.size(); ++k) {
    const LaunchSpec& s = back[k];
    for (std::uint32_t w : writers[s.node])
      if (s.kind != LaunchKind::accumulate) out += "  b" + std::to_string(w) + " -> b" + std::to_string(k) + ";\n";
    if (s.kind == LaunchKind::accumulate && k > 0)
      out += "  b" + std::to_string(k - 1) + " -> b" + std::to_string(k) + " [style=dashed];\n";
    if (!s.to_scratch) writers[s.input].push_back(k);
  }
  return out + "}\n";
}

}  // namespace grad::device
