// grad::device: capture a recorded episode and replay it on a backend.
// Link grad_device (meson: grad_device_dep), which holds the backends.
//
// The pipeline, in order:
//   capture.hpp     capture(tape, loss, options) -> Program (a Layout: nodes, buffers, backward steps)
//   plan.hpp        the launch list and the fusion planner's segments
//   replay.hpp      resolves the launches once; per-node, graph or fused replay
//   launch.hpp      the plain-data records a backend runs (Launch, ParamView)
// and around it:
//   engine.hpp      Backend, Mode, Layout, Engine (what a backend implements)
//   optimizers.hpp  device::SGD, device::Adam
//   sampling.hpp    top-k and argmax of a row of logits on a GPU (CUB), for decoding
// The backends and the bodies they run are in kernels/ (cpu_backend.cpp,
// cuda_backend.cu, work_items.hpp, block_reduce.hpp, optimizer_steps.hpp);
// each op's own math is its tag's per-item bodies (grad/tags/contract.hpp).
#pragma once

#include "grad/device/capture.hpp"
#include "grad/device/engine.hpp"
#include "grad/device/optimizers.hpp"
#include "grad/device/sampling.hpp"
