// The emitted CUDA source on a GPU (scripts/device-check.sh): compiled here
// from what emit_check_gen wrote, run there, compared bit for bit with the
// tape's answers (emit_check_expected.hpp):
//
//   1. the autoencoder's training step (f64, batch 200, Adam) as per-node
//      kernels: five steps, each loss, then every parameter
//   2. value_and_grad of a linear regression's loss, called from inside a
//      user kernel, 256 threads (each its own point, alternately two points)
//
// Exit status: 0 same bits, 1 a difference, 77 no CUDA device (a skip).
#include <cstdio>
#include <cstring>
#include <vector>

#include "emit_check_ae.cuh"
#include "emit_check_expected.hpp"
#include "emit_check_linreg.cuh"

namespace {

__global__ void per_thread_value_and_grad(const double* x, double* answers, int threads) {
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= threads) return;
  const int point = t % 2;
  answers[5 * t] = ck_linreg::value_and_grad(x + 4 * point, answers + 5 * t + 1);
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("emit_cuda_check: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

template <class T>
T* upload(const T* host, std::size_t n) {
  T* d = nullptr;
  cudaMalloc(&d, n * sizeof(T));
  if (host) cudaMemcpy(d, host, n * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

std::size_t differ(const double* got, const double* want, std::size_t n) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += std::memcmp(got + i, want + i, sizeof(double)) != 0;
  return bad;
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("emit_cuda_check: no CUDA device: skipped\n");
    return 77;
  }
  std::size_t failures = 0;

  // 1. The autoencoder's step.
  {
    namespace m = ck_ae;
    static_assert(m::parameters.size() == 8);
    double* w[8];
    for (int i = 0; i < 8; ++i) w[i] = upload(m::parameters[i].init, m::parameters[i].size);  // the metadata table
    const m::Params p{w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]};
    m::DeviceWorkspace ws{upload<double>(nullptr, m::value_size), upload<double>(nullptr, m::grad_size),
                          upload<double>(nullptr, m::scratch_size)};
    m::DeviceOptimizer opt;
    opt.m = upload(m::m_init, m::moment_size);
    opt.v = upload(m::v_init, m::moment_size);
    opt.state = upload<grad::emitted::DeviceOptimizerState<double>>(nullptr, 1);
    double* x = upload(expected::ae_batches, expected::ae_steps * m::size::x);
    std::vector<double> losses(expected::ae_steps);
    for (int k = 0; k < expected::ae_steps; ++k) {
      m::Inputs in{x + k * m::size::x};
      m::step(in, p, opt, ws);
      if (!ok(cudaMemcpy(&losses[k], ws.value + m::loss_offset, sizeof(double), cudaMemcpyDeviceToHost), "step"))
        return 1;
    }
    std::vector<double> params;
    for (int i = 0; i < 8; ++i) {
      std::vector<double> h(m::parameters[i].size);
      cudaMemcpy(h.data(), w[i], m::parameters[i].size * sizeof(double), cudaMemcpyDeviceToHost);
      params.insert(params.end(), h.begin(), h.end());
    }
    if (!ok(cudaDeviceSynchronize(), "autoencoder")) return 1;
    const std::size_t bad = differ(losses.data(), expected::ae_losses, losses.size()) +
                            differ(params.data(), expected::ae_params, params.size());
    std::printf(
        "emit_cuda_check: autoencoder step x%d (per-node kernels, Adam): %zu of %zu values differ from the tape\n",
        expected::ae_steps, bad, losses.size() + params.size());
    failures += bad;
  }

  // 2. value_and_grad inside a user kernel.
  {
    const int threads = 256;
    double* x = upload(expected::linreg_x, 8);
    double* answers = upload<double>(nullptr, 5 * threads);
    per_thread_value_and_grad<<<(threads + 127) / 128, 128>>>(x, answers, threads);
    std::vector<double> got(5 * threads);
    if (!ok(cudaMemcpy(got.data(), answers, got.size() * sizeof(double), cudaMemcpyDeviceToHost), "value_and_grad"))
      return 1;
    std::size_t bad = 0;
    for (int t = 0; t < threads; ++t) bad += differ(got.data() + 5 * t, expected::linreg_answers + 5 * (t % 2), 5);
    std::printf("emit_cuda_check: value_and_grad in a user kernel, %d threads: %zu of %d values differ from the tape\n",
                threads, bad, 5 * threads);
    failures += bad;
  }
  std::printf("emit_cuda_check: %s\n", failures ? "FAILED" : "ok (same bits as the tape)");
  return failures ? 1 : 0;
}
