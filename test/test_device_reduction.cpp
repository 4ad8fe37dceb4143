// The one order of every full reduction (grad/tags/reduce.hpp), checked bit
// for bit in each of the forms the engines compute it in: the host's row
// form (sum_fixed, vectorised), one lane per thread (lane_sum, what a CUDA
// warp runs), a block of threads (block_sum_fixed, what the CUDA kernels and
// the CPU backend run) at several block sizes and thread orders, the tape's
// sum / mean / clip norm, and the device engine. The suite also runs with
// GRAD_ISA=avx2 and baseline (test/meson.build).
#include <doctest/doctest.h>

#include <cstring>
#include <grad/device/device.hpp>
#include <vector>

#include "../kernels/block_reduce.hpp"
#include "support.hpp"

using namespace grad;
using namespace grad::testing;
namespace fo = grad::fixed_order;

namespace {

// The order written from its definition (as test_identities does).
template <class T>
T documented_sum(const T* x, std::size_t n, int level = 0) {
  if (n > 4096 && level < 4) {
    std::vector<T> next;
    for (std::size_t c = 0; c < n; c += 4096)
      next.push_back(documented_sum(x + c, std::min<std::size_t>(4096, n - c), 4));
    return documented_sum(next.data(), next.size(), level + 1);
  }
  T lane[32] = {};
  for (std::size_t i = 0; i < n; ++i) lane[i % 32] = lane[i % 32] + x[i];
  for (std::size_t w = 16; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) lane[j] = lane[j] + lane[j + w];
  return lane[0];
}

template <class T>
bool same(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Values of very different magnitudes, so that any change of order shows.
template <class T>
std::vector<T> spread(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(rng.uniform(-1, 1) * std::ldexp(1.0, static_cast<int>(rng.next() % 40) - 20));
  return v;
}

// kernels.hpp's Block as loops, threads in order or reversed.
struct LoopBlock {
  std::size_t size;
  bool reversed;
  template <class F>
  void step(F&& f) {
    if (reversed)
      for (std::size_t t = size; t-- > 0;) f(t, size);
    else
      for (std::size_t t = 0; t < size; ++t) f(t, size);
  }
  template <class F>
  void step_one(F&& f) {
    f();
  }
};

const std::size_t lengths[] = {
    1, 2, 31, 32, 33, 63, 64, 100, 4095, 4096, 4097, 8191, 8192 + 17, 32 * 4096, 33 * 4096, 1000003, 4096 * 4096 + 5};

}  // namespace

TEST_CASE_TEMPLATE("sum_fixed is the documented order at every length, through every level", T, double, float) {
  for (std::size_t n : lengths) {
    if (std::is_same_v<T, double> && n > 2000000) continue;  // the three-level case runs in float (64 MiB)
    CAPTURE(n);
    const std::vector<T> v = spread<T>(n, n);
    CHECK(same(sum_fixed(v.data(), n), documented_sum(v.data(), n)));
  }
}

TEST_CASE("the level structure: one level up to 4096, then one more per factor of 4096") {
  std::size_t sizes[fo::max_levels + 1];
  CHECK(fo::level_sizes(1, sizes) == 0);
  CHECK(fo::level_sizes(4096, sizes) == 0);
  CHECK(fo::level_sizes(4097, sizes) == 1);
  CHECK(sizes[1] == 2);
  CHECK(fo::level_sizes(4096 * 4096, sizes) == 1);
  CHECK(fo::level_sizes(4096 * 4096 + 1, sizes) == 2);
  CHECK(sizes[1] == 4097);
  CHECK(sizes[2] == 2);
}

TEST_CASE_TEMPLATE("one lane per thread (a CUDA warp) gives the row form's bits", T, double, float) {
  for (std::size_t n : {1, 5, 32, 33, 1000, 4096}) {
    CAPTURE(n);
    const std::vector<T> v = spread<T>(n, 7 * n);
    T lanes[32];
    for (std::size_t j = 0; j < 32; ++j) lanes[j] = fo::lane_sum(v.data(), n, j);
    CHECK(same(fo::combine_lanes(lanes), fo::lanes32(v.data(), n)));
    for (std::size_t j = 0; j < 32; ++j) lanes[j] = fo::lane_sum(v.data(), n, j, fo::Square{});
    CHECK(same(fo::combine_lanes(lanes), fo::lanes32(v.data(), n, fo::Square{})));
  }
}

TEST_CASE_TEMPLATE("a block of any size, threads in any order, gives sum_fixed's bits", T, double, float) {
  std::vector<T> shared(device::block_sum_shared);
  for (std::size_t n : {1, 33, 4096, 4097, 40000, 33 * 4096 + 1, 1000003}) {
    const std::vector<T> v = spread<T>(n, 3 * n);
    const T want = sum_fixed(v.data(), n), want_sq = sum_fixed(v.data(), n, fo::Square{});
    for (std::size_t threads : {1, 32, 96, 256, 1024})
      for (bool reversed : {false, true}) {
        CAPTURE(n);
        CAPTURE(threads);
        CAPTURE(reversed);
        LoopBlock block{threads, reversed};
        CHECK(same(device::block_sum_fixed(v.data(), n, fo::Identity{}, shared.data(), block), want));
        CHECK(same(device::block_sum_fixed(v.data(), n, fo::Square{}, shared.data(), block), want_sq));
      }
  }
}

TEST_CASE("sum and mean on the tape are the same bits at every thread count") {
  const std::vector<double> v = spread<double>(300001, 5);
  const Tensor<double> t({300001}, v);
  std::vector<double> got;
  for (std::size_t threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tape<double> tp;
    auto x = tp.param(t);
    auto loss = sum(x) + mean(x * x);
    REQUIRE(tp.backward(loss));
    got.push_back(tp.scalar(loss));
  }
  set_num_threads(1);
  CHECK(same(got[0], got[1]));
  CHECK(same(got[0], got[2]));
  const double want = documented_sum(v.data(), v.size());
  std::vector<double> sq(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) sq[i] = v[i] * v[i];
  CHECK(same(got[0], want + documented_sum(sq.data(), sq.size()) / 300001.0));
}

TEST_CASE("the global clip norm: each parameter's squares in the fixed order, then add order") {
  Rng rng(4);
  Tape<double> tp;
  auto a = tp.param(random_tensor<double>({70, 90}, rng, -3, 3)), b = tp.param(random_tensor<double>({5000}, rng));
  auto c = tp.param(random_tensor<double>({3}, rng));
  REQUIRE(tp.backward(sum(a * a) * 0.5 + sum(b * b * b) + sum(c)));
  grad::SGD<double> opt(0.1);
  for (auto p : {a, b, c}) REQUIRE(opt.add(p));
  opt.set_clip(1e-3);
  double acc = 0;
  for (auto p : {a, b, c}) {
    std::vector<double> sq;
    for (double g : tp.grad(p)) sq.push_back(g * g);
    acc = acc + documented_sum(sq.data(), sq.size());
  }
  CHECK(same(opt.clip_scale(), 1e-3 / std::sqrt(acc)));
}

TEST_CASE("the device engine's sum, mean and clip norm match the tape on the CPU backend") {
  // 10,000 elements: three chunks, so the block's levels are exercised.
  Rng rng(6);
  Tape<double> tp;
  auto w = tp.param(random_tensor<double>({100, 100}, rng));
  auto x = tp.constant(random_tensor<double>({100, 100}, rng));
  auto loss = mean(w * x) + sum(w * w) * 1e-3;
  REQUIRE(tp.backward(loss));
  grad::SGD<double> host(0.1);
  REQUIRE(host.add(w));
  host.set_clip(1e-4);
  for (device::Mode mode : {device::Mode::per_node, device::Mode::fused}) {
    auto prog = device::capture(tp, loss, {.mode = mode});
    prog.forward();
    CHECK(same(prog.loss(), tp.scalar(loss)));
    prog.backward();
    device::SGD<double> opt(prog, 0.1);
    opt.add(w);
    opt.set_clip(1e-4);
    opt.step();
    // The step applied the tape's clip factor: compare with the host rule.
    const Tensor<double> after = prog.value(w);
    std::vector<double> expected(tp.value(w).begin(), tp.value(w).end());
    const double scale = host.clip_scale();
    CHECK(scale < 1.0);
    const View<double> g = tp.grad(w);
    for (std::size_t i = 0; i < expected.size(); ++i)
      expected[i] = SgdRule::update(expected[i], ClipRule::effective(g[i], expected[i], scale, 0.0), 0.1);
    CHECK(bitwise_equal<double>(after.data(), expected));
  }
}
