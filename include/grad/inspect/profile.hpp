// The profiler (torch.profiler): with tp.profile(true) the tape times every
// op's forward and every backward step, and every forward step a recompute
// scope computes again during backward (TraceEvent, in
// tp.inspection().events, kept across mark/reset until clear_profile()).
// This header turns the events into tables per op kind and per name scope,
// and into a Chrome trace (chrome://tracing or https://ui.perfetto.dev).
//
//   tp.profile(true);
//   tp.clear_profile();
//   step();                                             // forward, backward
//   std::cout << grad::profile_table(grad::profile_by_op(tp));
//   grad::write_chrome_trace(tp, "trace.json");
#pragma once

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/inspect/tape_hooks.hpp"

namespace grad {

struct ProfileRow {
  std::string key;  // op name, or scope path ("(top)" outside every scope)
  std::size_t forward_calls = 0, backward_calls = 0;
  double forward_ms = 0, backward_ms = 0;
  // Forward steps computed again during backward (recompute scopes).
  std::size_t recomputed_calls = 0;
  double recomputed_ms = 0;
  std::uint64_t bytes = 0;  // written: values (forward, recomputed) and gradients handed down (backward)
  double share = 0;         // of the total time of all events
  double total_ms() const { return forward_ms + backward_ms + recomputed_ms; }
};

namespace inspect_detail {
template <class Key>
std::vector<ProfileRow> profile_rows(const std::vector<TraceEvent>& events, Key key) {
  std::map<std::string, ProfileRow> by;
  double total = 0;
  for (const TraceEvent& e : events) {
    ProfileRow& r = by[key(e)];
    const double ms = static_cast<double>(e.duration_ns) * 1e-6;
    (e.recomputed ? r.recomputed_ms : e.backward ? r.backward_ms : r.forward_ms) += ms;
    ++(e.recomputed ? r.recomputed_calls : e.backward ? r.backward_calls : r.forward_calls);
    r.bytes += e.bytes;
    total += ms;
  }
  std::vector<ProfileRow> rows;
  for (auto& [k, r] : by) {
    r.key = k;
    r.share = total > 0 ? r.total_ms() / total : 0;
    rows.push_back(r);
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const ProfileRow& a, const ProfileRow& b) { return a.total_ms() > b.total_ms(); });
  return rows;
}
}  // namespace inspect_detail

// Rows sorted by total time, most first.
template <class T>
std::vector<ProfileRow> profile_by_op(const Tape<T>& tp) {
  return inspect_detail::profile_rows(tp.inspection().events,
                                      [](const TraceEvent& e) { return std::string(op_name(e.op)); });
}
template <class T>
std::vector<ProfileRow> profile_by_scope(const Tape<T>& tp) {
  const auto& names = tp.inspection().scopes.names;
  return inspect_detail::profile_rows(tp.inspection().events, [&](const TraceEvent& e) {
    return names[e.scope].empty() ? std::string("(top)") : names[e.scope];
  });
}

// The name column is as wide as the longest name (scope paths such as
// "layers.1.attn_norm.rmsnorm" run long), at least 24. The recomputed
// columns appear when some row has recomputed steps.
inline std::string profile_table(const std::vector<ProfileRow>& rows) {
  int width = 24;
  bool recomputed = false;
  for (const ProfileRow& r : rows) {
    width = std::max(width, static_cast<int>(std::min<std::size_t>(r.key.size(), 200)));
    recomputed = recomputed || r.recomputed_calls > 0;
  }
  auto line = [](const char* fmt, auto... xs) {
    char buf[512];
    std::snprintf(buf, sizeof buf, fmt, xs...);
    return std::string(buf);
  };
  std::string out = line("%-*s %8s %11s %8s %11s", width, "Name", "fwd n", "fwd ms", "bwd n", "bwd ms");
  if (recomputed) out += line(" %8s %11s", "re n", "re ms");
  out += line(" %12s %7s\n", "bytes", "share");
  for (const ProfileRow& r : rows) {
    out += line("%-*s %8zu %11.3f %8zu %11.3f", width, r.key.c_str(), r.forward_calls, r.forward_ms, r.backward_calls,
                r.backward_ms);
    if (recomputed) out += line(" %8zu %11.3f", r.recomputed_calls, r.recomputed_ms);
    out += line(" %12llu %6.1f%%\n", static_cast<unsigned long long>(r.bytes), 100 * r.share);
  }
  return out;
}

// Chrome's trace-event JSON: one complete ("X") slice per event, forward on
// thread 1, backward on thread 2 and recomputed forward steps on thread 3,
// named by op, with the node, scope and bytes as arguments. Times are
// microseconds since profiling began.
template <class T>
std::string chrome_trace(const Tape<T>& tp) {
  const auto& names = tp.inspection().scopes.names;
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"forward\"}},\n";
  out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"backward\"}},\n";
  out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":3,\"args\":{\"name\":\"recompute\"}}";
  char numbers[160];
  for (const TraceEvent& e : tp.inspection().events) {
    const char* track = e.recomputed ? "recompute" : e.backward ? "backward" : "forward";
    const int tid = e.recomputed ? 3 : e.backward ? 2 : 1;
    std::snprintf(numbers, sizeof numbers, "\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"node\":%u,\"bytes\":%llu,",
                  tid, static_cast<double>(e.start_ns) * 1e-3, static_cast<double>(e.duration_ns) * 1e-3, e.node,
                  static_cast<unsigned long long>(e.bytes));
    out += ",\n{\"name\":\"" + std::string(op_name(e.op)) + "\",\"cat\":\"" + track +
           "\",\"ph\":\"X\",\"pid\":1," + numbers + "\"scope\":\"" + inspect_detail::json_escape(names[e.scope]) +
           "\"}}";
  }
  out += "\n]}\n";
  return out;
}

// Throws std::runtime_error when the file cannot be written.
template <class T>
void write_chrome_trace(const Tape<T>& tp, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  if (!(f << chrome_trace(tp))) throw std::runtime_error("write_chrome_trace: cannot write " + path);
}

}  // namespace grad
