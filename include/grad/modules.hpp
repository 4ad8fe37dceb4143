// Modules: thin owners of parameters. A module creates its parameters on a
// tape when it is constructed (with PyTorch's default initialisers, from
// grad's seeded generator) and, when called, records ordinary ops through the
// grad::nn builders: nothing hides the tape, and what a module records is
// what a hand-written program would record.
//
//   grad::SplitMix64 gen(seed);
//   grad::nn::Sequential<double> model(tp);
//   model.add(grad::nn::Linear<double>(tp, 64, 128, gen)).add(grad::nn::relu_layer<double>)
//        .add(grad::nn::Linear<double>(tp, 128, 10, gen));
//   for (const auto& p : model.parameters()) std::cout << p.name << "\n";   // "0.weight", "0.bias", "2.weight", ...
//   grad::nn::add_parameters(opt, model, {.weights = 1e-4, .others = 0});  // L2 on weights only (unset: opt's default)
//   auto logits = model(x);
//
// Conventions (those of grad::nn): a Linear weight is [in, out] (PyTorch
// stores its transpose, [out, in]); a bias or norm weight is [out].
//
// Initialisers (nn::init), all drawing from grad::SplitMix64, so the same
// seed gives the same weights on every platform:
//   kaiming_uniform  U(-b, b), b = 1 / sqrt(fan_in): torch.nn.Linear's default
//                    for weights (kaiming_uniform_ with a = sqrt(5), whose gain
//                    sqrt(2 / 6) times sqrt(3 / fan_in) is 1 / sqrt(fan_in))
//   bias_uniform     U(-1 / sqrt(fan_in), 1 / sqrt(fan_in)): torch.nn.Linear's bias
//   xavier_uniform   U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out))
//   xavier_normal    N(0, gain^2 * 2 / (fan_in + fan_out))
//   normal           N(mean, std^2) (Box-Muller on SplitMix64)
//   uniform          U(lo, hi)
//   zeros, ones      constants (norm weights are ones, their biases zeros)
// Values are drawn in row-major order of the [in, out] tensor, in double,
// then rounded to T.
//
// Names: a module's parameters are named as PyTorch names them in a
// state_dict: "weight", "bias"; a child registered as "encoder" prefixes
// "encoder."; Sequential names its layers by position ("0.", "1.", ...,
// activations included, as torch.nn.Sequential counts them). Save and load
// them by name with grad/model_file.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "grad/nn.hpp"
#include "grad/opt.hpp"
#include "grad/random.hpp"

namespace grad::nn {

namespace init {

template <class T>
void uniform(Tensor<T>& t, double lo, double hi, SplitMix64& gen) {
  if (!(lo <= hi)) throw std::invalid_argument("nn::init::uniform: expected lo <= hi");
  for (T& v : t.data()) v = static_cast<T>(gen.uniform(lo, hi));
}
template <class T>
void normal(Tensor<T>& t, double mean, double std, SplitMix64& gen) {
  if (!(std >= 0) || !std::isfinite(std))
    throw std::invalid_argument("nn::init::normal: std " + std::to_string(std) + " must be finite and >= 0");
  for (T& v : t.data()) v = static_cast<T>(mean + std * gen.normal());
}
template <class T>
void zeros(Tensor<T>& t) {
  for (T& v : t.data()) v = T(0);
}
template <class T>
void ones(Tensor<T>& t) {
  for (T& v : t.data()) v = T(1);
}
inline double checked_fan(std::string_view who, std::size_t fan) {
  if (fan == 0) throw std::invalid_argument("nn::init::" + std::string(who) + ": fan_in must be > 0");
  return static_cast<double>(fan);
}
// torch.nn.Linear's weight default (kaiming_uniform_, a = sqrt(5)).
template <class T>
void kaiming_uniform(Tensor<T>& t, std::size_t fan_in, SplitMix64& gen) {
  const double b = 1.0 / std::sqrt(checked_fan("kaiming_uniform", fan_in));
  uniform(t, -b, b, gen);
}
// torch.nn.Linear's bias default.
template <class T>
void bias_uniform(Tensor<T>& t, std::size_t fan_in, SplitMix64& gen) {
  const double b = 1.0 / std::sqrt(checked_fan("bias_uniform", fan_in));
  uniform(t, -b, b, gen);
}
template <class T>
void xavier_uniform(Tensor<T>& t, std::size_t fan_in, std::size_t fan_out, SplitMix64& gen, double gain = 1.0) {
  const double b = gain * std::sqrt(6.0 / checked_fan("xavier_uniform", fan_in + fan_out));
  uniform(t, -b, b, gen);
}
template <class T>
void xavier_normal(Tensor<T>& t, std::size_t fan_in, std::size_t fan_out, SplitMix64& gen, double gain = 1.0) {
  normal(t, 0.0, gain * std::sqrt(2.0 / checked_fan("xavier_normal", fan_in + fan_out)), gen);
}

}  // namespace init

// What a parameter is for: optimizers commonly decay weights but not biases
// or norm gains (add_parameters' Decay).
enum class ParamKind { weight, bias, norm };

template <class T>
struct NamedParameter {
  std::string name;
  Var<T> var;
  ParamKind kind = ParamKind::weight;
};

// A module's mode and its random-draw counter, shared by the module, its
// copies and every module it is registered in (so that a parent's train()
// and eval() reach it wherever it was moved).
struct ModuleState {
  bool training = true;
  std::uint64_t steps = 0;  // training calls so far of a layer that draws (Dropout's mask step)
};

// The base of every module: a tape, a list of named parameters and the
// states of the module and its children (a child's are copied in, prefixed,
// when it is registered: Vars and states are handles, so a module may be
// moved freely; a copy shares its original's state).
template <class T>
class Module {
 public:
  explicit Module(Tape<T>& tp) : tape_(&tp), states_{std::make_shared<ModuleState>()} {}
  virtual ~Module() = default;
  Module(const Module&) = default;
  Module(Module&&) noexcept = default;
  Module& operator=(const Module&) = default;
  Module& operator=(Module&&) noexcept = default;

  Tape<T>& tape() const { return *tape_; }
  const std::vector<NamedParameter<T>>& parameters() const { return params_; }
  // The parameter called `name`; a default (invalid) Var when there is none.
  Var<T> parameter(std::string_view name) const {
    for (const auto& p : params_)
      if (p.name == name) return p.var;
    return {};
  }
  // Training mode, as PyTorch's model.train() / model.eval(): every
  // registered descendant follows. Modules start in training mode; only
  // layers that behave differently (Dropout) read it.
  void train(bool on = true) {
    for (const auto& s : states_) s->training = on;
  }
  void eval() { train(false); }
  bool training() const { return states_.front()->training; }

  // Freezing, as torch's requires_grad_(False): every parameter of this
  // module (and its children) stops receiving gradients and optimizers skip
  // it (Tape::set_requires_grad). Between episodes: after reset_to, before
  // the next forward. False (the tape poisoned) when the tape is.
  bool requires_grad(bool on) {
    for (const auto& p : params_)
      if (!tape_->set_requires_grad(p.var, on)) return false;
    return true;
  }
  bool freeze() { return requires_grad(false); }
  bool unfreeze() { return requires_grad(true); }

  // The draw counters of this module and its children, in registration
  // order, and their restoration: what a resumed run needs for Dropout to
  // draw the masks an uninterrupted one would (grad::LoopState keeps them).
  std::vector<std::uint64_t> random_steps() const {
    std::vector<std::uint64_t> steps;
    for (const auto& s : states_) steps.push_back(s->steps);
    return steps;
  }
  void set_random_steps(std::span<const std::uint64_t> steps) {
    if (steps.size() != states_.size())
      throw std::invalid_argument("nn::Module::set_random_steps: " + std::to_string(steps.size()) +
                                  " counters given, but the module has " + std::to_string(states_.size()) +
                                  " (one per module, children included)");
    for (std::size_t i = 0; i < steps.size(); ++i) states_[i]->steps = steps[i];
  }

  // Elements over all parameters.
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for (const auto& p : params_) n += tape_->value(p.var).size();
    return n;
  }

 protected:
  // Records `init` as a parameter of this module (tp.param) under `name`.
  Var<T> register_parameter(std::string name, const Tensor<T>& init, ParamKind kind) {
    check_name(name);
    Var<T> v = tape_->param(init);
    params_.push_back({std::move(name), v, kind});
    return v;
  }
  // Adds a child's parameters as "<name>.<its name>". Register a child once
  // its own parameters exist (after its constructor).
  void register_module(const std::string& name, const Module& child) {
    if (child.tape_ != tape_)
      throw std::invalid_argument("nn::Module: child '" + name + "' records on a different tape");
    for (const auto& p : child.params_) {
      std::string full = name + "." + p.name;
      check_name(full);
      params_.push_back({std::move(full), p.var, p.kind});
    }
    states_.insert(states_.end(), child.states_.begin(), child.states_.end());
  }
  // This module's own state (the first of states_).
  ModuleState& state() const { return *states_.front(); }

 private:
  void check_name(const std::string& name) const {
    if (name.empty() || name.front() == '.' || name.back() == '.')
      throw std::invalid_argument("nn::Module: parameter name '" + name + "' is empty or starts/ends with '.'");
    for (const auto& p : params_)
      if (p.name == name) throw std::invalid_argument("nn::Module: parameter name '" + name + "' is used twice");
  }

  Tape<T>* tape_;
  std::vector<NamedParameter<T>> params_;
  std::vector<std::shared_ptr<ModuleState>> states_;  // its own first, then each child's
};

// y = x . weight + bias, weight [in, out], bias [out]; PyTorch's default
// initialisation (weight kaiming_uniform, bias bias_uniform, both bound
// 1/sqrt(in)), weight drawn first, then bias.
template <class T>
class Linear : public Module<T> {
 public:
  Linear(Tape<T>& tp, std::size_t in, std::size_t out, SplitMix64& gen, bool with_bias = true) : Module<T>(tp) {
    if (in == 0 || out == 0)
      throw std::invalid_argument("nn::Linear: in and out must be > 0, got " + std::to_string(in) + " and " +
                                  std::to_string(out));
    Tensor<T> w({in, out});
    init::kaiming_uniform(w, in, gen);
    weight = this->register_parameter("weight", w, ParamKind::weight);
    if (with_bias) {
      Tensor<T> b({out});
      init::bias_uniform(b, in, gen);
      bias = this->register_parameter("bias", b, ParamKind::bias);
    }
  }
  // A given initial weight (and bias, when not empty); shapes [in, out], [out].
  Linear(Tape<T>& tp, const Tensor<T>& w, const Tensor<T>& b = {}) : Module<T>(tp) {
    if (w.rank() != 2 || (b.size() != 0 && (b.rank() != 1 || b.shape()[0] != w.shape()[1])))
      throw std::invalid_argument("nn::Linear: weight " + shape_string(w.shape()) + " and bias " +
                                  shape_string(b.shape()) + ": expected [in, out] and [out]");
    weight = this->register_parameter("weight", w, ParamKind::weight);
    if (b.size() != 0) bias = this->register_parameter("bias", b, ParamKind::bias);
  }
  Var<T> operator()(Var<T> x) const { return bias.valid() ? linear_bias(x, weight, bias) : linear(x, weight); }

  Var<T> weight, bias;  // bias is invalid (default) when built without one
};

// torch.nn.LayerNorm over the last axis of [rows, cols]: weight ones, bias zeros.
template <class T>
class LayerNorm : public Module<T> {
 public:
  LayerNorm(Tape<T>& tp, std::size_t cols, T epsilon = T(1e-5)) : Module<T>(tp), eps(epsilon) {
    Tensor<T> w({cols}), b({cols});
    init::ones(w);
    weight = this->register_parameter("weight", w, ParamKind::norm);
    bias = this->register_parameter("bias", b, ParamKind::bias);
  }
  Var<T> operator()(Var<T> x) const { return layernorm(x, weight, bias, eps); }
  Var<T> weight, bias;
  T eps;
};

// RMSNorm (Qwen2/LLaMA): weight ones.
template <class T>
class RMSNorm : public Module<T> {
 public:
  RMSNorm(Tape<T>& tp, std::size_t cols, T epsilon = T(1e-6)) : Module<T>(tp), eps(epsilon) {
    Tensor<T> w({cols});
    init::ones(w);
    weight = this->register_parameter("weight", w, ParamKind::norm);
  }
  Var<T> operator()(Var<T> x) const { return rmsnorm(x, weight, eps); }
  Var<T> weight;
  T eps;
};

// LoRA adapters over a frozen weight (PEFT's form and initialisation):
// y = x . w0 + (alpha / r) * (x . A) . B, A [in, r] kaiming_uniform, B [r, out]
// zeros, so the layer starts as exactly x . w0. w0 is a constant (frozen): it
// is not in parameters(); only lora_A and lora_B are.
template <class T>
class LoRALinear : public Module<T> {
 public:
  LoRALinear(Tape<T>& tp, const Tensor<T>& w0, std::size_t rank, T alpha, SplitMix64& gen)
      : Module<T>(tp), scale(alpha / static_cast<T>(rank == 0 ? 1 : rank)) {
    if (w0.rank() != 2 || rank == 0)
      throw std::invalid_argument("nn::LoRALinear: w0 " + shape_string(w0.shape()) + ", rank " + std::to_string(rank) +
                                  ": expected w0 [in, out] and rank > 0");
    frozen = tp.constant(w0);
    Tensor<T> a({w0.shape()[0], rank}), b({rank, w0.shape()[1]});
    init::kaiming_uniform(a, w0.shape()[0], gen);
    A = this->register_parameter("lora_A", a, ParamKind::weight);
    B = this->register_parameter("lora_B", b, ParamKind::weight);
  }
  Var<T> operator()(Var<T> x) const { return lora_linear(x, frozen, A, B, scale); }
  Var<T> frozen, A, B;
  T scale;
};

// torch.nn.Dropout(p): in training mode, inverted dropout (each element kept
// with probability 1 - p and scaled by 1 / (1 - p)); in eval mode, and for
// p = 0, the input itself (nothing is recorded). The mask of the k-th
// training call is a pure function of (seed, k, the node's index on the
// tape) (grad::dropout_key), the seed drawn from `gen` when the layer is
// built: the same seed gives the same masks on every engine, and a run
// resumed with its counters (random_steps) draws what a straight run draws.
template <class T>
class Dropout : public Module<T> {
 public:
  Dropout(Tape<T>& tp, double rate, SplitMix64& gen) : Module<T>(tp), p(rate), seed(gen.next()) {
    if (!(rate >= 0 && rate < 1))
      throw std::invalid_argument("nn::Dropout: p = " + std::to_string(rate) + " is out of range: expected 0 <= p < 1");
  }
  Var<T> operator()(Var<T> x) const {
    if (!this->training() || p == 0 || !x.valid()) return x;
    const std::uint64_t node = this->tape().size();  // the index the dropout node gets
    return dropout(x, p, dropout_key(seed, this->state().steps++, node));
  }
  double p;
  std::uint64_t seed;
};

// Activations usable as Sequential layers (they own nothing).
template <class T>
Var<T> relu_layer(Var<T> x) {
  return grad::relu(x);
}
template <class T>
Var<T> tanh_layer(Var<T> x) {
  return grad::tanh(x);
}
template <class T>
Var<T> sigmoid_layer(Var<T> x) {
  return grad::sigmoid(x);
}

// Layers applied in order, named by position as torch.nn.Sequential names
// them ("0.weight", "2.bias": activations take a position too). A module is
// moved in and kept; a plain function (an activation) is kept as is.
template <class T>
class Sequential : public Module<T> {
 public:
  explicit Sequential(Tape<T>& tp) : Module<T>(tp) {}

  template <class Layer>
  Sequential& add(Layer&& layer) {
    using L = std::remove_cvref_t<Layer>;
    const std::string name = std::to_string(layers_.size());
    if constexpr (std::is_base_of_v<Module<T>, L>) {
      auto kept = std::make_shared<L>(std::forward<Layer>(layer));
      this->register_module(name, *kept);
      layers_.push_back([kept](Var<T> x) { return (*kept)(x); });
    } else {
      layers_.push_back(std::function<Var<T>(Var<T>)>(std::forward<Layer>(layer)));
    }
    return *this;
  }
  Var<T> operator()(Var<T> x) const {
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      if (!x.valid()) break;  // the tape is poisoned: later layers would only say so again
      NameScope<T> scope(this->tape(), std::to_string(i));  // its nodes are layer "i" (inspect: anomalies, summary)
      x = layers_[i](x);
    }
    return x;
  }
  std::size_t size() const { return layers_.size(); }

 private:
  std::vector<std::function<Var<T>(Var<T>)>> layers_;
};

// A multilayer perceptron widths[0] -> ... -> widths.back(): Linear layers
// with `activation` between them (none after the last), as a Sequential;
// with dropout > 0, a Dropout(dropout) after each activation (which shifts
// the later layers' positions: "0.weight", "3.weight", ...). Every Linear
// draws its weights from `gen` before the Dropout after it draws its seed.
template <class T>
Sequential<T> mlp(Tape<T>& tp, std::initializer_list<std::size_t> widths, SplitMix64& gen,
                  Var<T> (*activation)(Var<T>) = relu_layer<T>, double dropout = 0) {
  if (widths.size() < 2) throw std::invalid_argument("nn::mlp: expected at least two widths (in and out)");
  if (!(dropout >= 0 && dropout < 1))
    throw std::invalid_argument("nn::mlp: dropout " + std::to_string(dropout) +
                                " is out of range: expected 0 <= p < 1");
  Sequential<T> s(tp);
  const std::size_t* w = widths.begin();
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    if (i > 0) {
      s.add(activation);
      if (dropout > 0) s.add(Dropout<T>(tp, dropout, gen));
    }
    s.add(Linear<T>(tp, w[i], w[i + 1], gen));
  }
  return s;
}

// Decay coefficients by parameter kind for add_parameters: what opt.add(p, c)
// takes (L2 for SGD and Adam, the decoupled weight decay for AdamW). A kind
// left unset gets the optimizer's own default, opt.add(p): AdamW's
// weight_decay() (0.01 unless given), 0 for SGD and Adam. So the default
// decays every parameter as torch's AdamW(model.parameters(), weight_decay=wd)
// does, biases and norm gains too; exempting them (the usual practice for
// transformers) is explicit:
//   add_parameters(opt, model);                               // every parameter: the optimizer's decay
//   add_parameters(opt, model, {.others = 0});                // no decay on biases and norm gains
//   add_parameters(opt, model, {.weights = 1e-4, .others = 0});
struct Decay {
  std::optional<double> weights = {};  // ParamKind::weight
  std::optional<double> others = {};   // ParamKind::bias and ParamKind::norm
};

// Adds every parameter of `model` to `opt` in parameters() order, weights
// with decay.weights and the rest with decay.others (each, when unset, the
// optimizer's default), under the module's names ("fc2.weight": what the
// optimizer's messages call them). False (the tape poisoned, saying which
// parameter) as soon as one add fails.
template <class Opt, class T>
bool add_parameters(Opt& opt, const Module<T>& model, Decay decay = {}) {
  static_assert(std::is_same_v<typename Opt::value_type, T>,
                "grad::nn::add_parameters: the optimizer's precision differs from the model's (e.g. a float model "
                "with grad::Adam opt(0.005), which is Adam<double>): declare grad::Adam<float> opt(0.005f)");
  for (const auto& p : model.parameters()) {
    const std::optional<double>& c = p.kind == ParamKind::weight ? decay.weights : decay.others;
    if (!(c ? opt.add(p.var, static_cast<T>(*c), p.name) : opt.add(p.var, p.name))) return false;
  }
  return true;
}

}  // namespace grad::nn

// With GRAD_COMPILED_KERNELS the modules for float and double are the compiled
// library's (src/extras_*.cpp, core.hpp's GRAD_WALK_INSTANCES says why), so a
// consumer's unit does not compile them again.
#define GRAD_MODULES_INSTANCES(E, T)                                                                      \
  E template class grad::nn::Module<T>;                                                                   \
  E template class grad::nn::Linear<T>;                                                                   \
  E template class grad::nn::LayerNorm<T>;                                                                \
  E template class grad::nn::RMSNorm<T>;                                                                  \
  E template class grad::nn::LoRALinear<T>;                                                               \
  E template class grad::nn::Dropout<T>;                                                                  \
  E template class grad::nn::Sequential<T>;                                                               \
  E template grad::nn::Sequential<T> grad::nn::mlp<T>(grad::Tape<T>&, std::initializer_list<std::size_t>, \
                                                      grad::SplitMix64&, grad::Var<T> (*)(grad::Var<T>), double);
#if defined(GRAD_COMPILED_KERNELS) && GRAD_SIMD
GRAD_MODULES_INSTANCES(extern, float)
GRAD_MODULES_INSTANCES(extern, double)
#endif
