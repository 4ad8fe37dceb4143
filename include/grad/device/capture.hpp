// capture(): one recorded episode of a Tape becomes a Program that a backend
// replays: forward, backward (and a device optimizer's step) per minibatch,
// with fresh input rows uploaded into the captured constants.
//
// Capture fails closed: anything it cannot replay exactly is refused with a
// CaptureError whose message says what and why.
//
// Modes (Options::mode): per_node launches each node's kernels as forward()
// and backward() are called. graph and fused queue forward(), backward() and
// the device optimizer's step() and run them as one CUDA graph at the next
// upload or read (loss(), value(), grad(), sync_params_to()); fused runs the
// plan's fused kernels inside it (plan() shows the cut). All three land on
// the same bits; fallback_reason() says if a graph could not be used.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "grad/device/engine.hpp"
#include "grad/device/plan.hpp"
#include "grad/tape.hpp"

namespace grad::device {

struct Options {
  Backend backend = Backend::cpu;
  Mode mode = Mode::per_node;
  bool f32 = false;  // hold and compute everything in float32 on the device
  // CPU backend only: the order blocks and threads run in (engine.hpp). A
  // result that differs from Schedule::in_order's is a race.
  Schedule schedule = Schedule::in_order;
  // CPU backend only: skip the kernel bodies to time the engine's host-side
  // cost per step (bench_device); the values are then meaningless.
  bool host_only = false;
  // For tests: edits the planner's cut before the engine is built (a
  // deliberately broken plan must be caught by the race schedules).
  std::function<void(FusionPlan&)> edit_plan = nullptr;
};

class CaptureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline std::string_view backend_name(Backend b) { return b == Backend::cpu ? "cpu" : "cuda"; }
inline std::string_view mode_name(Mode m) {
  return m == Mode::per_node ? "per_node" : m == Mode::graph ? "graph" : "fused";
}

// What capture saw of a node, for reports and pictures: they must not read
// the tape again (it may have been reset and re-recorded since).
struct CapturedNode {
  std::uint8_t op = 0;
  std::uint32_t a = no_node, b = no_node;
  Dims dims;
  std::string scope;  // the NameScope path it was recorded under ("" for none)
};

template <class T>
class Program;

template <class T>
Program<T> capture(const Tape<T>& tape, Var<T> loss, Options options = {});

template <class T>
class Program {
 public:
  // Uploads fresh values into a captured constant (tp.constant) of the same shape.
  void set_input(Var<T> input, const Tensor<T>& values) {
    const std::uint32_t i = node_of(input, "set_input");
    if (tape_->nodes()[i].op != op_code<Const>)
      throw std::invalid_argument("grad::device::set_input: node " + std::to_string(i) + " is a " +
                                  std::string(op_name(tape_->nodes()[i].op)) +
                                  " node; only constants (tape.constant) are inputs");
    if (narrow(tape_->nodes()[i].storage))
      throw std::invalid_argument("grad::device::set_input: node " + std::to_string(i) + " is a constant held as " +
                                  std::string(storage_name(tape_->nodes()[i].storage)) +
                                  " (a frozen weight); inputs are native constants");
    if (!(Dims::of(values.shape()) == node(i).dims))
      throw std::invalid_argument("grad::device::set_input: node " + std::to_string(i) + " has shape " +
                                  shape_string(node(i).dims) + " but the tensor has shape " +
                                  shape_string(values.shape()));
    with_engine([&](auto& e, auto zero) {
      using S = decltype(zero);
      if constexpr (std::is_same_v<S, T>) {
        e.write_values(value_offset_[i], values.data());
      } else {
        staging_.resize(values.size());
        std::transform(values.data().begin(), values.data().end(), staging_.begin(),
                       [](T x) { return static_cast<float>(x); });
        e.write_values(value_offset_[i], staging_);
      }
    });
  }

  // Anomaly detection (the tape's detect_anomalies, on the replay): while on,
  // forward(), backward() and an optimizer's step() run launch by launch and
  // check what each launch wrote; the first non-finite value, gradient or
  // updated parameter stops the replay with device::AnomalyError, whose
  // anomaly() (also kept in anomaly()) names the node, its op, name scope,
  // shapes and which operand was already non-finite. Off by default; off, a
  // launch costs one branch. Phases queued before it is turned on run unchecked.
  void detect_anomalies(bool on) {
    with_engine([&](auto& e, auto) {
      if (on)
        e.detect_anomalies([seen = captured_.get()](const NonFinite& f) { return seen->name(f); });
      else
        e.detect_anomalies(nullptr);
    });
    detects_anomalies_ = on;
  }
  bool detects_anomalies() const { return detects_anomalies_; }
  // The latest anomaly found (null before any).
  const Anomaly* anomaly() const { return captured_->has_anomaly ? &captured_->anomaly : nullptr; }
  // Node i as captured; std::out_of_range for i >= nodes().
  const CapturedNode& node(std::uint32_t i) const {
    if (i >= captured_->nodes.size())
      throw std::out_of_range("grad::device::Program::node: node " + std::to_string(i) + " of a program of " +
                              std::to_string(captured_->nodes.size()) + " captured nodes");
    return captured_->nodes[i];
  }

  // A program replays its captured episode, dropout masks included (their
  // key is the captured step's): a second forward() of an episode with a
  // dropout node would silently train on the first step's masks, so it is
  // refused; capture each step again, or capture in eval mode.
  void forward() {
    if (dropout_node_ != no_node && forwards_ > 0)
      throw std::logic_error("grad::device::Program::forward: node " + std::to_string(dropout_node_) +
                             " is a dropout whose mask belongs to the captured step; replaying it again would reuse "
                             "that mask. Capture each step again, or capture the model in eval mode (model.eval())");
    ++forwards_;
    with_engine([](auto& e, auto) { e.forward(); });
  }
  void backward() {
    with_engine([](auto& e, auto) { e.backward(); });
  }
  // The loss of the latest forward(): the only value a training step reads back.
  T loss() { return read(loss_, false)[0]; }

  // A captured node's value / gradient (zeros for a node without gradient).
  Tensor<T> value(Var<T> v) {
    return Tensor<T>(node(node_of(v, "value")).dims.shape(), read(node_of(v, "value"), false));
  }
  Tensor<T> grad(Var<T> v) { return Tensor<T>(node(node_of(v, "grad")).dims.shape(), read(node_of(v, "grad"), true)); }

  // Writes every captured parameter's device value into the tape it came from.
  void sync_params_to(Tape<T>& tape) {
    if (&tape != tape_)
      throw std::invalid_argument("grad::device::sync_params_to: the program was captured from a different tape");
    // The captured parameters, each checked before the tape is touched: after a
    // reset_to, a captured node may no longer exist (or be another node).
    for (std::uint32_t i : params_) check_node(i, "sync_params_to");
    for (std::uint32_t i : params_) {
      const std::vector<T> v = read(i, false);
      std::copy(v.begin(), v.end(), tape.nodes()[i].value);
    }
  }

  Backend backend() const { return options_.backend; }
  Mode mode() const { return options_.mode; }
  // Does the device hold float32 (an f32 capture, or a float tape)?
  bool f32() const { return narrow_ != nullptr || std::is_same_v<T, float>; }
  std::size_t nodes() const { return captured_->nodes.size(); }
  // Kernel launches of one forward() and one backward() (per-node mode).
  std::size_t forward_launches() const { return forward_launches_; }
  std::size_t backward_launches() const { return backward_launches_; }
  // The fusion planner's cut of this program (plan().describe() prints it),
  // whatever the mode; fused() says whether the fused kernels run it.
  const FusionPlan& plan() const { return plan_; }
  bool fused() const { return fused_; }
  // Kernels one forward() + backward() runs in this program's mode.
  std::size_t kernels_per_pass() const {
    return fused_ ? plan_.kernels(Phase::forward) + plan_.kernels(Phase::backward)
                  : forward_launches_ + backward_launches_;
  }
  // Kernels run so far; over one training step, the step's launch count.
  std::uint64_t launches() {
    return with_engine([](auto& e, auto) { return e.launches(); });
  }
  // Graph / fused modes: graphs captured so far (Engine::graph_captures). A
  // learning-rate schedule changes the rate every step without adding any.
  std::uint64_t graph_captures() {
    return with_engine([](auto& e, auto) { return e.graph_captures(); });
  }
  // Graph / fused modes: why the program fell back to per-node launches ("" if it did not).
  std::string fallback_reason() {
    return with_engine([](auto& e, auto) { return e.fallback_reason(); });
  }
  // Bytes of device gradient buffers: only nodes the loss's backward reaches have one.
  std::size_t grad_bytes() const { return grad_elements_ * (f32() ? sizeof(float) : sizeof(T)); }
  bool reaches(Var<T> v) const { return grad_offset_[node_of(v, "reaches")] != no_offset; }

  // For device optimizers: where a parameter lives, or an exception saying why it cannot be trained.
  ParamSlot param_slot(Var<T> param, std::string_view who) const {
    const std::uint32_t i = node_of(param, who);
    if (tape_->nodes()[i].op != op_code<Param>)
      throw std::invalid_argument("grad::device::" + std::string(who) + ": node " + std::to_string(i) + " is a " +
                                  std::string(op_name(tape_->nodes()[i].op)) +
                                  " node; expected a parameter (tape.param)");
    return {value_offset_[i], grad_offset_[i], node(i).dims.size(), 0.0};
  }
  template <class F>
  decltype(auto) with_engine(F&& f) {
    if constexpr (std::is_same_v<T, double>)
      if (narrow_) return f(*narrow_, float{});
    return f(*same_, T{});
  }

 private:
  friend Program capture<T>(const Tape<T>&, Var<T>, Options);
  Program() = default;

  std::uint32_t node_of(Var<T> v, std::string_view who) const {
    if (v.tape() != tape_ || (tape_->value(v).empty() && !narrow(tape_->storage(v))))
      throw std::invalid_argument(
          "grad::device::" + std::string(who) +
          ": the Var is not a live node of the captured tape (default, from another tape, or dropped)");
    if (v.index() > loss_)
      throw std::invalid_argument("grad::device::" + std::string(who) + ": node " + std::to_string(v.index()) +
                                  " was recorded after the loss (node " + std::to_string(loss_) +
                                  ") and is not captured");
    check_node(v.index(), who);
    return v.index();
  }
  void check_node(std::uint32_t i, std::string_view who) const {
    if (tape_->size() <= i || tape_->nodes()[i].serial != serials_[i])
      throw std::invalid_argument("grad::device::" + std::string(who) + ": node " + std::to_string(i) +
                                  " of the tape was re-recorded after capture; capture again");
  }
  std::vector<T> read(std::uint32_t i, bool gradient) {
    std::vector<T> out(node(i).dims.size(), T(0));
    const std::size_t offset = gradient ? grad_offset_[i] : value_offset_[i];
    if (offset == no_offset) return out;
    with_engine([&](auto& e, auto zero) {
      using S = decltype(zero);
      std::vector<S> tmp(out.size());
      if (gradient)
        e.read_grads(offset, tmp);
      else
        e.read_values(offset, tmp);
      std::transform(tmp.begin(), tmp.end(), out.begin(), [](S x) { return static_cast<T>(x); });
    });
    return out;
  }

  const Tape<T>* tape_ = nullptr;
  std::uint32_t dropout_node_ = no_node;  // the first dropout node, if any
  std::uint64_t forwards_ = 0;
  Options options_;
  std::uint32_t loss_ = 0;
  // The captured nodes, and the anomaly namer's state; on the heap, so the
  // engine's namer keeps pointing at it when the Program moves.
  struct Captured {
    std::vector<CapturedNode> nodes;
    bool has_anomaly = false;
    Anomaly anomaly;
    Anomaly name(const NonFinite& f);
  };
  std::unique_ptr<Captured> captured_ = std::make_unique<Captured>();
  bool detects_anomalies_ = false;
  std::vector<std::size_t> value_offset_, grad_offset_;
  std::vector<std::uint64_t> serials_;
  std::vector<std::uint32_t> params_;  // indices of the captured parameter nodes
  std::size_t grad_elements_ = 0, forward_launches_ = 0, backward_launches_ = 0;
  FusionPlan plan_;
  bool fused_ = false;
  std::unique_ptr<Engine<T>> same_;
  std::unique_ptr<Engine<float>> narrow_;  // f32 capture of a double tape
  std::vector<float> staging_;
};

namespace capture_detail {

// Buffers start on 256-byte boundaries so that every node's loads coalesce.
inline std::size_t aligned(std::size_t n, std::size_t elem) {
  const std::size_t per = 256 / elem;
  return (n + per - 1) / per * per;
}

// The refusal for an op whose tag has no per-item bodies.
inline std::string missing_kernel(std::uint32_t node, std::string_view op) {
  return "grad::device::capture: node " + std::to_string(node) + " is a '" + std::string(op) +
         "' op, whose tag has no per-item bodies (forward_item and backward_item, grad/tags/contract.hpp)";
}

template <class S, class T>
Layout<S> build_layout(const Tape<T>& tape, std::uint32_t loss, std::vector<std::size_t>& value_offset,
                       std::vector<std::size_t>& grad_offset) {
  const auto nodes = tape.nodes().first(loss + 1);
  Layout<S> L;
  L.loss = loss;
  L.extras.assign(tape.extras().begin(), tape.extras().end());

  // Which nodes the loss's backward reaches, and for each (node, input) pair
  // whether the input already holds a contribution: the tape's reverse walk
  // (backward.hpp), replayed statically.
  std::vector<char> reached(nodes.size(), 0);
  reached[loss] = nodes[loss].requires_grad;
  for (std::size_t i = loss + 1; i-- > 0;) {
    const Node<T>& n = nodes[i];
    if (!reached[i]) continue;
    const std::uint32_t in[2] = {n.a, n.b};
    for (std::uint8_t k = 0; k < 2; ++k) {
      if (in[k] == no_node || !nodes[in[k]].requires_grad) continue;
      L.backward.push_back({static_cast<std::uint32_t>(i), k, reached[in[k]] != 0});
      if (reached[in[k]]) L.scratch_size = std::max(L.scratch_size, nodes[in[k]].dims.size());
      reached[in[k]] = 1;
    }
  }

  std::size_t values = 0, grads = 0;
  value_offset.assign(nodes.size(), no_offset);
  grad_offset.assign(nodes.size(), no_offset);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const std::size_t size = nodes[i].dims.size();
    value_offset[i] = values;
    values += aligned(size, sizeof(S));
    if (reached[i]) {
      grad_offset[i] = grads;
      grads += aligned(size, sizeof(S));
    }
  }
  L.values.assign(values, S(0));
  L.grad_size = grads;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node<T>& n = nodes[i];
    DeviceNode<S> d;
    d.op = n.op;
    d.a = n.a;
    d.b = n.b;
    d.dims = n.dims;
    d.scalar = static_cast<S>(n.scalar);
    d.axis = n.axis;
    d.extra = n.extra == no_node ? no_offset : n.extra;
    d.value = value_offset[i];
    d.grad = grad_offset[i];
    L.nodes.push_back(d);
    // Every value starts as the tape recorded it: leaves are the inputs and
    // weights; computed values are overwritten by the first forward(). A
    // 16-bit constant (a frozen base) is held widened: the kernels read T,
    // and widening is exact, so they give the tape's bits.
    for (std::size_t k = 0; k < n.dims.size(); ++k) L.values[d.value + k] = static_cast<S>(n.value_at(k));
  }
  return L;
}

// Why an episode cannot be read off the tape at all (capture and grad::emit
// both start here; `doing` is "capturing" or "emitting"), or "".
template <class T>
std::string episode_refusal(const Tape<T>& tape, Var<T> loss, std::string_view doing) {
  if (!tape.ok())
    return "the tape is poisoned (" + tape.error() + "); record a clean episode before " + std::string(doing);
  if (loss.tape() != &tape) return "the loss Var belongs to a different tape (or to none)";
  if (tape.value(loss).empty()) return "the loss Var is not a live node of the tape (rejected, or dropped by reset_to)";
  // A recompute scope's transient values are not kept, and both engines read
  // every node's value from the tape.
  for (std::uint32_t i = 0; i <= loss.index(); ++i) {
    if (tape.nodes()[i].transient)
      return "node " + std::to_string(i) + " (a '" + std::string(op_name(tape.nodes()[i].op)) +
             "' op) was recorded inside a recompute scope (grad::recompute), whose values are not kept; record the "
             "episode without recompute scopes before " +
             std::string(doing);
    if (quantized(tape.nodes()[i].storage))
      return "node " + std::to_string(i) + " is a constant held as " +
             std::string(storage_name(tape.nodes()[i].storage)) +
             " (llama.cpp's quantized blocks), which neither the device engine nor grad::emit has kernels for; hold "
             "the base as f32, bf16 or f16 (nn::Lm's base_storage, hf::GgufLoadOptions) to " +
             std::string(doing == "capturing" ? "capture" : "emit") + " it";
  }
  return "";
}

}  // namespace capture_detail

template <class T>
Anomaly Program<T>::Captured::name(const NonFinite& f) {
  auto described = [&](std::uint32_t i) {
    Anomaly::Operand o;
    o.node = i;
    o.op = std::string(op_name(nodes[i].op));
    o.shape = shape_string(nodes[i].dims);
    o.scope = nodes[i].scope;
    return o;
  };
  const CapturedNode& n = nodes[f.node];
  Anomaly a;
  a.phase = f.phase;
  a.node = f.node;
  a.op = std::string(op_name(n.op));
  a.scope = n.scope;
  a.shape = shape_string(n.dims);
  a.element = f.element;
  a.bad = f.bad;
  a.incoming_gradient_finite = f.incoming_finite;
  if (f.phase != Anomaly::Phase::optimizer) {
    const std::uint32_t in[2] = {n.a, n.b};
    for (int k = 0; k < 2; ++k) {
      if (in[k] == no_node) continue;
      a.operands.push_back(described(in[k]));
      a.operands.back().value_finite = f.operand_finite[k];
    }
  }
  // x * x hands its one input two contributions: the first slot names it.
  if (f.phase == Anomaly::Phase::backward) a.gradient_to = n.a == f.input ? 0 : 1;
  a.message = inspect_detail::anomaly_message(
      a, "a leaf's value: an input, or a parameter an unchecked step wrote, or a phase queued before detection");
  anomaly = a;
  has_anomaly = true;
  return a;
}

template <class T>
Program<T> capture(const Tape<T>& tape, Var<T> loss, Options options) {
  const std::string who = "grad::device::capture: ";
  if (std::string why = capture_detail::episode_refusal(tape, loss, "capturing"); !why.empty())
    throw CaptureError(who + why);
  const Node<T>& root = tape.nodes()[loss.index()];
  if (root.dims.size() != 1)
    throw CaptureError(who + "the loss has shape " + shape_string(root.dims) +
                       "; expected a single element (reduce it with sum or mean first)");
  for (std::uint32_t i = 0; i <= loss.index(); ++i) {
    const Node<T>& n = tape.nodes()[i];
    const bool has_kernel = with_op(n.op, [](auto op) {
      using Op = decltype(op);
      return Op::arity == 0 || has_item_bodies<Op>;
    });
    if (!has_kernel) throw CaptureError(capture_detail::missing_kernel(i, op_name(n.op)));
    if (n.op == op_code<Bmm>) {
      const Dims &a = tape.nodes()[n.a].dims, &b = tape.nodes()[n.b].dims;
      if (a.rank != 3 || b.rank != 3 || a[0] != n.dims[0] || b[0] != n.dims[0])
        throw CaptureError(who + "node " + std::to_string(i) + ": bmm operands " + shape_string(a) + " x " +
                           shape_string(b) + " do not both carry the full batch of " + std::to_string(n.dims[0]));
    }
  }
  if (options.backend == Backend::cuda && !cuda_available())
    throw CaptureError(who + "backend 'cuda' requested but " + cuda_unavailable_reason());

  Program<T> p;
  p.tape_ = &tape;
  p.options_ = options;
  p.loss_ = loss.index();
  for (std::uint32_t i = 0; i <= p.loss_; ++i) {
    const Node<T>& n = tape.nodes()[i];
    p.captured_->nodes.push_back({n.op, n.a, n.b, n.dims, tape.scope_name(i)});
    p.serials_.push_back(tape.nodes()[i].serial);
    if (tape.nodes()[i].op == op_code<Param>) p.params_.push_back(i);
    if (tape.nodes()[i].op == op_code<Dropout> && p.dropout_node_ == no_node) p.dropout_node_ = i;
  }
  auto finish = [&](const auto& layout) {
    p.grad_elements_ = layout.grad_size;
    p.plan_ = plan_fusion(layout);
    if (options.edit_plan) options.edit_plan(p.plan_);
    p.forward_launches_ = p.plan_.forward.size();
    p.backward_launches_ = p.plan_.backward.size();
    // Fused segments run for speed where they pay (CUDA), and always on the
    // CPU backend, whose purpose is to check their bits.
    p.fused_ = options.mode == Mode::fused && (options.backend == Backend::cpu || p.plan_.worthwhile(options.backend));
  };
  try {
    if (options.f32 && std::is_same_v<T, double>) {
      const Layout<float> L = capture_detail::build_layout<float>(tape, p.loss_, p.value_offset_, p.grad_offset_);
      finish(L);
      p.narrow_ = make_engine<float>(options.backend, L, options.mode, p.plan_, p.fused_,
                                     {options.schedule, options.host_only});
    } else {
      const Layout<T> L = capture_detail::build_layout<T>(tape, p.loss_, p.value_offset_, p.grad_offset_);
      finish(L);
      p.same_ =
          make_engine<T>(options.backend, L, options.mode, p.plan_, p.fused_, {options.schedule, options.host_only});
    }
  } catch (const std::runtime_error& e) {
    throw CaptureError(who + "backend '" + std::string(backend_name(options.backend)) +
                       "' failed to start: " + e.what());
  }
  return p;
}

}  // namespace grad::device
