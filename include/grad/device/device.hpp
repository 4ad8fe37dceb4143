// grad::device: capture a recorded episode and replay it on a backend.
// Link grad_device (meson: grad_device_dep), which holds the backends.
//
//   engine.hpp      Backend, Mode, Layout (what capture hands a backend), Engine
//   kernels.hpp     DeviceKernel<Op>: per-work-item bodies every backend runs
//   replay.hpp      the per-node replay the backends share
//   program.hpp     capture(tape, loss, options) -> Program
//   optimizers.hpp  device::SGD, device::Adam
#pragma once

#include "grad/device/engine.hpp"
#include "grad/device/optimizers.hpp"
#include "grad/device/program.hpp"
