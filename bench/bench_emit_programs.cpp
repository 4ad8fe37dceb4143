// The emitted autoencoder steps of bench_emit, compiled once per loop mode:
// as is (each node a loop over its tag's per-item bodies) and, as a separate
// library built with -DGRAD_EMITTED_HOST_LOOPS, through the tags' host loops.
// The generated headers (bench/meson.build, examples/emit_model.cpp) have a
// namespace per mode, and grad/emitted.hpp an inline namespace per mode, so
// both copies live in one program without sharing a symbol.
#include <benchmark/benchmark.h>

#ifdef GRAD_EMITTED_HOST_LOOPS
#include "ae_b200_f32_h.hpp"
#include "ae_b200_f64_h.hpp"
#include "ae_b20_f64_h.hpp"
#include "ae_b2_f64_h.hpp"
#define GRAD_BENCH_NS(name) name##_h
#define GRAD_BENCH_MODE "emitted_host_loops"
#define GRAD_BENCH_REGISTER register_emitted_host_loops
#else
#include "ae_b200_f32.hpp"
#include "ae_b200_f64.hpp"
#include "ae_b20_f64.hpp"
#include "ae_b2_f64.hpp"
#define GRAD_BENCH_NS(name) name
#define GRAD_BENCH_MODE "emitted_items"
#define GRAD_BENCH_REGISTER register_emitted_items
#endif

namespace {

// One step of program NS per iteration, on the batch it captured (the cost
// of a step does not depend on the values), state in static storage.
#define GRAD_BENCH_STEP(name)                                                           \
  benchmark::RegisterBenchmark(GRAD_BENCH_MODE "/" #name, [](benchmark::State& state) { \
    namespace ns = GRAD_BENCH_NS(name);                                                 \
    static ns::ParamStore params;                                                       \
    static ns::Optimizer opt;                                                           \
    static ns::Workspace ws;                                                            \
    params.load();                                                                      \
    opt.load();                                                                         \
    const ns::Params p = params.view();                                                 \
    const ns::Inputs in;                                                                \
    for (auto _ : state) benchmark::DoNotOptimize(ns::step(in, p, opt, ws));            \
  })->Unit(benchmark::kMicrosecond)

}  // namespace

void GRAD_BENCH_REGISTER() {
  GRAD_BENCH_STEP(ae_b200_f64);
  GRAD_BENCH_STEP(ae_b200_f32);
  GRAD_BENCH_STEP(ae_b20_f64);
  GRAD_BENCH_STEP(ae_b2_f64);
}
