// Recompute scopes (grad/recompute.hpp): the same values and gradients, bit
// for bit, as the same recording without them, in less memory; and the
// refusals of what a scope cannot do.
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>

#include <grad/device/device.hpp>
#include <grad/first_fit.hpp>
#include <grad/emit.hpp>
#include <grad/inspect.hpp>
#include <grad/lm.hpp>

#include "support.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

// A residual stack of blocks, each matmul -> tanh -> softmax -> matmul plus
// a layer-normalised skip; its parameters read outside the blocks too (the
// final product reuses w[0]), so some gradients sum contributions from
// inside and outside the scopes.
template <class T>
struct Stack {
  Tape<T> tp;
  std::vector<Var<T>> w, v;
  Var<T> x, loss;
  std::vector<Var<T>> block_out;

  Stack(std::size_t rows, std::size_t width, std::size_t blocks, bool scoped, bool frozen_first = false) {
    Rng rng(42);
    x = tp.constant(random_tensor<T>({rows, width}, rng));
    for (std::size_t b = 0; b < blocks; ++b) {
      w.push_back(tp.param(random_tensor<T>({width, width}, rng, -0.5, 0.5)));
      v.push_back(tp.param(random_tensor<T>({width, width}, rng, -0.5, 0.5)));
    }
    if (frozen_first) {  // no gradient work inside the first scope
      tp.set_requires_grad(w[0], false);
      tp.set_requires_grad(v[0], false);
    }
    Var<T> h = x;
    for (std::size_t b = 0; b < blocks; ++b) {
      auto block = [&, b, in = h] {
        Var<T> a = softmax(tanh(matmul(in, w[b])), -1);
        return in + matmul(a, v[b]) * in;  // `in` read twice inside, once outside (below)
      };
      h = scoped ? recompute(tp, block) : block();
      block_out.push_back(h);
    }
    loss = mean(matmul(h + x, w[0]) * h);
  }

  bool same_as(const Stack& o) const {
    bool same = bitwise_equal(tp.value(loss).data, o.tp.value(o.loss).data);
    for (std::size_t b = 0; b < w.size(); ++b)
      same = same && bitwise_equal(tp.grad(w[b]).data, o.tp.grad(o.w[b]).data) &&
             bitwise_equal(tp.grad(v[b]).data, o.tp.grad(o.v[b]).data);
    return same;
  }
};

template <class T>
void check_stack(std::size_t threads) {
  set_num_threads(threads);
  for (bool frozen : {false, true}) {
    Stack<T> plain(256, 64, 4, false, frozen), scoped(256, 64, 4, true, frozen);
    REQUIRE(plain.tp.backward(plain.loss));
    REQUIRE(scoped.tp.backward(scoped.loss));
    CHECK(scoped.same_as(plain));
    // A second walk over the same recording replays again: the same bits.
    REQUIRE(scoped.tp.backward(scoped.loss));
    CHECK(scoped.same_as(plain));
    // Only the blocks' outputs are kept; the shared memory is one block's.
    CHECK(scoped.tp.arena_bytes() < plain.tp.arena_bytes());
    CHECK(scoped.tp.recompute_bytes() > 0);
    CHECK(plain.tp.recompute_bytes() == 0);
  }
  set_num_threads(1);
}

nn::LmConfig lm_config(std::size_t lora_rank, bool tied) {
  nn::LmConfig c;
  c.vocab = 256;
  c.d_model = 16;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 24;
  c.max_seq = 16;
  c.lora_rank = lora_rank;
  c.lora_scale = 0.5;
  c.tied_embeddings = tied;
  return c;
}

std::vector<int> tokens(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<int> t(n);
  for (int& x : t) x = static_cast<int>(rng.next() % 256);
  return t;
}

// Two Adam steps of the LM with and without recompute: every loss, every
// gradient and the parameters after the steps equal bit for bit.
template <class T>
void check_lm(typename nn::Lm<T>::Train train, bool tied) {
  const nn::LmConfig c = lm_config(train == nn::Lm<T>::Train::lora ? 4 : 0, tied);
  Tape<T> tp_a, tp_b;
  nn::Lm<T> a(tp_a, c, 11, train), b(tp_b, c, 11, train);
  for (nn::Lm<T>* m : {&a, &b}) {
    Rng rng(5);
    for (const auto& p : m->adapters())  // B starts at zero: make the adapters matter
      for (T& x : m->tape().leaf_value(p.var)) x = static_cast<T>(rng.uniform(-0.3, 0.3));
  }
  b.set_recompute(true);
  CHECK(b.recomputes());
  Adam<T> opt_a(T(1e-2)), opt_b(T(1e-2));
  for (const auto& p : a.trainable()) opt_a.add(p.var);
  for (const auto& p : b.trainable()) opt_b.add(p.var);
  const auto mark_a = tp_a.mark(), mark_b = tp_b.mark();
  for (int step = 0; step < 2; ++step) {
    tp_a.reset_to(mark_a);
    tp_b.reset_to(mark_b);
    const std::vector<int> in = tokens(2 * 12, 100 + step), out = tokens(2 * 12, 200 + step);
    auto ra = a.forward(a.ids(in, 2, 12), a.ids(out, 24, 0));
    auto rb = b.forward(b.ids(in, 2, 12), b.ids(out, 24, 0));
    REQUIRE(tp_a.backward(ra.loss));
    REQUIRE(tp_b.backward(rb.loss));
    // Each layer's down projection feeds the residual add alone, which reads no value, and the
    // layer's output is kept: the walk does not compute the projection again.
    std::size_t transient = 0;
    for (const auto& n : tp_b.nodes()) transient += n.transient;
    CHECK(tp_a.recomputed_nodes() == 0);
    CHECK(tp_b.recomputed_nodes() > 0);
    CHECK(tp_b.recomputed_nodes() < transient);
    CHECK(bitwise_equal(tp_a.value(ra.loss).data, tp_b.value(rb.loss).data));
    CHECK(bitwise_equal(tp_a.value(ra.logits).data, tp_b.value(rb.logits).data));
    for (std::size_t i = 0; i < a.named().size(); ++i) {
      INFO(a.named()[i].name);
      CHECK(bitwise_equal(tp_a.grad(a.named()[i].var).data, tp_b.grad(b.named()[i].var).data));
    }
    REQUIRE(opt_a.step());
    REQUIRE(opt_b.step());
  }
  for (std::size_t i = 0; i < a.named().size(); ++i)
    CHECK(bitwise_equal(tp_a.value(a.named()[i].var).data, tp_b.value(b.named()[i].var).data));
}

}  // namespace

TEST_CASE("recompute: the same loss and gradients as without scopes, in less memory") {
  check_stack<float>(1);
  check_stack<double>(1);
  check_stack<float>(3);
}

TEST_CASE("recompute: the LM with recompute on trains to the same bits") {
  check_lm<float>(nn::Lm<float>::Train::full, false);
  check_lm<float>(nn::Lm<float>::Train::lora, true);
  check_lm<double>(nn::Lm<double>::Train::lora, false);
  set_num_threads(2);
  check_lm<float>(nn::Lm<float>::Train::lora, true);
  set_num_threads(1);
}

TEST_CASE("recompute: a memory budget puts as few layers in scopes as it must, and the same bits") {
  nn::LmConfig c = lm_config(4, false);
  c.layers = 6;
  struct Step {
    std::vector<std::uint32_t> bits;  // the loss's and every trainable gradient's
    std::size_t recomputed = 0, in_use = 0;
  };
  auto step = [&](auto configure) {
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 11, nn::Lm<float>::Train::lora);
    Rng rng(5);
    for (const auto& p : m.adapters())
      for (float& x : tp.leaf_value(p.var)) x = static_cast<float>(rng.uniform(-0.3, 0.3));
    configure(m);
    Step s;
    for (int round = 0; round < 2; ++round) {  // the second forward knows the head's share
      const auto mark = tp.mark();
      const Var<float> loss = m.forward_loss(m.ids(tokens(24, 100), 2, 12), m.ids(tokens(24, 200), 24, 0));
      REQUIRE(tp.backward(loss));
      s = Step{};
      auto add = [&](View<float> v) {
        for (float x : v) s.bits.push_back(std::bit_cast<std::uint32_t>(x));
      };
      add(tp.value(loss));
      for (const auto& p : m.trainable()) add(tp.grad(p.var));
      s.recomputed = m.recomputed_layers();
      s.in_use = tp.bytes_in_use();
      tp.reset_to(mark);
    }
    return s;
  };
  const Step none = step([](nn::Lm<float>& m) { m.set_recompute(false); });
  const Step every = step([](nn::Lm<float>& m) { m.set_recompute(true); });
  const Step automatic = step([](nn::Lm<float>&) {});  // this machine has room for a toy model: no scope
  const Step ample = step([](nn::Lm<float>& m) { m.set_memory_budget(std::size_t{1} << 40); });
  const Step tiny = step([](nn::Lm<float>& m) { m.set_memory_budget(1); });
  // A quarter of what scopes on every layer save: some layers in scopes, not all.
  const std::size_t budget = none.in_use - (none.in_use - every.in_use) / 4;
  const Step middle = step([&](nn::Lm<float>& m) { m.set_memory_budget(budget); });
  CHECK(none.recomputed == 0);
  CHECK(every.recomputed == c.layers);
  CHECK(automatic.recomputed == 0);
  CHECK(ample.recomputed == 0);
  CHECK(tiny.recomputed == c.layers - 1);  // layer 0 is recorded whole: forward measures it
  CHECK(middle.recomputed > 0);
  CHECK(middle.recomputed < c.layers - 1);
  CHECK(every.in_use < tiny.in_use);
  CHECK(tiny.in_use < middle.in_use);
  CHECK(middle.in_use <= budget);
  CHECK(middle.in_use < none.in_use);
  CHECK(ample.in_use == none.in_use);
  for (const Step* s : {&every, &automatic, &ample, &tiny, &middle}) CHECK(s->bits == none.bits);
}

TEST_CASE("recompute: backward computes again only the values its steps read, and the same bits") {
  // in + matmul(tanh(in), w): add's backward reads no value and matmul's reads w and tanh's value,
  // so of the two transient nodes only tanh is computed again (its own backward reads it too).
  for (bool train_w : {true, false}) {
    CAPTURE(train_w);
    auto run = [&](bool scoped, Tape<double>& tp, Var<double>& x, Var<double>& w) {
      Rng rng(7);
      x = tp.param(random_tensor<double>({5, 4}, rng));
      w = train_w ? tp.param(random_tensor<double>({4, 4}, rng)) : tp.constant(random_tensor<double>({4, 4}, rng));
      auto block = [&] { return x + matmul(tanh(x), w); };
      const Var<double> y = scoped ? recompute(tp, block) : block();
      const Var<double> loss = sum(y * y);
      REQUIRE(tp.backward(loss));
      return loss;
    };
    Tape<double> tp_plain, tp_scoped;
    Var<double> xp, wp, xs, ws;
    const Var<double> lp = run(false, tp_plain, xp, wp), ls = run(true, tp_scoped, xs, ws);
    CHECK(tp_scoped.recomputed_nodes() == 1);
    CHECK(bitwise_equal(tp_plain.value(lp).data, tp_scoped.value(ls).data));
    CHECK(bitwise_equal(tp_plain.grad(xp).data, tp_scoped.grad(xs).data));
    if (train_w) CHECK(bitwise_equal(tp_plain.grad(wp).data, tp_scoped.grad(ws).data));
    // Under anomaly detection the walk computes every value again (its reports read them).
    tp_scoped.detect_anomalies(true);
    REQUIRE(tp_scoped.backward(ls));
    CHECK(tp_scoped.recomputed_nodes() == 2);
    CHECK(bitwise_equal(tp_plain.grad(xp).data, tp_scoped.grad(xs).data));
  }
}

TEST_CASE("recompute: a scope's gradients share memory where their lifetimes do not meet, and the same bits") {
  // LoRA blocks (x.W + 0.5 (x.A).B with W frozen), then t * t (one node both operands of its
  // consumer) and a skip that reads the block's input again at its end (a gradient that
  // lives across the whole block). The forward pass keeps the scope's values only; the walk
  // gives each transient gradient memory from its last consumer's step to its own.
  const std::size_t rows = 256, width = 128, rank = 4, blocks = 3;
  auto run = [&](bool scoped, Tape<float>& tp, std::vector<Var<float>>& params, std::size_t& transient_bytes) {
    Rng rng(3);
    Var<float> h = tp.constant(random_tensor<float>({rows, width}, rng));
    for (std::size_t b = 0; b < blocks; ++b) {
      const Var<float> w = tp.constant(random_tensor<float>({width, width}, rng, -0.3, 0.3));
      const Var<float> a = tp.param(random_tensor<float>({width, rank}, rng, -0.3, 0.3));
      const Var<float> up = tp.param(random_tensor<float>({rank, width}, rng, -0.3, 0.3));
      params.push_back(a);
      params.push_back(up);
      auto block = [&, in = h] {
        const Var<float> t = tanh(add_scaled(matmul(in, w), matmul(matmul(in, a), up), 0.5f));
        return in + (t * t) * in;
      };
      h = scoped ? recompute(tp, block) : block();
    }
    const Var<float> loss = mean(h * h);
    REQUIRE(tp.backward(loss));
    transient_bytes = 0;
    for (const auto& n : tp.nodes())
      if (n.transient) transient_bytes += n.dims.size() * sizeof(float) * (n.requires_grad ? 2 : 1);
    return loss;
  };
  for (std::size_t threads : {1, 3}) {
    CAPTURE(threads);
    set_num_threads(threads);
    Tape<float> tp_plain, tp_scoped;
    std::vector<Var<float>> pp, ps;
    std::size_t plain_transient = 0, every_value_and_gradient = 0;
    const Var<float> lp = run(false, tp_plain, pp, plain_transient);
    const Var<float> ls = run(true, tp_scoped, ps, every_value_and_gradient);
    CHECK(plain_transient == 0);
    CHECK(bitwise_equal(tp_plain.value(lp).data, tp_scoped.value(ls).data));
    for (std::size_t k = 0; k < pp.size(); ++k)
      CHECK(bitwise_equal(tp_plain.grad(pp[k]).data, tp_scoped.grad(ps[k]).data));
    // Less than one block's values and gradients (a third of every scope's), which is what the
    // shared memory held when each transient node kept a gradient buffer of its own.
    CHECK(tp_scoped.recompute_bytes() > 0);
    CHECK(tp_scoped.recompute_bytes() * blocks * 5 < every_value_and_gradient * 4);
    MESSAGE("scope memory ", tp_scoped.recompute_bytes(), " bytes; one block's values and gradients ",
            every_value_and_gradient / blocks);
    // Walking again places the gradients the same way: the same bits.
    REQUIRE(tp_scoped.backward(ls));
    for (std::size_t k = 0; k < pp.size(); ++k)
      CHECK(bitwise_equal(tp_plain.grad(pp[k]).data, tp_scoped.grad(ps[k]).data));
  }
  set_num_threads(1);
}

TEST_CASE("recompute: a replayed value's bytes are reused once the last step that reads it is done") {
  // in + tanh(((in.W1).W2).W3), the W frozen: the walk computes the three products and tanh again
  // (tanh's backward reads its value, which is computed from them), but each product is read
  // only by the next one's replay, and tanh's value only by its own backward step. So the
  // replay holds at most three buffers at once (a product and the next, or tanh's value and
  // two gradients), where holding every value to the end took six; the scope memory is then
  // the forward pass's five (three products, tanh, the output before it is kept).
  // (Buffers of 128 KiB: the scope memory's smallest chunk is 256 KiB.)
  const std::size_t rows = 256, width = 128, blocks = 3;
  auto run = [&](bool scoped, Tape<float>& tp, Var<float>& x) {
    Rng rng(9);
    x = tp.param(random_tensor<float>({rows, width}, rng));
    Var<float> h = x;
    for (std::size_t b = 0; b < blocks; ++b) {
      std::vector<Var<float>> w;
      for (int k = 0; k < 3; ++k) w.push_back(tp.constant(random_tensor<float>({width, width}, rng, -0.3, 0.3)));
      auto block = [&, in = h] { return in + tanh(matmul(matmul(matmul(in, w[0]), w[1]), w[2])); };
      h = scoped ? recompute(tp, block) : block();
    }
    const Var<float> loss = mean(h * h);
    REQUIRE(tp.backward(loss));
    return loss;
  };
  Tape<float> tp_plain, tp_scoped;
  Var<float> xp, xs;
  const Var<float> lp = run(false, tp_plain, xp), ls = run(true, tp_scoped, xs);
  CHECK(tp_scoped.recomputed_nodes() == 4 * blocks);
  CHECK(bitwise_equal(tp_plain.value(lp).data, tp_scoped.value(ls).data));
  CHECK(bitwise_equal(tp_plain.grad(xp).data, tp_scoped.grad(xs).data));
  CHECK(tp_scoped.recompute_bytes() == 5 * rows * width * sizeof(float));
  // Under anomaly detection every value lives to the walk's last step in the scope (the
  // reports read them): four values and two gradients.
  tp_scoped.detect_anomalies(true);
  REQUIRE(tp_scoped.backward(ls));
  CHECK(tp_scoped.recompute_bytes() == 6 * rows * width * sizeof(float));
  CHECK(bitwise_equal(tp_plain.grad(xp).data, tp_scoped.grad(xs).data));
}

TEST_CASE("FirstFit: the lowest free span that fits, merged neighbours, a grown tail") {
  FirstFit plan;
  CHECK(plan.take(100) == 0);
  CHECK(plan.take(50) == 100);
  CHECK(plan.take(10) == 150);
  plan.give(0, 100);
  CHECK(plan.take(80) == 0);    // fits where the first was
  CHECK(plan.take(30) == 160);  // the 20 left at 80 are too few: appended
  CHECK(plan.extent() == 190);
  plan.give(100, 50);  // merges with the 20 free at 80: 70 free at 80
  CHECK(plan.take(70) == 80);
  plan.give(160, 30);  // the free tail
  CHECK(plan.take(45) == 160);  // grows the block by 15, not 45
  CHECK(plan.extent() == 205);
  plan.clear();
  CHECK(plan.extent() == 0);
  CHECK(plan.take(7) == 0);
}

TEST_CASE("FirstFit: buffers alive at the same time never share a byte, and the same calls place them the same") {
  // Random lifetimes over 200 steps; at each step the buffers that start take space first, then
  // those that end are given back (the recompute replay's order).
  auto place = [](std::uint64_t seed, std::vector<std::size_t>& offsets, std::size_t& peak_live) {
    Rng rng(seed);
    struct Buffer {
      std::size_t start, end, length;
    };
    std::vector<Buffer> buffers(300);
    for (Buffer& b : buffers) {
      b.start = static_cast<std::size_t>(rng.uniform(0.0, 200.0));
      b.end = b.start + static_cast<std::size_t>(rng.uniform(0.0, 30.0));
      b.length = 1 + static_cast<std::size_t>(rng.uniform(0.0, 1000.0));
    }
    FirstFit plan;
    offsets.assign(buffers.size(), 0);
    peak_live = 0;
    for (std::size_t step = 0; step < 240; ++step) {
      for (std::size_t k = 0; k < buffers.size(); ++k)
        if (buffers[k].start == step) offsets[k] = plan.take(buffers[k].length);
      std::size_t live = 0;
      for (std::size_t k = 0; k < buffers.size(); ++k)
        if (buffers[k].start <= step && step <= buffers[k].end) {
          live += buffers[k].length;
          CHECK(offsets[k] + buffers[k].length <= plan.extent());
          for (std::size_t j = 0; j < k; ++j)
            if (buffers[j].start <= step && step <= buffers[j].end) {
              const bool apart =
                  offsets[j] + buffers[j].length <= offsets[k] || offsets[k] + buffers[k].length <= offsets[j];
              if (!apart) FAIL_CHECK("buffers " << j << " and " << k << " overlap at step " << step);
            }
        }
      peak_live = std::max(peak_live, live);
      for (std::size_t k = 0; k < buffers.size(); ++k)
        if (buffers[k].end == step) plan.give(offsets[k], buffers[k].length);
    }
    return plan.extent();
  };
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    std::vector<std::size_t> first, again;
    std::size_t peak = 0, peak_again = 0;
    const std::size_t extent = place(seed, first, peak);
    CHECK(place(seed, again, peak_again) == extent);
    CHECK(first == again);
    CHECK(extent >= peak);
    CHECK(extent < peak * 3 / 2);  // fragmentation bounded in practice
    MESSAGE("seed ", seed, ": block ", extent, " for at most ", peak, " live");
  }
}

TEST_CASE("recompute: gradient accumulation and a loss that is a scope's output") {
  Stack<double> plain(9, 8, 2, false), scoped(9, 8, 2, true);
  // The last block's output itself as the loss's input, summed: the walk starts inside a scope's range.
  const Var<double> lp = sum(plain.block_out.back()), ls = sum(scoped.block_out.back());
  REQUIRE(plain.tp.backward(lp, accumulate));
  REQUIRE(scoped.tp.backward(ls, accumulate));
  REQUIRE(plain.tp.backward(plain.loss, accumulate));
  REQUIRE(scoped.tp.backward(scoped.loss, accumulate));
  CHECK(scoped.same_as(plain));
}

TEST_CASE("recompute: what a scope keeps and what it refuses") {
  Tape<double> tp;
  Rng rng(3);
  const Var<double> w = tp.param(random_tensor<double>({4, 4}, rng));
  const Var<double> x = tp.constant(random_tensor<double>({2, 4}, rng));
  Var<double> inner, made;
  const Var<double> y = recompute(tp, [&] {
    inner = tanh(matmul(x, w));
    made = tp.param(random_tensor<double>({2, 4}, rng));  // a leaf made inside is kept
    return inner * made;
  });
  REQUIRE(tp.ok());
  CHECK(tp.value(y).size() == 8);
  CHECK(tp.value(made).size() == 8);
  CHECK(tp.value(inner).empty());  // not kept
  SUBCASE("an inner node as an operand afterwards") {
    CHECK_FALSE((inner + y).valid());
    CHECK(tp.error().find("recorded inside a recompute scope and is not one of its outputs") != std::string::npos);
    CHECK(tp.error().find("tanh") != std::string::npos);
  }
  SUBCASE("scopes do not nest") {
    recompute(tp, [&] { return recompute(tp, [&] { return x * 2.0; }); });
    CHECK(tp.error().find("scopes do not nest") != std::string::npos);
  }
  SUBCASE("no backward or reset_to inside a scope") {
    recompute(tp, [&] {
      tp.backward(sum(y));
      return y;
    });
    CHECK(tp.error().find("backward: a recompute scope is open") != std::string::npos);
    Tape<double> tp2;
    const auto m2 = tp2.mark();
    const Var<double> c = tp2.constant(Tensor<double>({1}, {1.0}));
    recompute(tp2, [&] {
      tp2.reset_to(m2);
      return c;
    });
    CHECK(tp2.error().find("reset_to: a recompute scope is open") != std::string::npos);
  }
  SUBCASE("a mark taken inside a scope") {
    Tape<double>::Mark inside;
    const Var<double> z = recompute(tp, [&] {
      const Var<double> a = x * 3.0;
      inside = tp.mark();
      return a * a;
    });
    REQUIRE(z.valid());
    tp.reset_to(inside);
    CHECK(tp.error().find("the mark was taken inside a recompute scope") != std::string::npos);
  }
  SUBCASE("an exception from the block closes the scope") {
    CHECK_THROWS_AS(recompute(tp, [&]() -> Var<double> { throw std::runtime_error("block"); }), std::runtime_error);
    CHECK(tp.ok());
    CHECK_FALSE(tp.recompute_open());
    CHECK(recompute(tp, [&] { return x * 2.0; }).valid());  // a new scope opens
  }
  SUBCASE("to_dot with norms after backward: inner nodes say recomputed, whichever scope holds the memory") {
    const Var<double> z = recompute(tp, [&] { return grad::tanh(y * 2.0); });  // a second scope
    REQUIRE(tp.backward(sum(z)));  // the walk replays both; the first holds the memory last
    DotOptions opt;
    opt.value_norms = opt.gradient_norms = true;
    const std::string dot = to_dot(tp, opt);
    CHECK(dot.find("recomputed") != std::string::npos);
    CHECK(dot.find("|g| = ") != std::string::npos);  // kept nodes and parameters still show theirs
    CHECK(tp.value(inner).empty());
  }
  SUBCASE("the device engine and emitted code refuse a tape with scopes") {
    const Var<double> loss = sum(y);
    REQUIRE(tp.ok());
    try {
      (void)device::capture(tp, loss);
      FAIL("capture accepted a tape with a recompute scope");
    } catch (const device::CaptureError& e) {
      CHECK(std::string(e.what()).find("recorded inside a recompute scope") != std::string::npos);
    }
    CHECK_THROWS_WITH_AS(emit(tp, loss), doctest::Contains("recorded inside a recompute scope"), EmitError);
  }
  SUBCASE("backward through it equals the plain recording") {
    Tape<double> plain;
    Rng rng2(3);
    const Var<double> pw = plain.param(random_tensor<double>({4, 4}, rng2));
    const Var<double> px = plain.constant(random_tensor<double>({2, 4}, rng2));
    const Var<double> pmade = plain.param(random_tensor<double>({2, 4}, rng2));
    const Var<double> py = tanh(matmul(px, pw)) * pmade;
    REQUIRE(plain.backward(sum(py)));
    REQUIRE(tp.backward(sum(y)));
    CHECK(bitwise_equal(tp.grad(w).data, plain.grad(pw).data));
    CHECK(bitwise_equal(tp.grad(made).data, plain.grad(pmade).data));
    CHECK(tp.grad(inner).empty());
  }
}
