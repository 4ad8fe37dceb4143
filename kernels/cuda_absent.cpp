// The CUDA entry points of a build without nvcc: no device, and a message
// that says why.
#include <stdexcept>

#include "grad/device/engine.hpp"
#include "grad/device/sampling.hpp"
#include "sampling_instances.hpp"

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

// Sampling: the arguments checked as the CUDA build checks them, then no device.
template <class T>
void cuda_top_k_async(const T*, std::size_t n, std::size_t k, std::int32_t*, T*, void*, void*) {
  check_top_k(n, k);
  throw std::runtime_error("grad::device::cuda_top_k: " + cuda_unavailable_reason());
}
template <class T>
TopK<T> cuda_top_k(std::span<const T> logits, std::size_t k) {
  cuda_top_k_async<T>(logits.data(), logits.size(), k, nullptr, nullptr, nullptr, nullptr);
  return {};
}
template <class T>
std::int32_t cuda_argmax(std::span<const T> logits) {
  return cuda_top_k(logits, 1).ids.at(0);
}
GRAD_SAMPLING_INSTANCES(float)
GRAD_SAMPLING_INSTANCES(double)

}  // namespace grad::device
