// The checks the one case table (op_cases.hpp) drives here: the host loops
// against the tags' per-item bodies, bit for bit (and, since this suite also
// runs under GRAD_ISA=baseline and avx2, every compiled instruction-set copy
// of the loops); the same bits on 1, 2 and 3 threads; coverage of OpList;
// and float64 PyTorch, from the very tapes the table records (oracle/cases.py,
// which evaluates each node's tag-given torch expression).
#include <doctest/doctest.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "golden.hpp"
#include "op_cases.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

template <class T>
bool same_bits(const T* x, const T* y, std::size_t n, std::size_t& at) {
  for (at = 0; at < n; ++at)
    if (std::memcmp(x + at, y + at, sizeof(T)) != 0) return false;
  return true;
}

// Every recorded node of a case: its host loops (what the tape ran) against
// its tag's per-item bodies, forward and each operand's backward from the
// node's own upstream gradient.
template <class T>
void check_host_against_items(const OpCase<T>& c) {
  CAPTURE(c.name);
  RecordedCase<T> r;
  record_case(c, r);
  REQUIRE(r.tp.ok());
  const auto& nodes = r.tp.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node<T>& n = nodes[i];
    with_op(n.op, [&](auto op) {
      using Op = decltype(op);
      if constexpr (Op::arity > 0) {
        CAPTURE(Op::name);
        CAPTURE(i);
        const NodeArgs<T> x = r.tp.args(n);
        std::vector<T> y(n.dims.size());
        ItemLoops<Op>::forward_tensor(x, y.data());
        std::size_t at = 0;
        CHECK_MESSAGE(same_bits(n.value, y.data(), y.size(), at), "forward differs at element ", at);
        if (!n.grad) return;
        auto operand = [&]<int In>(std::integral_constant<int, In>) {
          const std::uint32_t in = In == 0 ? n.a : n.b;
          if (!nodes[in].requires_grad) return;
          const std::size_t size = nodes[in].dims.size();
          std::vector<T> host(size, T(-7)), items(size, T(-9));  // different garbage: every element must be written
          Op::template backward_tensor<In>(x, n.value, n.grad, host.data());
          ItemLoops<Op>::template backward_tensor<In>(x, n.value, n.grad, items.data());
          CHECK_MESSAGE(same_bits(host.data(), items.data(), size, at), "backward of operand ", In,
                        " differs at element ", at);
        };
        operand(std::integral_constant<int, 0>{});
        if constexpr (Op::arity > 1) operand(std::integral_constant<int, 1>{});
      }
    });
  }
}

// Loss, output and every gradient of a case, as bits.
template <class T>
std::vector<T> run_case(const OpCase<T>& c) {
  RecordedCase<T> r;
  record_case(c, r);
  REQUIRE(r.tp.ok());
  std::vector<T> out{r.tp.scalar(r.loss)};
  const View<T> y = r.tp.value(r.out);
  out.insert(out.end(), y.data.begin(), y.data.end());
  for (const Var<T>& v : r.vars)
    if (r.tp.has_grad(v)) {
      const View<T> g = r.tp.grad(v);
      out.insert(out.end(), g.data.begin(), g.data.end());
    }
  return out;
}

// ---- the torch oracle: the table's tapes, written out for oracle/cases.py ----

std::string key_of(std::string name) {
  for (char& ch : name)
    if (ch == ' ' || ch == ',' || ch == '/') ch = '_';
  return name;
}

std::string hex(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

// One line per node: "node <i> <op> <a> <b> <scalar> <axis> dims <d...> extra <e...> torch <expr>",
// leaves as "leaf <i> param|const dims <d...> values <v...>"; "loss <i>" ends a case.
void dump_cases(std::ostream& os) {
  for (const OpCase<double>& c : op_cases<double>()) {
    if (c.large) continue;
    RecordedCase<double> r;
    record_case(c, r);
    REQUIRE(r.tp.ok());
    os << "case " << key_of(c.name) << "\n";
    const auto& nodes = r.tp.nodes();
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const Node<double>& n = nodes[i];
      with_op(n.op, [&](auto op) {
        using Op = decltype(op);
        auto dims = [&] {
          for (std::size_t k = 0; k < n.dims.rank; ++k) os << " " << n.dims.d[k];
        };
        if constexpr (Op::arity == 0) {
          os << "leaf " << i << " " << Op::name << " dims";
          dims();
          os << " values";
          for (std::size_t k = 0; k < n.dims.size(); ++k) os << " " << hex(n.value[k]);
        } else {
          const NodeArgs<double> x = r.tp.args(n);
          os << "node " << i << " " << Op::name << " " << static_cast<long long>(n.a == no_node ? -1 : n.a) << " "
             << static_cast<long long>(n.b == no_node ? -1 : n.b) << " " << hex(n.scalar) << " " << n.axis << " dims";
          dims();
          os << " extra";
          // One per axis of a (slice's starts), or one per row (linear_cross_entropy's classes).
          const std::size_t extras = requires { Op::keeps_row_ids; } ? x.a.dims[0] : x.a.dims.rank;
          if (x.extra)
            for (std::size_t k = 0; k < extras; ++k) os << " " << x.extra[k];
          os << " torch " << Op::torch;
        }
        os << "\n";
      });
    }
    os << "loss " << r.loss.index() << "\n";
  }
}

constexpr double loss_bound = 1e-14;
constexpr double grad_bound = 1e-12;

double relative(double want, double got) {
  if (want == got) return 0;
  return std::fabs(want - got) / std::max(std::fabs(want), 2.2250738585072014e-308);
}

using Golden = std::map<std::string, Tensor<double>>;

void check_against(const Golden& golden) {
  for (const OpCase<double>& c : op_cases<double>()) {
    if (c.large) continue;
    CAPTURE(c.name);
    const std::string key = key_of(c.name);
    REQUIRE_MESSAGE(golden.count(key + ".loss"), "no golden data for this case: regenerate cases_golden.txt");
    RecordedCase<double> r;
    record_case(c, r);
    REQUIRE(r.tp.ok());
    CHECK(relative(golden.at(key + ".loss").data()[0], r.tp.scalar(r.loss)) <= loss_bound);
    for (std::size_t k = 0; k < c.params.size(); ++k) {
      CAPTURE(k);
      const Tensor<double>& want = golden.at(key + ".grad." + std::to_string(k));
      const View<double> got = r.tp.grad(r.vars[k]);
      REQUIRE(want.size() == got.data.size());
      double worst = 0;
      for (std::size_t e = 0; e < want.size(); ++e) worst = std::max(worst, relative(want.data()[e], got.data[e]));
      CHECK(worst <= grad_bound);
    }
  }
}

std::string golden_path() { return oracle_dir() + "/cases_golden.txt"; }

}  // namespace

TEST_CASE_TEMPLATE("every op's host loops compute its per-item bodies' bits, forward and backward", T, double, float) {
  for (const OpCase<T>& c : op_cases<T>()) check_host_against_items(c);
}

TEST_CASE_TEMPLATE("every case gives the same bits on 1, 2 and 3 threads", T, double, float) {
  set_num_threads(1);
  std::vector<std::vector<T>> one;
  for (const OpCase<T>& c : op_cases<T>()) one.push_back(run_case(c));
  for (std::size_t threads : {2, 3}) {
    set_num_threads(threads);
    std::size_t k = 0;
    for (const OpCase<T>& c : op_cases<T>()) {
      CAPTURE(c.name);
      CAPTURE(threads);
      const std::vector<T> got = run_case(c);
      std::size_t at = 0;
      REQUIRE(got.size() == one[k].size());
      CHECK_MESSAGE(same_bits(one[k].data(), got.data(), got.size(), at), "differs at value ", at);
      ++k;
    }
  }
  set_num_threads(1);
}

TEST_CASE("the case table covers every op in OpList") {
  std::set<std::uint8_t> seen;
  for (const OpCase<double>& c : op_cases<double>()) {
    RecordedCase<double> r;
    record_case(c, r);
    REQUIRE(r.tp.ok());
    for (const Node<double>& n : r.tp.nodes()) seen.insert(n.op);
  }
  boost::mp11::mp_for_each<OpList>([&](auto op) {
    CAPTURE(decltype(op)::name);
    CHECK(seen.count(op_code<decltype(op)>) == 1);
  });
}

TEST_CASE("every case matches float64 PyTorch: loss <= 1e-14, every gradient element <= 1e-12 relative") {
  // To regenerate after changing the table: GRAD_CASES_DUMP=/tmp/cases.txt
  // build/test/test_op_cases, then /usr/bin/python3 test/oracle/cases.py /tmp/cases.txt
  if (const char* dump = std::getenv("GRAD_CASES_DUMP")) {
    std::ofstream os(dump);
    dump_cases(os);
    MESSAGE((std::string("wrote the case tapes to ") + dump));
  }
  check_against(load_golden(golden_path()));
}

TEST_CASE("a live run of cases.py on the table's tapes reproduces the golden file") {
  if (!grad::testing::torch_available()) {
    const std::string why = grad::testing::python() + " cannot import torch (apt-get install python3-torch)";
    MESSAGE("skipped: " << why);
    return;
  }
  char dir_template[] = "/tmp/grad_cases_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::filesystem::path dir = dir_template;
  {
    std::ofstream os(dir / "cases.txt");
    dump_cases(os);
  }
  const std::string fresh_path = (dir / "cases_golden.txt").string();
  const std::string command =
      grad::testing::python() + " -B '" + oracle_dir() + "/cases.py' '" + (dir / "cases.txt").string() + "' '" + fresh_path + "'";
  const int rc = std::system(command.c_str());
  const Golden fresh = rc == 0 ? load_golden(fresh_path) : Golden{};
  std::filesystem::remove_all(dir);
  INFO(command);
  REQUIRE(rc == 0);
  const Golden golden = load_golden(golden_path());
  REQUIRE(fresh.size() == golden.size());
  for (const auto& [key, want] : fresh) {
    CAPTURE(key);
    REQUIRE(golden.count(key));
    const Tensor<double>& old = golden.at(key);
    REQUIRE(old.size() == want.size());
    for (std::size_t e = 0; e < want.size(); ++e)
      CHECK(relative(old.data()[e], want.data()[e]) <= (key.ends_with(".loss") ? loss_bound : grad_bound));
  }
  check_against(fresh);
}
