// The emitter proper: EmitPlan checks an episode, lays out its workspace and names, and writes
// both sources (C++ and CUDA share each text function); emit() returns them. Apart from files.hpp:
// no file is touched here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "grad/config.hpp"
#include "grad/device/capture.hpp"
#include "grad/device/plan.hpp"
#include "grad/emit/spelling.hpp"
#include "grad/opt.hpp"
#include "grad/tape.hpp"

namespace grad {

class EmitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class T>
struct EmitOptions {
  std::string name = "model";  // the emitted namespace
  // Names of leaves (parameters, inputs) and forward outputs; the others are
  // p<node>, in<node>, out<k>.
  std::vector<std::pair<Var<T>, std::string>> names;
  std::vector<Var<T>> outputs;              // forward()'s outputs (none: no forward())
  const Optimizer<T>* optimizer = nullptr;  // SGD or Adam over the tape's parameters: step() updates
  bool value_and_grad = false;              // emit value_and_grad(x, g) (a small per-example loss)
};

struct EmittedSource {
  std::string cpp;   // the C++ header
  std::string cuda;  // the CUDA source
};

namespace emit_detail {

inline std::size_t round_up(std::size_t n) { return (n + 7) / 8 * 8; }  // 64 bytes of double

}  // namespace emit_detail

// The program both files are written from: the layout, the launch list, and
// what each node's buffer is called in the emitted code.
template <class T>
class EmitPlan {
 public:
  EmitPlan(const Tape<T>& tape, Var<T> loss, const EmitOptions<T>& o) : o_(o) {
    const std::string who = "grad::emit: ";
    if (std::string why = device::capture_detail::episode_refusal(tape, loss, "emitting"); !why.empty())
      throw EmitError(who + why);
    if (!emit_detail::identifier(o.name) || emit_detail::needs_suffix(o.name) ||
        emit_detail::implementation_reserved(o.name))
      throw EmitError(who + "the namespace name '" + o.name +
                      "' is not a C++ identifier, or is a keyword, a macro or a name the emitted code uses ("
                      "std, grad, T, ...), or one C++ reserves: it cannot name the emitted namespace");
    loss_ = loss.index();
    const Node<T>& root = tape.nodes()[loss_];
    if (root.dims.size() != 1)
      throw EmitError(who + "the loss (node " + std::to_string(loss_) + ") has shape " + shape_string(root.dims) +
                      "; expected a single element (reduce it with sum or mean first)");
    nodes_ = tape.nodes().first(loss_ + 1);
    for (std::uint32_t i = 0; i <= loss_; ++i) {
      const Node<T>& n = nodes_[i];
      const bool bodies = with_op(n.op, [](auto op) {
        using Op = decltype(op);
        return Op::arity == 0 || has_item_bodies<Op>;
      });
      if (!bodies)
        throw EmitError(who + "node " + std::to_string(i) + " is a '" + std::string(op_name(n.op)) +
                        "' op, whose tag has no per-item bodies (forward_item and backward_item, "
                        "grad/tags/contract.hpp): there is nothing to emit for it");
      // The emitted shapes hold one extra per axis of operand a (slice's
      // starts); an op that keeps one per row (linear_cross_entropy's class
      // ids) would lose them.
      const bool row_ids = with_op(n.op, [](auto op) {
        return requires { decltype(op)::keeps_row_ids; };
      });
      if (row_ids)
        throw EmitError(who + "node " + std::to_string(i) + " is a '" + std::string(op_name(n.op)) +
                        "' op, which keeps one id per row on the tape's index pool: emitted code keeps one extra "
                        "per axis and cannot hold them (record the op's composite instead, e.g. "
                        "cross_entropy(matmul_nt(h, w), ids, ignore))");
      // The emitted code computes the captured episode, whose dropout keys
      // are the captured step's: a step() run again and again would train on
      // one mask. forward() and value_and_grad() compute that episode, masks
      // included, as documented (docs/emit.md).
      if (n.op == op_code<Dropout> && o.optimizer)
        throw EmitError(who + "node " + std::to_string(i) +
                        " is a dropout, whose mask belongs to the captured step: an emitted step() would reuse it "
                        "every step. Emit the model in eval mode (model.eval()) to train without dropout");
    }
    std::vector<std::size_t> vo, go;
    layout_ = device::capture_detail::build_layout<T>(tape, loss_, vo, go);
    std::tie(forward_, backward_) = device::launch_list(layout_);

    // Names: given ones first, checked; then the defaults (p<node>, in<node>,
    // out<k>, with underscores added while taken); each spelt as an identifier
    // (a trailing underscore for keywords, macros and the like).
    names_.assign(nodes_.size(), "");
    for (const auto& [v, name] : o.names) {
      const std::uint32_t i = index_of(tape, v, "a named Var");
      if (!emit_detail::identifier(name)) throw EmitError(who + "the name '" + name + "' is not a C++ identifier");
      if (emit_detail::implementation_reserved(name))
        throw EmitError(who + "the name '" + name + "' (node " + std::to_string(i) +
                        ") cannot be represented: C++ reserves identifiers with a double underscore, or an "
                        "underscore and a capital letter first, to the implementation");
      names_[i] = name;
    }
    std::map<std::string, std::uint32_t> spelt;  // identifier -> node
    for (std::uint32_t i = 0; i <= loss_; ++i) {
      if (names_[i].empty()) continue;
      const std::string id = emit_detail::spelling(names_[i]);
      if (const auto [it, fresh] = spelt.try_emplace(id, i); !fresh) {
        const std::uint32_t j = it->second;
        if (names_[j] == names_[i])
          throw EmitError(who + "the name '" + names_[i] + "' is given to nodes " + std::to_string(j) + " and " +
                          std::to_string(i));
        throw EmitError(who + "the names '" + names_[j] + "' (node " + std::to_string(j) + ") and '" + names_[i] +
                        "' (node " + std::to_string(i) + ") would both be written '" + id +
                        "' (a keyword or macro gets a trailing underscore): rename one");
      }
    }
    auto fresh_default = [&](std::uint32_t i, std::string base) {
      while (spelt.count(base)) base += "_";
      spelt.emplace(base, i);
      names_[i] = base;
    };
    for (std::uint32_t i = 0; i <= loss_; ++i) {
      if (!names_[i].empty()) continue;
      if (nodes_[i].op == op_code<Param>) fresh_default(i, "p" + std::to_string(i));
      if (nodes_[i].op == op_code<Const>) fresh_default(i, "in" + std::to_string(i));
    }
    for (std::size_t k = 0; k < o.outputs.size(); ++k) {
      const std::uint32_t i = index_of(tape, o.outputs[k], "output " + std::to_string(k));
      outputs_.push_back(i);
      if (names_[i].empty()) fresh_default(i, "out" + std::to_string(k));
    }
    ids_.assign(nodes_.size(), "");
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (!names_[i].empty()) ids_[i] = emit_detail::spelling(names_[i]);

    shape_name_.assign(nodes_.size(), "");
    {
      std::map<std::string, std::string> seen;
      for (std::uint32_t i = 0; i <= loss_; ++i)
        if (!is_leaf(i)) {
          const std::string t = shape_text(i);
          const auto [it, fresh] = seen.try_emplace(t, "s" + std::to_string(seen.size()));
          shape_name_[i] = it->second;
          if (fresh) shapes_.emplace_back(t, it->second);
        }
    }

    // Workspace offsets: a value slot per computed node, a gradient slot per reached node.
    value_off_.assign(nodes_.size(), no_slot);
    grad_off_.assign(nodes_.size(), no_slot);
    for (std::uint32_t i = 0; i <= loss_; ++i) {
      if (!is_leaf(i)) {
        value_off_[i] = values_;
        values_ += emit_detail::round_up(nodes_[i].dims.size());
      }
      if (layout_.nodes[i].grad != device::no_offset) {
        grad_off_[i] = grads_;
        grads_ += emit_detail::round_up(nodes_[i].dims.size());
      }
    }

    if (o.optimizer) {
      const Optimizer<T>& opt = *o.optimizer;
      if (opt.tape() != &tape)
        throw EmitError(who + "the optimizer's parameters belong to a different tape (or it has none)");
      if (opt.schedule())
        throw EmitError(who +
                        "the optimizer has a learning-rate schedule, which is not emitted; "
                        "clear it and set the emitted Optimizer's lr before each step");
      if (const std::string feature = opt.feature_not_emitted(); !feature.empty())
        throw EmitError(who + "the optimizer uses " + feature +
                        ", which emitted code does not run (it runs SGD without momentum and Adam's efficient form)");
      adam_ = dynamic_cast<const Adam<T>*>(&opt);
      std::size_t k = 0;
      for (const auto& e : opt.params()) {
        const std::uint32_t i = index_of(tape, e.var, "optimizer parameter " + std::to_string(k + 1));
        ++k;
        opt_params_.push_back({i, e.l2, e.offset, e.size});
      }
    }
  }

  static constexpr std::size_t no_slot = static_cast<std::size_t>(-1);

  EmittedSource sources() const { return {host(), cuda()}; }

  // ---- the host header ----
  std::string host() const {
    std::string s = preamble(false);
    s += "namespace " + o_.name + " {\n\n";
    s += common(false);
    // step / forward bodies, serial
    s += "// Forward, backward (the loss's gradient seeded to 1)" +
         std::string(o_.optimizer ? " and the optimizer's update" : "") +
         "; returns the loss. Gradients stay in ws.grad (grad_<name>(ws)).\n";
    s += "template <class Ws>\nGRAD_HD inline T step_body(const Inputs& in, const Params& p, Ws& ws) {\n"
         "  (void)in;\n  (void)p;\n";
    s += step_calls(false, "  ");
    s += "  return ws.value[" + std::to_string(value_off_[loss_]) + "];\n}\n\n";
    if (o_.optimizer) {
      s += optimizer_host();
      s += "inline T step(const Inputs& in, const Params& p, Optimizer& opt, Workspace& ws) {\n";
      s += "  const T loss = step_body(in, p, ws);\n  update(p, opt, ws);\n  return loss;\n}\n\n";
    } else {
      s += "inline T step(const Inputs& in, const Params& p, Workspace& ws) { return step_body(in, p, ws); }\n\n";
    }
    if (!outputs_.empty()) s += forward_text(false);
    if (o_.value_and_grad) s += value_and_grad_text(false);
    s += "}  // namespace " + o_.name + "\n" + epilogue();
    return s;
  }

  // ---- the CUDA source ----
  std::string cuda() const {
    std::string s = preamble(true);
    s += "namespace " + o_.name + " {\n\n";
    s += common(true);
    s += "// The device buffers of a program (sizes above), allocated by the caller.\n";
    s += "struct DeviceWorkspace {\n  T* value;    // value_size\n  T* grad;     // grad_size\n"
         "  T* scratch;  // scratch_size\n};\n\n";
    if (o_.optimizer) s += optimizer_cuda();
    s += "// A training step's kernels on `stream`: forward, backward";
    s += o_.optimizer ? ", the optimizer's update" : "";
    s += ". Every pointer is device memory; the loss is ws.value[loss_offset].\n";
    if (o_.optimizer) {
      s += "inline void step(const Inputs& in, const Params& p, DeviceOptimizer& opt, DeviceWorkspace& ws, "
           "cudaStream_t stream = 0) {\n";
    } else {
      s += "inline void step(const Inputs& in, const Params& p, DeviceWorkspace& ws, cudaStream_t stream = 0) {\n";
    }
    s += "  (void)in;\n  (void)p;\n";
    s += step_calls(true, "  ");
    if (o_.optimizer) s += "  update(p, opt, ws, stream);\n";
    s += "}\n\n";
    if (!outputs_.empty()) s += forward_text(true);
    if (o_.value_and_grad) s += value_and_grad_text(true);
    s += "}  // namespace " + o_.name + "\n" + epilogue();
    return s;
  }

 private:
  struct OptParam {
    std::uint32_t node;
    T l2;
    std::size_t offset, size;
  };

  std::uint32_t index_of(const Tape<T>& tape, Var<T> v, const std::string& what) const {
    if (v.tape() != &tape || tape.value(v).empty())
      throw EmitError("grad::emit: " + what +
                      " is not a live node of the tape (default, from another tape, or dropped)");
    if (v.index() > loss_)
      throw EmitError("grad::emit: " + what + " (node " + std::to_string(v.index()) +
                      ") was recorded after the loss (node " + std::to_string(loss_) + ") and is not captured");
    return v.index();
  }
  bool is_leaf(std::uint32_t i) const { return nodes_[i].op == op_code<Param> || nodes_[i].op == op_code<Const>; }
  bool is_param(std::uint32_t i) const { return nodes_[i].op == op_code<Param>; }
  const char* scalar_type() const { return std::is_same_v<T, float> ? "float" : "double"; }

  std::string preamble(bool cuda) const {
    std::size_t computed = 0;
    for (std::uint32_t i = 0; i <= loss_; ++i) computed += !is_leaf(i);
    std::string s = "// Written by grad::emit (grad " GRAD_VERSION ", emitted format 1): a captured episode of " +
                    std::to_string(nodes_.size()) + " nodes (" + std::to_string(computed) +
                    " computed), element type " + scalar_type() + ".\n";
    s += "// Needs grad's headers of the same version (include/), nothing else: no Boost, no library.\n";
    if (cuda) {
      s += "// Compile: nvcc -std=c++20 --fmad=false --expt-relaxed-constexpr -Xcompiler=-ffp-contract=off\n"
           "//          -I <grad>/include -arch=<sm_XX> ...\n"
           "//\n"
           "// !!! --fmad=false IS REQUIRED, and nothing in this file can check it: without it nvcc fuses a*b+c\n"
           "// !!! in device code into one FMA and the bits differ from the tape's (silently; nvcc sets no macro\n"
           "// !!! for it). Host code: nvcc's host side needs -Xcompiler=-ffp-contract=off as above (the\n"
           "// !!! pragma below that switches contraction off for g++ and clang is not one nvcc accepts).\n";
    } else {
      s += "// Compile: g++ -std=c++20 -O2 -I <grad>/include your_main.cpp (or clang++)\n"
           "// a*b+c must not be fused into an FMA, or the bits differ from the tape's: this file switches\n"
           "// contraction off itself (g++: whatever -ffp-contract says; clang: unless -ffp-contract=fast,\n"
           "// which overrides the pragma and which no macro shows, so do not use it). -ffast-math is refused.\n"
           "// Add -DGRAD_EMITTED_HOST_LOOPS -Wno-psabi for the tags' vectorised host loops: the same bits,\n"
           "// several times faster on a CPU, not allocation-free (grad/emitted.hpp).\n";
    }
    s += "#pragma once\n\n";
    s += "// a*b+c must not be fused (the tape rounds the product and the sum apart): contraction is\n"
         "// switched off for this file and grad's headers whatever the command line says (g++ and\n"
         "// clang; GNU modes and clang contract by default), and restored at its end.\n"
         "#if !defined(__CUDA_ARCH__)\n#if defined(__clang__)\n#pragma float_control(push)\n"
         "#pragma clang fp contract(off)\n#elif defined(__GNUC__)\n#pragma GCC push_options\n"
         "#if !defined(__CUDACC__) // nvcc knows no optimize pragma (#1675-D): -Xcompiler=-ffp-contract=off\n"
         "#pragma GCC optimize(\"fp-contract=off\")\n#endif\n#endif\n#endif\n\n";
    s += "#include <cstddef>\n#include <limits>\n\n#include \"grad/emitted.hpp\"\n\n";
    s += "static_assert(grad::emitted::format_version == 1, \"written for grad's emitted format 1\");\n";
    s += "#if defined(__FAST_MATH__)\n#error \"an emitted grad program must not be compiled with -ffast-math\"\n"
         "#endif\n\n";
    return s;
  }

  static std::string epilogue() {
    return "\n#if !defined(__CUDA_ARCH__)\n#if defined(__clang__)\n#pragma float_control(pop)\n"
           "#elif defined(__GNUC__)\n#pragma GCC pop_options\n#endif\n#endif\n";
  }

  std::string values_text(const Node<T>& n, const std::string& name, const std::string& qualifier) const {
    std::string s = qualifier + " T " + name + "[" + std::to_string(n.dims.size()) + "] = {";
    for (std::size_t k = 0; k < n.dims.size(); ++k) {
      s += (k % 8 == 0 ? "\n    " : " ") + emit_detail::literal(n.value_at(k)) + ",";  // a 16-bit constant widened
    }
    return s + "\n};\n";
  }
  template <class V>
  static std::string array_text(const V& values, std::size_t from, std::size_t n, const std::string& name,
                                const std::string& qualifier) {
    std::string s = qualifier + " T " + name + "[" + std::to_string(n) + "] = {";
    for (std::size_t k = 0; k < n; ++k)
      s += (k % 8 == 0 ? "\n    " : " ") + emit_detail::literal(values[from + k]) + ",";
    return s + "\n};\n";
  }

  // "::name::" : the emitted namespace, fully qualified (for use inside structs, whose members are user names).
  std::string ns() const { return "::" + o_.name + "::"; }

  // Sizes, captured values, Inputs, Params, Workspace, the metadata tables, shapes.
  std::string common(bool cuda) const {
    std::string s = "using T = " + std::string(scalar_type()) + ";\n\n";
    s += "// A name given to emit is spelt as given, or with a trailing underscore when it is a keyword, a\n"
         "// macro, or T, std, grad, load, view, Inputs, Params, ParamStore (the tables keep the names as\n"
         "// given). A macro of the same spelling defined before this file would break it: refused here.\n";
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (!ids_[i].empty())
        s += "#if defined(" + ids_[i] + ")\n#error \"grad::emit: '" + ids_[i] +
             "' is a macro here, and also the name of a tensor of " + o_.name + "\"\n#endif\n";
    s += "\n// ---- leaves: their sizes and the values the tape held when the episode was emitted ----\n";
    s += "namespace size {\n";
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (is_leaf(i))
        s += "inline constexpr std::size_t " + ids_[i] + " = " + std::to_string(nodes_[i].dims.size()) + ";  // " +
             (is_param(i) ? "parameter" : "input") + ", node " + std::to_string(i) + ", shape " +
             shape_string(nodes_[i].dims) + "\n";
    s += "}  // namespace size\nnamespace init {\n";
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (is_leaf(i)) s += values_text(nodes_[i], ids_[i], "alignas(64) inline constexpr");
    s += "}  // namespace init\n";
    s += "\n// The inputs (constants of the tape) a step reads";
    s += cuda ? " (device pointers).\nstruct Inputs {\n" : ", by default the values they held.\nstruct Inputs {\n";
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (is_leaf(i) && !is_param(i))
        s += "  const T* " + ids_[i] + (cuda ? "" : " = " + ns() + "init::" + ids_[i]) + ";\n";
    s += "};\n// The parameters" + std::string(cuda ? " (device pointers)" : "") +
         " (written only by an optimizer's update).\nstruct Params {\n";
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (is_param(i)) s += "  T* " + ids_[i] + ";\n";
    s += "};\n";
    if (!cuda) {
      s += "// Storage for the parameters, filled with their captured values by load().\nstruct ParamStore {\n";
      for (std::uint32_t i = 0; i <= loss_; ++i)
        if (is_param(i)) s += "  alignas(64) T " + ids_[i] + "[" + std::to_string(nodes_[i].dims.size()) + "];\n";
      s += "  void load() {\n";
      for (std::uint32_t i = 0; i <= loss_; ++i)
        if (is_param(i))
          s += "    grad::emitted::copy<" + std::to_string(nodes_[i].dims.size()) + ">(" + ids_[i] + ", " + ns() +
               "init::" + ids_[i] + ");\n";
      s += "  }\n  " + ns() + "Params view() { return {";
      bool first = true;
      for (std::uint32_t i = 0; i <= loss_; ++i)
        if (is_param(i)) {
          s += (first ? "" : ", ") + ids_[i];
          first = false;
        }
      s += "}; }\n};\n";
    }
    s += "\n// ---- the workspace: every computed value, every gradient, one scratch buffer ----\n";
    s += "inline constexpr std::size_t value_size = " + std::to_string(std::max<std::size_t>(values_, 1)) + ";\n";
    s += "inline constexpr std::size_t grad_size = " + std::to_string(std::max<std::size_t>(grads_, 1)) + ";\n";
    s += "inline constexpr std::size_t scratch_size = " +
         std::to_string(std::max<std::size_t>(layout_.scratch_size, 1)) + ";\n";
    s += "inline constexpr std::size_t loss_offset = " + std::to_string(value_off_[loss_]) + ";  // in value\n";
    s += "struct Workspace {\n  alignas(64) T value[value_size];\n  alignas(64) T grad[grad_size];\n"
         "  alignas(64) T scratch[scratch_size];\n};\n";
    s += "// Where each parameter's gradient lives in Workspace::grad after a step (those the loss reaches).\n"
         "namespace grad_offset {\n";
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (is_param(i) && grad_off_[i] != no_slot)
        s += "inline constexpr std::size_t " + ids_[i] + " = " + std::to_string(grad_off_[i]) + ";\n";
    s += "}  // namespace grad_offset\n";
    if (!cuda) {
      s += "namespace gradient {  // gradient::w(ws): parameter w's gradient after a step\n";
      for (std::uint32_t i = 0; i <= loss_; ++i)
        if (is_param(i) && grad_off_[i] != no_slot)
          s += "inline const T* " + ids_[i] + "(const " + ns() + "Workspace& ws) { return ws.grad + " + ns() +
               "grad_offset::" + ids_[i] + "; }\n";
      s += "}  // namespace gradient\n";
    }
    s += metadata_text();
    s += "\n// ---- each node's shapes (nodes with equal shapes share one) ----\nnamespace shapes {\n";
    for (const auto& [text, name] : shapes_)
      s += "struct " + name + " {\n  static constexpr grad::emitted::Node node" + text + ";\n};\n";
    s += "}  // namespace shapes\n\n";
    return s;
  }

  // The tables of parameters, inputs and outputs (grad::emitted::TensorInfo),
  // and the flat views a generic caller drives the program with.
  std::string metadata_text() const {
    auto entry = [&](std::uint32_t i, std::size_t offset, std::size_t grad_offset, bool init) {
      return "    {\"" + names_[i] + "\", \"" + ids_[i] + "\", " + std::to_string(i) + ", " +
             emit_detail::dims_text(nodes_[i].dims) + ", " + std::to_string(nodes_[i].dims.size()) + ", " +
             std::to_string(offset) + ", " +
             (grad_offset == no_slot ? std::string("grad::emitted::no_offset") : std::to_string(grad_offset)) + ", " +
             (init ? ns() + "init::" + ids_[i] : std::string("nullptr")) + "},\n";
    };
    std::string params, inputs, outputs;
    std::size_t np = 0, ni = 0, no = 0, ep = 0, ei = 0, eo = 0;
    for (std::uint32_t i = 0; i <= loss_; ++i) {
      if (is_param(i)) {
        params += entry(i, ep, grad_off_[i], true);
        ++np;
        ep += nodes_[i].dims.size();
      } else if (is_leaf(i)) {
        inputs += entry(i, ei, no_slot, true);
        ++ni;
        ei += nodes_[i].dims.size();
      }
    }
    for (std::uint32_t i : outputs_) {
      outputs += entry(i, eo, no_slot, false);
      ++no;
      eo += nodes_[i].dims.size();
    }
    auto table = [](const std::string& name, std::size_t n, const std::string& rows) {
      return "inline constexpr std::array<grad::emitted::TensorInfo<T>, " + std::to_string(n) + "> " + name + "{{\n" +
             rows + "}};\n";
    };
    std::string s =
        "\n// ---- metadata: every parameter, input and output by name (as given to emit), shape, size, offset in\n"
        "// its flat buffer (params_at / value_and_grad's x and g; inputs_at; forward_flat's out), gradient\n"
        "// offset in Workspace::grad (parameters) and captured values ----\n";
    s += table("parameters", np, params) + table("inputs", ni, inputs) + table("outputs", no, outputs);
    s += "inline constexpr std::size_t parameter_elements = " + std::to_string(ep) + ";\n";
    s += "inline constexpr std::size_t input_elements = " + std::to_string(ei) + ";\n";
    s += "inline constexpr std::size_t output_elements = " + std::to_string(eo) + ";\n";
    s += "// Params over one buffer of parameter_elements (the table's offsets; value_and_grad's x).\n";
    s += "GRAD_HD inline Params params_at(T* x) {\n  Params p{};\n";
    for (std::uint32_t i = 0, at = 0; i <= loss_; ++i)
      if (is_param(i)) {
        s += "  p." + ids_[i] + " = x + " + std::to_string(at) + ";\n";
        at += static_cast<std::uint32_t>(nodes_[i].dims.size());
      }
    s += "  (void)x;\n  return p;\n}\n";
    s += "// Inputs over one buffer of input_elements (the table's offsets).\n";
    s += "GRAD_HD inline Inputs inputs_at(const T* data) {\n  Inputs in{};\n";
    for (std::uint32_t i = 0, at = 0; i <= loss_; ++i)
      if (is_leaf(i) && !is_param(i)) {
        s += "  in." + ids_[i] + " = data + " + std::to_string(at) + ";\n";
        at += static_cast<std::uint32_t>(nodes_[i].dims.size());
      }
    s += "  (void)data;\n  return in;\n}\n";
    return s;
  }

  std::string shape_text(std::uint32_t i) const {
    const device::DeviceNode<T>& n = layout_.nodes[i];
    std::string s = "{";
    s += n.a != no_node ? emit_detail::dims_text(layout_.nodes[n.a].dims) : "{}";
    s += ", ";
    s += n.b != no_node ? emit_detail::dims_text(layout_.nodes[n.b].dims) : "{}";
    s += ", " + emit_detail::dims_text(n.dims) + ", " + std::to_string(n.axis);
    if (n.extra != device::no_offset) {
      s += ", {{";
      const std::size_t rank = layout_.nodes[n.a].dims.rank;
      // Unsigned literals: a dropout key may exceed the largest signed one.
      for (std::size_t k = 0; k < rank; ++k)
        s += (k ? ", " : "") + std::to_string(layout_.extras[n.extra + k]) + "u";
      s += "}}";
    }
    return s + "}";
  }
  std::string shape_of(std::uint32_t i) const { return "shapes::" + shape_name_[i]; }

  std::string tag_of(std::uint32_t i) const {
    return with_op(nodes_[i].op, [](auto op) { return emit_detail::type_name<decltype(op)>(); });
  }

  // The expression of node i's value / gradient buffer.
  std::string value_of(std::uint32_t i, const std::vector<std::string>* outputs = nullptr) const {
    if (is_param(i)) return "p." + ids_[i];
    if (is_leaf(i)) return "in." + ids_[i];
    if (outputs && !(*outputs)[i].empty()) return (*outputs)[i];
    return "ws.value + " + std::to_string(value_off_[i]);
  }
  std::string grad_of(std::uint32_t i) const { return "ws.grad + " + std::to_string(grad_off_[i]); }
  std::string scalar_of(std::uint32_t i) const { return "T(" + emit_detail::literal(nodes_[i].scalar) + ")"; }
  std::string operands(std::uint32_t i, const std::vector<std::string>* outputs = nullptr) const {
    const Node<T>& n = nodes_[i];
    std::string a = n.a != no_node ? value_of(n.a, outputs) : "nullptr";
    std::string b = n.b != no_node ? value_of(n.b, outputs) : "nullptr";
    return a + ", " + b + ", " + scalar_of(i);
  }

  // The shapes as a template argument: the Node (host) or its struct (a CUDA launch).
  std::string shape_arg(std::uint32_t i, bool cuda) const { return shape_of(i) + (cuda ? "" : "::node"); }
  std::string forward_call(std::uint32_t i, bool cuda, const std::vector<std::string>* outputs = nullptr) const {
    const std::string f = cuda ? "grad::emitted::launch_forward<" : "grad::emitted::forward<";
    return f + tag_of(i) + ", " + shape_arg(i, cuda) + ", T>(" + (cuda ? "stream, " : "") + operands(i, outputs) +
           ", " + value_of(i, outputs) + ");  // node " + std::to_string(i) + "\n";
  }

  std::string step_calls(bool cuda, const std::string& ind) const {
    // Forward: the nodes the loss depends on (the episode's others change nothing it reads).
    std::vector<char> need(nodes_.size(), 0);
    need[loss_] = 1;
    for (std::uint32_t i = loss_ + 1; i-- > 0;)
      if (need[i]) {
        if (nodes_[i].a != no_node) need[nodes_[i].a] = 1;
        if (nodes_[i].b != no_node) need[nodes_[i].b] = 1;
      }
    std::string s = ind + "// forward\n";
    for (const device::LaunchSpec& l : forward_)
      if (need[l.node]) s += ind + forward_call(l.node, cuda);
    s += ind + "// backward\n";
    if (grad_off_[loss_] != no_slot) {
      s += cuda ? ind + "grad::emitted::set_kernel<<<1, 1, 0, stream>>>(" + grad_of(loss_) + ", T(1));\n"
                : ind + "ws.grad[" + std::to_string(grad_off_[loss_]) + "] = T(1);\n";
    }
    for (const device::LaunchSpec& l : backward_) {
      if (l.kind == device::LaunchKind::accumulate) {
        s += ind + (cuda ? "grad::emitted::launch_accumulate<" : "grad::emitted::accumulate<") +
             std::to_string(nodes_[l.input].dims.size()) + ", T>(" + (cuda ? "stream, " : "") + grad_of(l.input) +
             ", ws.scratch);\n";
        continue;
      }
      const int in = l.kind == device::LaunchKind::backward_a ? 0 : 1;
      const std::string dx = l.to_scratch ? "ws.scratch" : grad_of(l.input);
      s += ind + (cuda ? "grad::emitted::launch_backward<" : "grad::emitted::backward<") + tag_of(l.node) + ", " +
           std::to_string(in) + ", " + shape_arg(l.node, cuda) + ", T>(" + (cuda ? "stream, " : "") + operands(l.node) +
           ", " + value_of(l.node) + ", " + grad_of(l.node) + ", " + dx + ");  // node " + std::to_string(l.node) +
           " -> " + std::to_string(l.input) + "\n";
    }
    return s;
  }

  // forward(in, p, out..., ws): the nodes the outputs need, in tape order.
  // The output arguments are out_<name> (never a name of the signature).
  std::string forward_text(bool cuda) const {
    std::vector<char> need(nodes_.size(), 0);
    for (std::uint32_t i : outputs_) need[i] = 1;
    for (std::uint32_t i = loss_ + 1; i-- > 0;)
      if (need[i]) {
        if (nodes_[i].a != no_node) need[nodes_[i].a] = 1;
        if (nodes_[i].b != no_node) need[nodes_[i].b] = 1;
      }
    std::vector<std::string> out(nodes_.size()), arg(outputs_.size());
    std::string s = "// Inference: ";
    std::string args, call;
    std::size_t at = 0;
    for (std::size_t k = 0; k < outputs_.size(); ++k) {
      const std::uint32_t i = outputs_[k];
      arg[k] = std::string("out_").append(ids_[i]);  // not "out_" + string: GCC 12 -Wrestrict misfires
      for (std::size_t j = 0; j < k; ++j)
        if (outputs_[j] == i) arg[k].append("_").append(std::to_string(k));  // the same node twice
      if (!is_leaf(i) && out[i].empty()) out[i] = arg[k];
      s += (k ? ", " : "") + arg[k] + " " + shape_string(nodes_[i].dims) + " (node " + std::to_string(i) + ")";
      args += "T* " + arg[k] + ", ";
      call += "out + " + std::to_string(at) + ", ";
      at += nodes_[i].dims.size();
    }
    s += " from the inputs and parameters" + std::string(cuda ? " (device pointers; kernels on `stream`)" : "") +
         ". Writes nothing else but ws.value.\n";
    s += "inline void forward(const Inputs& in, const Params& p, " + args +
         (cuda ? "DeviceWorkspace& ws, cudaStream_t stream = 0) {\n" : "Workspace& ws) {\n");
    s += "  (void)in;\n  (void)p;\n  (void)ws;\n";
    for (const device::LaunchSpec& l : forward_)
      if (need[l.node]) s += "  " + forward_call(l.node, cuda, &out);
    for (std::size_t k = 0; k < outputs_.size(); ++k) {
      const std::uint32_t i = outputs_[k];
      const std::string n = std::to_string(nodes_[i].dims.size());
      if (is_leaf(i) || out[i] != arg[k]) {  // a leaf, or a node given twice: copied
        const std::string from = is_leaf(i) ? value_of(i) : out[i];
        s += cuda ? "  cudaMemcpyAsync(" + arg[k] + ", " + from + ", " + n +
                        " * sizeof(T), cudaMemcpyDeviceToDevice, stream);\n"
                  : "  grad::emitted::copy<" + n + ">(" + arg[k] + ", " + from + ");\n";
      }
    }
    s += "}\n";
    s += "// forward() into one buffer of output_elements (the outputs table's offsets).\n";
    s += "inline void forward_flat(const Inputs& in, const Params& p, T* out, " +
         std::string(cuda ? "DeviceWorkspace& ws, cudaStream_t stream = 0) {\n" : "Workspace& ws) {\n");
    s += "  forward(in, p, " + call + (cuda ? "ws, stream);\n}\n\n" : "ws);\n}\n\n");
    return s;
  }

  // value_and_grad([in,] x, g): x and g hold the parameters, concatenated in node order.
  std::string value_and_grad_text(bool cuda) const {
    std::string s;
    std::size_t total = 0;
    std::string layout;
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (is_param(i)) {
        layout += "//   " + ids_[i] + " at " + std::to_string(total) + " (" + std::to_string(nodes_[i].dims.size()) +
                  ")\n";
        total += nodes_[i].dims.size();
      }
    if (cuda) {
      s += "// The inputs' captured values in device memory, for value_and_grad(x, g) on the device.\n"
           "namespace device_init {\n";
      for (std::uint32_t i = 0; i <= loss_; ++i)
        if (is_leaf(i) && !is_param(i)) s += values_text(nodes_[i], ids_[i], "__device__ const");
      s += "}  // namespace device_init\n";
    }
    s += "// The loss and its gradient with respect to the parameters, x and g holding\n"
         "// them concatenated (value_and_grad_size elements, the parameters table's offsets):\n" +
         layout + "// Serial, its workspace a local: one call per example from a user's kernel" +
         (cuda ? "" : " or loop") + ".\n";
    s += "inline constexpr std::size_t value_and_grad_size = " + std::to_string(total) + ";\n";
    s += "// x as captured: the parameters' values when the episode was emitted.\ninline void captured_x(T* x) {\n"
         "  (void)x;\n";
    std::size_t from = 0;
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (is_param(i)) {
        s += "  grad::emitted::copy<" + std::to_string(nodes_[i].dims.size()) + ">(x + " + std::to_string(from) +
             ", init::" + ids_[i] + ");\n";
        from += nodes_[i].dims.size();
      }
    s += "}\n";
    s += "// With the caller's inputs `in`" + std::string(cuda ? " (pointers valid where it runs)" : "") +
         ": e.g. one example's data.\n";
    s += "GRAD_HD inline T value_and_grad(const Inputs& in, const T* x, T* g) {\n";
    s += "  (void)x;\n  (void)g;\n  Params p{};\n";
    std::size_t at = 0;
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (is_param(i)) {
        s += "  p." + ids_[i] + " = const_cast<T*>(x + " + std::to_string(at) + ");\n";
        at += nodes_[i].dims.size();
      }
    s += "  Workspace ws;\n  const T loss = step_body(in, p, ws);\n";
    at = 0;
    for (std::uint32_t i = 0; i <= loss_; ++i)
      if (is_param(i)) {
        const std::size_t n = nodes_[i].dims.size();
        s += "  for (std::size_t k = 0; k < " + std::to_string(n) + "; ++k) g[" + std::to_string(at) + " + k] = " +
             (grad_off_[i] != no_slot ? "ws.grad[" + std::to_string(grad_off_[i]) + " + k]" : std::string("T(0)")) +
             ";\n";
        at += n;
      }
    s += "  return loss;\n}\n";
    s += "// With the captured inputs" + std::string(cuda ? " (device code: device_init)" : "") + ".\n";
    s += "GRAD_HD inline T value_and_grad(const T* x, T* g) {\n  Inputs in{};\n";
    if (cuda)
      for (std::uint32_t i = 0; i <= loss_; ++i)
        if (is_leaf(i) && !is_param(i)) s += "  in." + ids_[i] + " = device_init::" + ids_[i] + ";\n";
    s += "  return value_and_grad(in, x, g);\n}\n\n";
    if (cuda) {
      // The serial body, usable on the device too.
      std::string body =
          "template <class Ws>\nGRAD_HD inline T step_body(const Inputs& in, const Params& p, Ws& ws) {\n"
          "  (void)in;\n  (void)p;\n";
      body += step_calls(false, "  ");
      body += "  return ws.value[" + std::to_string(value_off_[loss_]) + "];\n}\n\n";
      s = body + s;
    }
    return s;
  }

  std::string optimizer_fields() const {
    std::string s;
    const Optimizer<T>& opt = *o_.optimizer;
    s += "  T lr = T(" + emit_detail::literal(opt.lr()) + ");\n";
    s += "  T clip = T(" + emit_detail::literal(opt.clip()) + ");  // 0: off\n";
    if (adam_) {
      s += "  T beta1 = T(" + emit_detail::literal(adam_->beta1()) + "), beta2 = T(" +
           emit_detail::literal(adam_->beta2()) + "), eps = T(" + emit_detail::literal(adam_->eps()) + ");\n";
      s += "  T beta1_power = T(" + emit_detail::literal(adam_->beta1_power()) + "), beta2_power = T(" +
           emit_detail::literal(adam_->beta2_power()) + ");  // b^t after the captured steps\n";
    }
    return s;
  }

  std::string optimizer_host() const {
    const Optimizer<T>& opt = *o_.optimizer;
    std::string s = "// ---- the optimizer (" + std::string(adam_ ? "Adam" : "SGD") +
                    "), its state as captured; grad/opt.hpp documents the step ----\n";
    if (adam_) {
      s += "inline constexpr std::size_t moment_size = " + std::to_string(std::max<std::size_t>(opt.elements(), 1)) +
           ";\n";
      s += array_text(adam_->first_moments(), 0, opt.elements(), "m_init", "alignas(64) inline constexpr");
      s += array_text(adam_->second_moments(), 0, opt.elements(), "v_init", "alignas(64) inline constexpr");
    }
    s += "struct Optimizer {\n" + optimizer_fields();
    if (adam_) {
      s += "  alignas(64) T m[moment_size];\n  alignas(64) T v[moment_size];\n";
      s += "  void load() {\n    for (std::size_t k = 0; k < " + std::to_string(opt.elements()) +
           "; ++k) {\n      m[k] = m_init[k];\n      v[k] = v_init[k];\n    }\n  }\n";
    } else {
      s += "  void load() {}\n";
    }
    s += "};\n\n";
    s += "// The update after a step's backward: parameters in the optimizer's add order.\n";
    s += "GRAD_HD inline void update(const Params& p, Optimizer& opt, Workspace& ws) {\n  (void)p;\n  (void)ws;\n";
    s += clip_norm_text() + "  const T scale = clip.scale(opt.clip);\n  (void)scale;\n";
    if (adam_) {
      s += "  grad::AdamRule::advance(opt.beta1_power, opt.beta2_power, opt.beta1, opt.beta2);\n";
      s += "  const grad::AdamStepConstants<T> c =\n"
           "      grad::AdamRule::constants(opt.lr, opt.beta1, opt.beta2, opt.beta1_power, opt.beta2_power);\n"
           "  (void)c;\n";
    }
    for (const OptParam& q : opt_params_) {
      if (grad_off_[q.node] == no_slot) {
        s += "  // " + ids_[q.node] + ": not reached by the loss's backward, skipped\n";
        continue;
      }
      const std::string n = std::to_string(q.size), l2 = "T(" + emit_detail::literal(q.l2) + ")";
      if (adam_)
        s += "  grad::emitted::adam_update<" + n + ">(p." + ids_[q.node] + ", opt.m + " + std::to_string(q.offset) +
             ", opt.v + " + std::to_string(q.offset) + ", " + grad_of(q.node) + ", scale, " + l2 +
             ", opt.beta1, opt.beta2, opt.eps, c);\n";
      else
        s += "  grad::emitted::sgd_update<" + n + ">(p." + ids_[q.node] + ", " + grad_of(q.node) + ", scale, " + l2 +
             ", opt.lr);\n";
    }
    s += "}\n\n";
    return s;
  }

  // The global norm's squares, parameter after parameter in the optimizer's
  // order (host and device updates both start with it).
  std::string clip_norm_text() const {
    std::string s = "  grad::emitted::Clip<T> clip;\n  if (opt.clip != T(0)) {\n";
    for (const OptParam& q : opt_params_)
      if (grad_off_[q.node] != no_slot)
        s += "    clip.share(" + grad_of(q.node) + ", " + std::to_string(q.size) + ");\n";
    return s + "  }\n";
  }

  std::string optimizer_cuda() const {
    const Optimizer<T>& opt = *o_.optimizer;
    std::string s = "// ---- the optimizer (" + std::string(adam_ ? "Adam" : "SGD") + ") on the device ----\n";
    if (adam_) {
      s += "inline constexpr std::size_t moment_size = " + std::to_string(std::max<std::size_t>(opt.elements(), 1)) +
           ";\n";
      s += array_text(adam_->first_moments(), 0, opt.elements(), "m_init", "alignas(64) inline constexpr");
      s += array_text(adam_->second_moments(), 0, opt.elements(), "v_init", "alignas(64) inline constexpr");
    }
    s += "struct DeviceOptimizer {\n" + optimizer_fields();
    if (adam_) s += "  T* m;  // moment_size, device (m_init, v_init: the captured moments)\n  T* v;\n";
    s += "  grad::emitted::DeviceOptimizerState<T>* state;  // one record, device memory\n};\n";
    s += "__global__ void prepare_kernel(DeviceOptimizer opt, DeviceWorkspace ws) {\n  (void)ws;\n";
    s += clip_norm_text() + "  opt.state->scale = clip.scale(opt.clip);\n";
    if (adam_) {
      s += "  opt.state->beta1_power = opt.beta1_power;\n  opt.state->beta2_power = opt.beta2_power;\n";
      s += "  grad::AdamRule::advance(opt.state->beta1_power, opt.state->beta2_power, opt.beta1, opt.beta2);\n";
      s += "  opt.state->constants = grad::AdamRule::constants(opt.lr, opt.beta1, opt.beta2, "
           "opt.state->beta1_power, opt.state->beta2_power);\n";
    }
    s += "}\n";
    s += "inline void update(const Params& p, DeviceOptimizer& opt, DeviceWorkspace& ws, cudaStream_t stream) {\n"
         "  (void)p;\n  (void)ws;\n";
    s += "  prepare_kernel<<<1, 1, 0, stream>>>(opt, ws);\n";
    if (adam_)
      s += "  grad::AdamRule::advance(opt.beta1_power, opt.beta2_power, opt.beta1, opt.beta2);  // host copy\n";
    for (const OptParam& q : opt_params_) {
      if (grad_off_[q.node] == no_slot) continue;
      const std::string n = std::to_string(q.size), l2 = "T(" + emit_detail::literal(q.l2) + ")";
      const std::string grid =
          "<<<grad::emitted::blocks_for(" + n + "), grad::emitted::threads_per_block, 0, stream>>>";
      if (adam_)
        s += "  grad::emitted::adam_update_kernel<" + n + ", T>" + grid + "(p." + ids_[q.node] + ", opt.m + " +
             std::to_string(q.offset) + ", opt.v + " + std::to_string(q.offset) + ", " + grad_of(q.node) + ", " + l2 +
             ", opt.beta1, opt.beta2, opt.eps, opt.state);\n";
      else
        s += "  grad::emitted::sgd_update_kernel<" + n + ", T>" + grid + "(p." + ids_[q.node] + ", " +
             grad_of(q.node) + ", " + l2 + ", opt.lr, opt.state);\n";
    }
    s += "}\n\n";
    return s;
  }

  EmitOptions<T> o_;
  std::uint32_t loss_ = 0;
  std::span<const Node<T>> nodes_;
  device::Layout<T> layout_;
  std::vector<device::LaunchSpec> forward_, backward_;
  std::vector<std::string> names_, ids_, shape_name_;  // names as given, their spellings
  std::vector<std::pair<std::string, std::string>> shapes_;  // (shape text, name), first use first
  std::vector<std::uint32_t> outputs_;
  std::vector<std::size_t> value_off_, grad_off_;
  std::size_t values_ = 0, grads_ = 0;
  const Adam<T>* adam_ = nullptr;
  std::vector<OptParam> opt_params_;
};

// Both sources of the episode that ends at `loss` (a single element), or EmitError.
template <class T>
EmittedSource emit(const Tape<T>& tape, Var<T> loss, const EmitOptions<T>& options = {}) {
  return EmitPlan<T>(tape, loss, options).sources();
}

}  // namespace grad
