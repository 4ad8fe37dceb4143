// gradcheck (torch.autograd.gradcheck): the tape's gradient of a scalar
// function against central differences, in float64, element by element.
//
//   auto r = grad::gradcheck([](grad::Tape<double>& tp, const std::vector<grad::Var<double>>& x) {
//     return grad::sum(my_norm(x[0]) * x[1]);
//   }, {x0, w0});
//   if (!r.passed) std::cerr << r.report() << "\n";
//
// f records a scalar on the tape it is given from the Vars of `inputs` (as
// parameters, in order); it is called once for the analytic gradient and
// twice per checked element, each time on a fresh tape, so it must be a pure
// function of its inputs (no state carried between calls).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/backward.hpp"
#include "grad/inspect/tape_hooks.hpp"
#include "grad/random.hpp"

namespace grad {

struct GradcheckOptions {
  double step = 1e-6;  // central-difference step, scaled by max(1, |x|)
  // An element passes when |analytic - numeric| <= atol + rtol * |numeric|
  // (torch.autograd.gradcheck's rule and defaults).
  double atol = 1e-5;
  double rtol = 1e-3;
  // Above this many input elements in all, a seeded random subset of this
  // size is checked (every element of each input is equally likely). 0: all.
  std::size_t max_elements = 4096;
  std::uint64_t seed = 0x6772616463686b;
};

struct GradcheckResult {
  bool passed = false;
  std::size_t checked = 0;  // elements compared
  std::size_t failures = 0;
  // The worst element (largest |analytic - numeric| / (atol + rtol |numeric|)).
  std::size_t input = 0, element = 0;
  double analytic = 0, numeric = 0, abs_error = 0, rel_error = 0;
  std::string report() const {
    return std::string(passed ? "gradcheck passed" : "gradcheck FAILED") + ": " + std::to_string(checked) +
           " elements checked, " + std::to_string(failures) + " out of tolerance; worst: input " +
           std::to_string(input) + " element " + std::to_string(element) + ": analytic " +
           inspect_detail::number(analytic) + ", numeric " + inspect_detail::number(numeric) + " (|difference| " +
           inspect_detail::number(abs_error) + ", relative " + inspect_detail::number(rel_error) + ")";
  }
};

using GradcheckFunction = std::function<Var<double>(Tape<double>&, const std::vector<Var<double>>&)>;

// Throws std::invalid_argument for what is not a gradient check: no inputs,
// an empty input, an output that is not one element, a tape that f poisoned
// (the message carries the tape's error), or a non-finite output.
inline GradcheckResult gradcheck(const GradcheckFunction& f, const std::vector<Tensor<double>>& inputs,
                                 const GradcheckOptions& options = {}) {
  if (inputs.empty()) throw std::invalid_argument("gradcheck: no inputs");
  if (!(options.step > 0) || !(options.atol >= 0) || !(options.rtol >= 0))
    throw std::invalid_argument("gradcheck: step must be > 0, atol and rtol >= 0");
  auto evaluate = [&](const std::vector<Tensor<double>>& at, Tape<double>& tp, std::vector<Var<double>>& vars) {
    vars.clear();
    for (const Tensor<double>& x : at) vars.push_back(tp.param(x));
    const Var<double> y = f(tp, vars);
    if (!tp.ok()) throw std::invalid_argument("gradcheck: recording f poisoned the tape: " + tp.error());
    const View<double> v = tp.value(y);
    if (!y.valid() || v.size() != 1)
      throw std::invalid_argument("gradcheck: f must return a single-element Var (reduce it with sum or mean); it "
                                  "returned shape " +
                                  shape_string(v.shape));
    if (!std::isfinite(v[0]))
      throw std::invalid_argument("gradcheck: f's value is not finite (" + inspect_detail::number(v[0]) + ")");
    return y;
  };
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].size() == 0) throw std::invalid_argument("gradcheck: input " + std::to_string(k) + " is empty");

  Tape<double> tp;
  std::vector<Var<double>> vars;
  const Var<double> y = evaluate(inputs, tp, vars);
  if (!tp.backward(y)) throw std::invalid_argument("gradcheck: backward failed: " + tp.error());

  // Which (input, element) pairs to check.
  std::vector<std::size_t> offsets{0};
  for (const Tensor<double>& x : inputs) offsets.push_back(offsets.back() + x.size());
  const std::size_t total = offsets.back();
  std::vector<std::size_t> picks;
  if (options.max_elements == 0 || total <= options.max_elements) {
    picks.resize(total);
    std::iota(picks.begin(), picks.end(), std::size_t{0});
  } else {  // a partial Fisher-Yates shuffle, seeded: the same subset on every run
    std::vector<std::size_t> all(total);
    std::iota(all.begin(), all.end(), std::size_t{0});
    SplitMix64 gen{options.seed};
    for (std::size_t k = 0; k < options.max_elements; ++k)
      std::swap(all[k], all[k + static_cast<std::size_t>(gen.next() % (total - k))]);
    picks.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(options.max_elements));
    std::sort(picks.begin(), picks.end());
  }

  GradcheckResult r;
  double worst = -1;
  std::vector<Tensor<double>> moved = inputs;
  for (std::size_t flat : picks) {
    const std::size_t k = static_cast<std::size_t>(std::upper_bound(offsets.begin(), offsets.end(), flat) -
                                                   offsets.begin()) - 1;
    const std::size_t i = flat - offsets[k];
    const double x0 = inputs[k][i];
    const double h = options.step * std::max(1.0, std::abs(x0));
    auto at = [&](double x) {
      moved[k][i] = x;
      Tape<double> t2;
      std::vector<Var<double>> v2;
      return t2.scalar(evaluate(moved, t2, v2));
    };
    const double numeric = (at(x0 + h) - at(x0 - h)) / (2 * h);
    moved[k][i] = x0;
    const double analytic = tp.grad(vars[k])[i];
    const double diff = std::abs(analytic - numeric);
    const double allowed = options.atol + options.rtol * std::abs(numeric);
    const double score = std::isfinite(diff) ? diff / std::max(allowed, 1e-300) : INFINITY;
    ++r.checked;
    if (!(diff <= allowed)) ++r.failures;
    if (score > worst) {
      worst = score;
      r.input = k;
      r.element = i;
      r.analytic = analytic;
      r.numeric = numeric;
      r.abs_error = diff;
      r.rel_error = diff / std::max({std::abs(analytic), std::abs(numeric), 1e-300});
    }
  }
  r.passed = r.failures == 0;
  return r;
}

}  // namespace grad
