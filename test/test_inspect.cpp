// The inspection tools (docs/inspect.md): anomaly detection with name
// scopes, gradcheck, DOT pictures, the model summary and the profiler.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <grad/grad.hpp>
#include <grad/inspect.hpp>
#include <grad/lm.hpp>
#include <grad/modules.hpp>
#include <sstream>
#include <string>
#include <vector>

using namespace grad;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::size_t count(const std::string& s, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

bool have_program(const char* name) {
  return std::system(("command -v " + std::string(name) + " > /dev/null 2>&1").c_str()) == 0;
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/grad_test_inspect_" + name;
}

// A small two-layer block: scope "block", layers "block.0" (a linear map) and
// "block.1" (whatever `second` records). Returns the output.
template <class T, class F>
Var<T> small_block(Tape<T>& tp, Var<T> x, Var<T> w, F second) {
  NameScope<T> block(tp, "block");
  Var<T> h;
  {
    NameScope<T> layer(tp, "0");
    h = matmul(x, w);
  }
  NameScope<T> layer(tp, "1");
  return second(h);
}

}  // namespace

TEST_CASE("anomaly: log of a negative names the log node, its scope and its finite operand") {
  Tape<double> tp;
  tp.detect_anomalies(true);
  Var<double> x = tp.param(Tensor<double>({1, 2}, {1.0, 2.0}));
  Var<double> w = tp.param(Tensor<double>({2, 2}, {1.0, 0.0, 0.0, -1.0}));  // h = [1, -2]
  std::uint32_t log_node = 0;
  Var<double> y = small_block(tp, x, w, [&](Var<double> h) {
    Var<double> shifted = h + 0.5;  // [1.5, -1.5]: finite
    log_node = static_cast<std::uint32_t>(tp.size());
    Var<double> l = log(shifted);
    return sum(l);
  });
  CHECK_FALSE(y.valid());
  REQUIRE_FALSE(tp.ok());
  const Anomaly* a = tp.anomaly();
  REQUIRE(a != nullptr);
  CHECK(a->phase == Anomaly::Phase::forward);
  CHECK(a->node == log_node);
  CHECK(a->op == "log");
  CHECK(a->scope == "block.1");
  CHECK(a->element == 1);
  CHECK(std::isnan(a->bad));
  REQUIRE(a->operands.size() == 1);
  CHECK(a->operands[0].op == "add_scalar");
  CHECK(a->operands[0].value_finite);
  CHECK(contains(tp.error(), "node " + std::to_string(log_node) + " (log in 'block.1'"));
  CHECK(contains(tp.error(), "this node made the first non-finite value"));
  CHECK(tp.scope_name(log_node - 2) == "block.0");  // the matmul
}

TEST_CASE("anomaly: 0/0 in a custom norm names the division, not the sum after it") {
  Tape<double> tp;
  grad::AnomalyGuard<double> guard(tp);
  Var<double> x = tp.param(Tensor<double>({1, 4}));  // zeros: the norm is 0
  Var<double> w = tp.param(Tensor<double>({4, 4}));
  std::uint32_t div_node = 0;
  small_block(tp, x, w, [&](Var<double> h) {
    Var<double> norm = sqrt(sum(h * h));
    div_node = static_cast<std::uint32_t>(tp.size());
    Var<double> unit = h / norm;
    return sum(unit);
  });
  const Anomaly* a = tp.anomaly();
  REQUIRE(a != nullptr);
  CHECK(a->node == div_node);
  CHECK(a->op == "div");
  CHECK(a->scope == "block.1");
  REQUIRE(a->operands.size() == 2);
  CHECK(a->operands[0].value_finite);
  CHECK(a->operands[1].value_finite);
  CHECK(a->operands[1].op == "sqrt");
}

TEST_CASE("anomaly: an exp overflowing f32 is found; in f64 the same program is fine") {
  auto run = [](auto zero) {
    using T = decltype(zero);
    Tape<T> tp;
    tp.detect_anomalies(true);
    Var<T> x = tp.param(Tensor<T>({1, 2}, {T(1), T(2)}));
    Var<T> w = tp.param(Tensor<T>({2, 2}, {T(30), T(0), T(0), T(30)}));  // h = [30, 60]
    std::uint32_t exp_node = 0;
    small_block(tp, x, w, [&](Var<T> h) {
      Var<T> scaled = h * T(2);  // [60, 120]: exp(120) > FLT_MAX
      exp_node = static_cast<std::uint32_t>(tp.size());
      return sum(exp(scaled));
    });
    return std::make_pair(exp_node, tp.anomaly() ? *tp.anomaly() : Anomaly{});
  };
  const auto [node, a] = run(0.0f);
  CHECK(a.node == node);
  CHECK(a.op == "exp");
  CHECK(a.element == 1);
  CHECK(std::isinf(a.bad));
  CHECK(run(0.0).second.node == no_node);
}

TEST_CASE("anomaly: backward names the first node whose gradient became non-finite from finite inputs") {
  Tape<double> tp;
  tp.detect_anomalies(true);
  Var<double> x = tp.param(Tensor<double>({1, 2}, {0.0, 4.0}));
  Var<double> w = tp.param(Tensor<double>({2, 2}, {1.0, 0.0, 0.0, 1.0}));
  std::uint32_t sqrt_node = 0;
  Var<double> loss = small_block(tp, x, w, [&](Var<double> h) {
    sqrt_node = static_cast<std::uint32_t>(tp.size());
    Var<double> r = sqrt(h);  // sqrt(0) = 0 is finite; its slope there is not
    return sum(r * 3.0);
  });
  REQUIRE(tp.ok());
  CHECK_FALSE(tp.backward(loss));
  const Anomaly* a = tp.anomaly();
  REQUIRE(a != nullptr);
  CHECK(a->phase == Anomaly::Phase::backward);
  CHECK(a->node == sqrt_node);
  CHECK(a->op == "sqrt");
  CHECK(a->scope == "block.1");
  CHECK(a->gradient_to == 0);
  CHECK(a->element == 0);
  CHECK(a->incoming_gradient_finite);
  CHECK(a->operands[0].value_finite);
  CHECK(contains(tp.error(), "anomaly: backward: node " + std::to_string(sqrt_node) + " (sqrt"));
  CHECK(contains(tp.error(), "this node made the first non-finite gradient"));
}

TEST_CASE("anomaly: off by default (NaNs flow), the guard restores, exception mode throws with the report kept") {
  {
    Tape<double> tp;
    Var<double> y = log(tp.param(Tensor<double>({2}, {-1.0, 1.0})));
    CHECK(tp.ok());
    CHECK(std::isnan(tp.value(y)[0]));
    CHECK(tp.anomaly() == nullptr);
    {
      AnomalyGuard<double> g(tp);
      CHECK(tp.detects_anomalies());
    }
    CHECK_FALSE(tp.detects_anomalies());
  }
  {
    Tape<double> tp;
    tp.throw_on_error(true);
    tp.detect_anomalies(true);
    Var<double> x = tp.param(Tensor<double>({2}, {-1.0, 1.0}));
    CHECK_THROWS_AS(log(x), TapeError);
    REQUIRE(tp.anomaly() != nullptr);
    CHECK(tp.anomaly()->node == 1);
  }
  {  // a leaf already non-finite is named as such
    Tape<double> tp;
    tp.detect_anomalies(true);
    tp.param(Tensor<double>({2}, {NAN, 1.0}));
    REQUIRE(tp.anomaly() != nullptr);
    CHECK(tp.anomaly()->op == "param");
    CHECK(tp.anomaly()->node == 0);
  }
}

TEST_CASE("anomaly: Sequential names its layers, so the report says which one") {
  Tape<double> tp;
  SplitMix64 gen{7};
  nn::Sequential<double> model(tp);
  model.add(nn::Linear<double>(tp, 3, 4, gen)).add(+[](Var<double> h) { return log(h * 0.0 - 1.0); });
  tp.detect_anomalies(true);
  NameScope<double> outer(tp, "model");
  model(tp.constant(Tensor<double>({2, 3}, {1, 2, 3, 4, 5, 6})));
  REQUIRE(tp.anomaly() != nullptr);
  CHECK(tp.anomaly()->op == "log");
  CHECK(tp.anomaly()->scope == "model.1");
}

TEST_CASE("scopes: a node's scope survives mark/reset_to episodes") {
  Tape<double> tp;
  Var<double> x = tp.param(Tensor<double>({2}, {1.0, 2.0}));
  const auto m = tp.mark();
  for (int episode = 0; episode < 3; ++episode) {
    tp.reset_to(m);
    Var<double> a = x * 2.0;
    Var<double> b;
    {
      NameScope<double> s(tp, "head");
      b = exp(a);
    }
    Var<double> c = sum(b);
    CHECK(tp.scope_name(a.index()).empty());
    CHECK(tp.scope_name(b.index()) == "head");
    CHECK(tp.scope_name(c.index()).empty());
  }
  CHECK(tp.inspection().scopes.names.size() == 2);  // "" and "head", interned once
}

TEST_CASE("gradcheck: passes a correct function, reports the worst element of a detached norm") {
  const GradcheckResult good = gradcheck(
      [](Tape<double>&, const std::vector<Var<double>>& v) { return sum(tanh(matmul(v[0], v[1]))); },
      {Tensor<double>({2, 3}, {0.1, -0.2, 0.3, 0.4, 0.5, -0.6}), Tensor<double>({3, 2}, {1, 2, 3, -1, 0.5, 0.25})});
  CHECK(good.passed);
  CHECK(good.checked == 12);
  CHECK(good.failures == 0);

  // The bug: the norm is read off the tape and fed back as a constant, so no
  // gradient flows through it (a "detached" normaliser).
  const GradcheckResult bad = gradcheck(
      [](Tape<double>& tp, const std::vector<Var<double>>& v) {
        const double norm = std::sqrt(tp.scalar(sum(v[0] * v[0])));
        Var<double> w = tp.constant(Tensor<double>({2}, {1.0, 2.0}));
        return sum(w * (v[0] / norm));
      },
      {Tensor<double>({2}, {3.0, 4.0})});
  CHECK_FALSE(bad.passed);
  CHECK(bad.failures == 2);
  // analytic w / 5 = [0.2, 0.4]; true gradient w/n - (w.x) x / n^3 = [-0.064, 0.048]
  CHECK(bad.input == 0);
  CHECK(bad.element == 1);
  CHECK(bad.analytic == doctest::Approx(0.4));
  CHECK(bad.numeric == doctest::Approx(0.048).epsilon(1e-6));
  CHECK(contains(bad.report(), "gradcheck FAILED"));
}

TEST_CASE("gradcheck: bad input is refused clearly; large inputs are sampled") {
  auto identity = [](Tape<double>&, const std::vector<Var<double>>& v) { return v[0] * 2.0; };
  CHECK_THROWS_WITH_AS(gradcheck(identity, {Tensor<double>({3})}),
                       doctest::Contains("must return a single-element Var"), std::invalid_argument);
  CHECK_THROWS_AS(gradcheck(identity, {}), std::invalid_argument);
  auto mismatched = [](Tape<double>&, const std::vector<Var<double>>& v) { return sum(v[0] + v[1]); };
  CHECK_THROWS_WITH_AS(gradcheck(mismatched, {Tensor<double>({3}), Tensor<double>({4})}),
                       doctest::Contains("poisoned the tape"), std::invalid_argument);
  GradcheckOptions few;
  few.max_elements = 50;
  const GradcheckResult r = gradcheck(
      [](Tape<double>&, const std::vector<Var<double>>& v) { return sum(v[0] * v[0]); },
      {Tensor<double>::ones({40, 50})}, few);
  CHECK(r.checked == 50);
  CHECK(r.passed);
}

namespace {
// A LoRA projection under scopes: frozen w0, adapters A, B.
Var<double> scoped_lora(Tape<double>& tp, Var<double>& a_out) {
  Var<double> x = tp.constant(Tensor<double>({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8}));
  NameScope<double> s(tp, "layer");
  SplitMix64 gen{3};
  nn::LoRALinear<double> lora(tp, Tensor<double>::ones({4, 3}), 2, 4.0, gen);
  a_out = lora.A;
  NameScope<double> inner(tp, "q_proj");
  return sum(lora(x));
}
}  // namespace

TEST_CASE("to_dot: ops, shapes, styles and clusters; `dot` accepts it; a poisoned tape is refused") {
  Tape<double> tp;
  Var<double> adapter;
  Var<double> loss = scoped_lora(tp, adapter);
  REQUIRE(tp.backward(loss));
  DotOptions opt;
  opt.value_norms = opt.gradient_norms = true;
  const std::string dot = to_dot(tp, opt);
  CHECK(contains(dot, "digraph grad_tape {"));
  CHECK(contains(dot, "subgraph cluster_"));
  CHECK(contains(dot, "label=\"layer.q_proj\""));
  CHECK(contains(dot, " matmul\\n[2, 3]"));
  CHECK(contains(dot, "|g| = "));
  CHECK(count(dot, "shape=ellipse, style=\"filled,dashed\"") == 2);  // the input and w0 (constants)
  CHECK(count(dot, "fillcolor=\"#ffe08a\"") == 2);                   // A and B
  CHECK(count(dot, " -> ") >= tp.size() - 4);
  if (have_program("dot")) {
    const std::string svg = temp_path("lora.svg");
    std::string why;
    CHECK_MESSAGE(render_svg(dot, svg, &why), why);
    std::ifstream f(svg);
    std::stringstream text;
    text << f.rdbuf();
    CHECK(contains(text.str(), "<svg"));
    std::remove(svg.c_str());
  } else {
    MESSAGE("graphviz's dot is not on PATH: the parse check is skipped");
  }

  Tape<double> poisoned;
  Var<double> p = poisoned.param(Tensor<double>({2}));
  p + poisoned.param(Tensor<double>({3}));
  CHECK_THROWS_WITH_AS(to_dot(poisoned), doctest::Contains("the tape is poisoned"), std::invalid_argument);
  DotOptions anyway;
  anyway.allow_poisoned = true;
  CHECK(contains(to_dot(poisoned, anyway), "#1 param"));
}

TEST_CASE("summarize: per-layer rows of a Sequential, parameter counts equal the model's") {
  Tape<double> tp;
  SplitMix64 gen{11};
  nn::Sequential<double> model = nn::mlp<double>(tp, {4, 8, 3}, gen);
  Var<double> y = model(tp.constant(Tensor<double>::ones({5, 4})));
  REQUIRE(tp.backward(sum(y)));
  const Summary s = summarize(tp, model);
  CHECK(s.trainable == model.parameter_count());
  CHECK(s.trainable == 4 * 8 + 8 + 8 * 3 + 3);
  auto row = [&](const std::string& scope) {
    for (const SummaryRow& r : s.rows)
      if (r.scope == scope) return r;
    FAIL("no row " << scope);
    return SummaryRow{};
  };
  CHECK(row("0").trainable == 40);
  CHECK(row("0").output_shape == "[5, 8]");
  CHECK(row("1").trainable == 0);
  CHECK(row("1").output_shape == "[5, 8]");
  CHECK(row("2").trainable == 27);
  CHECK(row("2").output_shape == "[5, 3]");
  CHECK(s.grad_bytes == tp.grad_bytes());
  CHECK(s.arena_bytes >= s.value_bytes + s.grad_bytes);
  const std::string table = s.table();
  if (std::getenv("GRAD_INSPECT_PRINT")) std::printf("%s", table.c_str());  // docs/inspect.md shows this table
  CHECK(contains(table, "Trainable parameters: 67"));
  CHECK(contains(table, "[5, 3]"));

  Tape<double> lt;  // a raw tape: LoRA's frozen base weight counts as frozen
  Var<double> adapter;
  scoped_lora(lt, adapter);
  const Summary ls = summarize(lt);
  CHECK(ls.frozen == 12);
  CHECK(ls.trainable == 4 * 2 + 2 * 3);
}

TEST_CASE("profiler: per-op and per-scope rows count every call; the Chrome trace has one slice per event") {
  Tape<double> tp;
  Var<double> adapter;
  const auto m = tp.mark();
  tp.profile(true);
  for (int step = 0; step < 2; ++step) {
    tp.reset_to(m);
    tp.clear_profile();
    Var<double> loss = scoped_lora(tp, adapter);
    REQUIRE(tp.backward(loss));
  }
  tp.profile(false);
  std::size_t matmuls = 0;
  for (const Node<double>& n : tp.nodes()) matmuls += n.op == op_code<Matmul>;
  const auto by_op = profile_by_op(tp);
  bool found = false;
  double share = 0;
  for (const ProfileRow& r : by_op) {
    share += r.share;
    if (r.key != "matmul") continue;
    found = true;
    CHECK(r.forward_calls == matmuls);
    CHECK(r.backward_calls >= 1);
  }
  CHECK(found);
  CHECK(share == doctest::Approx(1.0));
  bool scoped = false;
  for (const ProfileRow& r : profile_by_scope(tp)) scoped = scoped || r.key == "layer.q_proj";
  CHECK(scoped);
  CHECK(contains(profile_table(by_op), "matmul"));
  const std::string trace = chrome_trace(tp);
  CHECK(count(trace, "\"ph\":\"X\"") == tp.inspection().events.size());
  CHECK(contains(trace, "\"scope\":\"layer.q_proj\""));
  if (have_program("python3")) {
    const std::string path = temp_path("trace.json");
    write_chrome_trace(tp, path);
    CHECK(std::system(("python3 -c 'import json,sys; json.load(open(sys.argv[1]))' " + path).c_str()) == 0);
    std::remove(path.c_str());
  }
  // Off: nothing more is recorded.
  const std::size_t events = tp.inspection().events.size();
  tp.reset_to(m);
  scoped_lora(tp, adapter);
  CHECK(tp.inspection().events.size() == events);
}

namespace {
nn::LmConfig tiny_lm() {
  nn::LmConfig c;
  c.vocab = 16;
  c.d_model = 8;
  c.layers = 3;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn = 16;
  c.max_seq = 8;
  return c;
}
std::vector<int> tokens(std::size_t n, int shift) {
  std::vector<int> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<int>((i * 7 + static_cast<std::size_t>(shift)) % 16);
  return t;
}
const SummaryRow* find_row(const Summary& s, const std::string& scope) {
  for (const SummaryRow& r : s.rows)
    if (r.scope == scope) return &r;
  return nullptr;
}
}  // namespace

TEST_CASE("Lm names its parts: every node and parameter under block / part scopes, the summary per part") {
  Tape<double> tp;
  nn::Lm<double> m(tp, tiny_lm(), 3);
  auto r = m.forward(m.ids(tokens(2 * 6, 1), 2, 6), m.ids(tokens(2 * 6, 2), 12, 0));
  REQUIRE(tp.backward(r.loss));
  CHECK(tp.scope_name(m.layer(2).w[static_cast<std::size_t>(nn::Proj::q)].index()) == "layers.2.attention.q");
  CHECK(tp.scope_name(m.layer(1).w[static_cast<std::size_t>(nn::Proj::down)].index()) == "layers.1.mlp.down");
  CHECK(tp.scope_name(m.layer(0).attn_norm.index()) == "layers.0.attn_norm");
  CHECK(tp.scope_name(m.embed().index()) == "embed");
  CHECK(tp.scope_name(r.logits.index()) == "head");
  CHECK(tp.scope_name(r.loss.index()) == "loss");
  // Each block's attention probabilities are its attention's; its rms_norm nodes are the norms'.
  std::vector<std::string> softmax_scopes, norm_scopes;
  for (std::size_t i = 0; i < tp.size(); ++i) {
    if (tp.nodes()[i].op == op_code<CausalAttentionProbs>) softmax_scopes.push_back(tp.scope_name(i));
    if (tp.nodes()[i].op == op_code<RmsNorm>) norm_scopes.push_back(tp.scope_name(i));
  }
  CHECK(softmax_scopes == std::vector<std::string>{"layers.0.attention", "layers.1.attention", "layers.2.attention"});
  REQUIRE(norm_scopes.size() == 7);
  CHECK(norm_scopes[2] == "layers.1.attn_norm.rmsnorm");
  CHECK(norm_scopes[3] == "layers.1.mlp_norm.rmsnorm");
  CHECK(norm_scopes[6] == "final_norm.rmsnorm");

  const Summary s = summarize(tp);
  CHECK(s.trainable == m.parameter_count());  // every parameter counted, in its part
  const nn::LmConfig c = tiny_lm();
  const SummaryRow* q = find_row(s, "layers.1.attention.q");
  REQUIRE(q != nullptr);
  CHECK(q->trainable == c.d_model * c.d_model);
  CHECK(q->nodes == 2);  // the weight and its matmul
  CHECK(find_row(s, "layers.2.mlp.swiglu") != nullptr);
  bool profiled_scope = false;
  tp.profile(true);
  m.forward(m.ids(tokens(2 * 6, 1), 2, 6), m.ids(tokens(2 * 6, 2), 12, 0));
  tp.profile(false);
  const std::vector<ProfileRow> by_scope = profile_by_scope(tp);
  for (const ProfileRow& row : by_scope) profiled_scope = profiled_scope || row.key == "layers.2.attention";
  CHECK(profiled_scope);
  // Long scope paths widen the name column: every line of the table lines up.
  std::istringstream table(profile_table(by_scope));
  std::size_t lines = 0, width = 0;
  for (std::string line; std::getline(table, line); ++lines) {
    if (lines == 0) width = line.size();
    CHECK(line.size() == width);
  }
  CHECK(lines == by_scope.size() + 1);
  CHECK(width == 26 + 63);  // the longest name, "layers.0.attn_norm.rmsnorm", and 63 for the numbers

  // LoRA: the base weights are frozen constants in their parts, the adapters under ".lora".
  nn::LmConfig lc = tiny_lm();
  lc.lora_rank = 2;
  lc.lora_targets = nn::parse_projections("q,v");
  Tape<double> lt;
  nn::Lm<double> lm(lt, lc, 3, nn::Lm<double>::Train::lora);
  lm.forward(lm.ids(tokens(6, 1), 1, 6), lm.ids(tokens(6, 2), 6, 0));
  REQUIRE(lt.ok());
  const Summary ls = summarize(lt);
  std::size_t adapters = 0, base = 0;
  for (const auto& p : lm.adapters()) adapters += lt.value(p.var).size();
  for (const auto& p : lm.base()) base += lt.value(p.var).size();
  CHECK(ls.trainable == adapters);
  CHECK(ls.frozen == base);
  CHECK(lt.scope_name(lm.layer(0).lora_a[0].index()) == "layers.0.attention.q.lora");
  const SummaryRow* lora = find_row(ls, "layers.0.attention.v.lora");
  REQUIRE(lora != nullptr);
  CHECK(lora->trainable == c.d_model * 2 + 2 * c.kv_heads * c.head_dim());
}

TEST_CASE("anomaly deep in an Lm block: an overflowing projection is named by block, part and op") {
  Tape<double> tp;
  nn::Lm<double> m(tp, tiny_lm(), 3);
  // The norm's output ~1e200 (finite), times k's weights 1e200: every product overflows.
  for (double& w : tp.leaf_value(m.layer(1).attn_norm)) w = 1e200;
  for (double& w : tp.leaf_value(m.layer(1).w[static_cast<std::size_t>(nn::Proj::k)])) w = 1e200;
  tp.detect_anomalies(true);
  auto r = m.forward(m.ids(tokens(6, 1), 1, 6), m.ids(tokens(6, 2), 6, 0));
  CHECK_FALSE(r.loss.valid());
  const Anomaly* a = tp.anomaly();
  REQUIRE(a != nullptr);
  CHECK(a->phase == Anomaly::Phase::forward);
  CHECK(a->op == "matmul");
  CHECK(a->scope == "layers.1.attention.k");
  REQUIRE(a->operands.size() == 2);
  CHECK(a->operands[0].value_finite);
  CHECK(a->operands[0].scope == "layers.1.attn_norm.rmsnorm");
  CHECK(a->operands[1].op == "param");
  CHECK(a->operands[1].value_finite);
  CHECK(contains(tp.error(), "(matmul in 'layers.1.attention.k'"));
}

TEST_CASE("profiler: the per-op totals account for the step's wall time, with recompute scopes too") {
  // A step of the LM at tinylm's default width: the events' durations
  // against the wall time of the same forward and backward. The events
  // leave out the tape's own bookkeeping between ops (shape checks,
  // allocation, the reverse walk's loop), so they sum to a little less.
  // With recompute on, the forward steps backward computes again are
  // events of their own (about a third of such a step).
  nn::LmConfig c = tiny_lm();
  c.vocab = 256;
  c.d_model = 64;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 176;
  c.max_seq = 32;
  for (const bool recompute : {false, true}) {
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 5);
    m.set_recompute(recompute);
    const auto mark = tp.mark();
    double best = 0, best_wall = 0, best_events = 0, best_recomputed = 0;
    for (int step = 0; step < 3; ++step) {  // the first warms the arenas; the best of the rest counts
      tp.reset_to(mark);
      tp.clear_profile();
      tp.profile(true);
      const auto t0 = std::chrono::steady_clock::now();
      auto r = m.forward(m.ids(tokens(4 * 32, 1), 4, 32), m.ids(tokens(4 * 32, 2), 128, 0));
      REQUIRE(tp.backward(r.loss));
      const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      tp.profile(false);
      double events = 0, recomputed = 0;
      for (const ProfileRow& row : profile_by_op(tp)) {
        events += row.total_ms();
        recomputed += row.recomputed_ms;
      }
      if (step > 0 && events / wall > best) {
        best = events / wall;
        best_wall = wall;
        best_events = events;
        best_recomputed = recomputed;
      }
    }
    MESSAGE("recompute " << recompute << ": per-op totals " << best_events << " ms (recomputed " << best_recomputed
                         << ") of a " << best_wall << " ms step (" << 100 * best << "%)");
    CHECK(best <= 1.0);   // nested in the step: cannot exceed it
    CHECK(best >= 0.75);  // 0.9 or more on an idle machine; loose for shared CI cores
    CHECK((best_recomputed > 0) == recompute);
  }
}

TEST_CASE("profiler: the steps a recompute scope computes again are timed on a track of their own") {
  nn::LmConfig c = tiny_lm();
  Tape<double> tp;
  nn::Lm<double> m(tp, c, 3);
  m.set_recompute(true);
  const auto mark = tp.mark();
  tp.profile(true);
  auto r = m.forward(m.ids(tokens(2 * 8, 1), 2, 8), m.ids(tokens(2 * 8, 2), 16, 0));
  REQUIRE(tp.backward(r.loss));
  tp.profile(false);
  REQUIRE(tp.recomputed_nodes() > 0);
  std::size_t recomputed = 0, forward = 0, both = 0;
  for (const TraceEvent& e : tp.inspection().events) {
    recomputed += e.recomputed;
    forward += !e.recomputed && !e.backward;
    both += e.recomputed && e.backward;
  }
  CHECK(both == 0);
  CHECK(recomputed == tp.recomputed_nodes());
  CHECK(forward > recomputed);  // every node was recorded once; backward computes some again
  std::size_t rows_recomputed = 0;
  double share = 0;
  const auto by_op = profile_by_op(tp);
  for (const ProfileRow& row : by_op) {
    rows_recomputed += row.recomputed_calls;
    share += row.share;
  }
  CHECK(rows_recomputed == recomputed);
  CHECK(share == doctest::Approx(1.0));
  CHECK(contains(profile_table(by_op), "re ms"));
  const std::string trace = chrome_trace(tp);
  CHECK(count(trace, "\"tid\":3,\"ts\"") == recomputed);
  CHECK(count(trace, "\"cat\":\"recompute\"") == recomputed);
  // Without recompute scopes the table keeps its usual columns.
  tp.reset_to(mark);
  tp.clear_profile();
  m.set_recompute(false);
  tp.profile(true);
  r = m.forward(m.ids(tokens(2 * 8, 1), 2, 8), m.ids(tokens(2 * 8, 2), 16, 0));
  REQUIRE(tp.backward(r.loss));
  tp.profile(false);
  CHECK_FALSE(contains(profile_table(profile_by_op(tp)), "re ms"));
}
