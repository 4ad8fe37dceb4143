// The CPU backend: the device kernel bodies (grad/device/kernels.hpp) run on
// the host, one loop over blocks and threads per launch, launches in order.
// It exists so the bit-exactness contract can be checked on any machine; it
// is not meant to be fast.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/device/replay.hpp"

namespace grad::device {

namespace {

// The CUDA backend's launch geometry (kernels.hpp), blocks and threads as loops.
template <class F>
void for_each_item(std::size_t items, F&& body) {
  const std::size_t blocks = blocks_for(items);
  for (std::size_t block = 0; block < blocks; ++block)
    for (std::size_t thread = 0; thread < threads_per_block; ++thread) {
      const std::size_t w = block * threads_per_block + thread;
      if (w < items) body(w);
    }
}

class CpuLauncher {
 public:
  template <class U>
  U* allocate(std::size_t n) {
    auto& block =
        blocks_.emplace_back(new (std::align_val_t{64}) unsigned char[std::max<std::size_t>(n, 1) * sizeof(U)]);
    std::memset(block.get(), 0, std::max<std::size_t>(n, 1) * sizeof(U));
    return reinterpret_cast<U*>(block.get());
  }
  void upload(void* dst, const void* src, std::size_t bytes) {
    outside_graph("upload");
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes) {
    outside_graph("download");
    if (bytes) std::memcpy(dst, src, bytes);
  }

  template <class Op, class S>
  void forward(const NodeArgs<S>& x, S* y, std::size_t items) {
    for_each_item(items, [&](std::size_t w) { DeviceKernel<Op>::forward(x, y, w); });
  }
  template <class Op, int In, class S>
  void backward(const NodeArgs<S>& x, const S* y, const S* g, S* dx, std::size_t items) {
    for_each_item(items, [&](std::size_t w) { DeviceKernel<Op>::template backward<In>(x, y, g, dx, w); });
  }
  template <class S>
  void accumulate(S* grad, const S* contribution, std::size_t n) {
    for_each_item(n, [&](std::size_t w) { accumulate_element(grad, contribution, w); });
  }
  // Fused kernels: the CUDA kernels' bodies, blocks and threads as loops; a
  // barrier is the end of a thread loop.
  template <class S>
  void rows(const Launch<S>* launches, std::size_t count, std::size_t rows, std::size_t threads) {
    for (std::size_t row = 0; row < rows; ++row)
      for (std::size_t k = 0; k < count; ++k)
        for (std::size_t thread = 0; thread < threads; ++thread)
          row_segment_step(launches[k], rows, row, thread, threads);
  }
  template <class S>
  void serial(const Launch<S>* launches, std::size_t count) {
    serial_segment(launches, count);
  }
  template <class S>
  void batch(const Launch<S>* launches, std::size_t count, const Launch<S>*) {
    const std::size_t blocks = batch_blocks(launches, count);
    for (std::size_t block = 0; block < blocks; ++block)
      for (std::size_t thread = 0; thread < threads_per_block; ++thread)
        batch_block(launches, count, block, thread, threads_per_block);
  }
  // No graphs on the host: graph mode runs the very launch list it would
  // capture, and refuses a copy inside it as a CUDA capture would.
  template <class F>
  void graph(std::size_t, F&& record) {
    recording_ = true;
    try {
      record();
    } catch (...) {
      recording_ = false;
      throw;
    }
    recording_ = false;
  }
  void drop_graphs() {}

  template <class S>
  void optimizer_prepare(const ParamView<S>* params, std::size_t count, const OptimizerHyper<S>& h,
                         OptimizerState<S>* st) {
    device::optimizer_prepare(params, count, h, st);
  }
  template <class S>
  void optimizer_update_all(const ParamView<S>* params, std::size_t count, const ParamView<S>*,
                            const OptimizerHyper<S>& h, const OptimizerState<S>* st) {
    const std::size_t blocks = update_blocks(params, count);
    for (std::size_t block = 0; block < blocks; ++block)
      for (std::size_t thread = 0; thread < threads_per_block; ++thread)
        optimizer_update_block(params, count, h, *st, block, thread, threads_per_block);
  }
  template <class S>
  void optimizer_update(const ParamView<S>& p, const OptimizerHyper<S>& h, const OptimizerState<S>* st) {
    for_each_item(p.size, [&](std::size_t w) { device::optimizer_update(p, h, *st, w); });
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  void outside_graph(const char* what) const {
    if (recording_)
      throw std::runtime_error(std::string("grad::device (cpu): ") + what +
                               " inside a graph capture (copies must stay outside the recorded step)");
  }
  std::vector<std::unique_ptr<unsigned char[], Free>> blocks_;
  bool recording_ = false;
};

}  // namespace

// Declared here, defined by the CUDA library (kernels/cuda_backend.cu) or,
// in a build without CUDA, by kernels/cuda_absent.cpp.
template <class S>
std::unique_ptr<Engine<S>> make_cuda_engine(const Layout<S>& layout, Mode mode, const FusionPlan& plan, bool fuse);

template <class S>
std::unique_ptr<Engine<S>> make_engine(Backend backend, const Layout<S>& layout, Mode mode, const FusionPlan& plan,
                                       bool fuse) {
  if (backend == Backend::cuda) return make_cuda_engine<S>(layout, mode, plan, fuse);
  return std::make_unique<ReplayEngine<S, CpuLauncher>>(layout, mode, plan, fuse);
}

template std::unique_ptr<Engine<float>> make_engine<float>(Backend, const Layout<float>&, Mode, const FusionPlan&,
                                                           bool);
template std::unique_ptr<Engine<double>> make_engine<double>(Backend, const Layout<double>&, Mode, const FusionPlan&,
                                                             bool);

}  // namespace grad::device
