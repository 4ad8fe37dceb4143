// grad::dist without MPI: the shard and ownership arithmetic, the documented
// fold (pinned against a hand-written one), LocalShards (the single-process
// S-shard reference every rank count is compared with: test/dist/run.sh) and
// its refusals. The MPI side runs in test 'dist_mpi'.
#include <doctest/doctest.h>

#include <cstring>
#include <grad/device/device.hpp>
#include <grad/dist.hpp>
#include <grad/dist/program.hpp>
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
  Tensor<double> rows(dist::Range r) const {
    Tensor<double> x({r.size(), 3});
    std::memcpy(x.data().data(), data.data().data() + 3 * r.begin, 3 * r.size() * sizeof(double));
    return x;
  }
  Var<double> loss_of(Var<double> in) { return grad::mse(grad::matmul(grad::tanh(grad::matmul(in, w1) + b1), w2), in); }
  Var<double> loss(dist::Range r) { return loss_of(tp.constant(rows(r))); }
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

TEST_CASE("DataParallel on a SoloGroup (one process, no MPI) is LocalShards, bit for bit, even and uneven shards") {
  for (std::size_t S : {1u, 4u, 5u}) {
    CAPTURE(S);
    Net a, b;
    dist::LocalShards<grad::Adam<double>> local(a.opt, {.shards = S});
    dist::SoloGroup solo;
    dist::DataParallel<grad::Adam<double>> ddp(solo, b.opt, {.shards = S, .check_every = 2});
    for (int step = 0; step < 6; ++step) {
      const double la = local.step([&](std::size_t s) { return a.loss(dist::shard_rows(10, S, s)); });
      const double lb = ddp.step([&](std::size_t s) { return b.loss(dist::shard_rows(10, S, s)); });
      CHECK(same_bits(la, lb));
    }
    CHECK(same_bits(a.params(), b.params()));
  }
}

namespace {

// The Net's shard episode captured as a device program (shard 0's rows), and
// its device Adam with the tape optimizer's settings.
struct CapturedNet {
  Net net;
  Var<double> in;
  std::optional<grad::device::Program<double>> program;
  std::optional<grad::device::Adam<double>> opt;

  CapturedNet(std::size_t S, grad::device::Mode mode, bool f32 = false) {
    in = net.tp.constant(net.rows(dist::shard_rows(10, S, 0)));
    program.emplace(grad::device::capture(net.tp, net.loss_of(in), {.mode = mode, .f32 = f32}));
    opt.emplace(*program, 0.01);
    opt->add(net.w1, 1e-3);
    opt->add(net.b1);
    opt->add(net.w2, 1e-3);
    opt->set_clip(0.1);
  }
  std::vector<double> params() {
    std::vector<double> all;
    for (Var<double> v : {net.w1, net.b1, net.w2}) {
      const Tensor<double> t = program->value(v);
      all.insert(all.end(), t.data().begin(), t.data().end());
    }
    return all;
  }
};

}  // namespace

TEST_CASE("ProgramParallel: a captured program's shards land on LocalShards' bits on the tape, in every mode") {
  using grad::device::Mode;
  const std::size_t S = 5;  // equal shards of 2 rows: one program serves them all
  Net reference;
  dist::LocalShards<grad::Adam<double>> local(reference.opt, {.shards = S});
  std::vector<double> losses;
  for (int step = 0; step < 6; ++step)
    losses.push_back(local.step([&](std::size_t s) { return reference.loss(dist::shard_rows(10, S, s)); }));
  CHECK(reference.opt.clip_scale() < 1.0);  // the clip norm bites: the reduced gradient's norm decides it
  for (Mode mode : {Mode::per_node, Mode::graph, Mode::fused}) {
    CAPTURE(grad::device::mode_name(mode));
    CapturedNet c(S, mode);
    dist::SoloGroup solo;
    dist::ProgramParallel<double> ddp(solo, *c.opt, {.shards = S, .check_every = 3});
    CHECK(ddp.owned().size() == S);
    for (int step = 0; step < 6; ++step) {
      const double loss =
          ddp.step([&](std::size_t s) { c.program->set_input(c.in, c.net.rows(dist::shard_rows(10, S, s))); });
      CHECK(same_bits(loss, losses[step]));
    }
    CHECK(same_bits(c.params(), reference.params()));
  }
}

TEST_CASE("ProgramParallel refuses what it cannot reduce, and a failing shard stops the step with its reason") {
  using grad::device::Mode;
  dist::SoloGroup solo;
  {
    CapturedNet c(2, Mode::per_node, /*f32=*/true);  // float engine under a double optimizer
    CHECK_THROWS_WITH_AS(dist::ProgramParallel<double>(solo, *c.opt, {.shards = 2}),
                         doctest::Contains("computes in float32"), dist::Error);
  }
  {
    Net net;
    const Var<double> unused = net.tp.param(seeded({2}, 3));
    const Var<double> in = net.tp.constant(net.rows({0, 5}));
    auto program = grad::device::capture(net.tp, net.loss_of(in));
    grad::device::SGD<double> opt(program, 0.1);
    opt.add(net.w1);
    opt.add(unused);
    CHECK_THROWS_WITH_AS(dist::ProgramParallel<double>(solo, opt, {.shards = 2}),
                         doctest::Contains("1 of the optimizer's 2 parameters are not reached"), dist::Error);
  }
  CapturedNet c(2, Mode::per_node);
  dist::ProgramParallel<double> ddp(solo, *c.opt, {.shards = 2});
  CHECK_THROWS_WITH_AS(ddp.step([&](std::size_t) {
    c.program->set_input(c.in, c.net.rows({0, 3}));
  }),
                       doctest::Contains("step 1 failed on rank(s) 0: shard 0: grad::device::set_input"), dist::Error);
  CHECK_THROWS_AS(dist::ProgramParallel<double>(solo, *c.opt, {.shards = 0}), dist::Error);
}

TEST_CASE("DataParallel checkpoints record the shard count: resuming with another S is refused, changing nothing") {
  const grad::testing::ScratchDir scratch("dist");
  const std::string path = scratch.file("s4.ckpt");
  dist::SoloGroup solo;
  Net a;
  dist::DataParallel<grad::Adam<double>> four(solo, a.opt, {.shards = 4});
  for (int step = 0; step < 3; ++step) four.step([&](std::size_t s) { return a.loss(dist::shard_rows(10, 4, s)); });
  four.save_checkpoint(path);

  Net b;
  dist::DataParallel<grad::Adam<double>> five(solo, b.opt, {.shards = 5});
  const std::vector<double> before = b.params();
  CHECK_THROWS_WITH_AS(five.load_checkpoint(path),
                       doctest::Contains("the file was written with grad.dist.shards = 4; this run has 5"),
                       dist::Error);
  CHECK(same_bits(b.params(), before));
  CHECK(b.opt.steps() == 0);

  Net c;
  dist::DataParallel<grad::Adam<double>> again(solo, c.opt, {.shards = 4});
  again.load_checkpoint(path);
  CHECK(same_bits(c.params(), a.params()));
  CHECK(c.opt.steps() == 3);
}

TEST_CASE("ProgramParallel checkpoints: save after 3 steps, resume in a fresh program (or on the tape), same bits") {
  using grad::device::Mode;
  const grad::testing::ScratchDir scratch("dist-program");
  const std::string path = scratch.file("program.ckpt");
  const std::size_t S = 5;
  dist::SoloGroup solo;
  auto train = [&](CapturedNet& c, dist::ProgramParallel<double>& ddp, int steps) {
    std::vector<double> losses;
    for (int k = 0; k < steps; ++k)
      losses.push_back(
          ddp.step([&](std::size_t s) { c.program->set_input(c.in, c.net.rows(dist::shard_rows(10, S, s))); }));
    return losses;
  };
  CapturedNet straight(S, Mode::graph);
  dist::ProgramParallel<double> ddp_straight(solo, *straight.opt, {.shards = S});
  const std::vector<double> all = train(straight, ddp_straight, 6);

  CapturedNet first(S, Mode::graph);
  dist::ProgramParallel<double> ddp_first(solo, *first.opt, {.shards = S});
  train(first, ddp_first, 3);
  ddp_first.save_checkpoint(path, first.net.tp, first.net.opt);  // the Net's host Adam: same parameters, same order

  CapturedNet resumed(S, Mode::fused);  // fresh values, fresh moments, another mode
  dist::ProgramParallel<double> ddp_resumed(solo, *resumed.opt, {.shards = S});
  ddp_resumed.load_checkpoint(path, resumed.net.tp, resumed.net.opt);
  CHECK(resumed.opt->steps() == 3);
  const std::vector<double> rest = train(resumed, ddp_resumed, 3);
  CHECK(same_bits(rest, std::vector<double>(all.begin() + 3, all.end())));
  CHECK(same_bits(resumed.params(), straight.params()));

  // The same file on the tape: DataParallel continues on the same bits.
  Net tape;
  dist::DataParallel<grad::Adam<double>> ddp_tape(solo, tape.opt, {.shards = S});
  ddp_tape.load_checkpoint(path);
  for (int k = 0; k < 3; ++k) ddp_tape.step([&](std::size_t s) { return tape.loss(dist::shard_rows(10, S, s)); });
  CHECK(same_bits(tape.params(), straight.params()));

  // Refusals name what differs and change nothing.
  CapturedNet other(S, Mode::per_node);
  dist::ProgramParallel<double> ddp_other(solo, *other.opt, {.shards = S});
  grad::Adam<double> fewer(0.01);
  fewer.add(other.net.w1);
  CHECK_THROWS_WITH_AS(ddp_other.save_checkpoint(scratch.file("x.ckpt"), other.net.tp, fewer),
                       doctest::Contains("the host optimizer's parameters are not this optimizer's"), dist::Error);
  grad::SGD<double> sgd(0.1);
  for (Var<double> v : {other.net.w1, other.net.b1, other.net.w2}) sgd.add(v);
  CHECK_THROWS_WITH_AS(ddp_other.save_checkpoint(scratch.file("x.ckpt"), other.net.tp, sgd),
                       doctest::Contains("the host optimizer is of another kind"), dist::Error);
  CapturedNet four(4, Mode::per_node);
  dist::ProgramParallel<double> ddp_four(solo, *four.opt, {.shards = 4});
  const std::vector<double> before = four.params();
  CHECK_THROWS_WITH_AS(ddp_four.load_checkpoint(path, four.net.tp, four.net.opt),
                       doctest::Contains("grad.dist.shards = 5; this run has 4"), dist::Error);
  CHECK(same_bits(four.params(), before));
}

TEST_CASE("the MPI watchdog's defaults: a short timeout after the first collective, an exit code of its own") {
  const grad::dist::CommOptions o;
  CHECK(o.first_timeout_s == 60);
  CHECK(o.timeout_s == 30);  // stops a hung job within a minute, MPI_Finalize included
  // Not coreutils timeout's 124-127, nor 128 + a signal: a wrapper can tell a hung peer from its own timeout.
  CHECK(grad::dist::watchdog_exit_code == 75);
  CHECK((grad::dist::watchdog_exit_code < 124 && grad::dist::watchdog_exit_code > 1));
}
