// A recorded episode as a Graphviz picture (torchviz's make_dot, from the
// tape): one box per node with its index, op and shape; parameters, constants
// and computed nodes styled apart; nodes that need a gradient drawn bold;
// name scopes as nested clusters; optionally each value's (and gradient's)
// L2 norm.
//
//   std::string dot = grad::to_dot(tp);
//   std::string why;
//   if (!grad::render_svg(dot, "graph.svg", &why)) std::cerr << why << "\n";
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/inspect/tape_hooks.hpp"

namespace grad {

struct DotOptions {
  bool value_norms = false;     // "|v| = ..." under each node
  bool gradient_norms = false;  // "|g| = ..." for nodes the latest backward reached
  bool scope_clusters = true;   // one cluster per NameScope path
  bool allow_poisoned = false;  // draw a poisoned tape (the anomaly's node, if any, in red)
  std::size_t first_node = 0;   // draw nodes [first_node, size): e.g. one episode after a mark
};

namespace inspect_detail {
inline std::string dot_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}
template <class T>
double l2(const T* p, std::size_t n) {
  double s = 0;
  for (std::size_t k = 0; k < n; ++k) s += static_cast<double>(p[k]) * static_cast<double>(p[k]);
  return std::sqrt(s);
}
}  // namespace inspect_detail

// Throws std::invalid_argument for a poisoned tape (unless allow_poisoned):
// its last nodes may be half-made, and the picture would hide the error.
template <class T>
std::string to_dot(const Tape<T>& tp, const DotOptions& options = {}) {
  using namespace inspect_detail;
  if (!tp.ok() && !options.allow_poisoned)
    throw std::invalid_argument("to_dot: the tape is poisoned (" + tp.error() +
                                "); set DotOptions::allow_poisoned to draw it anyway");
  const auto nodes = tp.nodes();
  const Scopes& scopes = tp.inspection().scopes;
  const Anomaly* anomaly = tp.anomaly();
  std::string out =
      "digraph grad_tape {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", "
      "fontsize=10, fillcolor=\"#ffffff\"];\n  edge [arrowsize=0.6];\n";
  auto node_line = [&](std::size_t i) {
    const Node<T>& n = nodes[i];
    const bool param = n.op == op_code<Param>, constant = n.op == op_code<Const>;
    // Parts are escaped one by one: the "\\n" between them are DOT's line breaks.
    std::string label = "#" + std::to_string(i) + " " + dot_escape(op_name(n.op)) + "\\n" + shape_string(n.dims);
    // A recompute scope's inner node keeps no value or gradient of its own
    // (only the scope last recorded or replayed holds them): "recomputed".
    if (n.transient && (options.value_norms || options.gradient_norms)) label += "\\nrecomputed";
    if (options.value_norms && !n.transient && n.storage == Storage::native)
      label += "\\n|v| = " + number(l2(n.value, n.dims.size()));
    if (options.gradient_norms && !n.transient && n.touched && n.grad)
      label += "\\n|g| = " + number(l2(n.grad, n.dims.size()));
    std::string style = param      ? "fillcolor=\"#ffe08a\", shape=ellipse"
                        : constant ? "fillcolor=\"#e6e6e6\", shape=ellipse, style=\"filled,dashed\""
                                   : "fillcolor=\"#d7e8fb\"";
    if (n.requires_grad) style += ", penwidth=2";
    if (anomaly && anomaly->node == i) style += ", color=\"#d62728\", fontcolor=\"#d62728\", penwidth=3";
    return "n" + std::to_string(i) + " [label=\"" + label + "\", " + style + "];\n";
  };
  // Nodes grouped by scope; clusters nest by the scope tree.
  std::map<std::uint32_t, std::vector<std::size_t>> members;
  for (std::size_t i = options.first_node; i < nodes.size(); ++i)
    members[options.scope_clusters ? scopes.of(i) : 0].push_back(i);
  std::map<std::uint32_t, std::vector<std::uint32_t>> children;
  std::vector<bool> shown(scopes.names.size(), false);
  for (const auto& [scope, list] : members)  // a scope is shown when it or a descendant has nodes
    for (std::uint32_t s = scope; s != 0 && !shown[s]; s = scopes.parents[s]) {
      shown[s] = true;
      children[scopes.parents[s]].push_back(s);
    }
  auto emit = [&](auto&& self, std::uint32_t scope, const std::string& indent) -> void {
    if (auto it = members.find(scope); it != members.end())
      for (std::size_t i : it->second) out += indent + node_line(i);
    if (auto it = children.find(scope); it != children.end())
      for (std::uint32_t c : it->second) {
        out += indent + "subgraph cluster_s" + std::to_string(c) + " {\n" + indent + "  label=\"" +
               dot_escape(scopes.names[c]) + "\"; style=rounded; color=\"#999999\"; fontname=\"Helvetica\";\n";
        self(self, c, indent + "  ");
        out += indent + "}\n";
      }
  };
  emit(emit, 0, "  ");
  for (std::size_t i = options.first_node; i < nodes.size(); ++i)
    for (std::uint32_t in : {nodes[i].a, nodes[i].b})
      if (in != no_node && in >= options.first_node)
        out += "  n" + std::to_string(in) + " -> n" + std::to_string(i) + ";\n";
  // Operands recorded before first_node (kept parameters, say) are drawn as plain leaves.
  std::vector<bool> drawn_before(options.first_node, false);
  for (std::size_t i = options.first_node; i < nodes.size(); ++i)
    for (std::uint32_t in : {nodes[i].a, nodes[i].b})
      if (in != no_node && in < options.first_node) {
        if (!drawn_before[in]) out += "  " + node_line(in);
        drawn_before[in] = true;
        out += "  n" + std::to_string(in) + " -> n" + std::to_string(i) + ";\n";
      }
  out += "}\n";
  return out;
}

// Renders DOT text to an SVG file with Graphviz's `dot` (run through the
// shell, so it must be on PATH). False, with `why` saying what went wrong or
// how to install Graphviz, when it cannot.
inline bool render_svg(const std::string& dot, const std::string& svg_path, std::string* why = nullptr) {
  auto fail = [&](std::string m) {
    if (why) *why = std::move(m);
    return false;
  };
  if (std::system("command -v dot > /dev/null 2>&1") != 0)
    return fail("render_svg: Graphviz's `dot` is not on PATH; install it (apt-get install graphviz, brew install "
                "graphviz, or https://graphviz.org/download/) or render the .dot file elsewhere");
  for (char c : svg_path)
    if (c == '\'' || c == '\n') return fail("render_svg: the output path contains a quote or newline");
  const std::string dot_path = svg_path + ".dot";
  {
    std::ofstream f(dot_path, std::ios::binary);
    if (!(f << dot)) return fail("render_svg: cannot write " + dot_path);
  }
  const std::string cmd = "dot -Tsvg '" + dot_path + "' -o '" + svg_path + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::remove(dot_path.c_str());
  if (rc != 0) return fail("render_svg: `dot -Tsvg` failed (exit status " + std::to_string(rc) + ")");
  return true;
}

}  // namespace grad
