// The CPU backend: the tags' per-item bodies and the fused kernels' bodies
// (work_items.hpp) run on the host, one loop over blocks and threads per launch, launches in order.
// It exists so the bit-exactness contract can be checked on any machine; it
// is not meant to be fast. Its Schedule (engine.hpp) reorders blocks and
// threads to expose races that in-order emulation would hide.
#include <concepts>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/device/replay.hpp"
#include "grad/random.hpp"
#include "optimizer_steps.hpp"
#include "work_items.hpp"

namespace grad::device {

namespace {

// The order blocks and threads run in (Schedule, engine.hpp).
class CpuOrder {
 public:
  explicit CpuOrder(Schedule s) : schedule_(s) {}
  Schedule schedule() const { return schedule_; }
  // Calls f(block) for every block of a grid of `blocks`.
  template <class F>
  void blocks(std::size_t blocks, F&& f) {
    if (schedule_ == Schedule::in_order) {
      for (std::size_t b = 0; b < blocks; ++b) f(b);
    } else if (schedule_ == Schedule::reverse) {
      for (std::size_t b = blocks; b-- > 0;) f(b);
    } else {
      // A fixed permutation per grid size (Fisher-Yates from a seed that
      // depends on nothing else), so a failure reproduces.
      std::vector<std::size_t>& perm = permutations_[blocks];
      if (perm.size() != blocks) {
        perm.resize(blocks);
        for (std::size_t b = 0; b < blocks; ++b) perm[b] = b;
        SplitMix64 rng(0x5eedULL + blocks);
        for (std::size_t b = blocks; b > 1; --b) std::swap(perm[b - 1], perm[rng.next() % b]);
      }
      for (std::size_t b : perm) f(b);
    }
  }
  // Calls f(thread) for the threads of one block, between two barriers.
  template <class F>
  void threads(std::size_t threads, F&& f) const {
    if (schedule_ == Schedule::in_order)
      for (std::size_t t = 0; t < threads; ++t) f(t);
    else
      for (std::size_t t = threads; t-- > 0;) f(t);
  }

 private:
  Schedule schedule_;
  std::map<std::size_t, std::vector<std::size_t>> permutations_;
};

// A block (block_reduce.hpp's Block) as loops: a step runs every thread's share
// in the schedule's thread order; the barrier is the end of that loop.
struct CpuBlock {
  const CpuOrder& order;
  std::size_t size;
  template <class F>
  void step(F&& f) {
    order.threads(size, [&](std::size_t t) { f(t, size); });
  }
  template <class F>
  void step_one(F&& f) {
    f();
  }
};

class CpuLauncher {
 public:
  explicit CpuLauncher(const BackendOptions& o) : order_(o.schedule), host_only_(o.host_only) {
    const char* fail = std::getenv("GRAD_DEVICE_FAIL_CAPTURE");
    fail_capture_ = fail && std::string(fail) == "1";
  }

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
    if (host_only_) return;
    if constexpr (std::same_as<Op, Sum> || std::same_as<Op, Mean>) {
      // The CUDA backend's one-block reduction, threads as loops.
      CpuBlock block{order_, threads_per_block};
      block_reduce_forward(x, y, op_code<Op>, shared<S>(), block);
    } else {
      for_each_item(items, [&](std::size_t w) { Op::forward_item(x, y, w); });
    }
  }
  template <class Op, int In, class S>
  void backward(const NodeArgs<S>& x, const S* y, const S* g, S* dx, std::size_t items) {
    if (host_only_) return;
    for_each_item(items, [&](std::size_t w) { Op::template backward_item<In>(x, y, g, dx, w); });
  }
  template <class S>
  void accumulate(S* grad, const S* contribution, std::size_t n) {
    if (host_only_) return;
    for_each_item(n, [&](std::size_t w) { accumulate_element(grad, contribution, w); });
  }
  // Fused kernels: the CUDA kernels' bodies, blocks and threads as loops; a
  // barrier is the end of a thread loop.
  template <class S>
  void rows(const Launch<S>* launches, std::size_t count, std::size_t rows, std::size_t threads) {
    if (host_only_) return;
    order_.blocks(rows, [&](std::size_t row) {
      for (std::size_t k = 0; k < count; ++k)
        order_.threads(threads, [&](std::size_t t) { row_segment_step(launches[k], rows, row, t, threads); });
    });
  }
  template <class S>
  void serial(const Launch<S>* launches, std::size_t count) {
    if (host_only_) return;
    CpuBlock block{order_, threads_per_block};
    serial_segment(launches, count, shared<S>(), block);
  }
  template <class S>
  void batch(const Launch<S>* launches, std::size_t count, const Launch<S>*) {
    if (host_only_) return;
    order_.blocks(batch_blocks(launches, count), [&](std::size_t block) {
      order_.threads(threads_per_block,
                     [&](std::size_t t) { batch_block(launches, count, block, t, threads_per_block); });
    });
  }
  // No graphs on the host: graph mode runs the very launch list it would
  // capture, and refuses a copy inside it as a CUDA capture would.
  template <class F>
  void graph(std::size_t, F&& record) {
    // A test hook: makes the fallback path reachable (as on CUDA).
    if (fail_capture_) throw std::runtime_error("graph capture refused (GRAD_DEVICE_FAIL_CAPTURE=1)");
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
  void optimizer_prepare(const ParamView<S>* params, std::size_t count, const OptimizerHyper<S>* h,
                         OptimizerState<S>* st) {
    if (host_only_) return;
    CpuBlock block{order_, threads_per_block};
    device::optimizer_prepare(params, count, h, st, shared<S>(), block);
  }
  template <class S>
  void optimizer_update_all(const ParamView<S>* params, std::size_t count, const ParamView<S>*,
                            const OptimizerHyper<S>* h, const OptimizerState<S>* st) {
    if (host_only_) return;
    order_.blocks(update_blocks(params, count), [&](std::size_t block) {
      order_.threads(threads_per_block, [&](std::size_t t) {
        optimizer_update_block(params, count, *h, *st, block, t, threads_per_block);
      });
    });
  }
  template <class S>
  void optimizer_update(const ParamView<S>& p, const OptimizerHyper<S>* h, const OptimizerState<S>* st) {
    if (host_only_) return;
    for_each_item(p.size, [&](std::size_t w) { device::optimizer_update(p, *h, *st, w); });
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  // The CUDA backend's launch geometry (grad/device/launch.hpp), blocks and threads as loops.
  template <class F>
  void for_each_item(std::size_t items, F&& body) {
    order_.blocks(blocks_for(items), [&](std::size_t block) {
      order_.threads(threads_per_block, [&](std::size_t thread) {
        const std::size_t w = block * threads_per_block + thread;
        if (w < items) body(w);
      });
    });
  }
  // A block's shared memory (block_sum_shared values).
  template <class S>
  S* shared() {
    return reinterpret_cast<S*>(shared_);
  }
  void outside_graph(const char* what) const {
    if (recording_)
      throw std::runtime_error(std::string("grad::device (cpu): ") + what +
                               " inside a graph capture (copies must stay outside the recorded step)");
  }
  CpuOrder order_;
  std::vector<std::unique_ptr<unsigned char[], Free>> blocks_;
  alignas(64) double shared_[block_sum_shared];
  bool host_only_ = false, recording_ = false, fail_capture_ = false;
};

}  // namespace

// Declared here, defined by the CUDA library (kernels/cuda_backend.cu) or,
// in a build without CUDA, by kernels/cuda_absent.cpp.
template <class S>
std::unique_ptr<Engine<S>> make_cuda_engine(const Layout<S>& layout, Mode mode, const FusionPlan& plan, bool fuse);

template <class S>
std::unique_ptr<Engine<S>> make_engine(Backend backend, const Layout<S>& layout, Mode mode, const FusionPlan& plan,
                                       bool fuse, const BackendOptions& options) {
  if (backend == Backend::cuda) return make_cuda_engine<S>(layout, mode, plan, fuse);
  return std::make_unique<ReplayEngine<S, CpuLauncher>>(layout, mode, plan, fuse, options);
}

template std::unique_ptr<Engine<float>> make_engine<float>(Backend, const Layout<float>&, Mode, const FusionPlan&, bool,
                                                           const BackendOptions&);
template std::unique_ptr<Engine<double>> make_engine<double>(Backend, const Layout<double>&, Mode, const FusionPlan&,
                                                             bool, const BackendOptions&);

}  // namespace grad::device
