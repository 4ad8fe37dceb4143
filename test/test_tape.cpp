// Tape semantics: copying in, borrowed views, requires-grad propagation,
// mark/reset, repeated backward.
#include <doctest/doctest.h>

#include "support.hpp"

using namespace grad;
using namespace grad::testing;
using T = double;

TEST_CASE("param and constant copy their tensor in") {
  Tensor<T> t({2}, {1, 2});
  Tape<T> tp;
  auto p = tp.param(t);
  t[0] = 99;
  CHECK(tp.value(p)[0] == 1);
  CHECK(tp.requires_grad(p));
  CHECK_FALSE(tp.requires_grad(tp.constant(t)));
}

TEST_CASE("a node with no parameter upstream has no gradient buffer, does no backward work and reads zeros") {
  Tape<T> tp;
  auto w = tp.param(Tensor<T>::full({3, 3}, 0.5));
  auto c = tp.constant(Tensor<T>::full({3, 3}, 2.0));
  const std::size_t param_only = tp.grad_bytes();
  CHECK(param_only == 9 * sizeof(T));
  auto frozen = grad::exp(matmul(c, c));  // constants only: no gradient buffers
  CHECK(tp.grad_bytes() == param_only);
  CHECK_FALSE(tp.requires_grad(frozen));
  auto loss = sum(matmul(frozen, w));
  CHECK(tp.grad_bytes() == param_only + 9 * sizeof(T) + sizeof(T));
  REQUIRE(tp.backward(loss));
  CHECK_FALSE(tp.has_grad(frozen));
  for (T g : tp.grad(frozen)) CHECK(g == 0);
  for (T g : tp.grad(c)) CHECK(g == 0);
  CHECK(tp.grad(frozen).size() == 9);
  CHECK(tp.has_grad(w));
}

TEST_CASE("a parameter the loss does not depend on is not reached by backward") {
  Tape<T> tp;
  auto used = tp.param(Tensor<T>::ones({2})), unused = tp.param(Tensor<T>::ones({2}));
  relu(unused);  // recorded, but not upstream of the loss
  REQUIRE(tp.backward(sum(used * used)));
  CHECK(tp.has_grad(used));
  CHECK_FALSE(tp.has_grad(unused));
  for (T g : tp.grad(unused)) CHECK(g == 0);
}

TEST_CASE("backward twice gives the same gradients, not their sum") {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({3}, {1, 2, 3}));
  auto loss = sum(x * x);
  REQUIRE(tp.backward(loss));
  REQUIRE(tp.backward(loss));
  CHECK(tp.grad(x)[2] == 6);
}

TEST_CASE("a loss that depends on no parameter has all-zero gradients") {
  Tape<T> tp;
  auto c = tp.constant(Tensor<T>::ones({2}));
  CHECK(tp.backward(sum(c)));
  for (T g : tp.grad(c)) CHECK(g == 0);
}

TEST_CASE("borrowed views stay valid while more nodes are recorded") {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({2}, {1, 2}));
  const View<T> v = tp.value(x);
  const T* before = v.data.data();
  for (int i = 0; i < 50; ++i) tp.constant(Tensor<T>({1000}));  // forces new arena chunks
  CHECK(tp.value(x).data.data() == before);
  CHECK(v[1] == 2);
}

TEST_CASE("reset_to drops later nodes, keeps earlier ones and their values") {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({2}, {1, 2}));
  const auto m = tp.mark();
  auto y = x * x;
  REQUIRE(tp.backward(sum(y)));
  tp.reset_to(m);
  CHECK(tp.size() == 1);
  CHECK(tp.value(x)[1] == 2);
  CHECK(tp.value(y).empty());  // y's node is gone
  CHECK_FALSE(tp.has_grad(x));
  CHECK(tp.ok());
}

TEST_CASE("leaf_value writes parameters and constants, not computed nodes") {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({2}, {1, 2}));
  tp.leaf_value(x)[0] = 5;
  CHECK(tp.value(x)[0] == 5);
  CHECK(tp.leaf_value(x * x).empty());
}

TEST_CASE("a rank-0 tensor is recorded as shape [1]") {
  Tape<T> tp;
  auto s = tp.param(Tensor<T>(Shape{}, {3}));
  CHECK(tp.value(s).shape.size() == 1);
  REQUIRE(tp.backward(s * s));
  CHECK(tp.grad(s)[0] == 6);
}

TEST_CASE("a view copies out into an owning Tensor with the same shape and values") {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({2, 2}, {1, 2, 3, 4}));
  const Tensor<T> copy = tp.value(x * x).tensor();
  CHECK(copy.shape() == Shape{2, 2});
  CHECK(copy[3] == 16);
}

// A scalar operand of -0.0 keeps its sign on the vector path as in plain C++
// (x / -0 is -inf for x > 0, x * -0 is -0): the packs' broadcast must not
// turn it into +0. 37 elements: whole packs at every width, and a tail.
template <class U>
void scalar_ops_match_plain_cpp() {
  Tape<U> tp;
  Tensor<U> x({37});
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<U>(i % 3 == 0 ? 1.5 + double(i) : -0.25 - double(i));
  x[5] = U(0);
  x[6] = -U(0);
  const Var<U> a = tp.constant(x);
  const U z = -U(0);
  const std::vector<std::pair<const char*, Var<U>>> ops = {{"a / -0", a / z}, {"a * -0", a * z}, {"a + -0", a + z},
                                                           {"a - -0", a - z}, {"-0 - a", z - a}, {"-0 + a", z + a},
                                                           {"-0 * a", z * a}, {"-0 / a", z / a}};
  const std::vector<U (*)(U, U)> plain = {[](U v, U s) { return v / s; }, [](U v, U s) { return v * s; },
                                          [](U v, U s) { return v + s; }, [](U v, U s) { return v - s; },
                                          [](U v, U s) { return s - v; }, [](U v, U s) { return s + v; },
                                          [](U v, U s) { return s * v; }, [](U v, U s) { return s / v; }};
  using Bits = std::conditional_t<sizeof(U) == 8, std::uint64_t, std::uint32_t>;
  auto bits = [](U v) { return std::bit_cast<Bits>(v); };
  REQUIRE(tp.ok());
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const View<U> y = tp.value(ops[k].second);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const U want = plain[k](x[i], z);
      INFO(std::string(ops[k].first), " at ", i, ": x = ", x[i], ", got ", y[i], ", want ", want);
      CHECK(bits(y[i]) == bits(want));
    }
  }
}

TEST_CASE("a scalar of -0.0 keeps its sign on the tape's vector path, as in plain C++ (float and double)") {
  scalar_ops_match_plain_cpp<double>();
  scalar_ops_match_plain_cpp<float>();
}

// ---- 16-bit constants (a frozen base held as bfloat16 or half) ----

namespace {

// Values with more bits than a bfloat16 or half holds, so that rounding matters.
template <class T>
Tensor<T> narrow_source(Shape shape, Rng& rng) {
  return random_tensor<T>(std::move(shape), rng, -1.5, 1.5);
}

// What a 16-bit constant holds, as a native tensor: each value rounded and widened.
template <class T>
Tensor<T> rounded(const Tensor<T>& t, Storage storage) {
  Tensor<T> r = t;
  for (T& x : r.data()) x = widen<T>(storage, round_to(storage, x));
  return r;
}

// Every op that reads a 16-bit operand, value and gradients, on one tape whose
// weights are held as `storage` (their values already rounded to it): matmul's b
// [k, n] (a batch of rows, and one row: the decoding path), matmul_nt's b
// [n, k], embedding's table and linear_cross_entropy's W (tied, [classes, d]).
template <class T>
struct ReaderRun {
  std::vector<std::vector<T>> values, grads;
};
template <class T>
ReaderRun<T> run_readers(const Tensor<T>& w, const Tensor<T>& wt, const Tensor<T>& table, Storage storage) {
  Tape<T> tp;
  Rng rng(99);
  const Var<T> x = tp.param(random_tensor<T>({7, 40}, rng)), row = tp.param(random_tensor<T>({1, 40}, rng));
  const Var<T> h = tp.param(random_tensor<T>({5, 24}, rng));
  const Var<T> W = tp.constant(w, storage), Wt = tp.constant(wt, storage), E = tp.constant(table, storage);
  CHECK(tp.storage(W) == storage);
  Tensor<T> ids({5}), targets({5});
  for (std::size_t i = 0; i < 5; ++i) {
    ids[i] = static_cast<T>((i * 7) % 33);
    targets[i] = static_cast<T>((i * 5 + 1) % 33);
  }
  const Var<T> y1 = matmul(x, W), y2 = matmul(row, W), y3 = matmul_nt(x, Wt), y4 = matmul_nt(row, Wt);
  const Var<T> e = embedding(E, tp.constant(ids));
  const Var<T> ce = linear_cross_entropy(h, E, tp.constant(targets));
  const Var<T> loss = weighted_sum(y1) + weighted_sum(y2) + weighted_sum(y3) + weighted_sum(y4) +
                      weighted_sum(e * h) + ce;
  REQUIRE_MESSAGE(tp.backward(loss), tp.error());
  ReaderRun<T> r;
  for (Var<T> v : {y1, y2, y3, y4, e, ce, loss}) r.values.emplace_back(tp.value(v).begin(), tp.value(v).end());
  for (Var<T> v : {x, row, h}) r.grads.emplace_back(tp.grad(v).begin(), tp.grad(v).end());
  return r;
}

}  // namespace

TEST_CASE_TEMPLATE("a 16-bit constant gives the bits of a native constant holding its widened values", T, float,
                   double) {
  Rng rng(7);
  const Tensor<T> w = narrow_source<T>({40, 300}, rng), wt = narrow_source<T>({300, 40}, rng);
  const Tensor<T> table = narrow_source<T>({33, 24}, rng);
  for (const auto& [storage, threads] : {std::pair{Storage::bf16, 1}, {Storage::bf16, 3}, {Storage::f16, 1},
                                         {Storage::f16, 3}}) {
    INFO(storage_name(storage), " threads ", threads);
    set_num_threads(static_cast<std::size_t>(threads));
    const ReaderRun<T> held = run_readers(w, wt, table, storage);
    const ReaderRun<T> native =
        run_readers(rounded(w, storage), rounded(wt, storage), rounded(table, storage), Storage::native);
    for (std::size_t i = 0; i < held.values.size(); ++i) {
      INFO("value ", i);
      CHECK(bitwise_equal<T>(held.values[i], native.values[i]));
    }
    for (std::size_t i = 0; i < held.grads.size(); ++i) {
      INFO("gradient ", i);
      CHECK(bitwise_equal<T>(held.grads[i], native.grads[i]));
    }
  }
  set_num_threads(1);
}

TEST_CASE("a 16-bit constant: half the memory, read out widened, written as bits, refused by other ops") {
  Tape<float> tp;
  Tensor<float> t({3, 4});
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 1.0f + static_cast<float>(i) / 1024.0f;  // 1 + i/1024: rounded
  const Var<float> half = tp.constant(t, Storage::f16);
  CHECK(tp.storage(half) == Storage::f16);
  CHECK(tp.widened_value(half)[1] == 1.0f + 1.0f / 1024.0f);  // a half holds 1 + 1/1024
  CHECK(tp.widened_value(half)[3] == 1.0f + 3.0f / 1024.0f);
  CHECK(std::isinf(tp.scalar(tp.constant(Tensor<float>::full({1}, INFINITY), Storage::f16))));  // an infinity stays
  {  // a finite value beyond a half's range (65504) is refused, naming it, with nothing allocated
    Tape<float> big;
    big.constant(t, Storage::f16);
    const std::size_t bytes = summarize(big).value_bytes;
    Tensor<float> over = t;
    over[5] = 65520.0f;  // the tie past 65504: to the even, an infinity
    CHECK_FALSE(big.constant(over, Storage::f16).valid());
    CHECK(big.error() == "grad: const: element 5 of [3, 4] (65520) is beyond f16's range (it would become "
                         "infinite); hold this tensor native (or as bf16)");
    CHECK(summarize(big).value_bytes == bytes);
  }
  const Var<float> w = tp.constant(t, Storage::bf16);
  REQUIRE(tp.ok());
  CHECK(tp.storage(w) == Storage::bf16);
  CHECK(tp.dims(w).size() == 12);
  CHECK(tp.value(w).empty());       // not T: read it widened
  CHECK(tp.leaf_value(w).empty());  // and write its bits
  const Tensor<float> widened = tp.widened_value(w);
  REQUIRE(widened.size() == 12);
  for (std::size_t i = 0; i < t.size(); ++i) CHECK(widened[i] == widen_bf16<float>(round_to_bf16(t[i])));
  CHECK(widened[1] == 1.0f);  // 1 + 1/1024 is not a bfloat16: it rounds to 1
  CHECK(tp.scalar(w) == 1.0f);
  std::span<std::uint16_t> bits = tp.leaf_bits(w);
  REQUIRE(bits.size() == 12);
  bits[0] = round_to_bf16(-2.5f);
  CHECK(tp.widened_value(w)[0] == -2.5f);
  CHECK(tp.leaf_bits(tp.constant(t)).empty());  // a native constant has no bits to write
  // Its value takes half a float's memory in the summary.
  const Tensor<float> big({1000, 100});
  const std::size_t before = summarize(tp).value_bytes;
  tp.constant(big, Storage::bf16);
  CHECK(summarize(tp).value_bytes - before == 200000);
  // Ops that do not widen it themselves refuse it, naming the op, the operand and the readers.
  const Var<float> x = tp.param(Tensor<float>::full({3, 4}, 1.0f));
  const Var<float> bad = x + w;
  CHECK_FALSE(bad.valid());
  CHECK(tp.error().find("add: operand 2 [3, 4] is a bf16 constant, which only matmul's operand 2") !=
        std::string::npos);
  CHECK(tp.error().find("embedding's operand 1") != std::string::npos);
  CHECK(tp.error().find("linear_cross_entropy's operand 2 read; record it as a native constant") != std::string::npos);
  Tape<double> td;  // a half constant likewise, in double
  const Var<double> h = td.constant(Tensor<double>::full({2, 2}, 0.1), Storage::f16);
  CHECK(td.scalar(h) == static_cast<double>(widen_f16<float>(round_to_f16(0.1))));
  CHECK_FALSE(exp(h).valid());
  CHECK(td.error().find("exp: operand 1 [2, 2] is a f16 constant, which only matmul's operand 2") != std::string::npos);
}
