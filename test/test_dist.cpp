// grad::dist without MPI: the shard and ownership arithmetic, the documented
// fold (pinned against a hand-written one), LocalShards (the single-process
// S-shard reference every rank count is compared with: test/dist/run.sh) and
// its refusals. The MPI side runs in test 'dist_mpi'.
#include <doctest/doctest.h>

#include <cstring>
#include <grad/dist.hpp>
#include <grad/grad.hpp>
#include <vector>

#include "support.hpp"

namespace dist = grad::dist;
using grad::Tensor;
using grad::Var;

TEST_CASE("split: contiguous, ascending, covering, sizes differ by at most one, the longer ones first") {
  for (std::size_t count : {0u, 1u, 5u, 6u, 7u, 200u, 1001u})
    for (std::size_t n : {1u, 2u, 3u, 4u, 6u, 8u}) {
      std::size_t at = 0, previous = count + 1;
      for (std::size_t k = 0; k < n; ++k) {
        const dist::Range r = dist::split(count, n, k);
        CHECK(r.begin == at);
        CHECK(r.size() <= previous);  // non-increasing
        CHECK(r.size() + 1 >= count / n + (count % n ? 1 : 0));
        previous = r.size();
        at = r.end;
      }
      CHECK(at == count);
    }
  CHECK(dist::shard_rows(200, 6, 0).size() == 34);
  CHECK(dist::shard_rows(200, 6, 5).begin == 167);
  // Ownership: the ranks' blocks in rank order are the shards in order.
  CHECK(dist::owned_shards(6, 4, 0).begin == 0);
  CHECK(dist::owned_shards(6, 4, 0).size() == 2);
  CHECK(dist::owned_shards(6, 4, 3).begin == 5);
}

TEST_CASE("fold: a left fold in ascending shard order, then / S for the mean; not the same bits as other orders") {
  // Three shard values whose sum depends on the order: (a + b) + c != a + (b + c).
  const double a = 1.0, b = 1e-16, c = 1e-16;
  std::vector<double> acc{a};
  const double next1[] = {b}, next2[] = {c};
  dist::fold_add(acc.data(), next1, 1);
  dist::fold_add(acc.data(), next2, 1);
  CHECK(acc[0] == (a + b) + c);
  CHECK(acc[0] != a + (b + c));
  dist::fold_finish(acc.data(), 1, 3, dist::Combine::mean);
  CHECK(acc[0] == ((a + b) + c) / 3.0);
  const double losses[] = {a, b, c};
  CHECK(dist::fold_losses<double>(losses, dist::Combine::sum) == (a + b) + c);
  CHECK(dist::fold_losses<double>(losses, dist::Combine::mean) == ((a + b) + c) / 3.0);
}

namespace {

grad::Tensor<double> seeded(grad::Shape shape, std::uint64_t seed) {
  grad::testing::Rng rng(seed);
  return grad::testing::random_tensor<double>(std::move(shape), rng);
}
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return grad::testing::bitwise_equal<double>(a, b);
}

// A small tanh MLP on a fixed batch of 10 rows: shard s is shard_rows(10, S, s).
struct Net {
  grad::Tape<double> tp;
  Var<double> w1, b1, w2;
  grad::Adam<double> opt{0.01};
  Tensor<double> data = seeded({10, 3}, 11);

  Net() {
    w1 = tp.param(seeded({3, 5}, 12));
    b1 = tp.param(seeded({5}, 13));
    w2 = tp.param(seeded({5, 3}, 14));
    opt.add(w1, 1e-3);
    opt.add(b1);
    opt.add(w2, 1e-3);
    opt.set_clip(0.1);
  }
  Var<double> loss(dist::Range rows) {
    Tensor<double> x({rows.size(), 3});
    std::memcpy(x.data().data(), data.data().data() + 3 * rows.begin, 3 * rows.size() * sizeof(double));
    const Var<double> in = tp.constant(x);
    return grad::mse(grad::matmul(grad::tanh(grad::matmul(in, w1) + b1), w2), in);
  }
  std::vector<double> params() const {
    std::vector<double> all;
    for (Var<double> v : {w1, b1, w2}) all.insert(all.end(), tp.value(v).begin(), tp.value(v).end());
    return all;
  }
  std::vector<double> grads() const {
    std::vector<double> all;
    for (Var<double> v : {w1, b1, w2}) all.insert(all.end(), tp.grad(v).begin(), tp.grad(v).end());
    return all;
  }
};

}  // namespace

TEST_CASE("LocalShards with one shard is the plain loop: backward on the whole batch, then opt.step()") {
  Net plain, sharded;
  const auto mark = plain.tp.mark();
  dist::LocalShards<grad::Adam<double>> shards(sharded.opt, {.shards = 1});
  for (int step = 0; step < 5; ++step) {
    plain.tp.reset_to(mark);
    const Var<double> l = plain.loss({0, 10});
    REQUIRE(plain.tp.backward(l));
    REQUIRE(plain.opt.step());
    const double loss = shards.step([&](std::size_t s) { return sharded.loss(dist::shard_rows(10, 1, s)); });
    CHECK(same_bits(loss, plain.tp.scalar(l)));
  }
  CHECK(same_bits(plain.params(), sharded.params()));
}

TEST_CASE("LocalShards: the gradient is the ascending fold of the shards' own gradients, / S; the loss likewise") {
  for (std::size_t S : {2u, 3u, 4u}) {
    CAPTURE(S);
    // Each shard alone, by hand, on its own tape.
    std::vector<std::vector<double>> g(S);
    std::vector<double> shard_loss(S);
    for (std::size_t s = 0; s < S; ++s) {
      Net alone;
      const Var<double> l = alone.loss(dist::shard_rows(10, S, s));
      REQUIRE(alone.tp.backward(l));
      g[s] = alone.grads();
      shard_loss[s] = alone.tp.scalar(l);
    }
    std::vector<double> expected = g[0];
    double expected_loss = shard_loss[0];
    for (std::size_t s = 1; s < S; ++s) {
      for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = expected[i] + g[s][i];
      expected_loss = expected_loss + shard_loss[s];
    }
    for (double& x : expected) x = x / static_cast<double>(S);
    expected_loss = expected_loss / static_cast<double>(S);

    Net net;
    dist::LocalShards<grad::Adam<double>> shards(net.opt, {.shards = S});
    const double loss = shards.backward([&](std::size_t s) { return net.loss(dist::shard_rows(10, S, s)); });
    CHECK(same_bits(net.grads(), expected));
    CHECK(same_bits(loss, expected_loss));
    CHECK(same_bits(std::vector<double>(shards.shard_losses().begin(), shards.shard_losses().end()), shard_loss));
    // The clip norm opt.step() uses is computed on that folded gradient.
    const double scale = net.opt.clip_scale();
    CHECK(scale < 1.0);  // the test's clip threshold is small enough to bite
  }
}

TEST_CASE("LocalShards: Combine::sum of shard sums / B is the batch's sum / B, up to the order of additions") {
  Net a;
  dist::LocalShards<grad::Adam<double>> shards(a.opt, {.shards = 3, .combine = dist::Combine::sum});
  const double loss = shards.backward([&](std::size_t s) {
    const Var<double> l = a.loss(dist::shard_rows(10, 3, s));  // mse: a mean over the shard's elements
    const double n = static_cast<double>(dist::shard_rows(10, 3, s).size());
    return l * (n / 10.0);  // the shard's share of the batch mean
  });
  Net b;
  const Var<double> whole = b.loss({0, 10});
  CHECK(loss == doctest::Approx(b.tp.scalar(whole)).epsilon(1e-14));
}

TEST_CASE("LocalShards refuses a shard whose loss does not reach every parameter, and a poisoned shard") {
  Net net;
  dist::LocalShards<grad::Adam<double>> shards(net.opt, {.shards = 2});
  CHECK_THROWS_WITH_AS(shards.backward([&](std::size_t) { return grad::sum(net.w1); }),
                       doctest::Contains("was not reached by the shard's backward"), dist::Error);
  Net poisoned;
  dist::LocalShards<grad::Adam<double>> more(poisoned.opt, {.shards = 2});
  CHECK_THROWS_WITH_AS(more.backward([&](std::size_t) { return grad::matmul(poisoned.w1, poisoned.w1); }),
                       doctest::Contains("shard 0: grad: matmul"), dist::Error);
  CHECK_THROWS_AS(dist::LocalShards<grad::Adam<double>>(net.opt, {.shards = 0}), dist::Error);
}
