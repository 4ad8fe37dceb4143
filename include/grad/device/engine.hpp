// What a backend receives from capture (Layout: plain data, no pointers)
// and the interface every backend implements (Engine). Backends live in the
// grad_device library (kernels/): the CPU backend always, CUDA when built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/inspect/hooks.hpp"
#include "grad/tensor.hpp"
#include "grad/update_rules.hpp"  // AdamForm

namespace grad::device {

enum class Backend { cpu, cuda };
enum class Mode { per_node, graph, fused };

// The order in which the CPU backend runs the blocks of a launch and the
// threads of a block between two barriers. A GPU promises no order, so a
// result that changes with the schedule is a bug (a missing barrier, or a
// block reading rows another block of the same kernel writes) that in-order
// emulation hides. reverse: blocks and threads last to first; shuffled:
// blocks in a fixed pseudo-random order, threads in reverse. CUDA ignores it.
enum class Schedule { in_order, reverse, shuffled };

// How a backend runs, beyond the layout and mode.
struct BackendOptions {
  Schedule schedule = Schedule::in_order;  // CPU backend: block and thread order
  // CPU backend: skip every kernel body (values are then meaningless). What
  // remains of a step is the engine's host-side cost (queueing, graph keys,
  // copies, launch dispatch), which CUDA pays on top of its kernels.
  bool host_only = false;
};

inline constexpr std::size_t no_offset = std::numeric_limits<std::size_t>::max();

// One captured node. Offsets are in elements of the program's flat value and
// gradient buffers; `grad == no_offset` for nodes no parameter is upstream of.
template <class S>
struct DeviceNode {
  std::uint8_t op = 0;
  std::uint32_t a = std::numeric_limits<std::uint32_t>::max(), b = std::numeric_limits<std::uint32_t>::max();
  Dims dims;
  S scalar = S(0);
  std::uint32_t axis = 0;
  std::size_t extra = no_offset;  // offset into Layout::extras
  std::size_t value = 0, grad = no_offset;
};

// One backward launch: node `node` hands input `input` (0 = a, 1 = b) its
// contribution. The first contribution an input receives is stored as is;
// later ones (`accumulate`) go through scratch and are then added, exactly as
// the tape's reverse walk does, in the same order.
struct BackwardStep {
  std::uint32_t node = 0;
  std::uint8_t input = 0;
  bool accumulate = false;
};

template <class S>
struct Layout {
  std::vector<DeviceNode<S>> nodes;  // tape order, up to and including the loss
  std::vector<std::size_t> extras;   // slice starts
  std::vector<BackwardStep> backward;
  std::vector<S> values;         // initial value buffer (leaves filled in)
  std::size_t grad_size = 0;     // elements of the gradient buffer
  std::size_t scratch_size = 0;  // largest accumulated contribution
  std::uint32_t loss = 0;
};

// Optimizer state lives beside the program on its backend. The update rules
// are grad/opt.hpp's; the engine only runs them over the parameter buffers.
struct ParamSlot {
  std::size_t value = 0, grad = 0, size = 0;
  double l2 = 0;
  double weight_decay = 0;  // AdamW's decoupled decay
};
struct OptimizerSettings {
  bool adam = false;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, clip = 0;  // clip 0 = off
  AdamForm form = AdamForm::efficient;
};

// A fault of the device itself (an illegal address, a failed or timed-out
// launch): the CUDA context is unusable afterwards, so nothing may retry or
// fall back; the message names the kernel when GRAD_DEVICE_SYNC=1.
class DeviceFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Anomaly mode's raw finding: the first launch of a replay that wrote a
// non-finite element. The engine knows buffers, not names; Program turns it
// into a grad::Anomaly (op, scope, shapes, message) and the replay stops
// with an AnomalyError.
struct NonFinite {
  Anomaly::Phase phase = Anomaly::Phase::forward;
  // forward: the node run; backward: the node differentiated; optimizer: the parameter.
  std::uint32_t node = 0;
  std::uint32_t input = 0;  // backward: the operand node whose gradient went non-finite
  std::size_t element = 0;
  double bad = 0;
  bool operand_finite[2] = {true, true};  // forward, backward: the values of the node's operands a, b
  // backward: the node's own gradient; optimizer: the parameter's gradient.
  bool incoming_finite = true;
};
using NameNonFinite = std::function<Anomaly(const NonFinite&)>;

// What a replay in anomaly mode throws; the report is kept in anomaly().
class AnomalyError : public std::runtime_error {
 public:
  explicit AnomalyError(Anomaly a) : std::runtime_error("grad::device: " + a.message), anomaly_(std::move(a)) {}
  const Anomaly& anomaly() const { return anomaly_; }

 private:
  Anomaly anomaly_;
};

template <class S>
class Engine {
 public:
  virtual ~Engine() = default;
  // Plain copies between host memory and the value / gradient buffers.
  virtual void write_values(std::size_t offset, std::span<const S> src) = 0;
  virtual void read_values(std::size_t offset, std::span<S> dst) = 0;
  virtual void read_grads(std::size_t offset, std::span<S> dst) = 0;
  // Overwrites gradient elements, e.g. with a gradient reduced across
  // processes between backward() and optimizer_step() (grad::dist).
  virtual void write_grads(std::size_t offset, std::span<const S> src) = 0;
  // The gradient buffer itself, in the backend's memory (device memory on
  // CUDA), after running every queued phase: for code on the same backend
  // that moves gradients without a host copy (NCCL). Valid for the engine's
  // lifetime.
  virtual S* grads_in_place() = 0;
  virtual void forward() = 0;
  virtual void backward() = 0;

  // One optimizer per program: (re)starts its state (zero moments, b^0 = 1)
  // over the parameters a step updates, in add order.
  virtual void set_optimizer(std::span<const ParamSlot> params, bool adam) = 0;
  // Clip factor, per-step constants and every update, all on the backend.
  // The settings go to one record in device memory (uploaded when they
  // change), which the kernels read: no graph is captured again for them.
  virtual void optimizer_step(const OptimizerSettings& s) = 0;
  // The optimizer's state, for checkpoints (after every queued phase has
  // run): Adam's moments over set_optimizer's parameters, contiguous in that
  // order (empty spans for SGD), and b1^t, b2^t. Throws std::logic_error
  // before set_optimizer and std::invalid_argument for spans of another size.
  virtual void read_optimizer_state(std::span<S> m, std::span<S> v, S& beta1_power, S& beta2_power) = 0;
  virtual void write_optimizer_state(std::span<const S> m, std::span<const S> v, S beta1_power, S beta2_power) = 0;

  // Anomaly mode (Program::detect_anomalies), on while `name` is set: every
  // phase then runs at once, launch by launch, and each launch's output is
  // checked; the first non-finite element stops the replay with
  // AnomalyError(name(finding)). Off (empty), a launch pays one branch.
  virtual void detect_anomalies(NameNonFinite name) = 0;

  // Graph and fused modes queue forward/backward/optimizer_step and run the
  // queue as one graph at the next copy; flush() runs it now.
  virtual void flush() = 0;
  // Why a graph or fused mode fell back to per-node launches ("" if it did not).
  virtual const std::string& fallback_reason() const = 0;
  // Kernels run so far (a replayed graph counts the kernels inside it): the
  // launch count per step is the difference over a step.
  virtual std::uint64_t launches() const = 0;
  // Graph and fused modes: graphs captured so far (the CPU backend counts the
  // captures it emulates; per-node mode captures none). A step whose phases
  // were seen before replays its graph; new hyperparameters (lr, betas, eps,
  // clip) are an upload and capture nothing, a new parameter set
  // (set_optimizer) drops the graphs and the next step captures again.
  virtual std::uint64_t graph_captures() const = 0;
};

struct FusionPlan;  // plan.hpp

// Defined in the grad_device library for S = float and double. Throws
// std::runtime_error when the backend cannot run here (no CUDA device).
// `plan` is plan_fusion(layout); its segments are used when `fuse` is set.
template <class S>
std::unique_ptr<Engine<S>> make_engine(Backend backend, const Layout<S>& layout, Mode mode, const FusionPlan& plan,
                                       bool fuse, const BackendOptions& options = {});

// True when the CUDA backend was built and a device answers.
bool cuda_available();
// Why cuda_available() is false, in one line ("" when it is true).
std::string cuda_unavailable_reason();

// The first CUDA device, for a preflight check (zeros and "" without one).
struct CudaDeviceInfo {
  std::string name;
  int major = 0, minor = 0;     // compute capability
  int driver = 0, runtime = 0;  // CUDA versions, 1000 * major + 10 * minor
  std::size_t memory_bytes = 0;
  int multiprocessors = 0;
};
CudaDeviceInfo cuda_device_info();

}  // namespace grad::device
