// grad::func: derivatives of functions that record onto a tape, in the
// spirit of torch.func. A function is any callable f(x) that takes a Var and
// records its result from it (a generic lambda, so that the same f runs on a
// Tape<T> and on a Tape<Dual<T>>); func::constant(x, t) puts other data on
// x's tape. docs/second_order.md has the worked examples.
//
//   jvp(f, x, v)             f(x) and J v: forward mode, one Tape<Dual<T>>
//   vjp(f, x, u)             f(x) and u^T J: reverse mode, one Tape<T>
//   value_and_grad(f, x)     f(x) (one element) and its gradient: one Tape<T>
//   hvp(f, x, v)             f(x), its gradient and H v: forward over reverse,
//                            the reverse walk of one Tape<Dual<T>> (the
//                            tangent of the gradient along v is H v)
//   hessian(f, x)            H, column j = H e_j (n HVPs)
//   jacobian(f, x[, mode])   J by n JVPs or m VJPs, the cheaper by default
//   mixed(f, theta, x, u)    f(theta, x), grad_theta f and (d2f / dtheta dx) u:
//                            gradient penalties, physics-informed losses
//
// The values (f(x), the gradient) have the bits a plain Tape<T> gives: the
// value part of a dual number is computed by the same operations.
//
// Bad input throws std::invalid_argument naming the function, the shapes or
// the element and what was expected: a tangent or cotangent of another
// shape, a non-finite one, a function that records nothing (returns a
// default Var or one of another tape), an output that is not one element
// where one is needed. An op that cannot carry a tangent yet throws
// grad::TapeError naming it (the tape is in exception mode).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "grad/dual.hpp"

namespace grad::func {

template <class T>
struct JvpResult {
  Tensor<T> value;    // f(x)
  Tensor<T> tangent;  // J v, f(x)'s shape
};
template <class T>
struct VjpResult {
  Tensor<T> value;  // f(x)
  Tensor<T> grad;   // u^T J, x's shape
};
template <class T>
struct GradResult {
  T value;         // f(x)
  Tensor<T> grad;  // x's shape
};
template <class T>
struct HvpResult {
  T value;         // f(x)
  T directional;   // the gradient . v (f's own tangent along v)
  Tensor<T> grad;  // the gradient, x's shape (the plain tape's bits)
  Tensor<T> hvp;   // H v, x's shape
};

enum class Mode { automatic, forward, reverse };

// t as a constant on x's tape: as it is on a Tape<T>, with zero tangents on
// a Tape<Dual<T>>.
template <class S, Scalar T>
Var<S> constant(Var<S> x, const Tensor<T>& t) {
  if (!x.tape()) throw std::invalid_argument("func::constant: x is a default-constructed Var (it belongs to no tape)");
  if constexpr (std::is_same_v<S, T>) {
    return x.tape()->constant(t);
  } else {
    static_assert(std::is_same_v<S, Dual<T>>, "func::constant: a Tensor<T> goes onto a Tape<T> or a Tape<Dual<T>>");
    std::vector<S> lifted(t.data().begin(), t.data().end());
    return x.tape()->constant(Tensor<S>(t.shape(), std::move(lifted)));
  }
}

namespace detail {

inline std::string shape_text(const Shape& s) { return shape_string(s); }

template <class T>
void check_direction(std::string_view fn, std::string_view what, const Tensor<T>& x, const Tensor<T>& v,
                     std::string_view of = "x") {
  if (v.shape() != x.shape())
    throw std::invalid_argument(std::string(fn) + ": the " + std::string(what) + " has shape " + shape_text(v.shape()) +
                                " but " + std::string(of) + " has shape " + shape_text(x.shape()) +
                                "; expected the same shape");
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) {
      char number[32];
      std::snprintf(number, sizeof number, "%g", static_cast<double>(v[i]));
      throw std::invalid_argument(std::string(fn) + ": element " + std::to_string(i) + " of the " + std::string(what) +
                                  " is " + number + "; expected finite numbers");
    }
}

template <class T>
void check_input(std::string_view fn, const Tensor<T>& x) {
  if (x.size() == 0)
    throw std::invalid_argument(std::string(fn) + ": x has shape " + shape_text(x.shape()) +
                                " with no elements; expected at least one");
}

// f(x) recorded, checked to be a Var of x's tape.
template <class S, class F>
Var<S> call(std::string_view fn, F& f, Var<S> x) {
  static_assert(std::is_invocable_v<F&, Var<S>>, "f must take a Var (write it as a generic lambda: [](auto x) {...})");
  using R = std::invoke_result_t<F&, Var<S>>;
  static_assert(std::is_same_v<R, Var<S>>, "f must return the Var it recorded (of the tape of its argument)");
  Var<S> out = f(x);
  if (!out.tape())
    throw std::invalid_argument(std::string(fn) +
                                ": f recorded nothing: it returned a default-constructed Var, not a node of x's tape");
  if (out.tape() != x.tape())
    throw std::invalid_argument(std::string(fn) + ": f returned a Var of another tape; expected one recorded from x");
  if (!x.tape()->ok()) throw TapeError(x.tape()->error());
  return out;
}

template <class T>
Tensor<Dual<T>> zip(const Tensor<T>& value, const Tensor<T>& tangent) {
  std::vector<Dual<T>> d(value.size());
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = Dual<T>(value[i], tangent[i]);
  return Tensor<Dual<T>>(value.shape(), std::move(d));
}

template <class S>
Shape shape_of(const View<S>& v) {
  return Shape(v.shape.begin(), v.shape.end());
}

// A view's values and tangents as two tensors.
template <class T>
std::pair<Tensor<T>, Tensor<T>> unzip(const View<Dual<T>>& v) {
  Tensor<T> value(shape_of(v)), tangent(shape_of(v));
  for (std::size_t i = 0; i < v.size(); ++i) {
    value[i] = v[i].value;
    tangent[i] = v[i].tangent;
  }
  return {std::move(value), std::move(tangent)};
}

inline Shape joined(const Shape& a, const Shape& b) {
  Shape s = a;
  s.insert(s.end(), b.begin(), b.end());
  return s;
}

template <class S>
void require_one_element(std::string_view fn, Tape<S>& tp, Var<S> out) {
  if (tp.value(out).size() != 1)
    throw std::invalid_argument(std::string(fn) + ": f's output has shape " + shape_text(shape_of(tp.value(out))) +
                                "; expected a single element (reduce it with sum or mean)");
}

// Column j of `out` (a row-major [rows, x.size()] matrix) is column(e_j), a
// tensor of `rows` elements, for each unit tangent e_j of x's shape: the
// Hessian by HVPs, a Jacobian by JVPs.
template <class T, class Column>
void columns_by_unit_tangents(const Tensor<T>& x, std::size_t rows, Tensor<T>& out, Column column) {
  const std::size_t n = x.size();
  Tensor<T> e(x.shape());
  for (std::size_t j = 0; j < n; ++j) {
    e[j] = T(1);
    const Tensor<T> c = column(e);
    e[j] = T(0);
    for (std::size_t i = 0; i < rows; ++i) out[i * n + j] = c[i];
  }
}
}  // namespace detail

// f(x) and its tangent J v (forward mode: x's values carry v's tangents).
template <class F, Scalar T>
JvpResult<T> jvp(F&& f, const Tensor<T>& x, const Tensor<T>& v) {
  detail::check_input("jvp", x);
  detail::check_direction("jvp", "tangent v", x, v);
  Tape<Dual<T>> tp;
  tp.throw_on_error(true);
  const Var<Dual<T>> xv = tp.constant(detail::zip(x, v));  // no backward: no gradient buffers
  const Var<Dual<T>> out = detail::call("jvp", f, xv);
  auto [value, tangent] = detail::unzip(tp.value(out));
  return {std::move(value), std::move(tangent)};
}

// f(x) and u^T J (reverse mode: the gradient of sum(f(x) * u)).
template <class F, Scalar T>
VjpResult<T> vjp(F&& f, const Tensor<T>& x, const Tensor<T>& u) {
  detail::check_input("vjp", x);
  Tape<T> tp;
  tp.throw_on_error(true);
  const Var<T> xv = tp.param(x);
  const Var<T> out = detail::call("vjp", f, xv);
  Tensor<T> value = tp.value(out).tensor();
  detail::check_direction("vjp", "cotangent u", value, u, "f(x)");
  tp.backward(sum(out * tp.constant(u)));
  return {std::move(value), tp.grad(xv).tensor()};
}

// f(x), one element, and its gradient: the plain tape's backward.
template <class F, Scalar T>
GradResult<T> value_and_grad(F&& f, const Tensor<T>& x) {
  detail::check_input("value_and_grad", x);
  Tape<T> tp;
  tp.throw_on_error(true);
  const Var<T> xv = tp.param(x);
  const Var<T> out = detail::call("value_and_grad", f, xv);
  detail::require_one_element("value_and_grad", tp, out);
  tp.backward(out);
  return {tp.value(out)[0], tp.grad(xv).tensor()};
}

// f(x) (one element), its gradient and the Hessian-vector product H v:
// x carries the tangent v, the reverse walk runs over dual values, and the
// gradient's tangent is the derivative of the gradient along v.
template <class F, Scalar T>
HvpResult<T> hvp(F&& f, const Tensor<T>& x, const Tensor<T>& v) {
  detail::check_input("hvp", x);
  detail::check_direction("hvp", "tangent v", x, v);
  Tape<Dual<T>> tp;
  tp.throw_on_error(true);
  const Var<Dual<T>> xv = tp.param(detail::zip(x, v));
  const Var<Dual<T>> out = detail::call("hvp", f, xv);
  detail::require_one_element("hvp", tp, out);
  tp.backward(out);  // seeds the loss's gradient with 1 (tangent 0)
  auto [grad, hv] = detail::unzip(tp.grad(xv));
  const Dual<T> y = tp.value(out)[0];
  return {y.value, y.tangent, std::move(grad), std::move(hv)};
}

template <class T>
struct MixedResult {
  T value;          // f(theta, x)
  Tensor<T> grad;   // the gradient with respect to theta (the plain tape's bits)
  Tensor<T> mixed;  // its derivative along u in x: (d/dx grad_theta f) u
};

// The mixed form, for gradient penalties and physics-informed losses: f
// (one element) of parameters theta and an input x; x carries the tangent
// u, theta none, so the reverse walk's tangent of the gradient with respect
// to theta is the mixed second derivative (d2f / dtheta dx) u. With u =
// grad_x f, twice that is the gradient of the penalty |grad_x f|^2 with
// respect to theta (WGAN-GP; docs/second_order.md).
template <class F, Scalar T>
MixedResult<T> mixed(F&& f, const Tensor<T>& theta, const Tensor<T>& x, const Tensor<T>& u) {
  detail::check_input("mixed", theta);
  detail::check_input("mixed", x);
  detail::check_direction("mixed", "tangent u", x, u);
  Tape<Dual<T>> tp;
  tp.throw_on_error(true);
  const Var<Dual<T>> tv = tp.param(detail::zip(theta, Tensor<T>(theta.shape())));
  const Var<Dual<T>> xv = tp.constant(detail::zip(x, u));
  static_assert(std::is_invocable_v<F&, Var<Dual<T>>, Var<Dual<T>>>, "f must take (theta, x), two Vars");
  auto of_theta = [&](Var<Dual<T>> t) { return f(t, xv); };
  const Var<Dual<T>> out = detail::call("mixed", of_theta, tv);
  detail::require_one_element("mixed", tp, out);
  tp.backward(out);
  auto [grad, second] = detail::unzip(tp.grad(tv));
  return {tp.value(out)[0].value, std::move(grad), std::move(second)};
}

// The Hessian of f (one element) at x, shape x.shape ++ x.shape (row-major:
// element [i, j] = d2f / dx_i dx_j), column j from hvp(f, x, e_j).
template <class F, Scalar T>
Tensor<T> hessian(F&& f, const Tensor<T>& x) {
  detail::check_input("hessian", x);
  Tensor<T> h(detail::joined(x.shape(), x.shape()));
  detail::columns_by_unit_tangents(x, x.size(), h, [&](const Tensor<T>& e) { return hvp(f, x, e).hvp; });
  return h;
}

// The Jacobian of f at x, shape f(x).shape ++ x.shape: by n JVPs (columns)
// or m VJPs (rows); automatic takes forward when n <= m.
template <class F, Scalar T>
Tensor<T> jacobian(F&& f, const Tensor<T>& x, Mode mode = Mode::automatic) {
  detail::check_input("jacobian", x);
  Shape out_shape;
  {
    Tape<T> tp;
    tp.throw_on_error(true);
    const Var<T> out = detail::call("jacobian", f, tp.constant(x));
    out_shape = detail::shape_of(tp.value(out));
  }
  const std::size_t n = x.size();
  std::size_t m = 1;
  for (std::size_t d : out_shape) m *= d;
  if (mode == Mode::automatic) mode = n <= m ? Mode::forward : Mode::reverse;
  Tensor<T> jac(detail::joined(out_shape, x.shape()));
  if (mode == Mode::forward) {
    detail::columns_by_unit_tangents(x, m, jac, [&](const Tensor<T>& e) { return jvp(f, x, e).tangent; });
  } else {
    Tensor<T> u(out_shape);
    for (std::size_t i = 0; i < m; ++i) {
      u[i] = T(1);
      const VjpResult<T> r = vjp(f, x, u);
      u[i] = T(0);
      for (std::size_t j = 0; j < n; ++j) jac[i * n + j] = r.grad[j];
    }
  }
  return jac;
}

}  // namespace grad::func
