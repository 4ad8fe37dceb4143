// The CUDA backend: one __global__ template per direction, instantiated for
// every op in OpList (through with_op in the shared replay, ReplayEngine),
// each thread running one work item of the op's DeviceKernel body: the same
// source the CPU backend runs. Built with --fmad=false so that no a*b+c is
// contracted; launches go in order on one stream.
//
// Fused mode adds one kernel that walks a segment's launch array and
// dispatches each launch through the op-code table (run_item, kernels.hpp):
// no run-time compilation, and only the fusable ops are in that table.
// Graph and fused modes record their launches on the same stream inside a
// CaptureScope and replay the instantiated graph.
//
// No CUB here: in per-node replay every reduction is one work item's serial
// loop in the documented order (the parallelism is across output elements),
// so there is no tree reduction a CUB primitive could take over.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/device/replay.hpp"

namespace grad::device {

namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw std::runtime_error(std::string("grad::device (cuda): ") + what + " failed: " + cudaGetErrorName(rc) + " (" +
                             cudaGetErrorString(rc) + ")");
}

__device__ inline std::size_t work_item() { return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }

template <class Op, class S>
__global__ void forward_kernel(NodeArgs<S> x, S* y, std::size_t items) {
  const std::size_t w = work_item();
  if (w < items) DeviceKernel<Op>::forward(x, y, w);
}

template <class Op, int In, class S>
__global__ void backward_kernel(NodeArgs<S> x, const S* y, const S* g, S* dx, std::size_t items) {
  const std::size_t w = work_item();
  if (w < items) DeviceKernel<Op>::template backward<In>(x, y, g, dx, w);
}

template <class S>
__global__ void accumulate_kernel(S* grad, const S* contribution, std::size_t n) {
  const std::size_t w = work_item();
  if (w < n) accumulate_element(grad, contribution, w);
}

// Every fused segment runs through this one kernel (one entry point keeps
// ptxas's whole-program work small): a row run (block per row, a barrier
// between its launches), the serial tail (one thread), or a grid of
// independent reductions.
template <class S>
__global__ void fused_kernel(SegmentKind kind, const Launch<S>* launches, std::size_t count, std::size_t rows) {
  if (kind == SegmentKind::rows) {
    for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x)
      for (std::size_t k = 0; k < count; ++k) {
        row_segment_step(launches[k], rows, row, threadIdx.x, blockDim.x);
        __syncthreads();
      }
  } else if (kind == SegmentKind::serial) {
    serial_segment(launches, count);
  } else {
    batch_block(launches, count, blockIdx.x, threadIdx.x, blockDim.x);
  }
}

template <class S>
__global__ void optimizer_prepare_kernel(const ParamView<S>* params, std::size_t count, OptimizerHyper<S> h,
                                         OptimizerState<S>* st) {
  optimizer_prepare(params, count, h, st);
}

template <class S>
__global__ void optimizer_update_all_kernel(const ParamView<S>* params, std::size_t count, OptimizerHyper<S> h,
                                            const OptimizerState<S>* st) {
  optimizer_update_block(params, count, h, *st, blockIdx.x, threadIdx.x, blockDim.x);
}

template <class S>
__global__ void optimizer_update_kernel(ParamView<S> p, OptimizerHyper<S> h, const OptimizerState<S>* st) {
  const std::size_t w = work_item();
  if (w < p.size) optimizer_update(p, h, *st, w);
}

// A grid of `blocks` blocks, as CUDA's launch syntax takes it.
unsigned grid(std::size_t blocks) { return static_cast<unsigned>(blocks); }

// Stream capture as a scope (tiny-cuda-nn's cuda_graph.h): end() hands the
// recorded graph over; leaving the scope any other way (a launch threw)
// ends the capture and discards it, so the stream is usable again.
class CaptureScope {
 public:
  explicit CaptureScope(cudaStream_t s) : stream_(s) {
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  }
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
  cudaGraph_t end() {
    cudaGraph_t g = nullptr;
    const cudaStream_t s = stream_;
    stream_ = nullptr;
    check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
    return g;
  }
  ~CaptureScope() {
    if (!stream_) return;
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    cudaGetLastError();  // clear the capture's error so that later launches report their own
  }

 private:
  cudaStream_t stream_;
};

class CudaLauncher {
 public:
  CudaLauncher() { check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~CudaLauncher() {
    cudaStreamSynchronize(stream_);
    drop_graphs();
    for (void* p : buffers_) cudaFree(p);
    cudaStreamDestroy(stream_);
  }
  CudaLauncher(const CudaLauncher&) = delete;
  CudaLauncher& operator=(const CudaLauncher&) = delete;

  template <class U>
  U* allocate(std::size_t n) {
    void* p = nullptr;
    const std::size_t bytes = (n ? n : 1) * sizeof(U);
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    buffers_.push_back(p);
    check(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync");
    return static_cast<U*>(p);
  }
  void upload(void* dst, const void* src, std::size_t bytes) {
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
    // The source may be a temporary: wait until the copy has read it.
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void download(void* dst, const void* src, std::size_t bytes) {
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  template <class Op, class S>
  void forward(const NodeArgs<S>& x, S* y, std::size_t items) {
    if (!items) return;
    forward_kernel<Op, S><<<grid(blocks_for(items)), threads_per_block, 0, stream_>>>(x, y, items);
    check(cudaGetLastError(), "forward kernel launch");
  }
  template <class Op, int In, class S>
  void backward(const NodeArgs<S>& x, const S* y, const S* g, S* dx, std::size_t items) {
    if (!items) return;
    backward_kernel<Op, In, S><<<grid(blocks_for(items)), threads_per_block, 0, stream_>>>(x, y, g, dx, items);
    check(cudaGetLastError(), "backward kernel launch");
  }
  template <class S>
  void accumulate(S* grad, const S* contribution, std::size_t n) {
    accumulate_kernel<S><<<grid(blocks_for(n)), threads_per_block, 0, stream_>>>(grad, contribution, n);
    check(cudaGetLastError(), "accumulate kernel launch");
  }
  template <class S>
  void rows(const Launch<S>* launches, std::size_t count, std::size_t rows, std::size_t threads) {
    const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(rows, 1u << 20));
    fused_kernel<S><<<blocks, static_cast<unsigned>(threads), 0, stream_>>>(SegmentKind::rows, launches, count, rows);
    check(cudaGetLastError(), "fused rows kernel launch");
  }
  template <class S>
  void serial(const Launch<S>* launches, std::size_t count) {
    fused_kernel<S><<<1, 1, 0, stream_>>>(SegmentKind::serial, launches, count, 0);
    check(cudaGetLastError(), "fused serial kernel launch");
  }
  // The host holds the same launches at the same positions (ReplayEngine
  // keeps both copies): the block count is the sum of each launch's blocks.
  template <class S>
  void batch(const Launch<S>* device_launches, std::size_t count, const Launch<S>* host_launches) {
    fused_kernel<S><<<grid(batch_blocks(host_launches, count)), threads_per_block, 0, stream_>>>(
        SegmentKind::across_rows, device_launches, count, 0);
    check(cudaGetLastError(), "fused batch kernel launch");
  }

  template <class F>
  void graph(std::size_t key, F&& record) {
    if (key >= graphs_.size()) graphs_.resize(key + 1, nullptr);
    if (!graphs_[key]) {
      CaptureScope scope(stream_);
      record();
      cudaGraph_t g = scope.end();
      cudaGraphExec_t exec = nullptr;
      const cudaError_t rc = cudaGraphInstantiate(&exec, g, 0);
      cudaGraphDestroy(g);
      check(rc, "cudaGraphInstantiate");
      graphs_[key] = exec;
    }
    check(cudaGraphLaunch(graphs_[key], stream_), "cudaGraphLaunch");
  }
  void drop_graphs() {
    for (cudaGraphExec_t& e : graphs_)
      if (e) {
        cudaGraphExecDestroy(e);
        e = nullptr;
      }
  }

  template <class S>
  void optimizer_prepare(const ParamView<S>* params, std::size_t count, const OptimizerHyper<S>& h,
                         OptimizerState<S>* st) {
    optimizer_prepare_kernel<S><<<1, 1, 0, stream_>>>(params, count, h, st);
    check(cudaGetLastError(), "optimizer prepare kernel launch");
  }
  template <class S>
  void optimizer_update_all(const ParamView<S>* device_params, std::size_t count, const ParamView<S>* host_params,
                            const OptimizerHyper<S>& h, const OptimizerState<S>* st) {
    const std::size_t blocks = update_blocks(host_params, count);
    if (!blocks) return;
    optimizer_update_all_kernel<S><<<grid(blocks), threads_per_block, 0, stream_>>>(device_params, count, h, st);
    check(cudaGetLastError(), "fused optimizer update kernel launch");
  }
  template <class S>
  void optimizer_update(const ParamView<S>& p, const OptimizerHyper<S>& h, const OptimizerState<S>* st) {
    if (!p.size) return;
    optimizer_update_kernel<S><<<grid(blocks_for(p.size)), threads_per_block, 0, stream_>>>(p, h, st);
    check(cudaGetLastError(), "optimizer update kernel launch");
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<void*> buffers_;
  std::vector<cudaGraphExec_t> graphs_;
};

struct Probe {
  cudaError_t rc = cudaSuccess;
  int count = 0;
};

// Without a driver cudaGetDeviceCount returns an error and leaves the count alone.
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    r.rc = cudaGetDeviceCount(&r.count);
    if (r.rc != cudaSuccess) r.count = 0;
    return r;
  }();
  return p;
}

}  // namespace

bool cuda_available() { return probe().rc == cudaSuccess && probe().count > 0; }

std::string cuda_unavailable_reason() {
  const Probe& p = probe();
  if (p.rc != cudaSuccess)
    return std::string("no CUDA device answers (cudaGetDeviceCount: ") + cudaGetErrorName(p.rc) + ", " +
           cudaGetErrorString(p.rc) + ")";
  if (p.count == 0) return "no CUDA device is present (cudaGetDeviceCount returned 0)";
  return "";
}

template <class S>
std::unique_ptr<Engine<S>> make_cuda_engine(const Layout<S>& layout, Mode mode, const FusionPlan& plan, bool fuse) {
  if (!cuda_available()) throw std::runtime_error(cuda_unavailable_reason());
  return std::make_unique<ReplayEngine<S, CudaLauncher>>(layout, mode, plan, fuse);
}
template std::unique_ptr<Engine<float>> make_cuda_engine<float>(const Layout<float>&, Mode, const FusionPlan&, bool);
template std::unique_ptr<Engine<double>> make_cuda_engine<double>(const Layout<double>&, Mode, const FusionPlan&, bool);

}  // namespace grad::device
