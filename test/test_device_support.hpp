// What the device suites share about CUDA: whether to run its cases, and
// how a missing GPU is reported.
//
// CUDA is probed inside test cases, never while doctest registers them
// (a decorator such as doctest::skip(cuda_available()) runs during static
// initialisation, where calling the CUDA runtime is undefined).
//
// GRAD_REQUIRE_CUDA=1 (set by scripts/device-check.sh) turns every CUDA case
// that would skip into a failure that says why, so a run on a machine where
// CUDA does not work cannot pass.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <grad/device/device.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace grad::testing {

inline bool cuda_required() {
  const char* v = std::getenv("GRAD_REQUIRE_CUDA");
  return v && std::string_view(v) == "1";
}

// True when the CUDA part of a case can run. Otherwise reports the skip (a
// failure under GRAD_REQUIRE_CUDA=1) with the probe's reason.
inline bool cuda_case(std::string_view what) {
  if (device::cuda_available()) return true;
  const std::string why = std::string(what) + ": " + device::cuda_unavailable_reason();
  CHECK_FALSE(device::cuda_unavailable_reason().empty());  // a skip always says why
  if (cuda_required())
    FAIL_CHECK("GRAD_REQUIRE_CUDA=1 but the CUDA case cannot run: " << why);
  else
    MESSAGE("CUDA case skipped: " << why);
  return false;
}

// The backends a case runs on: the CPU backend always, CUDA when it answers
// (and a failure under GRAD_REQUIRE_CUDA=1 when it does not).
inline std::vector<device::Backend> device_backends(std::string_view what = "the CUDA backend") {
  std::vector<device::Backend> b{device::Backend::cpu};
  if (cuda_case(what)) b.push_back(device::Backend::cuda);
  return b;
}

}  // namespace grad::testing
