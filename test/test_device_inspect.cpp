// Inspecting a captured device program (docs/inspect.md): anomaly detection
// on the replay, against the tape's own report of the same input, in every
// mode; and the program's Graphviz picture with its fused segments.
// The CPU backend runs the very kernel bodies CUDA does.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <grad/device/device.hpp>
#include <grad/device/program_dot.hpp>
#include <grad/inspect.hpp>
#include <grad/nn.hpp>
#include <sstream>
#include <string>
#include <vector>

using namespace grad;
namespace dev = grad::device;

namespace {

constexpr dev::Mode all_modes[] = {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A block deep enough that the first non-finite value is not at the end:
// scope "block.0" h = x . w (w the identity: h is the input), scope
// "block.1" whatever `hazard` records from h, then a tail outside the block
// (tanh, sum) that a NaN would flow through. `hazard_node` is the node
// `hazard` is expected to blow up at, set by it.
struct Block {
  Tape<double> tp;
  Var<double> x, w, loss;
  std::uint32_t hazard_node = 0;
};
using Hazard = std::function<Var<double>(Tape<double>&, Var<double>, std::uint32_t&)>;

void record(Block& b, const Tensor<double>& input, const Hazard& hazard) {
  b.x = b.tp.constant(input);
  b.w = b.tp.param(Tensor<double>({4, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}));
  Var<double> y;
  {
    NameScope<double> block(b.tp, "block");
    Var<double> h;
    {
      NameScope<double> layer(b.tp, "0");
      h = matmul(b.x, b.w);
    }
    NameScope<double> layer(b.tp, "1");
    y = hazard(b.tp, h, b.hazard_node);
  }
  b.loss = sum(tanh(y));
}

// Three ways to the first NaN or inf, each at a known node.
Var<double> log_of_negative(Tape<double>& tp, Var<double> h, std::uint32_t& at) {
  Var<double> shifted = h * 0.5 + 0.25;
  at = static_cast<std::uint32_t>(tp.size());
  return log(shifted);  // h < -0.5: log of a negative
}
Var<double> custom_norm(Tape<double>& tp, Var<double> h, std::uint32_t& at) {
  Var<double> norm = sqrt(row_sum(h * h));  // no eps: a zero row is 0/0
  at = static_cast<std::uint32_t>(tp.size());
  return h / norm;
}
Var<double> exp_of_scaled(Tape<double>& tp, Var<double> h, std::uint32_t& at) {
  Var<double> scaled = h * 2.0;
  at = static_cast<std::uint32_t>(tp.size());
  return exp(scaled);  // h = 60: exp(120) overflows float32, not float64
}
Var<double> sqrt_at_zero(Tape<double>& tp, Var<double> h, std::uint32_t& at) {
  Var<double> squared = h * h;
  at = static_cast<std::uint32_t>(tp.size());
  return sqrt(squared) * 3.0;  // sqrt(0) = 0: finite value, infinite slope (backward only)
}

const Tensor<double> good({2, 4}, {0.5, 1.0, 1.5, 2.0, -0.25, 0.75, 1.25, 0.1});

// What the tape reports for `input` with anomaly detection on (forward, and
// backward when the forward is clean).
Anomaly tape_report(const Tensor<double>& input, const Hazard& hazard) {
  Block b;
  b.tp.detect_anomalies(true);
  record(b, input, hazard);
  if (b.tp.ok()) b.tp.backward(b.loss);
  REQUIRE(b.tp.anomaly() != nullptr);
  return *b.tp.anomaly();
}

// Captures the block from a clean input, runs a clean step, then replays
// `bad` with anomaly detection on: the report, or a failed check.
Anomaly device_report(const Tensor<double>& bad, const Hazard& hazard, dev::Mode mode, bool f32 = false) {
  Block b;
  record(b, good, hazard);
  REQUIRE(b.tp.ok());
  auto prog = dev::capture(b.tp, b.loss, {.backend = dev::Backend::cpu, .mode = mode, .f32 = f32});
  prog.forward();
  prog.backward();
  CHECK(std::isfinite(prog.loss()));
  prog.detect_anomalies(true);
  CHECK(prog.detects_anomalies());
  prog.set_input(b.x, bad);
  Anomaly found;
  bool thrown = false;
  try {
    prog.forward();
    prog.backward();
  } catch (const dev::AnomalyError& e) {
    thrown = true;
    found = e.anomaly();
    CHECK(contains(e.what(), found.message));
  }
  REQUIRE_MESSAGE(thrown, "no AnomalyError in mode " << dev::mode_name(mode));
  REQUIRE(prog.anomaly() != nullptr);
  CHECK(prog.anomaly()->node == found.node);
  CHECK(found.node == b.hazard_node);
  return found;
}

void check_same(const Anomaly& device, const Anomaly& tape) {
  CHECK(device.phase == tape.phase);
  CHECK(device.node == tape.node);
  CHECK(device.op == tape.op);
  CHECK(device.scope == tape.scope);
  CHECK(device.shape == tape.shape);
  CHECK(device.element == tape.element);
  CHECK(device.gradient_to == tape.gradient_to);
  CHECK(device.incoming_gradient_finite == tape.incoming_gradient_finite);
  REQUIRE(device.operands.size() == tape.operands.size());
  for (std::size_t k = 0; k < tape.operands.size(); ++k) {
    CHECK(device.operands[k].node == tape.operands[k].node);
    CHECK(device.operands[k].op == tape.operands[k].op);
    CHECK(device.operands[k].shape == tape.operands[k].shape);
    CHECK(device.operands[k].value_finite == tape.operands[k].value_finite);
  }
}

}  // namespace

TEST_CASE("device anomaly: log of a negative stops the forward replay at the log node, in every mode") {
  const Tensor<double> bad({2, 4}, {0.5, 1.0, 1.5, 2.0, -0.25, -0.75, 1.25, 0.1});  // element 5: h = -0.75
  const Anomaly tape = tape_report(bad, log_of_negative);
  CHECK(tape.op == "log");
  for (dev::Mode mode : all_modes) {
    CAPTURE(dev::mode_name(mode));
    const Anomaly a = device_report(bad, log_of_negative, mode);
    check_same(a, tape);
    CHECK(a.phase == Anomaly::Phase::forward);
    CHECK(a.op == "log");
    CHECK(a.scope == "block.1");
    CHECK(a.element == 5);
    CHECK(std::isnan(a.bad));
    REQUIRE(a.operands.size() == 1);
    CHECK(a.operands[0].op == "add_scalar");
    CHECK(a.operands[0].value_finite);
    CHECK(contains(a.message, "anomaly: forward: node " + std::to_string(a.node) + " (log in 'block.1', output [2, 4])"));
    CHECK(contains(a.message, "this node made the first non-finite value"));
    if (mode == dev::Mode::fused && std::getenv("GRAD_INSPECT_PRINT")) std::printf("%s\n", a.message.c_str());
  }
}

TEST_CASE("device anomaly: 0/0 in a custom norm names the division and both finite operands") {
  const Tensor<double> bad({2, 4}, {0.5, 1.0, 1.5, 2.0, 0, 0, 0, 0});  // row 1 is zero
  const Anomaly tape = tape_report(bad, custom_norm);
  for (dev::Mode mode : all_modes) {
    CAPTURE(dev::mode_name(mode));
    const Anomaly a = device_report(bad, custom_norm, mode);
    check_same(a, tape);
    CHECK(a.op == "div");
    CHECK(a.element == 4);
    REQUIRE(a.operands.size() == 2);
    CHECK(a.operands[1].op == "sqrt");
    CHECK(a.operands[1].shape == "[2, 1]");
  }
}

TEST_CASE("device anomaly: exp overflows in an f32 capture of a float64 tape, at the exp node") {
  const Tensor<double> big({2, 4}, {0.5, 1.0, 1.5, 2.0, 10, 60, 1.25, 0.1});  // exp(120) > FLT_MAX
  Block b;
  b.tp.detect_anomalies(true);
  record(b, big, exp_of_scaled);
  REQUIRE(b.tp.ok());  // float64: exp(120) is finite (tanh takes it to 1)
  for (dev::Mode mode : all_modes) {
    CAPTURE(dev::mode_name(mode));
    const Anomaly a = device_report(big, exp_of_scaled, mode, true);
    CHECK(a.phase == Anomaly::Phase::forward);
    CHECK(a.op == "exp");
    CHECK(a.scope == "block.1");
    CHECK(a.element == 5);
    CHECK(std::isinf(a.bad));
    CHECK(a.operands[0].value_finite);
  }
}

TEST_CASE("device anomaly: a backward-only NaN (sqrt at 0) stops the backward replay where the tape does") {
  const Tensor<double> zero_at_2({2, 4}, {0.5, 1.0, 0.0, 2.0, -0.25, 0.75, 1.25, 0.1});
  const Anomaly tape = tape_report(zero_at_2, sqrt_at_zero);
  REQUIRE(tape.phase == Anomaly::Phase::backward);
  for (dev::Mode mode : all_modes) {
    CAPTURE(dev::mode_name(mode));
    const Anomaly a = device_report(zero_at_2, sqrt_at_zero, mode);
    check_same(a, tape);
    CHECK(a.op == "sqrt");
    CHECK(a.gradient_to == 0);
    CHECK(a.element == 2);
    CHECK(a.incoming_gradient_finite);
    CHECK(contains(a.message, "anomaly: backward: node " + std::to_string(a.node) + " (sqrt in 'block.1'"));
    CHECK(contains(a.message, "this node made the first non-finite gradient"));
  }
}

TEST_CASE("device anomaly: an optimizer step that overflows a parameter is named by its node and scope") {
  for (dev::Mode mode : all_modes) {
    CAPTURE(dev::mode_name(mode));
    Tape<double> tp;
    Var<double> w, loss;
    {
      NameScope<double> s(tp, "head");
      w = tp.param(Tensor<double>({2}, {1.0, 2.0}));
    }
    loss = sum(w * 1e300);  // finite value and gradient (1e300); lr * 1e300 is not
    auto prog = dev::capture(tp, loss, {.backend = dev::Backend::cpu, .mode = mode});
    dev::SGD<double> opt(prog, 1e10);
    opt.add(w);
    prog.detect_anomalies(true);
    prog.forward();
    prog.backward();
    try {
      opt.step();
      FAIL("the step went through");
    } catch (const dev::AnomalyError& e) {
      const Anomaly& a = e.anomaly();
      CHECK(a.phase == Anomaly::Phase::optimizer);
      CHECK(a.node == w.index());
      CHECK(a.op == "param");
      CHECK(a.scope == "head");
      CHECK(a.element == 0);
      CHECK(std::isinf(a.bad));
      CHECK(a.incoming_gradient_finite);
      CHECK(contains(a.message, "anomaly: optimizer step: node 0 (param in 'head', [2]) became non-finite"));
    }
    CHECK(opt.steps() == 1);
  }
}

TEST_CASE("device anomaly: off by default (NaN flows, nothing thrown); on, a clean run keeps every bit") {
  const Tensor<double> bad({2, 4}, {0.5, 1.0, 1.5, 2.0, -0.25, -0.75, 1.25, 0.1});
  for (dev::Mode mode : all_modes) {
    CAPTURE(dev::mode_name(mode));
    Block b;
    record(b, good, log_of_negative);
    auto prog = dev::capture(b.tp, b.loss, {.backend = dev::Backend::cpu, .mode = mode});
    CHECK_FALSE(prog.detects_anomalies());
    prog.set_input(b.x, bad);
    prog.forward();
    prog.backward();
    CHECK(std::isnan(prog.loss()));
    CHECK(prog.anomaly() == nullptr);

    // Two programs, one watched: three Adam steps on clean input, the same bits.
    auto step3 = [&](bool watched) {
      Block c;
      record(c, good, log_of_negative);
      auto p = dev::capture(c.tp, c.loss, {.backend = dev::Backend::cpu, .mode = mode});
      p.detect_anomalies(watched);
      dev::Adam<double> opt(p, 0.01);
      opt.add(c.w);
      std::vector<double> out;
      for (int s = 0; s < 3; ++s) {
        p.forward();
        p.backward();
        opt.step();
        out.push_back(p.loss());
      }
      const Tensor<double> w = p.value(c.w);
      out.insert(out.end(), w.data().begin(), w.data().end());
      return out;
    };
    const std::vector<double> plain = step3(false), watched = step3(true);
    REQUIRE(plain.size() == watched.size());
    for (std::size_t k = 0; k < plain.size(); ++k) CHECK(std::memcmp(&plain[k], &watched[k], sizeof(double)) == 0);
  }
}

TEST_CASE("device anomaly: a NaN uploaded as input is named as an operand already non-finite") {
  Block b;
  record(b, good, log_of_negative);
  auto prog = dev::capture(b.tp, b.loss, {.backend = dev::Backend::cpu, .mode = dev::Mode::graph});
  prog.detect_anomalies(true);
  Tensor<double> nan_input = good;
  nan_input[3] = NAN;
  prog.set_input(b.x, nan_input);
  try {
    prog.forward();
    FAIL("the forward went through");
  } catch (const dev::AnomalyError& e) {
    const Anomaly& a = e.anomaly();
    CHECK(a.op == "matmul");  // the first launch that reads it
    CHECK(a.scope == "block.0");
    CHECK(a.element == 0);  // row 0 of x . w: x[0][3] * w[3][0] = nan * 0
    REQUIRE(a.operands.size() == 2);
    CHECK_FALSE(a.operands[0].value_finite);
    CHECK(a.operands[1].value_finite);
    CHECK(contains(a.message, "1 = node 0 (const [2, 4], already NOT finite)"));
    CHECK(contains(a.message, "the non-finite input came from outside the watched recording (a leaf's value"));
  }
}

TEST_CASE("device anomaly: turned off again, the replay runs through") {
  Block b;
  record(b, good, log_of_negative);
  auto prog = dev::capture(b.tp, b.loss, {.backend = dev::Backend::cpu, .mode = dev::Mode::fused});
  prog.detect_anomalies(true);
  prog.detect_anomalies(false);
  CHECK_FALSE(prog.detects_anomalies());
  prog.set_input(b.x, Tensor<double>({2, 4}, {0.5, 1.0, 1.5, 2.0, -0.25, -0.75, 1.25, 0.1}));
  CHECK_NOTHROW(prog.forward());
  CHECK(std::isnan(prog.loss()));
}

namespace {
bool have_program(const char* name) {
  return std::system(("command -v " + std::string(name) + " > /dev/null 2>&1").c_str()) == 0;
}
std::size_t count(const std::string& s, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("program to_dot: a LoRA block's fused segments are clusters of their launches; dot parses it") {
  Tape<double> tp;
  SplitMix64 gen{5};
  auto uniform = [&](Shape s, double bound) {
    Tensor<double> t(std::move(s));
    for (double& v : t.data()) v = gen.uniform(-bound, bound);
    return t;
  };
  Var<double> x = tp.constant(uniform({4, 8}, 1.0));
  Var<double> norm_w = tp.param(Tensor<double>::ones({8}));
  Var<double> w0 = tp.constant(uniform({8, 8}, 0.3)), a = tp.param(uniform({8, 2}, 0.3)), b = tp.param(uniform({2, 8}, 0.3));
  Var<double> h;
  {
    NameScope<double> s(tp, "q_proj");
    h = nn::lora_linear(nn::rmsnorm(x, norm_w, 1e-6), w0, a, b, 2.0);
  }
  Var<double> loss = mean(tanh(h) * h);
  REQUIRE(tp.ok());
  auto prog = dev::capture(tp, loss, {.backend = dev::Backend::cpu, .mode = dev::Mode::fused});
  const dev::FusionPlan& plan = prog.plan();
  REQUIRE(plan.fused_launches() > 0);  // something to draw as a cluster
  const std::string dot = dev::to_dot(prog);
  CHECK(contains(dot, "digraph grad_program {"));
  std::size_t clusters = 0;
  for (const dev::Segment& s : plan.segments) clusters += s.launches.size() > 1;
  CHECK(count(dot, "subgraph cluster_segment") == clusters);
  CHECK(count(dot, "label=\"kernel ") == clusters);  // the clusters' labels
  CHECK(count(dot, "tooltip=\"kernel ") == plan.segments.size() - clusters);  // kernels of one launch
  CHECK(contains(dot, "fused rows: "));
  // Each forward launch is its node, each backward launch a box, drawn once.
  // (Appended piecewise: GCC 12's -Wrestrict misfires on "n" + string.)
  auto drawn = [&](char kind, std::size_t i) {
    std::string box(1, kind);
    box += std::to_string(i);
    box += " [label=\"";
    return count(dot, box);
  };
  for (const dev::LaunchSpec& s : plan.forward) CHECK(drawn('n', s.node) == 1);
  for (std::size_t k = 0; k < plan.backward.size(); ++k) CHECK(drawn('b', k) == 1);
  CHECK(contains(dot, "q_proj.lora"));  // the node's name scope under its label
  if (std::getenv("GRAD_INSPECT_PRINT")) std::printf("%s", dot.c_str());
  CHECK(prog.node(static_cast<std::uint32_t>(h.index())).scope == "q_proj.lora");
  // 13 nodes: the rmsnorm is one rms_norm node (it was seven), LoRA's scaled sum one add_scaled (it was two).
  CHECK_THROWS_WITH_AS(prog.node(static_cast<std::uint32_t>(prog.nodes())), doctest::Contains("of a program of 13"),
                       std::out_of_range);
  const std::string forward_only = dev::to_dot(prog, {.backward = false});
  CHECK_FALSE(contains(forward_only, "cluster_backward"));
  CHECK_FALSE(contains(forward_only, "b0 ["));

  if (have_program("dot")) {
    const char* dir = std::getenv("TMPDIR");
    const std::string path = std::string(dir ? dir : "/tmp") + "/grad_test_device_inspect_program.svg";
    std::string why;
    CHECK_MESSAGE(render_svg(dot, path, &why), why);
    std::ifstream f(path);
    std::stringstream text;
    text << f.rdbuf();
    CHECK(contains(text.str(), "<svg"));
    CHECK(contains(text.str(), "cluster_segment"));
    std::remove(path.c_str());
  } else {
    MESSAGE("graphviz's dot is not on PATH: the parse check is skipped");
  }
}
