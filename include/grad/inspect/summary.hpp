// A model summary (torchinfo's summary) from what the tape recorded: one row
// per name scope (Sequential opens one per layer; NameScope opens one
// anywhere) with its nodes, the shape of its last output, parameter elements
// (trainable: tape parameters; frozen: constants recorded in the scope, such
// as LoRA's base weights), and the bytes of its values and gradients; plus
// the arena's high-water mark. As data (Summary::rows) and as a table
// (Summary::table()).
//
//   auto y = model(x);                            // one forward pass records the scopes
//   std::cout << grad::summarize(tp, model).table();
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "grad/inspect/tape_hooks.hpp"
#include "grad/modules.hpp"

namespace grad {

struct SummaryRow {
  std::string scope;  // "" for nodes outside every scope ("(top)" in the table)
  std::size_t nodes = 0;
  std::string output_shape;  // of the scope's last node
  std::size_t trainable = 0, frozen = 0;  // parameter elements
  std::size_t value_bytes = 0, grad_bytes = 0;
};

struct Summary {
  std::vector<SummaryRow> rows;  // in order of each scope's first node
  std::size_t trainable = 0, frozen = 0, value_bytes = 0, grad_bytes = 0;
  std::size_t arena_bytes = 0;  // value and gradient arenas reserved: the high-water mark
  std::string table() const {
    auto line = [](const std::string& a, const std::string& b, const std::string& c, const std::string& d,
                   const std::string& e, const std::string& f) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%-24s %6s %-16s %12s %10s %14s\n", a.c_str(), b.c_str(), c.c_str(), d.c_str(),
                    e.c_str(), f.c_str());
      return std::string(buf);
    };
    std::string out = line("Layer (scope)", "Nodes", "Output shape", "Trainable", "Frozen", "Values+grads B");
    out += std::string(87, '=') + "\n";
    for (const SummaryRow& r : rows)
      out += line(r.scope.empty() ? "(top)" : r.scope, std::to_string(r.nodes), r.output_shape,
                  std::to_string(r.trainable), std::to_string(r.frozen), std::to_string(r.value_bytes + r.grad_bytes));
    out += std::string(87, '=') + "\n";
    out += "Trainable parameters: " + std::to_string(trainable) + "\nFrozen parameters: " + std::to_string(frozen) +
           "\nValue bytes: " + std::to_string(value_bytes) + "\nGradient bytes: " + std::to_string(grad_bytes) +
           "\nArena high-water mark (bytes): " + std::to_string(arena_bytes) + "\n";
    return out;
  }
};

namespace inspect_detail {
template <class T>
Summary summarize_nodes(const Tape<T>& tp) {
  Summary s;
  const auto nodes = tp.nodes();
  const Scopes& scopes = tp.inspection().scopes;
  std::vector<std::size_t> row_of(scopes.names.size(), static_cast<std::size_t>(-1));
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node<T>& n = nodes[i];
    const std::uint32_t sc = scopes.of(i);
    if (row_of[sc] == static_cast<std::size_t>(-1)) {
      row_of[sc] = s.rows.size();
      s.rows.push_back({scopes.names[sc], 0, "", 0, 0, 0, 0});
    }
    SummaryRow& r = s.rows[row_of[sc]];
    const std::size_t size = n.dims.size();
    ++r.nodes;
    r.output_shape = shape_string(n.dims);
    r.value_bytes += held_bytes(n.storage, size, sizeof(T));
    if (n.grad) r.grad_bytes += size * sizeof(T);
    if (n.op == op_code<Param>) r.trainable += size;
    else if (n.op == op_code<Const> && sc != 0) r.frozen += size;  // a constant inside a layer: a frozen weight
  }
  for (const SummaryRow& r : s.rows) {
    s.trainable += r.trainable;
    s.frozen += r.frozen;
    s.value_bytes += r.value_bytes;
    s.grad_bytes += r.grad_bytes;
  }
  s.arena_bytes = tp.arena_bytes();
  return s;
}
}  // namespace inspect_detail

// Every node of the tape, grouped by name scope.
template <class T>
Summary summarize(const Tape<T>& tp) {
  return inspect_detail::summarize_nodes(tp);
}

// A module: its parameters are created in its constructor, outside any
// scope, so they are credited to the layer their name says ("0.weight" to
// layer "0"); layers without a recorded scope get a row of their own.
template <class T>
Summary summarize(const Tape<T>& tp, const nn::Module<T>& model) {
  Summary s = summarize(tp);
  std::vector<SummaryRow> rows = std::move(s.rows);
  auto row_for = [&](const std::string& scope) -> std::size_t {  // an index: rows may grow
    for (std::size_t k = 0; k < rows.size(); ++k)
      if (rows[k].scope == scope) return k;
    rows.push_back({scope, 0, "", 0, 0, 0, 0});
    return rows.size() - 1;
  };
  for (const auto& p : model.parameters()) {
    const std::size_t size = tp.value(p.var).size();
    const std::size_t from_row = row_for(tp.scope_name(p.var.index()));
    const std::size_t dot = p.name.rfind('.');
    const std::size_t to_row = row_for(dot == std::string::npos ? std::string() : p.name.substr(0, dot));
    if (from_row == to_row) continue;
    SummaryRow &from = rows[from_row], &to = rows[to_row];
    const std::size_t grad_bytes = tp.requires_grad(p.var) ? size * sizeof(T) : 0;
    from.trainable -= std::min(from.trainable, size);
    from.value_bytes -= std::min(from.value_bytes, size * sizeof(T));
    from.grad_bytes -= std::min(from.grad_bytes, grad_bytes);
    from.nodes -= std::min<std::size_t>(from.nodes, 1);
    to.trainable += size;
    to.value_bytes += size * sizeof(T);
    to.grad_bytes += grad_bytes;
    to.nodes += 1;
  }
  std::erase_if(rows, [](const SummaryRow& r) { return r.nodes == 0 && r.trainable == 0 && r.frozen == 0; });
  s.rows = std::move(rows);
  return s;
}

}  // namespace grad
