// grad against float64 PyTorch. test/oracle/graphs.py builds three composite
// graphs in torch and writes their inputs (exact bits), losses and parameter
// gradients to graphs_golden.txt; the graphs below are the same graphs, op
// for op, recorded on an f64 tape from those input bits.
//
// Bounds: the loss within 1e-14 of torch's, relative to |torch's loss|;
// every gradient element within 1e-12 relative, the denominator being that
// element's own magnitude, max(|expected_i|, DBL_MIN) (no per-tensor norm, no
// absolute floor: a zero expected gradient must be matched exactly).
// The two sides differ only in rounding order (torch's BLAS and vectorised
// sums) and in last-ulp differences of exp/log/tanh, so the graphs are kept
// well conditioned (see graphs.py) rather than the bounds loosened.
#include <doctest/doctest.h>

#include <unistd.h>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "golden.hpp"
#include "support.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

constexpr double loss_bound = 1e-14;
constexpr double grad_bound = 1e-12;

using Golden = std::map<std::string, Tensor<double>>;

// A graph's inputs by short name ("x", "W1"), each already on the tape.
struct Inputs {
  std::map<std::string, Var<double>> vars;
  Var<double> operator[](const std::string& name) const {
    auto it = vars.find(name);
    if (it == vars.end()) throw std::runtime_error("oracle graph uses input '" + name + "' that the golden file lacks");
    return it->second;
  }
};

struct OracleGraph {
  std::string name;
  std::function<Var<double>(const Inputs&)> build;
};

// Each builder mirrors the function of the same name in graphs.py.
std::vector<OracleGraph> oracle_graphs() {
  using V = Var<double>;
  return {
      {"mlp",
       [](const Inputs& in) {
         V z1 = matmul(in["x"], in["W1"]) + in["b1"];  // [4,5] + [5]
         V h = grad::tanh(z1);
         V a = relu(z1);  // fan-out of z1
         V m = 0.5 * h + a * 0.25 + 0.125;
         V o = sigmoid(matmul(m, in["W2"]) + in["b2"]);  // [4,2] + [1,2]
         return mse(o, in["target"]) + sum(in["W1"] * in["W1"]) * 0.01;
       }},
      {"attention",
       [](const Inputs& in) {
         V s = bmm(in["q"], transpose(in["k"])) / 2.0;
         V attn = softmax(s, -1);
         V o = bmm(attn, in["v"]);
         V bias = in["u"] + in["w"];  // [2,1,4] + [3,1] -> [2,3,4]
         V y = o - bias;
         V flat = reshape(y, {6, 4});
         V top = slice(flat, {0, 0}, {3, 4});
         V bottom = slice(flat, {3, 1}, {6, 4});
         V joined = concat(top, bottom, 1);
         V rows = row_sum(y);  // [2,3,1]
         return mean(joined * joined) + mean(rows) * 0.1;
       }},
      {"pointwise",
       [](const Inputs& in) {
         V a = in["a"], b = in["b"], c = in["c"];
         V e1 = grad::log(a + 0.5) + grad::sqrt(1.0 + a);
         V e2 = grad::exp(-a) * (3.0 - a);
         V e3 = a / b + 2.0 / a;    // [3,4] / [4]
         V e4 = b / (a - 0.25);     // [4] / [3,4]
         V e5 = softmax(c * a, 0);  // [3,1] * [3,4], softmax down the columns
         return mean(e1 * e2 + e3 + e4 * e5 + e4 / 3.0);
       }},
      {"tokens",
       [](const Inputs& in) {
         V x = reshape(embedding(in["E"], in["ids"]), {6, 3});  // ids [2, 3], id 1 and 4 twice
         V logits = matmul(grad::tanh(x), in["W"]) * 2.0;
         return grad::cross_entropy(logits, in["targets"], -1.0);  // row 1 ignored
       }},
  };
}

// Copies "<graph>.param.*" onto the tape as parameters and "<graph>.const.*"
// as constants.
Inputs load_inputs(Tape<double>& tp, const Golden& g, const std::string& graph) {
  Inputs in;
  for (const auto& [key, t] : g) {
    if (key.starts_with(graph + ".param.")) in.vars.emplace(key.substr(graph.size() + 7), tp.param(t));
    if (key.starts_with(graph + ".const.")) in.vars.emplace(key.substr(graph.size() + 7), tp.constant(t));
  }
  return in;
}

struct Worst {
  double rel = 0;
  std::string where;
};

// Largest |got_i - want_i| / max(|want_i|, DBL_MIN) over a tensor's elements.
void track(Worst& w, std::span<const double> got, std::span<const double> want, const std::string& name) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double rel = std::fabs(got[i] - want[i]) / std::max(std::fabs(want[i]), DBL_MIN);
    if (!(rel <= w.rel)) {  // also catches NaN
      w.rel = std::isnan(rel) ? INFINITY : rel;
      w.where = name + "[" + std::to_string(i) + "]";
    }
  }
}

struct GraphResult {
  Worst loss, grads;
  std::size_t params = 0;
};

// Records `graph` from `golden`'s inputs, runs backward and measures it
// against `golden`'s loss and gradients.
GraphResult compare_graph(const OracleGraph& graph, const Golden& golden) {
  GraphResult r;
  Tape<double> tp;
  const Inputs in = load_inputs(tp, golden, graph.name);
  REQUIRE_FALSE(in.vars.empty());
  const Var<double> loss = graph.build(in);
  INFO(tp.error());
  REQUIRE(tp.ok());
  REQUIRE(tp.backward(loss));

  const auto want_loss = golden.find(graph.name + ".loss");
  REQUIRE(want_loss != golden.end());
  track(r.loss, tp.value(loss).data, want_loss->second.data(), graph.name + ".loss");

  for (const auto& [key, t] : golden) {
    if (!key.starts_with(graph.name + ".param.")) continue;
    const std::string p = key.substr(graph.name.size() + 7);
    const auto want = golden.find(graph.name + ".grad." + p);
    INFO("parameter ", key);
    REQUIRE(want != golden.end());
    const View<double> got = tp.grad(in[p]);
    CHECK(Shape(got.shape.begin(), got.shape.end()) == want->second.shape());
    track(r.grads, got.data, want->second.data(), graph.name + ".grad." + p);
    ++r.params;
  }
  return r;
}

void check_against(const Golden& golden, const std::string& source) {
  for (const OracleGraph& g : oracle_graphs()) {
    CAPTURE(source);
    CAPTURE(g.name);
    const GraphResult r = compare_graph(g, golden);
    MESSAGE(source << " " << g.name << ": loss rel err " << r.loss.rel << ", worst gradient rel err " << r.grads.rel
                   << " at " << r.grads.where << " (" << r.params << " parameters)");
    CHECK(r.params > 0);
    CHECK(r.loss.rel <= loss_bound);
    CAPTURE(r.grads.where);
    CHECK(r.grads.rel <= grad_bound);
  }
}

std::string golden_path() { return oracle_dir() + "/graphs_golden.txt"; }

}  // namespace

TEST_CASE("oracle graphs match float64 PyTorch: loss <= 1e-14, every gradient element <= 1e-12 relative") {
  check_against(load_golden(golden_path()), "golden");
}

TEST_CASE("the oracle graphs touch every op in OpList") {
  const Golden golden = load_golden(golden_path());
  std::set<std::uint8_t> seen;
  for (const OracleGraph& g : oracle_graphs()) {
    Tape<double> tp;
    g.build(load_inputs(tp, golden, g.name));
    REQUIRE(tp.ok());
    for (const Node<double>& n : tp.nodes()) seen.insert(n.op);
  }
  boost::mp11::mp_for_each<OpList>([&](auto op) {
    CAPTURE(decltype(op)::name);
    CHECK(seen.count(op_code<decltype(op)>) == 1);
  });
}

// The checked-in golden file is only trusted while graphs.py still produces
// it: rerun the script, demand the very same input bits, and hold both grad
// and the checked-in outputs to the bounds against the fresh torch outputs
// (a different torch build may round differently, so not bit equality).
TEST_CASE("a live run of graphs.py reproduces the golden file") {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    MESSAGE("skipped: /usr/bin/python3 cannot import torch (apt-get install python3-torch)");
    return;
  }
  char dir_template[] = "/tmp/grad_oracle_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::filesystem::path dir = dir_template;
  const std::string fresh_path = (dir / "graphs_golden.txt").string();
  const std::string command = "/usr/bin/python3 -B '" + oracle_dir() + "/graphs.py' '" + fresh_path + "'";
  const int rc = std::system(command.c_str());
  const Golden fresh = rc == 0 ? load_golden(fresh_path) : Golden{};
  std::filesystem::remove_all(dir);
  INFO(command);
  REQUIRE(rc == 0);

  const Golden golden = load_golden(golden_path());
  std::set<std::string> fresh_keys, golden_keys;
  for (const auto& [k, t] : fresh) fresh_keys.insert(k);
  for (const auto& [k, t] : golden) golden_keys.insert(k);
  REQUIRE(fresh_keys == golden_keys);

  for (const auto& [key, want] : fresh) {
    CAPTURE(key);
    const Tensor<double>& old = golden.at(key);
    CHECK(old.shape() == want.shape());
    if (key.find(".param.") != std::string::npos || key.find(".const.") != std::string::npos) {
      CHECK(bitwise_equal(old.data(), want.data()));
    } else {
      Worst w;
      track(w, old.data(), want.data(), key);
      CHECK(w.rel <= (key.ends_with(".loss") ? loss_bound : grad_bound));
    }
  }
  check_against(fresh, "fresh");
}
