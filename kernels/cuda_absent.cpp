// The CUDA entry points of a build without nvcc: no device, and a message
// that says why.
#include <stdexcept>

#include "grad/device/engine.hpp"

namespace grad::device {

bool cuda_available() { return false; }
std::string cuda_unavailable_reason() { return "this build of grad has no CUDA backend (configured without nvcc)"; }
CudaDeviceInfo cuda_device_info() { return {}; }

template <class S>
std::unique_ptr<Engine<S>> make_cuda_engine(const Layout<S>&, Mode, const FusionPlan&, bool) {
  throw std::runtime_error(cuda_unavailable_reason());
}
template std::unique_ptr<Engine<float>> make_cuda_engine<float>(const Layout<float>&, Mode, const FusionPlan&, bool);
template std::unique_ptr<Engine<double>> make_cuda_engine<double>(const Layout<double>&, Mode, const FusionPlan&, bool);

}  // namespace grad::device
