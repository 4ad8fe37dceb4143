// See inside a training run (docs/inspect.md). The tape side (anomaly
// detection, NameScope, profiling events) is always there, in tape.hpp; this
// header adds the tools that read it:
//
//   inspect/gradcheck.hpp  gradcheck(f, inputs, options): tape vs central differences, float64
//   inspect/graph_dot.hpp  to_dot(tape), render_svg(dot, path): Graphviz pictures
//   inspect/summary.hpp    summarize(tape[, model]): a torchinfo-like table, and its rows as data
//   inspect/profile.hpp    profile_by_op / profile_by_scope / profile_table, chrome_trace
#pragma once

#include "grad/inspect/gradcheck.hpp"
#include "grad/inspect/graph_dot.hpp"
#include "grad/inspect/profile.hpp"
#include "grad/inspect/summary.hpp"
