// How the CUDA code reports a failed runtime call, shared by the engine
// (cuda_backend.cu) and sampling (sampling.cu): a DeviceFault when the
// context is lost, else a std::runtime_error; both name the call.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "grad/device/engine.hpp"

namespace grad::device {

// Errors after which the context is unusable (CUDA's "sticky" errors).
inline bool sticky(cudaError_t rc) {
  switch (rc) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

inline void check(cudaError_t rc, const std::string& what) {
  if (rc == cudaSuccess) return;
  const std::string msg =
      "grad::device (cuda): " + what + " failed: " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")";
  if (sticky(rc)) throw DeviceFault(msg + "; the CUDA context is unusable (set GRAD_DEVICE_SYNC=1 to name the kernel)");
  throw std::runtime_error(msg);
}

}  // namespace grad::device
