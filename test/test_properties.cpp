// Property test: random graphs over every op, generated from fixed seeds, each
// checked five ways:
//   1. gradients against central differences (small graphs);
//   2. the episode re-recorded after reset_to lands on the same bits;
//   3. the same bits on 1, 2 and 3 threads (wide graphs cross the split sizes);
//   4. the same bits from the device engine's CPU backend in every mode;
//   5. random bad calls poison the tape with a message naming the op and the
//      operands' shapes.
// Fixed length by default (default_graphs); GRAD_PROPERTY_GRAPHS=N runs N
// small graphs, N/10 wide ones and N bad calls, GRAD_PROPERTY_SEED=S starts
// elsewhere. A failure prints the seed and the graph: GRAD_PROPERTY_SEED=seed
// GRAD_PROPERTY_GRAPHS=1 reproduces it alone.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <grad/device/device.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "support.hpp"

using namespace grad;
using namespace grad::testing;
namespace dev = grad::device;

namespace {

using T = double;

// One graph: parameters (initial values) and steps that replay it onto any
// tape. Each step appends one value to the replay's list; the last is the
// output the loss reads.
struct Graph {
  std::vector<Tensor<T>> params;
  using Step = std::function<Var<T>(Tape<T>&, const std::vector<Var<T>>& params, const std::vector<Var<T>>& values)>;
  std::vector<Step> steps;
  std::vector<std::string> text;  // what each step did, for failure messages

  Var<T> build(Tape<T>& tp, const std::vector<Var<T>>& vars) const {
    std::vector<Var<T>> values;
    for (const Step& s : steps) values.push_back(s(tp, vars, values));
    // The output through fixed weights, plus a second use of an earlier value (fan-out).
    return weighted_sum(values.back()) + mean(values[values.size() / 2] * values[values.size() / 2]);
  }
  std::string describe() const {
    std::string s;
    for (std::size_t i = 0; i < text.size(); ++i) s += "  v" + std::to_string(i) + " = " + text[i] + "\n";
    return s;
  }
};

std::size_t env_or(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? static_cast<std::size_t>(std::strtoull(v, nullptr, 10)) : fallback;
}

// Builds a Graph step by step against a scratch tape, so that every choice
// (operands, shapes, shifts away from kinks) sees real shapes and values.
class Generator {
 public:
  Generator(std::uint64_t seed, std::size_t wide) : rng_(seed), wide_(wide) {}

  Graph make(std::size_t length) {
    param(random_shape());
    if (rng_.next() % 2) param(random_shape());
    while (g_.steps.size() < length) {
      const std::size_t before = g_.steps.size();
      const auto& gen = generators()[rng_.next() % generators().size()];
      gen(*this);
      REQUIRE_MESSAGE(tp_.ok(), tp_.error() << "\n" << g_.describe());
      if (g_.steps.size() > before && max_abs(last()) > 50) unary("tanh", [](Var<T> x) { return grad::tanh(x); });
    }
    if (!wide_) {
      layout_generators()[rng_.next() % layout_generators().size()](*this);
      REQUIRE_MESSAGE(tp_.ok(), tp_.error() << "\n" << g_.describe());
    }
    return std::move(g_);
  }

 private:
  using Gen = std::function<void(Generator&)>;

  // ---- the pool of values and how steps join it ----
  Var<T> last() const { return values_.back(); }
  const Dims& dims(Var<T> v) const { return tp_.dims(v); }
  double max_abs(Var<T> v) const {
    double m = 0;
    for (T x : tp_.value(v)) m = std::max(m, std::abs(static_cast<double>(x)));
    return m;
  }
  std::size_t pick() { return rng_.next() % values_.size(); }
  std::size_t dim() { return 1 + rng_.next() % 4; }
  Shape random_shape() {
    Shape s(1 + rng_.next() % 3);
    for (std::size_t& d : s) d = dim();
    if (wide_) s.back() *= wide_;  // wide graphs: rows of several thousand elements
    return s;
  }
  std::string name(std::size_t i) const { return std::string("v").append(std::to_string(i)); }

  void push(Graph::Step step, std::string text) {
    values_.push_back(step(tp_, vars_, values_));
    g_.steps.push_back(std::move(step));
    g_.text.push_back(std::move(text));
  }
  // A new parameter of the given shape, as a step.
  std::size_t param(const Shape& s) {
    const std::size_t p = g_.params.size();
    g_.params.push_back(random_tensor<T>(s, rng_));
    vars_.push_back(tp_.param(g_.params.back()));
    push([p](Tape<T>&, const auto& params, const auto&) { return params[p]; }, "param " + shape_string(s));
    return values_.size() - 1;
  }
  template <class F>
  void unary(std::string op, F f) {
    const std::size_t a = values_.size() - 1;
    push([a, f](Tape<T>&, const auto&, const auto& v) { return f(v[a]); }, op + "(" + name(a) + ")");
  }
  template <class F>
  void unary_at(std::size_t a, std::string op, F f) {
    push([a, f](Tape<T>&, const auto&, const auto& v) { return f(v[a]); }, op + "(" + name(a) + ")");
  }
  template <class F>
  void binary_at(std::size_t a, std::size_t b, std::string op, F f) {
    push([a, b, f](Tape<T>&, const auto&, const auto& v) { return f(v[a], v[b]); },
         op + "(" + name(a) + ", " + name(b) + ")");
  }
  // A positive value derived from v[a]: x*x + c, c in [0.5, 1.5] (log, sqrt and
  // denominators stay away from their poles).
  std::size_t positive(std::size_t a) {
    const T c = static_cast<T>(rng_.uniform(0.5, 1.5));
    unary_at(a, "square+" + std::to_string(c), [c](Var<T> x) { return x * x + c; });
    return values_.size() - 1;
  }
  // A shape that broadcasts against s: some axes set to 1, some leading axes dropped.
  Shape broadcastable(const Dims& s) {
    Shape out = s.shape();
    for (std::size_t& d : out)
      if (rng_.next() % 3 == 0) d = 1;
    const std::size_t drop = rng_.next() % out.size();
    out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(drop));
    return out;
  }
  // v[a] as a matrix [rows, last] (a reshape step when it is not one already).
  std::size_t as_matrix(std::size_t a) {
    const Dims d = dims(values_[a]);
    if (d.rank == 2) return a;
    const Shape m{d.size() / d.back(), d.back()};
    unary_at(a, "reshape" + shape_string(m), [m](Var<T> x) { return reshape(x, m); });
    return values_.size() - 1;
  }

  // One generator per op family; make() picks among them uniformly. The
  // coverage case below fails when an op in OpList is never recorded.
  static const std::vector<Gen>& generators() {
    static const std::vector<Gen> all = {
        [](Generator& g) {  // add / sub / mul with broadcasting, either operand order
          const std::size_t a = g.pick();
          const std::size_t b = g.param(g.broadcastable(g.dims(g.values_[a])));
          const bool swap = g.rng_.next() % 2;
          const std::size_t x = swap ? b : a, y = swap ? a : b;
          switch (g.rng_.next() % 3) {
            case 0:
              return g.binary_at(x, y, "add", [](Var<T> p, Var<T> q) { return p + q; });
            case 1:
              return g.binary_at(x, y, "sub", [](Var<T> p, Var<T> q) { return p - q; });
            default:
              return g.binary_at(x, y, "mul", [](Var<T> p, Var<T> q) { return p * q; });
          }
        },
        [](Generator& g) {  // div by a positive broadcastable denominator
          const std::size_t a = g.pick();
          const std::size_t d = g.positive(g.param(g.broadcastable(g.dims(g.values_[a]))));
          g.binary_at(a, d, "div", [](Var<T> p, Var<T> q) { return p / q; });
        },
        [](Generator& g) {  // neg and the scalar forms
          const T s = static_cast<T>(g.rng_.uniform(0.5, 2.0));
          const std::size_t a = g.pick();
          switch (g.rng_.next() % 6) {
            case 0:
              return g.unary_at(a, "neg", [](Var<T> x) { return -x; });
            case 1:
              return g.unary_at(a, "add_scalar", [s](Var<T> x) { return x + s; });
            case 2:
              return g.unary_at(a, "mul_scalar", [s](Var<T> x) { return s * x; });
            case 3:
              return g.unary_at(a, "div_scalar", [s](Var<T> x) { return x / s; });
            case 4:
              return g.unary_at(a, "scalar_sub", [s](Var<T> x) { return s - x; });
            default:
              return g.unary_at(g.positive(a), "scalar_div", [s](Var<T> x) { return s / x; });
          }
        },
        [](Generator& g) {  // relu, shifted so that no element sits within 0.05 of the kink
          const std::size_t a = g.pick();
          const View<T> v = g.tp_.value(g.values_[a]);
          for (T shift : {T(0), T(0.1), T(-0.1), T(0.25), T(-0.25), T(0.4)}) {
            const bool clear = std::all_of(v.begin(), v.end(), [&](T x) { return std::abs(x + shift) >= 0.05; });
            if (!clear) continue;
            return g.unary_at(a, "relu(+" + std::to_string(shift) + ")", [shift](Var<T> x) { return relu(x + shift); });
          }
        },
        [](Generator& g) {  // the smooth pointwise ops
          const std::size_t a = g.pick();
          switch (g.rng_.next() % 6) {
            case 0:
              return g.unary_at(a, "sigmoid", [](Var<T> x) { return sigmoid(x); });
            case 4:
              return g.unary_at(a, "gelu", [](Var<T> x) { return gelu(x); });
            case 1:
              return g.unary_at(a, "tanh", [](Var<T> x) { return grad::tanh(x); });
            case 2:
              return g.unary_at(a, "exp(tanh)", [](Var<T> x) { return grad::exp(grad::tanh(x)); });
            case 3:
              return g.unary_at(g.positive(a), "log", [](Var<T> x) { return grad::log(x); });
            default:
              return g.unary_at(g.positive(a), "sqrt", [](Var<T> x) { return grad::sqrt(x); });
          }
        },
        [](Generator& g) {  // dropout with a key from the graph's seed: a fixed mask, linear in x
          const std::size_t a = g.pick();
          const std::uint64_t key = g.rng_.next();
          return g.unary_at(a, "dropout", [key](Var<T> x) { return dropout(x, 0.25, key); });
        },
        [](Generator& g) {  // reductions
          const std::size_t a = g.pick();
          switch (g.rng_.next() % 3) {
            case 0:
              return g.unary_at(a, "sum", [](Var<T> x) { return sum(x); });
            case 1:
              return g.unary_at(a, "mean", [](Var<T> x) { return mean(x); });
            default:
              return g.unary_at(a, "row_sum", [](Var<T> x) { return row_sum(x); });
          }
        },
        [](Generator& g) {  // matmul against a new [k, n] parameter
          const std::size_t a = g.as_matrix(g.pick());
          const std::size_t b = g.param({g.dims(g.values_[a])[1], g.dim()});
          g.binary_at(a, b, "matmul", [](Var<T> x, Var<T> y) { return matmul(x, y); });
        },
        [](Generator& g) {  // bmm: [B, m, k] x [B, k, n]
          const std::size_t m = g.as_matrix(g.pick());
          const Dims d = g.dims(g.values_[m]);
          const Shape batched{1, d[0], d[1]};
          g.unary_at(m, "reshape" + shape_string(batched), [batched](Var<T> x) { return reshape(x, batched); });
          const std::size_t a = g.values_.size() - 1;
          const std::size_t b = g.param({1, d[1], g.dim()});
          g.binary_at(a, b, "bmm", [](Var<T> x, Var<T> y) { return bmm(x, y); });
        },
        [](Generator& g) {  // transpose (of a matrix view when rank 1)
          std::size_t a = g.pick();
          if (g.dims(g.values_[a]).rank < 2) a = g.as_matrix(a);
          if (g.dims(g.values_[a]).rank < 2) {
            const Shape row{1, g.dims(g.values_[a]).size()};
            g.unary_at(a, "reshape" + shape_string(row), [row](Var<T> x) { return reshape(x, row); });
            a = g.values_.size() - 1;
          }
          g.unary_at(a, "transpose", [](Var<T> x) { return transpose(x); });
        },
        [](Generator& g) {  // reshape into a random factorisation
          const std::size_t a = g.pick();
          std::size_t n = g.dims(g.values_[a]).size();
          Shape s;
          for (std::size_t f = 2; f <= n && s.size() < 2; ++f)
            if (n % f == 0 && g.rng_.next() % 2) {
              s.push_back(f);
              n /= f;
            }
          s.push_back(n);
          g.unary_at(a, "reshape" + shape_string(s), [s](Var<T> x) { return reshape(x, s); });
        },
        [](Generator& g) {  // slice: a random non-empty range on every axis
          const std::size_t a = g.pick();
          const Dims d = g.dims(g.values_[a]);
          Shape lo(d.rank), hi(d.rank);
          for (std::size_t ax = 0; ax < d.rank; ++ax) {
            lo[ax] = g.rng_.next() % d[ax];
            hi[ax] = lo[ax] + 1 + g.rng_.next() % (d[ax] - lo[ax]);
          }
          g.unary_at(a, "slice" + shape_string(lo) + shape_string(hi),
                     [lo, hi](Var<T> x) { return slice(x, std::span(lo), std::span(hi)); });
        },
        [](Generator& g) {  // concat with a new parameter along a random axis
          const std::size_t a = g.pick();
          const Dims d = g.dims(g.values_[a]);
          const std::size_t ax = g.rng_.next() % d.rank;
          Shape other = d.shape();
          other[ax] = g.dim();
          const std::size_t b = g.param(other);
          const bool swap = g.rng_.next() % 2;
          const std::ptrdiff_t axis = g.rng_.next() % 2
                                          ? static_cast<std::ptrdiff_t>(ax)
                                          : static_cast<std::ptrdiff_t>(ax) - static_cast<std::ptrdiff_t>(d.rank);
          g.binary_at(swap ? b : a, swap ? a : b, "concat axis " + std::to_string(axis),
                      [axis](Var<T> x, Var<T> y) { return concat(x, y, axis); });
        },
        [](Generator& g) {  // softmax over a random axis
          const std::size_t a = g.pick();
          const auto axis = static_cast<std::ptrdiff_t>(g.rng_.next() % g.dims(g.values_[a]).rank);
          g.unary_at(a, "softmax axis " + std::to_string(axis), [axis](Var<T> x) { return softmax(x, axis); });
        },
        [](Generator& g) {  // embedding: a value's rows gathered by constant ids (repeats sum their gradients)
          const std::size_t a = g.as_matrix(g.pick());
          const std::size_t vocab = g.dims(g.values_[a])[0];
          Tensor<T> ids(g.rng_.next() % 2 ? Shape{1 + g.rng_.next() % 5} : Shape{2, 1 + g.rng_.next() % 3});
          for (T& x : ids.data()) x = static_cast<T>(g.rng_.next() % vocab);
          g.push([a, ids](Tape<T>& tp, const auto&, const auto& v) { return embedding(v[a], tp.constant(ids)); },
                 "embedding(" + g.name(a) + ", ids " + shape_string(ids.shape()) + ")");
        },
        [](Generator& g) {  // cross_entropy of a value's rows against constant class ids, one ignored now and then
          const std::size_t a = g.as_matrix(g.pick());
          const Dims d = g.dims(g.values_[a]);
          Tensor<T> ids({d[0]});
          for (T& x : ids.data()) x = g.rng_.next() % 5 == 0 ? T(-1) : static_cast<T>(g.rng_.next() % d[1]);
          g.push([a, ids](Tape<T>& tp, const auto&,
                          const auto& v) { return grad::cross_entropy(v[a], tp.constant(ids), T(-1)); },
                 "cross_entropy(" + g.name(a) + ", ids)");
        },
        // ---- the ops of issue 28; those with kinks or ties are shifted (or
        // skipped) so that every element keeps 0.05 from them ----
        [](Generator& g) {  // abs, shifted like relu
          const std::size_t a = g.pick();
          const View<T> v = g.tp_.value(g.values_[a]);
          for (T shift : {T(0), T(0.1), T(-0.1), T(0.25), T(-0.25), T(0.4)})
            if (std::all_of(v.begin(), v.end(), [&](T x) { return std::abs(x + shift) >= 0.05; }))
              return g.unary_at(a, "abs(+" + std::to_string(shift) + ")",
                                [shift](Var<T> x) { return grad::abs(x + shift); });
        },
        [](Generator& g) {  // clamp, clamp_min or clamp_max at bounds clear of every element
          const std::size_t a = g.pick();
          const View<T> v = g.tp_.value(g.values_[a]);
          const int which = static_cast<int>(g.rng_.next() % 3);
          static constexpr std::pair<T, T> bounds[] = {{-0.5, 0.5}, {-0.3, 0.2}, {-1, 0}, {0.1, 0.8}, {-0.8, -0.1}};
          for (const auto& [lo, hi] : bounds) {
            auto clear = [&](T bound) {
              return std::all_of(v.begin(), v.end(), [&](T x) { return std::abs(x - bound) >= 0.05; });
            };
            if (which == 0 && clear(lo) && clear(hi))
              return g.unary_at(a, "clamp " + std::to_string(lo) + " " + std::to_string(hi),
                                [lo, hi](Var<T> x) { return clamp(x, lo, hi); });
            if (which == 1 && clear(lo))
              return g.unary_at(a, "clamp_min " + std::to_string(lo), [lo](Var<T> x) { return clamp_min(x, lo); });
            if (which == 2 && clear(hi))
              return g.unary_at(a, "clamp_max " + std::to_string(hi), [hi](Var<T> x) { return clamp_max(x, hi); });
          }
        },
        [](Generator& g) {  // pow: an integer exponent on any value, a fractional one or a tensor on a positive one
          const std::size_t a = g.pick();
          switch (g.rng_.next() % 3) {
            case 0: {
              const T s = g.rng_.next() % 2 ? T(2) : T(3);
              return g.unary_at(a, "pow " + std::to_string(s), [s](Var<T> x) { return grad::pow(x, s); });
            }
            case 1: {
              const T s = static_cast<T>(g.rng_.uniform(-1.5, 2.5));
              return g.unary_at(g.positive(a), "pow " + std::to_string(s), [s](Var<T> x) { return grad::pow(x, s); });
            }
            default: {
              const std::size_t base = g.positive(a);
              const std::size_t e = g.param(g.broadcastable(g.dims(g.values_[base])));
              return g.binary_at(base, e, "pow", [](Var<T> x, Var<T> y) { return grad::pow(x, y); });
            }
          }
        },
        [](Generator& g) {  // maximum / minimum against a broadcastable parameter, shifted clear of ties
          const std::size_t a = g.pick();
          const std::size_t b = g.param(g.broadcastable(g.dims(g.values_[a])));
          const View<T> gap = g.tp_.value(g.values_[a] - g.values_[b]);  // a probe on the scratch tape only
          const bool larger = g.rng_.next() % 2;
          for (T shift : {T(0), T(0.1), T(-0.1), T(0.25), T(-0.25), T(0.4)})
            if (std::all_of(gap.begin(), gap.end(), [&](T x) { return std::abs(x - shift) >= 0.05; })) {
              if (larger)
                return g.binary_at(a, b, "maximum(+" + std::to_string(shift) + ")",
                                   [shift](Var<T> x, Var<T> y) { return maximum(x, y + shift); });
              return g.binary_at(b, a, "minimum(+" + std::to_string(shift) + ")",
                                 [shift](Var<T> y, Var<T> x) { return minimum(y + shift, x); });
            }
        },
        [](Generator& g) {  // where with a constant 0/1 mask of a broadcastable shape
          const std::size_t a = g.pick();
          const std::size_t b = g.param(g.broadcastable(g.dims(g.values_[a])));
          Tensor<T> mask(g.broadcastable(g.dims(g.values_[a])));
          for (T& x : mask.data()) x = static_cast<T>(g.rng_.next() % 2);
          g.push([a, b, mask](Tape<T>& tp, const auto&,
                              const auto& v) { return where(tp.constant(mask), v[a], v[b]); },
                 "where(mask " + shape_string(mask.shape()) + ", " + g.name(a) + ", " + g.name(b) + ")");
        },
        [](Generator& g) {  // max / min over a random axis, when every lane's extreme is clear of the runner-up
          const std::size_t a = g.pick();
          const Dims d = g.dims(g.values_[a]);
          const View<T> v = g.tp_.value(g.values_[a]);
          const std::size_t axis = g.rng_.next() % d.rank;
          const bool largest = g.rng_.next() % 2, keep = g.rng_.next() % 2;
          std::size_t inner = 1;
          for (std::size_t i = axis + 1; i < d.rank; ++i) inner *= d[i];
          const std::size_t n = d[axis];
          for (std::size_t lane = 0; lane < d.size() / n; ++lane) {
            const std::size_t base = lane / inner * n * inner + lane % inner;
            std::vector<T> x(n);
            for (std::size_t i = 0; i < n; ++i) x[i] = (largest ? 1 : -1) * v[base + i * inner];
            std::sort(x.begin(), x.end());
            if (n > 1 && x[n - 1] - x[n - 2] < 0.05) return;
          }
          const auto ax = static_cast<std::ptrdiff_t>(axis);
          g.unary_at(a, std::string(largest ? "max" : "min") + " axis " + std::to_string(axis) + (keep ? "" : " dropped"),
                     [ax, largest, keep](Var<T> x) { return largest ? grad::max(x, ax, keep) : grad::min(x, ax, keep); });
        },
        [](Generator& g) {  // log_softmax over a random axis
          const std::size_t a = g.pick();
          const auto axis = static_cast<std::ptrdiff_t>(g.rng_.next() % g.dims(g.values_[a]).rank);
          g.unary_at(a, "log_softmax axis " + std::to_string(axis), [axis](Var<T> x) { return log_softmax(x, axis); });
        },
        // ---- the fused ops of issue 27 ----
        [](Generator& g) {  // matmul_nt against a new [n, k] parameter
          const std::size_t a = g.as_matrix(g.pick());
          const std::size_t b = g.param({g.dim(), g.dims(g.values_[a])[1]});
          g.binary_at(a, b, "matmul_nt", [](Var<T> x, Var<T> y) { return matmul_nt(x, y); });
        },
        [](Generator& g) {  // linear_cross_entropy of a value's rows (at most 8 columns: the device modes'
                            // per-item bodies recompute logits) against a new W in either layout
          std::size_t a = g.as_matrix(g.pick());
          const Dims d = g.dims(g.values_[a]);
          if (d[1] > 8) {
            const Shape lo{0, 0}, hi{d[0], 8};
            g.unary_at(a, "slice to 8 columns", [lo, hi](Var<T> x) { return slice(x, std::span(lo), std::span(hi)); });
            a = g.values_.size() - 1;
          }
          const std::size_t width = std::min<std::size_t>(d[1], 8), classes = g.dim() + 1;
          const bool rows_layout = g.rng_.next() % 2;
          const std::size_t w = g.param(rows_layout ? Shape{classes, width} : Shape{width, classes});
          Tensor<T> ids({d[0]});
          for (T& x : ids.data()) x = g.rng_.next() % 5 == 0 ? T(-1) : static_cast<T>(g.rng_.next() % classes);
          const ClassAxis along = rows_layout ? ClassAxis::rows : ClassAxis::columns;
          g.push(
              [a, w, ids, along](Tape<T>& tp, const auto&, const auto& v) {
                return linear_cross_entropy(v[a], v[w], tp.constant(ids), T(-1), along);
              },
              "linear_cross_entropy(" + g.name(a) + ", " + g.name(w) + ", ids)");
        },
        [](Generator& g) {  // add_scaled / silu_mul (the fused pairs of tags/gated.hpp), broadcasting, either order
          const std::size_t a = g.pick();
          const std::size_t b = g.param(g.broadcastable(g.dims(g.values_[a])));
          const bool swap = g.rng_.next() % 2;
          const std::size_t x = swap ? b : a, y = swap ? a : b;
          if (g.rng_.next() % 2 == 0) return g.binary_at(x, y, "silu_mul", [](Var<T> p, Var<T> q) { return silu_mul(p, q); });
          const T s = static_cast<T>(g.rng_.uniform(-2.0, 2.0));
          g.binary_at(x, y, "add_scaled", [s](Var<T> p, Var<T> q) { return add_scaled(p, q, s); });
        },
        [](Generator& g) {  // rms_norm over the last axis with a new weight; eps 0.1 keeps a row near zero tame
          const std::size_t a = g.pick();
          const std::size_t w = g.param({g.dims(g.values_[a]).back()});
          g.binary_at(a, w, "rms_norm", [](Var<T> x, Var<T> y) { return rms_norm(x, y, T(0.1)); });
        },
        [](Generator& g) {  // layer_norm over the last axis; eps 0.1 keeps a nearly constant row tame
          g.unary_at(g.pick(), "layer_norm", [](Var<T> x) { return layer_norm(x, T(0.1)); });
        },
        [](Generator& g) {  // causal_attention_probs: a matrix [m, c] as q [1, G*t, c] (G 1 or 2), k a new [1, t, c]
          const std::size_t a = g.as_matrix(g.pick());
          const Dims d = g.dims(g.values_[a]);
          const std::size_t m = d[0], c = d[1], t = m % 2 == 0 && g.rng_.next() % 2 ? m / 2 : m;
          const std::size_t k = g.param({1, t, c});
          g.binary_at(a, k, "causal_attention_probs G " + std::to_string(m / t), [m, c](Var<T> x, Var<T> y) {
            return causal_attention_probs(reshape(x, {1, m, c}), y, T(0.5));
          });
        },
        [](Generator& g) {  // attention_context: a matrix [m, t] (t dividing m) as p [1, m, t], v a new [1, t, hd]
          const std::size_t a = g.as_matrix(g.pick());
          const Dims d = g.dims(g.values_[a]);
          const std::size_t m = d[0], t = d[1];
          if (m % t != 0) return;
          const std::size_t v = g.param({1, t, g.dim()});
          g.binary_at(a, v, "attention_context G " + std::to_string(m / t),
                      [m, t](Var<T> x, Var<T> y) { return attention_context(reshape(x, {1, m, t}), y); });
        },
    };
    return all;
  }

  // Attention's layout ops, one as the last step of every small graph (make):
  // drawn after the other generators' steps, so those graphs stay the ones
  // the suite has always drawn; wide graphs leave them out (no threaded loops).
  static const std::vector<Gen>& layout_generators() {
    static const std::vector<Gen> all = {
        // (heads_major's and rope_heads_major's results go back to [m, w]: as
        // matrices [m * heads, w / heads] they would grow tall)
        [](Generator& g) {  // heads_major: a matrix [m, w] as batch (dividing m) x heads (dividing w)
          const std::size_t a = g.as_matrix(g.pick());
          const Dims d = g.dims(g.values_[a]);
          const std::size_t m = d[0], w = d[1], batch = m % 2 == 0 && g.rng_.next() % 2 ? 2 : 1,
                            heads = w % 2 == 0 ? 2 : 1;
          g.unary_at(a, "heads_major batch " + std::to_string(batch) + " heads " + std::to_string(heads),
                     [m, w, batch, heads](Var<T> x) { return reshape(heads_major(x, batch, heads), {m, w}); });
        },
        [](Generator& g) {  // rows_major: a matrix [m, c] as heads-major [m, 1, c] (batch 1 or 2): rows stay rows
          const std::size_t a = g.as_matrix(g.pick());
          const Dims d = g.dims(g.values_[a]);
          const std::size_t m = d[0], c = d[1], batch = m % 2 == 0 && g.rng_.next() % 2 ? 2 : 1;
          g.unary_at(a, "rows_major batch " + std::to_string(batch) + " of [m, 1, c]",
                     [m, c, batch](Var<T> x) { return rows_major(reshape(x, {m, 1, c}), batch); });
        },
        [](Generator& g) {  // rope_heads_major: a matrix [m, w] (w even), heads of 2 (of w past 8), a new table
          const std::size_t a = g.as_matrix(g.pick());
          const Dims d = g.dims(g.values_[a]);
          if (d[1] % 2 != 0) return;
          const std::size_t t = d[0] % 2 == 0 && g.rng_.next() % 2 ? d[0] / 2 : d[0], hd = d[1] > 8 ? d[1] : 2;
          const std::size_t table = g.param({2, t, hd});
          g.binary_at(a, table, "rope_heads_major", [d](Var<T> x, Var<T> y) {
            return reshape(rope_heads_major(x, y), {d[0], d[1]});
          });
        },
    };
    return all;
  }

  Rng rng_;
  std::size_t wide_;
  Graph g_;
  Tape<T> tp_;
  std::vector<Var<T>> vars_, values_;
};

// Loss and every parameter's gradient of one recorded episode.
struct Outcome {
  std::vector<T> bits;  // loss, then every parameter gradient, in order
  bool ok = false;
  std::string error;
};

Outcome record(Tape<T>& tp, const std::vector<Var<T>>& vars, const Graph& g) {
  Outcome o;
  const Var<T> loss = g.build(tp, vars);
  o.ok = tp.backward(loss);
  o.error = tp.error();
  o.bits.push_back(tp.scalar(loss));
  for (const Var<T>& p : vars)
    for (T x : tp.grad(p)) o.bits.push_back(x);
  return o;
}

Outcome fresh(const Graph& g) {
  Tape<T> tp;
  std::vector<Var<T>> vars;
  for (const auto& p : g.params) vars.push_back(tp.param(p));
  return record(tp, vars, g);
}

void check_graph(const Graph& g, bool finite_differences) {
  INFO("graph:\n" << g.describe());
  const Outcome base = fresh(g);
  REQUIRE_MESSAGE(base.ok, base.error);
  REQUIRE(std::isfinite(base.bits[0]));

  if (finite_differences) {
    const FdResult fd = check_gradients<T>(
        g.params, [&](Tape<T>& tp, const auto& v) { return g.build(tp, v); }, 1e-6);
    CHECK_MESSAGE(fd.worst <= 1e-5, "finite differences: worst " << fd.worst << " at " << fd.where);
  }

  {  // reset_to replay: the same episode after another one in between, same bits
    Tape<T> tp;
    std::vector<Var<T>> vars;
    for (const auto& p : g.params) vars.push_back(tp.param(p));
    const auto m = tp.mark();
    const Outcome first = record(tp, vars, g);
    tp.reset_to(m);
    (void)(sum(vars[0] * vars[0]) + T(1));  // a different episode, then back
    tp.reset_to(m);
    const Outcome again = record(tp, vars, g);
    REQUIRE_MESSAGE(again.ok, again.error);
    CHECK_MESSAGE(bitwise_equal<T>(first.bits, again.bits), "reset_to replay differs");
    CHECK(bitwise_equal<T>(base.bits, again.bits));
  }

  for (std::size_t threads : {2, 3}) {  // thread counts
    set_num_threads(threads);
    const Outcome o = fresh(g);
    set_num_threads(1);
    CHECK_MESSAGE(bitwise_equal<T>(base.bits, o.bits), "differs on " << threads << " threads");
  }

  for (dev::Mode mode : {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused}) {  // device engine, CPU backend
    Tape<T> tp;
    std::vector<Var<T>> vars;
    for (const auto& p : g.params) vars.push_back(tp.param(p));
    const Var<T> loss = g.build(tp, vars);
    REQUIRE(tp.backward(loss));
    dev::Program<T> prog = dev::capture(tp, loss, {dev::Backend::cpu, mode});
    prog.forward();
    prog.backward();
    std::vector<T> bits{prog.loss()};
    for (const Var<T>& p : vars) {
      const Tensor<T> grad = prog.grad(p);
      bits.insert(bits.end(), grad.data().begin(), grad.data().end());
    }
    CHECK_MESSAGE(bitwise_equal<T>(base.bits, bits), "device mode " << dev::mode_name(mode) << " differs");
  }
}

std::uint64_t first_seed() { return env_or("GRAD_PROPERTY_SEED", 1); }

// Small graphs per run (and a tenth as many wide ones): about 15 s of CPU,
// most of it finite differences and the wide graphs.
constexpr std::size_t default_graphs = 3000;

}  // namespace

TEST_CASE("random small graphs: finite differences, reset_to replay, thread counts, device modes") {
  const std::size_t count = env_or("GRAD_PROPERTY_GRAPHS", default_graphs);
  std::set<std::uint8_t> seen;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t seed = first_seed() + i;
    CAPTURE(seed);
    Generator gen(seed, 0);
    const Graph g = gen.make(3 + seed % 18);
    check_graph(g, true);
    Tape<T> tp;
    std::vector<Var<T>> vars;
    for (const auto& p : g.params) vars.push_back(tp.param(p));
    g.build(tp, vars);
    for (const Node<T>& n : tp.nodes()) seen.insert(n.op);
  }
  if (count >= 100)  // the default run reaches every op; a generator missing for a new op fails here
    boost::mp11::mp_for_each<OpList>([&](auto op) {
      CAPTURE(decltype(op)::name);
      CHECK(seen.count(op_code<decltype(op)>) == 1);
    });
}

TEST_CASE("random wide graphs (rows past the split sizes): reset_to replay, thread counts, device modes") {
  const std::size_t count = env_or("GRAD_PROPERTY_GRAPHS", default_graphs) / 10;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t seed = first_seed() + 1'000'000 + i;
    CAPTURE(seed);
    Generator gen(seed, 3000);
    check_graph(gen.make(3 + seed % 6), false);
  }
}

TEST_CASE("random bad calls poison the tape with a message naming the op and every operand's shape") {
  Rng rng(first_seed() + 7);
  auto shape = [&](std::size_t rank) {
    Shape s(rank);
    for (std::size_t& d : s) d = 2 + rng.next() % 4;
    return s;
  };
  const std::size_t count = env_or("GRAD_PROPERTY_GRAPHS", default_graphs);
  for (std::size_t i = 0; i < count; ++i) {
    Tape<T> tp;
    Shape sa = shape(1 + rng.next() % 3), sb = sa;
    std::string op;
    std::function<void(Var<T>, Var<T>)> call;
    switch (rng.next() % 7) {
      case 0:  // binary op on shapes that do not broadcast: one axis differs, neither is 1
        sb.back() = sa.back() + 1;
        op = "add";
        call = [](Var<T> a, Var<T> b) { (void)(a + b); };
        break;
      case 1:
        sb.back() = sa.back() + 1;
        op = "div";
        call = [](Var<T> a, Var<T> b) { (void)(a / b); };
        break;
      case 2:  // matmul with mismatched inner sizes
        sa = shape(2);
        sb = {sa[1] + 1, 3};
        op = "matmul";
        call = [](Var<T> a, Var<T> b) { (void)matmul(a, b); };
        break;
      case 3:  // bmm with different batches
        sa = shape(3);
        sb = {sa[0] + 1, sa[2], 2};
        op = "bmm";
        call = [](Var<T> a, Var<T> b) { (void)bmm(a, b); };
        break;
      case 4: {  // concat whose shapes differ off the axis
        sa = shape(2);
        sb = {sa[0] + 1, sa[1] + 1};
        op = "concat";
        call = [](Var<T> a, Var<T> b) { (void)concat(a, b, 1); };
        break;
      }
      case 5: {  // concat on an axis out of range
        sa = shape(2);
        sb = sa;
        op = "concat";
        const auto far = static_cast<std::ptrdiff_t>(rng.next() % 3);
        const std::ptrdiff_t axis = rng.next() % 2 ? 2 + far : -3 - far;  // rank 2: valid are -2 .. 1
        call = [axis](Var<T> a, Var<T> b) { (void)concat(a, b, axis); };
        break;
      }
      default:
        sb.push_back(2);
        op = "mse";
        call = [](Var<T> a, Var<T> b) { (void)mse(a, b); };
        break;
    }
    CAPTURE(op);
    CAPTURE(shape_string(sa));
    CAPTURE(shape_string(sb));
    const Var<T> a = tp.param(Tensor<T>::ones(sa)), b = tp.param(Tensor<T>::ones(sb));
    call(a, b);
    REQUIRE_FALSE(tp.ok());
    CAPTURE(tp.error());
    CHECK(tp.error().find(op) != std::string::npos);
    CHECK(tp.error().find(shape_string(sa)) != std::string::npos);
    CHECK(tp.error().find(shape_string(sb)) != std::string::npos);
    const std::size_t nodes = tp.size();
    (void)(a + b);  // and nothing more is recorded
    CHECK(tp.size() == nodes);
  }
}
