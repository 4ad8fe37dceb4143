// The CUDA backend: one __global__ template per direction, instantiated for
// every op in OpList (through with_op in the shared replay, ReplayEngine),
// each thread running one work item of the tag's per-item body: the same
// source the CPU backend runs. Built with --fmad=false so that no a*b+c is
// contracted; launches go in order on one stream.
//
// Fused mode adds one kernel that walks a segment's launch array and
// dispatches each launch through the op-code table (run_item, work_items.hpp):
// no run-time compilation, and only the fusable ops are in that table.
// Graph and fused modes record their launches on the same stream inside a
// CaptureScope and replay the instantiated graph.
//
// No CUB here: a full reduction (sum, mean, the clip norm) runs the one
// documented order (sum_fixed, grad/numerics/fixed_order.hpp) with one block of warps
// through block_sum_fixed (block_reduce.hpp), the functions the host and the CPU
// backend call too; CUB's trees would give other bits. Every other
// reduction is one work item's serial loop (the parallelism is across
// output elements).
//
// Failures are loud: a launch error names its kernel; GRAD_DEVICE_SYNC=1
// synchronises after every launch so that an asynchronous fault is pinned on
// the kernel that caused it; a sticky fault (illegal address, failed launch)
// throws DeviceFault, which the replay never answers with a fallback.
// Inputs go through a pinned staging buffer without a synchronisation, and
// reads come back through a pinned buffer: a training step synchronises
// once, when it reads the loss.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_check.hpp"
#include "grad/device/replay.hpp"
#include "optimizer_steps.hpp"
#include "work_items.hpp"

namespace grad::device {

namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "1";
}

// block_reduce.hpp's Block on the real block. Host bodies exist only so that the
// GRAD_HD drivers compile for the host too; they are never called there.
struct CudaBlock {
  template <class F>
  GRAD_HD void step(F&& f) {
#ifdef __CUDA_ARCH__
    f(static_cast<std::size_t>(threadIdx.x), static_cast<std::size_t>(blockDim.x));
    __syncthreads();
#else
    f(std::size_t{0}, std::size_t{1});
#endif
  }
  template <class F>
  GRAD_HD void step_one(F&& f) {
#ifdef __CUDA_ARCH__
    if (threadIdx.x == 0) f();
    __syncthreads();
#else
    f();
#endif
  }
};

// The shared memory of block_sum_fixed, typed.
template <class S>
__device__ S* block_shared() {
  __shared__ alignas(16) unsigned char raw[block_sum_shared * sizeof(double)];
  return reinterpret_cast<S*>(raw);
}

// Threads of the one-block reductions: 8 warps.
constexpr unsigned reduce_threads = 256;

__device__ inline std::size_t work_item() { return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }

template <class Op, class S>
__global__ void forward_kernel(NodeArgs<S> x, S* y, std::size_t items) {
  const std::size_t w = work_item();
  if (w < items) Op::forward_item(x, y, w);
}

template <class Op, int In, class S>
__global__ void backward_kernel(NodeArgs<S> x, const S* y, const S* g, S* dx, std::size_t items) {
  const std::size_t w = work_item();
  if (w < items) Op::template backward_item<In>(x, y, g, dx, w);
}

// The scalar tail: thread 0 runs the launches in order, a sum or mean by the whole block.
template <class S>
__global__ void fused_serial_kernel(const Launch<S>* launches, std::size_t count) {
  CudaBlock block;
  serial_segment(launches, count, block_shared<S>(), block);
}

// sum / mean forward: one block (block_reduce.hpp's block_reduce_forward).
template <class S>
__global__ void reduce_forward_kernel(NodeArgs<S> x, S* y, std::uint8_t op) {
  CudaBlock block;
  block_reduce_forward(x, y, op, block_shared<S>(), block);
}

template <class S>
__global__ void accumulate_kernel(S* grad, const S* contribution, std::size_t n) {
  const std::size_t w = work_item();
  if (w < n) accumulate_element(grad, contribution, w);
}

// Every fused row run (block per row, a barrier between its launches) and
// grid of independent reductions runs through this one kernel (one entry
// point keeps ptxas's whole-program work small). The serial tail has its own
// (fused_serial_kernel): its block reduction's state would otherwise raise
// this kernel's registers (76 -> 128 per thread) and halve its occupancy.
template <class S>
__global__ void fused_kernel(SegmentKind kind, const Launch<S>* launches, std::size_t count, std::size_t rows) {
  if (kind == SegmentKind::rows) {
    for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x)
      for (std::size_t k = 0; k < count; ++k) {
        row_segment_step(launches[k], rows, row, threadIdx.x, blockDim.x);
        __syncthreads();
      }
  } else {
    batch_block(launches, count, blockIdx.x, threadIdx.x, blockDim.x);
  }
}

template <class S>
__global__ void optimizer_prepare_kernel(const ParamView<S>* params, std::size_t count, const OptimizerHyper<S>* h,
                                         OptimizerState<S>* st) {
  CudaBlock block;
  optimizer_prepare(params, count, h, st, block_shared<S>(), block);
}

template <class S>
__global__ void optimizer_update_all_kernel(const ParamView<S>* params, std::size_t count, const OptimizerHyper<S>* h,
                                            const OptimizerState<S>* st) {
  optimizer_update_block(params, count, *h, *st, blockIdx.x, threadIdx.x, blockDim.x);
}

template <class S>
__global__ void optimizer_update_kernel(ParamView<S> p, const OptimizerHyper<S>* h, const OptimizerState<S>* st) {
  const std::size_t w = work_item();
  if (w < p.size) optimizer_update(p, *h, *st, w);
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
  CudaLauncher() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    sync_each_ = env_flag("GRAD_DEVICE_SYNC");
    fail_capture_ = env_flag("GRAD_DEVICE_FAIL_CAPTURE");
  }
  ~CudaLauncher() {
    cudaStreamSynchronize(stream_);
    drop_graphs();
    for (void* p : buffers_) cudaFree(p);
    if (staging_) cudaFreeHost(staging_);
    if (readback_) cudaFreeHost(readback_);
    cudaEventDestroy(staged_);
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
  // The source may be a temporary: it is copied into pinned staging at once,
  // and the device copy runs asynchronously from there. The staging buffer
  // is reused only after the previous copy out of it has finished (by the
  // next upload, one step later, it long has): no per-step synchronisation.
  void upload(void* dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
    check(cudaEventSynchronize(staged_), "cudaEventSynchronize (staging)");
    if (bytes > staging_bytes_) {
      if (staging_) check(cudaFreeHost(staging_), "cudaFreeHost");
      staging_ = nullptr;
      check(cudaMallocHost(&staging_, bytes), "cudaMallocHost (staging)");
      staging_bytes_ = bytes;
    }
    std::memcpy(staging_, src, bytes);
    check(cudaMemcpyAsync(dst, staging_, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
    check(cudaEventRecord(staged_, stream_), "cudaEventRecord (staging)");
  }
  // The one synchronisation of a step: the read (the loss) lands in pinned memory.
  void download(void* dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
    if (bytes > readback_bytes_) {
      if (readback_) check(cudaFreeHost(readback_), "cudaFreeHost");
      readback_ = nullptr;
      check(cudaMallocHost(&readback_, bytes), "cudaMallocHost (readback)");
      readback_bytes_ = bytes;
    }
    check(cudaMemcpyAsync(readback_, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (the step's kernels, then the read)");
    std::memcpy(dst, readback_, bytes);
  }

  template <class Op, class S>
  void forward(const NodeArgs<S>& x, S* y, std::size_t items) {
    if (!items) return;
    if constexpr (std::is_same_v<Op, Sum> || std::is_same_v<Op, Mean>)
      reduce_forward_kernel<S><<<1, reduce_threads, 0, stream_>>>(x, y, op_code<Op>);
    else
      forward_kernel<Op, S><<<grid(blocks_for(items)), threads_per_block, 0, stream_>>>(x, y, items);
    launched([&] { return "forward kernel of '" + std::string(Op::name) + "'"; });
  }
  template <class Op, int In, class S>
  void backward(const NodeArgs<S>& x, const S* y, const S* g, S* dx, std::size_t items) {
    if (!items) return;
    backward_kernel<Op, In, S><<<grid(blocks_for(items)), threads_per_block, 0, stream_>>>(x, y, g, dx, items);
    launched([&] { return "backward kernel of '" + std::string(Op::name) + "' (input " + std::to_string(In) + ")"; });
  }
  template <class S>
  void accumulate(S* grad, const S* contribution, std::size_t n) {
    accumulate_kernel<S><<<grid(blocks_for(n)), threads_per_block, 0, stream_>>>(grad, contribution, n);
    launched([] { return std::string("accumulate kernel"); });
  }
  // Rows beyond the grid's 2^20 blocks are taken by a grid-stride loop.
  template <class S>
  void rows(const Launch<S>* launches, std::size_t count, std::size_t rows, std::size_t threads) {
    const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(rows, max_row_blocks));
    fused_kernel<S><<<blocks, static_cast<unsigned>(threads), 0, stream_>>>(SegmentKind::rows, launches, count, rows);
    launched([&] {
      return "fused rows kernel (" + std::to_string(count) + " launches, " + std::to_string(rows) + " rows)";
    });
  }
  template <class S>
  void serial(const Launch<S>* launches, std::size_t count) {
    fused_serial_kernel<S><<<1, reduce_threads, 0, stream_>>>(launches, count);
    launched([&] { return "fused serial kernel (" + std::to_string(count) + " launches)"; });
  }
  // The host holds the same launches at the same positions (ReplayEngine
  // keeps both copies): the block count is the sum of each launch's blocks.
  template <class S>
  void batch(const Launch<S>* device_launches, std::size_t count, const Launch<S>* host_launches) {
    fused_kernel<S><<<grid(batch_blocks(host_launches, count)), threads_per_block, 0, stream_>>>(
        SegmentKind::across_rows, device_launches, count, 0);
    launched([&] { return "fused batch kernel (" + std::to_string(count) + " reductions over rows)"; });
  }

  template <class F>
  void graph(std::size_t key, F&& record) {
    if (key >= graphs_.size()) graphs_.resize(key + 1, nullptr);
    if (!graphs_[key]) {
      // A test hook: the fallback path must be exercised on a GPU too.
      if (fail_capture_) throw std::runtime_error("graph capture refused (GRAD_DEVICE_FAIL_CAPTURE=1)");
      CaptureScope scope(stream_);
      capturing_ = true;
      try {
        record();
      } catch (...) {
        capturing_ = false;
        throw;
      }
      capturing_ = false;
      cudaGraph_t g = scope.end();
      cudaGraphExec_t exec = nullptr;
      const cudaError_t rc = cudaGraphInstantiate(&exec, g, 0);
      cudaGraphDestroy(g);
      check(rc, "cudaGraphInstantiate");
      graphs_[key] = exec;
    }
    check(cudaGraphLaunch(graphs_[key], stream_), "cudaGraphLaunch");
    if (sync_each_)
      check(cudaStreamSynchronize(stream_), "the graph of step sequence " + std::to_string(key) +
                                                " (its kernels ran without a synchronisation between them)");
  }
  void drop_graphs() {
    for (cudaGraphExec_t& e : graphs_)
      if (e) {
        cudaGraphExecDestroy(e);
        e = nullptr;
      }
  }

  template <class S>
  void optimizer_prepare(const ParamView<S>* params, std::size_t count, const OptimizerHyper<S>* h,
                         OptimizerState<S>* st) {
    optimizer_prepare_kernel<S><<<1, reduce_threads, 0, stream_>>>(params, count, h, st);
    launched([] { return std::string("optimizer prepare kernel (clip norm, Adam constants)"); });
  }
  template <class S>
  void optimizer_update_all(const ParamView<S>* device_params, std::size_t count, const ParamView<S>* host_params,
                            const OptimizerHyper<S>* h, const OptimizerState<S>* st) {
    const std::size_t blocks = update_blocks(host_params, count);
    if (!blocks) return;
    optimizer_update_all_kernel<S><<<grid(blocks), threads_per_block, 0, stream_>>>(device_params, count, h, st);
    launched([] { return std::string("fused optimizer update kernel"); });
  }
  template <class S>
  void optimizer_update(const ParamView<S>& p, const OptimizerHyper<S>* h, const OptimizerState<S>* st) {
    if (!p.size) return;
    optimizer_update_kernel<S><<<grid(blocks_for(p.size)), threads_per_block, 0, stream_>>>(p, h, st);
    launched([] { return std::string("optimizer update kernel"); });
  }

 private:
  // After every launch: the launch error, named; with GRAD_DEVICE_SYNC=1 also
  // the kernel's own fault (not inside a capture, where nothing runs yet).
  template <class Name>
  void launched(Name&& name) {
    const cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) check(rc, "launch of the " + name());
    if (sync_each_ && !capturing_) check(cudaStreamSynchronize(stream_), "the " + name());
  }

  static constexpr std::size_t max_row_blocks = std::size_t{1} << 20;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t staged_ = nullptr;
  void* staging_ = nullptr;
  void* readback_ = nullptr;
  std::size_t staging_bytes_ = 0, readback_bytes_ = 0;
  bool sync_each_ = false, fail_capture_ = false, capturing_ = false;
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

CudaDeviceInfo cuda_device_info() {
  CudaDeviceInfo info;
  if (!cuda_available()) return info;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return info;
  info.name = p.name;
  info.major = p.major;
  info.minor = p.minor;
  info.memory_bytes = p.totalGlobalMem;
  info.multiprocessors = p.multiProcessorCount;
  cudaDriverGetVersion(&info.driver);
  cudaRuntimeGetVersion(&info.runtime);
  return info;
}

template <class S>
std::unique_ptr<Engine<S>> make_cuda_engine(const Layout<S>& layout, Mode mode, const FusionPlan& plan, bool fuse) {
  if (!cuda_available()) throw std::runtime_error(cuda_unavailable_reason());
  return std::make_unique<ReplayEngine<S, CudaLauncher>>(layout, mode, plan, fuse);
}
template std::unique_ptr<Engine<float>> make_cuda_engine<float>(const Layout<float>&, Mode, const FusionPlan&, bool);
template std::unique_ptr<Engine<double>> make_cuda_engine<double>(const Layout<double>&, Mode, const FusionPlan&, bool);

}  // namespace grad::device
