// Graph and fused replay against per-node replay, and the fusion planner.
//
// Every mode must land on the same bits: whole training runs (loss trace and
// final weights) of the autoencoder, an MLP with relu/sigmoid and a LoRA
// transformer block are compared across per-node, graph and fused, on the
// CPU backend always (it runs the fused kernels' very bodies) and on CUDA
// when a device answers. The planner is checked on hand-built graphs: which
// launches land in which segment, and that a graph that fuses nothing runs
// exactly as per-node.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <grad/device/device.hpp>
#include <grad/device/replay.hpp>
#include <grad/nn.hpp>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../examples/autoencoder.hpp"
#include "support.hpp"
#include "test_device_support.hpp"

using namespace grad;
namespace dev = grad::device;

namespace {

constexpr dev::Mode all_modes[] = {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused};

std::vector<dev::Backend> backends() { return testing::device_backends("fusion on CUDA"); }

// The CPU backend's race-checking schedules (engine.hpp): blocks and threads
// out of order. A run that differs from the in-order one has a race.
constexpr dev::Schedule race_schedules[] = {dev::Schedule::reverse, dev::Schedule::shuffled};

// A model recorded once: its loss, its parameters (optimizer order, with L2
// coefficients), and one input whose rows change per minibatch.
struct Model {
  Tape<double> tp;
  Var<double> loss, input;
  std::vector<Var<double>> params;
  std::vector<double> l2;
  std::vector<Tensor<double>> batches;  // fed into `input`, one per episode (cyclically)
};

struct Run {
  std::vector<double> losses;
  std::vector<double> weights;  // every parameter, concatenated
  std::string plan, fallback;
  std::size_t kernels = 0;
};

Run train(Model& m, dev::Backend backend, dev::Mode mode, int episodes, double lr = 0.005, double clip = 0.5,
          dev::Schedule schedule = dev::Schedule::in_order) {
  auto prog = dev::capture(m.tp, m.loss, {.backend = backend, .mode = mode, .schedule = schedule});
  dev::Adam<double> opt(prog, lr);
  for (std::size_t k = 0; k < m.params.size(); ++k) opt.add(m.params[k], m.l2[k]);
  opt.set_clip(clip);
  Run r;
  for (int e = 0; e < episodes; ++e) {
    if (!m.batches.empty()) prog.set_input(m.input, m.batches[static_cast<std::size_t>(e) % m.batches.size()]);
    prog.forward();
    prog.backward();
    opt.step();
    r.losses.push_back(prog.loss());
  }
  for (const Var<double>& p : m.params) {
    const Tensor<double> w = prog.value(p);
    r.weights.insert(r.weights.end(), w.data().begin(), w.data().end());
  }
  r.plan = prog.plan().describe();
  r.fallback = prog.fallback_reason();
  r.kernels = prog.kernels_per_pass();
  return r;
}

void check_same_bits(const Run& want, const Run& got) {
  CHECK(got.fallback == "");
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t e = 0; e < want.losses.size(); ++e) {
    CAPTURE(e);
    CHECK(std::memcmp(&want.losses[e], &got.losses[e], sizeof(double)) == 0);
  }
  CHECK(testing::bitwise_equal<double>(want.weights, got.weights));
}

// Per-node, graph and fused runs of one model on every backend, all bit-equal
// to the CPU backend's per-node run (and CUDA's to its own per-node run when
// the model has transcendental ops, whose last bit differs there).
void check_all_modes(const std::function<void(Model&)>& build, int episodes) {
  Model ref_model;
  build(ref_model);
  const Run ref = train(ref_model, dev::Backend::cpu, dev::Mode::per_node, episodes);
  for (dev::Backend b : backends()) {
    const Run& base = ref;  // every op is exact: every backend and mode lands on the same bits
    for (dev::Mode mode : all_modes) {
      CAPTURE(dev::backend_name(b));
      CAPTURE(dev::mode_name(mode));
      Model m;
      build(m);
      const Run got = train(m, b, mode, episodes);
      check_same_bits(base, got);
      if (b != dev::Backend::cpu || mode == dev::Mode::graph) continue;
      for (dev::Schedule schedule : race_schedules) {
        CAPTURE(schedule == dev::Schedule::reverse ? "reverse" : "shuffled");
        Model r;
        build(r);
        check_same_bits(base, train(r, b, mode, episodes, 0.005, 0.5, schedule));
      }
    }
  }
}

void build_autoencoder(Model& m) {
  namespace ae = autoencoder;
  const Tensor<double> data = ae::make_data<double>();
  const ae::Model<double> model = ae::make_model(m.tp);
  for (std::size_t first = 0; first + 200 <= 1000; first += 200) {
    Tensor<double> t({200, ae::dim});
    ae::copy_rows(data, first, 200, t.data());
    m.batches.push_back(std::move(t));
  }
  m.input = m.tp.constant(m.batches[0]);
  m.loss = ae::record_step(model, m.input);
  for (std::size_t layer = 0; layer < 4; ++layer) {
    m.params.insert(m.params.end(), {model.w(layer), model.b(layer)});
    m.l2.insert(m.l2.end(), {1e-3, 0.0});
  }
}

// relu and sigmoid hidden layers, a squared-weight L2 term in the loss (a
// scalar tail of more than one node) and a fan-out.
void build_mlp(Model& m) {
  testing::Rng rng(11);
  auto r = [&](Shape s, double b) { return testing::random_tensor<double>(std::move(s), rng, -b, b); };
  for (int k = 0; k < 3; ++k) m.batches.push_back(r({64, 8}, 1.0));
  const Tensor<double> target = r({64, 4}, 0.5);
  m.input = m.tp.constant(m.batches[0]);
  Var<double> w1 = m.tp.param(r({8, 32}, 0.5)), b1 = m.tp.param(r({32}, 0.1)), w2 = m.tp.param(r({32, 16}, 0.3)),
              b2 = m.tp.param(r({16}, 0.1)), w3 = m.tp.param(r({16, 4}, 0.3));
  Var<double> h1 = relu(matmul(m.input, w1) + b1);
  Var<double> h2 = sigmoid(matmul(h1, w2) + b2);
  Var<double> y = matmul(h2 * h2 + h2, w3);
  m.loss = mse(y, m.tp.constant(target)) + sum(w3 * w3) * 1e-3 + mean(b1) * 1e-2;
  m.params = {w1, b1, w2, b2, w3};
  m.l2 = {1e-4, 0, 1e-4, 0, 0};
}

// A LoRA transformer block (examples/lora_block.cpp in small): frozen base
// weights, adapters trained. Mostly attention, softmax, slices and concat,
// which keep their per-node kernels.
void build_lora_block(Model& m) {
  constexpr std::size_t t = 6, d = 16, heads = 4, kv_heads = 2, hd = 4, ffn = 24, vocab = 5, rank = 2;
  testing::Rng rng(5);
  auto r = [&](Shape s, double b) { return testing::random_tensor<double>(std::move(s), rng, -b, b); };
  for (int k = 0; k < 2; ++k) m.batches.push_back(r({t, d}, 1.0));
  m.input = m.tp.constant(m.batches[0]);
  Tape<double>& tp = m.tp;
  auto projection = [&](std::size_t in, std::size_t out) {
    Var<double> w = tp.constant(r({in, out}, 0.4)), a = tp.param(r({in, rank}, 0.4)), b = tp.param(r({rank, out}, 0.1));
    m.params.insert(m.params.end(), {a, b});
    return [=](Var<double> x) { return nn::lora_linear(x, w, a, b, 2.0); };
  };
  auto q = projection(d, heads * hd), k = projection(d, kv_heads * hd), v = projection(d, kv_heads * hd),
       o = projection(heads * hd, d), gate = projection(d, ffn), up = projection(d, ffn), down = projection(ffn, d);
  m.l2.assign(m.params.size(), 0.0);
  Tensor<double> targets({t, vocab});
  for (std::size_t p = 0; p < t; ++p) targets[p * vocab + (p * 3) % vocab] = 1;
  const auto rope = nn::rope_tables(t, hd, 10000.0);
  Var<double> cos = tp.constant(rope.cos), sin = tp.constant(rope.sin), mask = tp.constant(nn::causal_mask<double>(t));
  Var<double> norm = tp.constant(Tensor<double>::ones({d})), w_vocab = tp.constant(r({d, vocab}, 0.4));
  Var<double> x = m.input;
  Var<double> h = nn::rmsnorm(x, norm, 1e-6);
  Var<double> x2 = x + o(nn::gqa_attention(q(h), k(h), v(h), cos, sin, mask, heads, kv_heads, hd));
  Var<double> h2 = nn::rmsnorm(x2, norm, 1e-6);
  Var<double> x3 = x2 + down(nn::swiglu(gate(h2), up(h2)));
  m.loss = nn::cross_entropy_rows(nn::linear(x3, w_vocab), tp.constant(targets), t - 1);
  REQUIRE(tp.ok());
}

}  // namespace

TEST_CASE("the autoencoder trains to the same bits in per-node, graph and fused modes") {
  check_all_modes(build_autoencoder, 40);
}

TEST_CASE("an MLP with relu, sigmoid and an L2 tail trains to the same bits in every mode") {
  check_all_modes(build_mlp, 25);
}

TEST_CASE("the LoRA block, mostly not fusable, trains to the same bits in every mode") {
  check_all_modes(build_lora_block, 8);
}

TEST_CASE("the modes agree with the CPU tape itself on the autoencoder") {
  namespace ae = autoencoder;
  Model m;
  build_autoencoder(m);
  const Run fused = train(m, dev::Backend::cpu, dev::Mode::fused, 5);
  // The tape run: re-recorded per episode, grad::Adam with the same settings.
  Model t;
  build_autoencoder(t);
  grad::Adam<double> opt(0.005);
  for (std::size_t k = 0; k < t.params.size(); ++k) opt.add(t.params[k], t.l2[k]);
  opt.set_clip(0.5);
  ae::Model<double> model;
  std::copy(t.params.begin(), t.params.end(), model.params.begin());
  std::vector<double> losses;
  for (int e = 0; e < 5; ++e) {
    const Tensor<double>& rows = t.batches[static_cast<std::size_t>(e)];
    std::copy(rows.data().begin(), rows.data().end(), t.tp.leaf_value(t.input).begin());
    // Re-record the same graph after the captured one, as a tape user does.
    const Var<double> loss = ae::record_step(model, t.input);
    REQUIRE(t.tp.backward(loss));
    REQUIRE(opt.step());
    losses.push_back(t.tp.scalar(loss));
  }
  CHECK(testing::bitwise_equal<double>(losses, fused.losses));
}

// ---- the planner ----

namespace {

std::vector<std::string> segment_kinds(const dev::FusionPlan& p, dev::Phase phase) {
  std::vector<std::string> out;
  for (const dev::Segment& s : p.segments) {
    if (s.phase != phase) continue;
    const char* k = s.kind == dev::SegmentKind::rows          ? "rows"
                    : s.kind == dev::SegmentKind::serial      ? "serial"
                    : s.kind == dev::SegmentKind::across_rows ? "across"
                                                              : "node";
    out.push_back(std::string(k) + ":" + std::to_string(s.launches.size()));
  }
  return out;
}

// The nodes (forward) a phase's segment runs, by tape index.
std::vector<std::uint32_t> nodes_of(const dev::FusionPlan& p, const dev::Segment& s) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t i : s.launches) out.push_back(p.launches(s.phase)[i].node);
  return out;
}

}  // namespace

TEST_CASE("planner: the autoencoder's forward is one row run and a mean; backward one row run and one grid of dW, db") {
  Model m;
  build_autoencoder(m);
  auto prog = dev::capture(m.tp, m.loss, {.mode = dev::Mode::fused});
  const dev::FusionPlan& p = prog.plan();
  INFO(p.describe());
  // nodes 0-7 parameters, 8 the batch, 9..21 the layers and mse's sub, mul; 22 the mean.
  CHECK(segment_kinds(p, dev::Phase::forward) == std::vector<std::string>{"rows:13", "node:1"});
  CHECK(nodes_of(p, p.segments[0]) == std::vector<std::uint32_t>{9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21});
  CHECK(p.segments[0].rows == 200);
  CHECK(p.segments[0].width == 64);
  CHECK(p.segments[1].why == "a single-item launch with no scalar neighbours");
  // Backward: mean' .. add' (the row-local chain, 15 launches including the
  // scratch accumulate of d*d), then the 8 weight and bias gradients.
  CHECK(segment_kinds(p, dev::Phase::backward) == std::vector<std::string>{"rows:15", "across:8"});
  const dev::Segment& grads = p.segments.back();
  std::vector<std::uint32_t> receivers;
  for (std::uint32_t i : grads.launches) receivers.push_back(p.backward[i].input);
  CHECK(receivers == std::vector<std::uint32_t>{7, 6, 5, 4, 3, 2, 1, 0});  // b3, w3, b2, w2, ..., w0
  CHECK(p.kernels(dev::Phase::forward) + p.kernels(dev::Phase::backward) == 4);
  CHECK(prog.kernels_per_pass() == 4);
  CHECK(prog.forward_launches() + prog.backward_launches() == 14 + 23);
  CHECK(p.worthwhile(dev::Backend::cuda));
  CHECK_FALSE(p.worthwhile(dev::Backend::cpu));
  CHECK(p.describe().find("fused rows   (13 launches, 200 blocks of 64 items): #9 matmul; #10 add;") !=
        std::string::npos);
}

TEST_CASE("planner: a matmul whose W is computed in the same run starts a new run") {
  // relu(x) and relu(w) share the row split (3 rows), but the matmul reads
  // relu(w) whole: other blocks' rows, so it may not join their run.
  testing::Rng rng(1);
  Tape<double> tp;
  Var<double> x = tp.param(testing::random_tensor<double>({3, 3}, rng)),
              w = tp.param(testing::random_tensor<double>({3, 3}, rng));
  Var<double> y = matmul(relu(x), relu(w));
  Var<double> loss = sum(y * y);
  auto prog = dev::capture(tp, loss, {.mode = dev::Mode::fused});
  const dev::FusionPlan& p = prog.plan();
  INFO(p.describe());
  // relu, relu | matmul, mul (a fresh run: relu(w) is complete by then) | sum
  CHECK(segment_kinds(p, dev::Phase::forward) == std::vector<std::string>{"rows:2", "rows:2", "node:1"});
  CHECK(nodes_of(p, p.segments[0]) == std::vector<std::uint32_t>{2, 3});
  CHECK(nodes_of(p, p.segments[1]) == std::vector<std::uint32_t>{4, 5});
  tp.backward(loss);
  prog.forward();
  prog.backward();
  CHECK(testing::bitwise_equal<double>(tp.grad(w).data, prog.grad(w).data()));
  CHECK(testing::bitwise_equal<double>(tp.grad(x).data, prog.grad(x).data()));
}

TEST_CASE("planner: rows of different counts, rank-1 tensors and a scalar chain") {
  testing::Rng rng(2);
  Tape<double> tp;
  Var<double> a = tp.param(testing::random_tensor<double>({4, 5}, rng)),
              v = tp.param(testing::random_tensor<double>({5}, rng));
  Var<double> s = sum(a * a);        // rows (4) then a scalar
  Var<double> t = sum(v * 2.0) + s;  // v * 2 is rank 1: per-node; then sum, add: a scalar chain
  Var<double> loss = t * 0.5 - 1.0;  // more of the chain
  auto prog = dev::capture(tp, loss, {.mode = dev::Mode::fused});
  const dev::FusionPlan& p = prog.plan();
  INFO(p.describe());
  // mul (alone: per-node), sum (serial with nothing: per-node), v*2 (rank 1), then sum, add, mul, sub serial.
  CHECK(segment_kinds(p, dev::Phase::forward) == std::vector<std::string>{"node:1", "node:1", "node:1", "serial:4"});
  CHECK(p.segments[0].why == "row-local, but nothing next to it to fuse with");
  CHECK(p.segments[2].why == "mul_scalar: writes [5], not a [rows, cols] tensor");
  tp.backward(loss);
  prog.forward();
  prog.backward();
  const double want = tp.scalar(loss), got = prog.loss();
  CHECK(std::memcmp(&want, &got, sizeof want) == 0);
  CHECK(testing::bitwise_equal<double>(tp.grad(a).data, prog.grad(a).data()));
  CHECK(testing::bitwise_equal<double>(tp.grad(v).data, prog.grad(v).data()));
}

TEST_CASE("planner: a graph that fuses nothing runs exactly as per-node") {
  // softmax, transpose and bmm have no fused form: every launch stays per-node.
  testing::Rng rng(3);
  Tape<double> tp;
  Var<double> a = tp.param(testing::random_tensor<double>({2, 3, 4}, rng)),
              b = tp.param(testing::random_tensor<double>({2, 4, 3}, rng));
  Var<double> loss = sum(softmax(bmm(a, b), -1));
  auto fused = dev::capture(tp, loss, {.mode = dev::Mode::fused});
  auto per_node = dev::capture(tp, loss);
  const dev::FusionPlan& p = fused.plan();
  INFO(p.describe());
  CHECK(p.fused_launches() == 0);
  CHECK_FALSE(p.worthwhile(dev::Backend::cuda));
  CHECK(fused.kernels_per_pass() == per_node.kernels_per_pass());
  CHECK(p.describe().find("per-node    : #2 bmm  [bmm: no fused form (not row-local)]") != std::string::npos);
  for (auto* prog : {&fused, &per_node}) {
    prog->forward();
    prog->backward();
  }
  const double x = fused.loss(), y = per_node.loss();
  CHECK(std::memcmp(&x, &y, sizeof x) == 0);
  CHECK(testing::bitwise_equal<double>(fused.grad(a).data(), per_node.grad(a).data()));
  CHECK(testing::bitwise_equal<double>(fused.grad(b).data(), per_node.grad(b).data()));
}

TEST_CASE("planner: every launch lands in exactly one segment, in a valid order") {
  for (auto build : {build_autoencoder, build_mlp, build_lora_block}) {
    Model m;
    build(m);
    auto prog = dev::capture(m.tp, m.loss, {.mode = dev::Mode::fused});
    const dev::FusionPlan& p = prog.plan();
    for (dev::Phase phase : {dev::Phase::forward, dev::Phase::backward}) {
      std::vector<int> seen(p.launches(phase).size(), 0);
      for (const dev::Segment& s : p.segments)
        if (s.phase == phase)
          for (std::uint32_t i : s.launches) ++seen[i];
      for (int c : seen) CHECK(c == 1);
    }
  }
}

// ---- graph mode's queue ----

TEST_CASE("graph mode runs whatever was queued when a value is read: forward only, forward + backward, a step") {
  for (dev::Backend backend : backends()) {
    CAPTURE(dev::backend_name(backend));
    Model a, b;
    build_mlp(a);
    build_mlp(b);
    auto g = dev::capture(a.tp, a.loss, {.backend = backend, .mode = dev::Mode::graph});
    auto n = dev::capture(b.tp, b.loss, {.backend = backend});
    auto same = [](double x, double y) { return std::memcmp(&x, &y, sizeof x) == 0; };
    g.forward();
    n.forward();
    CHECK(same(g.loss(), n.loss()));
    g.forward();
    g.backward();
    n.forward();
    n.backward();
    CHECK(testing::bitwise_equal<double>(g.grad(a.params[0]).data(), n.grad(b.params[0]).data()));
    dev::SGD<double> sg(g, 0.1), sn(n, 0.1);
    sg.add(a.params[0]);
    sn.add(b.params[0]);
    for (int e = 0; e < 3; ++e) {
      g.set_input(a.input, a.batches[static_cast<std::size_t>(e) % 3]);
      n.set_input(b.input, b.batches[static_cast<std::size_t>(e) % 3]);
      for (auto* p : {&g, &n}) {
        p->forward();
        p->backward();
      }
      sg.step();
      sn.step();
      if (e == 1) {  // a new learning rate is a new graph, not a stale one
        sg.set_lr(0.05);
        sn.set_lr(0.05);
      }
    }
    g.forward();
    n.forward();
    CHECK(same(g.loss(), n.loss()));
    CHECK(g.fallback_reason() == "");
  }
}

// ---- paths the models above do not reach ----

namespace {

// A model from a builder of one [rows, cols] input: captured in every mode
// on every backend (and the CPU race schedules), trained a few SGD steps,
// all bit-equal to the CPU backend's per-node run.
void check_shape_everywhere(const std::function<Var<double>(Tape<double>&, Var<double>, Var<double>)>& build,
                            Shape input, Shape param, int episodes = 2) {
  auto make = [&](Model& m) {
    testing::Rng rng(21);
    m.batches.push_back(testing::random_tensor<double>(input, rng, 0.5, 1.5));
    m.batches.push_back(testing::random_tensor<double>(input, rng, 0.5, 1.5));
    m.input = m.tp.constant(m.batches[0]);
    Var<double> w = m.tp.param(testing::random_tensor<double>(param, rng, 0.5, 1.5));
    m.loss = build(m.tp, m.input, w);
    m.params = {w};
    m.l2 = {0};
    REQUIRE(m.tp.ok());
  };
  check_all_modes(make, episodes);
}

}  // namespace

TEST_CASE("fused kernels dispatch neg, exp, log, div and every scalar op bit for bit") {
  auto build = [](Tape<double>&, Var<double> x, Var<double> w) {
    Var<double> h = grad::exp(-(x * w)) + grad::log(x + w);  // neg, exp, log
    h = (h / (w + 2.0)) * 1.5 - 0.25;                        // div, mul_scalar, add_scalar
    h = 2.0 - h / 3.0;                                       // scalar_sub, div_scalar
    h = 1.0 / (h * h + 1.0) + relu(h) + sigmoid(h) * grad::tanh(h) + grad::sqrt(h * h + 1.0);
    return mean(h * x);
  };
  // The row run really holds these ops (not per-node launches).
  Model m;
  testing::Rng rng(3);
  m.input = m.tp.constant(testing::random_tensor<double>({16, 8}, rng, 0.5, 1.5));
  Var<double> w = m.tp.param(testing::random_tensor<double>({16, 8}, rng, 0.5, 1.5));
  auto prog = dev::capture(m.tp, build(m.tp, m.input, w), {.mode = dev::Mode::fused});
  INFO(prog.plan().describe());
  std::set<std::string> fused_ops;
  for (const dev::Segment& seg : prog.plan().segments)
    if (seg.kind == dev::SegmentKind::rows)
      for (std::uint32_t i : seg.launches)
        fused_ops.insert(std::string(op_name(prog.plan().launches(seg.phase)[i].op)));
  for (const char* op : {"neg", "exp", "log", "div", "mul_scalar", "add_scalar", "scalar_sub", "div_scalar",
                         "scalar_div", "relu", "sigmoid", "tanh", "sqrt"}) {
    CAPTURE(op);
    CHECK(fused_ops.count(op) == 1);
  }
  check_shape_everywhere(build, {16, 8}, {16, 8});
}

TEST_CASE("rows wider than a block (256 threads) and than 1,024 threads loop inside the block") {
  for (std::size_t width : {300, 1100}) {
    CAPTURE(width);
    check_shape_everywhere([](Tape<double>&, Var<double> x, Var<double> w) { return sum(grad::tanh(x * w) * x + w); },
                           {3, width}, {width});
  }
}

TEST_CASE("more than 2^20 rows: the row kernel's grid-stride loop") {
  const std::size_t rows = (std::size_t{1} << 20) + 3;
  check_shape_everywhere([](Tape<double>&, Var<double> x, Var<double> w) { return mean(relu(x * w) - x); }, {rows, 1},
                         {1}, 1);
}

TEST_CASE(
    "a forced capture failure falls back to per-node launches with the reason, or fails under "
    "GRAD_REQUIRE_CUDA=1") {
  for (dev::Backend backend : backends()) {
    CAPTURE(dev::backend_name(backend));
    Model ref;
    build_mlp(ref);
    const Run want = train(ref, backend, dev::Mode::per_node, 3);
    ::setenv("GRAD_DEVICE_FAIL_CAPTURE", "1", 1);
    Model m;
    build_mlp(m);
    if (testing::cuda_required()) {
      CHECK_THROWS_WITH(train(m, backend, dev::Mode::fused, 3), doctest::Contains("GRAD_REQUIRE_CUDA=1"));
    } else {
      const Run got = train(m, backend, dev::Mode::fused, 3);
      CHECK(got.fallback.find("graph capture refused (GRAD_DEVICE_FAIL_CAPTURE=1)") != std::string::npos);
      CHECK(testing::bitwise_equal<double>(want.losses, got.losses));
      CHECK(testing::bitwise_equal<double>(want.weights, got.weights));
    }
    ::unsetenv("GRAD_DEVICE_FAIL_CAPTURE");
  }
}

TEST_CASE("race schedules catch a deliberately broken plan and pass the real one") {
  // relu(w) and the matmul that reads relu(w) WHOLE are merged into one row
  // run: block r then reads rows of relu(w) other blocks write in the same
  // kernel. In-order emulation happens to read them finished (for rows
  // before r) or stale; any other block order reads other values.
  testing::Rng rng(8);
  const Tensor<double> x0 = testing::random_tensor<double>({6, 6}, rng),
                       w0 = testing::random_tensor<double>({6, 6}, rng),
                       w1 = testing::random_tensor<double>({6, 6}, rng);
  auto run = [&](dev::Schedule schedule, bool broken) {
    Tape<double> tp;
    Var<double> x = tp.param(x0), w = tp.constant(w0);
    Var<double> loss = sum(matmul(relu(x), relu(w)) * 2.0);
    dev::Options o{.mode = dev::Mode::fused, .schedule = schedule};
    if (broken)
      o.edit_plan = [](dev::FusionPlan& p) {
        // forward: [rows: relu, relu] [rows: matmul, mul] [sum] -> one run of four.
        auto& seg = p.segments;
        REQUIRE(seg.size() > 2);
        REQUIRE(seg[0].kind == dev::SegmentKind::rows);
        REQUIRE(seg[1].kind == dev::SegmentKind::rows);
        seg[0].launches.insert(seg[0].launches.end(), seg[1].launches.begin(), seg[1].launches.end());
        seg[0].width = std::max(seg[0].width, seg[1].width);
        seg.erase(seg.begin() + 1);
      };
    auto prog = dev::capture(tp, loss, o);
    prog.set_input(w, w1);  // fresh values: a stale row now differs from a finished one
    prog.forward();
    prog.backward();
    std::vector<double> out{prog.loss()};
    const Tensor<double> g = prog.grad(x);
    out.insert(out.end(), g.data().begin(), g.data().end());
    return out;
  };
  const std::vector<double> truth = run(dev::Schedule::in_order, false);
  for (dev::Schedule s : race_schedules) CHECK(testing::bitwise_equal<double>(truth, run(s, false)));
  const std::vector<double> in_order = run(dev::Schedule::in_order, true);
  bool caught = false;
  for (dev::Schedule s : race_schedules) caught = caught || !testing::bitwise_equal<double>(in_order, run(s, true));
  CHECK(caught);
  // And the broken plan is wrong, which in-order emulation alone would not say.
  CHECK_FALSE(testing::bitwise_equal<double>(truth, run(dev::Schedule::reverse, true)));
}

TEST_CASE("the fused autoencoder step runs six kernels: two forward, two backward, two for the optimizer") {
  for (dev::Backend backend : backends()) {
    CAPTURE(dev::backend_name(backend));
    Model m;
    build_autoencoder(m);
    auto prog = dev::capture(m.tp, m.loss, {.backend = backend, .mode = dev::Mode::fused});
    dev::Adam<double> opt(prog, 0.005);
    for (std::size_t k = 0; k < m.params.size(); ++k) opt.add(m.params[k], m.l2[k]);
    opt.set_clip(0.5);
    std::uint64_t per_step = 0;
    for (int e = 0; e < 3; ++e) {
      const std::uint64_t before = prog.launches();
      prog.set_input(m.input, m.batches[static_cast<std::size_t>(e)]);
      prog.forward();
      prog.backward();
      opt.step();
      prog.loss();
      per_step = prog.launches() - before;
    }
    CHECK(per_step == 6);
  }
}

TEST_CASE("capture accepts every mode on every backend and says which ran fused") {
  Tape<double> tp;
  Var<double> w = tp.param(Tensor<double>::ones({4, 2}));
  Var<double> loss = sum(relu(w) * w);
  for (dev::Backend b : backends())
    for (dev::Mode mode : all_modes) {
      auto prog = dev::capture(tp, loss, {.backend = b, .mode = mode});
      CHECK(prog.mode() == mode);
      CHECK(prog.fused() == (mode == dev::Mode::fused));
    }
}

// ---- what a failing graph does: fall back, or (a device fault) never ----

namespace {

// A launcher whose kernels do nothing and whose graph capture throws the
// given error: the replay's policy, without a GPU.
template <class Error>
struct FailingLauncher {
  std::vector<std::unique_ptr<unsigned char[]>> blocks;
  int graph_attempts = 0, kernels = 0;
  template <class U>
  U* allocate(std::size_t n) {
    blocks.emplace_back(new unsigned char[std::max<std::size_t>(n, 1) * sizeof(U)]());
    return reinterpret_cast<U*>(blocks.back().get());
  }
  void upload(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  template <class Op, class S>
  void forward(const NodeArgs<S>&, S*, std::size_t) {
    ++kernels;
  }
  template <class Op, int In, class S>
  void backward(const NodeArgs<S>&, const S*, const S*, S*, std::size_t) {
    ++kernels;
  }
  template <class S>
  void accumulate(S*, const S*, std::size_t) {
    ++kernels;
  }
  template <class S>
  void rows(const dev::Launch<S>*, std::size_t, std::size_t, std::size_t) {}
  template <class S>
  void serial(const dev::Launch<S>*, std::size_t) {}
  template <class S>
  void batch(const dev::Launch<S>*, std::size_t, const dev::Launch<S>*) {}
  template <class F>
  void graph(std::size_t, F&&) {
    ++graph_attempts;
    throw Error("grad::device (test): the graph failed");
  }
  void drop_graphs() {}
  template <class S>
  void optimizer_prepare(const dev::ParamView<S>*, std::size_t, const dev::OptimizerHyper<S>*,
                         dev::OptimizerState<S>*) {}
  template <class S>
  void optimizer_update_all(const dev::ParamView<S>*, std::size_t, const dev::ParamView<S>*,
                            const dev::OptimizerHyper<S>*, const dev::OptimizerState<S>*) {}
  template <class S>
  void optimizer_update(const dev::ParamView<S>&, const dev::OptimizerHyper<S>*, const dev::OptimizerState<S>*) {}
};

template <class Error>
std::unique_ptr<dev::ReplayEngine<double, FailingLauncher<Error>>> failing_engine(Tape<double>& tp, Var<double> loss) {
  std::vector<std::size_t> values, grads;
  const dev::Layout<double> L = dev::capture_detail::build_layout<double>(tp, loss.index(), values, grads);
  return std::make_unique<dev::ReplayEngine<double, FailingLauncher<Error>>>(L, dev::Mode::graph, dev::plan_fusion(L),
                                                                             false);
}

}  // namespace

TEST_CASE("a graph that fails falls back to per-node launches; a device fault never does") {
  Tape<double> tp;
  Var<double> w = tp.param(Tensor<double>::ones({3, 2}));
  Var<double> loss = sum(relu(w) * w);
  {
    auto e = failing_engine<std::runtime_error>(tp, loss);
    e->forward();
    e->backward();
    if (testing::cuda_required()) {
      CHECK_THROWS_WITH(e->flush(), doctest::Contains("[refused: GRAD_REQUIRE_CUDA=1]"));
    } else {
      e->flush();
      CHECK(e->fallback_reason().find("could not run the step as a graph (grad::device (test): the graph failed); "
                                      "falling back to per-node launches") != std::string::npos);
      CHECK(e->launches() > 0);  // the queued phases ran per node
    }
  }
  {
    auto e = failing_engine<dev::DeviceFault>(tp, loss);
    e->forward();
    CHECK_THROWS_AS(e->flush(), dev::DeviceFault);
    CHECK(e->fallback_reason() == "");  // no fallback was tried
    CHECK(e->launches() == 0);
  }
}
