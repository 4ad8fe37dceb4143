// Every op's backward against central differences, driven by the one case
// table (op_cases.hpp; test_op_cases checks that it covers every op).
#include <doctest/doctest.h>

#include "op_cases.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

template <class T>
void run_table(double h, double tolerance) {
  for (const OpCase<T>& c : op_cases<T>()) {
    if (c.large || c.at_kink) continue;
    CAPTURE(c.name);
    const std::size_t params = c.params.size();
    const std::vector<Tensor<T>> constants = c.constants;
    const auto build = c.build;
    // The constants go on the tape after the params, as the table says.
    const FdResult res = check_gradients<T>(
        c.params,
        [&](Tape<T>& tp, const std::vector<Var<T>>& v) {
          std::vector<Var<T>> all(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(params));
          for (const auto& k : constants) all.push_back(tp.constant(k));
          return weighted_sum(build(tp, all));
        },
        h);
    CAPTURE(res.where);
    CAPTURE(res.error);
    CHECK(res.worst <= tolerance);
  }
}

}  // namespace

TEST_CASE("every op's backward matches central differences at f64 (worst relative error <= 1e-6)") {
  run_table<double>(1e-6, 1e-6);
}

TEST_CASE("f32 tapes pass the same table within f32 precision") { run_table<float>(1e-2, 3e-2); }
