// A training loop's everyday pieces beyond the weights: dropout with
// train()/eval(), freezing, and the loop state a checkpoint keeps
// (LoopState, Batches::resume, generators and dropout counters), so that a
// stopped and resumed run is byte for byte an uninterrupted one.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <grad/checkpoint.hpp>
#include <grad/classify.hpp>
#include <grad/data.hpp>
#include <grad/device/capture.hpp>
#include <grad/emit.hpp>
#include <grad/loop_state.hpp>
#include <grad/modules.hpp>
#include <grad/tensor_math.hpp>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "support.hpp"

using grad::Tensor;
namespace nn = grad::nn;

namespace {

const grad::testing::ScratchDir scratch("training_loop");

std::vector<double> values(grad::View<double> v) { return {v.data.begin(), v.data.end()}; }

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("dropout in training: inverted (kept elements scaled by 1/(1-p)), a fresh mask per step; eval: identity") {
  grad::Tape<double> tp;
  grad::SplitMix64 gen(1);
  nn::Dropout<double> drop(tp, 0.25, gen);
  const auto x = tp.param(Tensor<double>::full({100, 100}, 2.0));
  const auto mark = tp.mark();
  const double scale = 1.0 / (1.0 - 0.25);
  std::vector<double> first;
  for (int step = 0; step < 2; ++step) {
    tp.reset_to(mark);
    const auto y = drop(x);
    REQUIRE(tp.ok());
    std::size_t kept = 0;
    for (double v : tp.value(y)) {
      CHECK((v == 0.0 || v == 2.0 * scale));
      kept += v != 0.0;
    }
    CHECK(std::abs(static_cast<double>(kept) / 10000.0 - 0.75) < 0.02);
    // The gradient is the same mask times the scale.
    REQUIRE(tp.backward(grad::sum(y)));
    for (std::size_t i = 0; i < 10000; ++i) CHECK(tp.grad(x)[i] == tp.value(y)[i] / 2.0);
    if (step == 0)
      first = values(tp.value(y));
    else
      CHECK(values(tp.value(y)) != first);  // the step is part of the key
  }
  CHECK(drop.random_steps() == std::vector<std::uint64_t>{2});

  // eval(): the input itself, nothing recorded; train() again draws step 2's mask.
  drop.eval();
  CHECK(!drop.training());
  tp.reset_to(mark);
  const std::size_t nodes = tp.size();
  CHECK(drop(x).index() == x.index());
  CHECK(tp.size() == nodes);
  drop.train();
  CHECK(drop.training());
  CHECK(drop(x).index() != x.index());
  CHECK(drop.random_steps() == std::vector<std::uint64_t>{3});

  // The mask is a pure function of (seed, step, node): the same key on a
  // fresh tape gives the same bits.
  grad::Tape<double> other;
  const auto x2 = other.param(Tensor<double>::full({100, 100}, 2.0));
  const auto y2 = grad::dropout(x2, 0.25, grad::dropout_key(drop.seed, 0, 1));
  CHECK(values(other.value(y2)) == first);
}

TEST_CASE("train()/eval() reach every registered child; mlp places a Dropout after each activation") {
  grad::Tape<double> tp;
  grad::SplitMix64 gen(2);
  auto model = nn::mlp<double>(tp, {4, 8, 8, 3}, gen, nn::relu_layer<double>, 0.5);
  CHECK(model.size() == 7);  // Linear, relu, Dropout, Linear, relu, Dropout, Linear
  CHECK(model.parameter("3.weight").valid());
  const auto x = tp.constant(Tensor<double>::full({2, 4}, 1.0));
  const auto mark = tp.mark();
  const std::size_t before = tp.size();
  (void)model(x);
  const std::size_t training_nodes = tp.size() - before;
  model.eval();
  tp.reset_to(mark);
  const std::vector<double> y_eval = values(tp.value(model(x)));
  CHECK(tp.size() - before == training_nodes - 2);  // both dropouts are gone
  for (std::size_t i = 0; i < tp.size(); ++i) CHECK(tp.nodes()[i].op != grad::op_code<grad::Dropout>);
  // eval() is what predict needs: the same logits twice.
  tp.reset_to(mark);
  CHECK(values(tp.value(model(x))) == y_eval);
  model.train();
  CHECK(model.random_steps() == std::vector<std::uint64_t>{0, 0, 1, 0, 1, 0});  // own, then children in order
}

TEST_CASE("dropout's p is checked: [0, 1) after rounding to T, by name") {
  grad::Tape<float> tp;
  grad::SplitMix64 gen(3);
  CHECK_THROWS_WITH_AS(nn::Dropout<float>(tp, 1.0, gen), doctest::Contains("nn::Dropout: p = 1.000000"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(nn::Dropout<float>(tp, -0.1, gen), doctest::Contains("expected 0 <= p < 1"),
                       std::invalid_argument);
  CHECK_THROWS_AS(nn::Dropout<float>(tp, std::nan(""), gen), std::invalid_argument);
  CHECK_THROWS_WITH_AS(nn::mlp<float>(tp, {2, 2, 2}, gen, nn::relu_layer<float>, 1.5),
                       doctest::Contains("nn::mlp: dropout 1.5"), std::invalid_argument);
  const auto x = tp.param(Tensor<float>::full({3}, 1.0f));
  // 1 - 1e-9 is 1 in float: a division by zero, refused.
  CHECK(!grad::dropout(x, 1.0 - 1e-9, 7).valid());
  CHECK(tp.error().find("grad: dropout: p = 1.000000 is out of range: expected 0 <= p < 1") == 0);
}

TEST_CASE("the device engine replays a dropout episode once and refuses a second replay; emit refuses a step()") {
  grad::Tape<double> tp;
  grad::SplitMix64 gen(4);
  nn::Dropout<double> drop(tp, 0.5, gen);
  const auto w = tp.param(Tensor<double>({2, 3}, {1, -2, 3, -4, 5, -6}));
  const auto loss = grad::sum(drop(w) * w);
  REQUIRE(tp.backward(loss));
  auto prog = grad::device::capture(tp, loss);
  prog.forward();
  prog.backward();
  CHECK(prog.loss() == tp.scalar(loss));
  const Tensor<double> g = prog.grad(w);
  CHECK(values(tp.grad(w)) == std::vector<double>(g.data().begin(), g.data().end()));
  CHECK_THROWS_WITH_AS(prog.forward(), doctest::Contains("node 1 is a dropout whose mask belongs to the captured step"),
                       std::logic_error);

  grad::SGD<double> sgd(0.1);
  REQUIRE(sgd.add(w));
  grad::EmitOptions<double> o;
  o.optimizer = &sgd;
  CHECK_THROWS_WITH_AS(grad::emit(tp, loss, o), doctest::Contains("is a dropout, whose mask belongs to the captured"),
                       grad::EmitError);
}

TEST_CASE("freeze(): the optimizer leaves frozen weights bitwise unchanged and no gradient work runs below them") {
  grad::Tape<double> tp;
  grad::SplitMix64 gen(5);
  auto model = nn::mlp<double>(tp, {3, 4, 2}, gen);
  grad::Adam<double> opt(0.05);
  REQUIRE(nn::add_parameters(opt, model));
  const auto w0 = model.parameter("0.weight"), b0 = model.parameter("0.bias"), w2 = model.parameter("2.weight");
  const Tensor<double> w0_before = tp.value(w0).tensor(), w2_before = tp.value(w2).tensor();
  const auto x = tp.constant(Tensor<double>({2, 3}, {1, 2, 3, -1, 0.5, 2}));
  const auto mark = tp.mark();
  REQUIRE(tp.set_requires_grad(w0, false));  // the first Linear only, through the tape
  REQUIRE(tp.set_requires_grad(b0, false));
  for (int step = 0; step < 3; ++step) {
    tp.reset_to(mark);
    const auto loss = grad::cross_entropy(model(x), std::vector<std::int32_t>{0, 1});
    REQUIRE(tp.backward(loss));
    CHECK(!tp.has_grad(w0));
    REQUIRE(opt.step());
  }
  for (std::size_t i = 0; i < 12; ++i) CHECK(tp.value(w0)[i] == w0_before[i]);  // bitwise
  CHECK(values(tp.value(w2)) != std::vector<double>(w2_before.data().begin(), w2_before.data().end()));
  // Only the second layer's nodes carried gradients: the first layer's
  // product, bias add and relu held no gradient buffer.
  std::size_t with_grad = 0;
  for (std::size_t i = mark.nodes; i < tp.size(); ++i) with_grad += tp.nodes()[i].requires_grad;
  tp.reset_to(mark);
  REQUIRE(model.unfreeze());
  const auto loss = grad::cross_entropy(model(x), std::vector<std::int32_t>{0, 1});
  std::size_t unfrozen = 0;
  for (std::size_t i = mark.nodes; i < tp.size(); ++i) unfrozen += tp.nodes()[i].requires_grad;
  CHECK(with_grad < unfrozen);
  REQUIRE(tp.backward(loss));
  REQUIRE(opt.step());
  CHECK(tp.value(w0)[0] != w0_before[0]);  // trained again
  // Module::freeze() freezes every parameter of a module.
  REQUIRE(model.freeze());
  for (const auto& p : model.parameters()) CHECK(!tp.requires_grad(p.var));

  // Only parameters can be frozen.
  CHECK(!tp.set_requires_grad(x, false));
  CHECK(tp.error() == "grad: set_requires_grad: node " + std::to_string(x.index()) +
                          " is a 'const' node; only parameters (tp.param) can be frozen or unfrozen");
}

TEST_CASE("LoopState: integers, numbers, strings, lists and batch positions survive a checkpoint; bad reads say why") {
  grad::Tape<double> tp;
  const auto w = tp.param(Tensor<double>({2}, {1, 2}));
  grad::SGD<double> opt(0.1);
  REQUIRE(opt.add(w));
  grad::LoopState st;
  st.set("epoch", 7);
  st.set("patience", -2);
  st.set("best_val", 0.1 + 0.2);
  st.set("run", "a run name longer than eight bytes");
  st.set("empty", "");
  st.set("gen", std::uint64_t{0xfedcba9876543210ULL});
  st.set("steps", std::vector<std::uint64_t>{0, 3, std::numeric_limits<std::uint64_t>::max()});
  st.set("batches", grad::BatchPosition{2, 5});
  const std::string path = scratch.file("state.ckpt");
  REQUIRE(grad::save_checkpoint(path, tp, opt, st.notes()).ok());

  std::vector<grad::CheckpointNote> notes;
  REQUIRE(grad::load_checkpoint(path, tp, opt, {}, &notes).ok());
  const grad::LoopState back(notes);
  CHECK(back.integer("epoch") == 7);
  CHECK(back.integer("patience") == -2);
  CHECK(back.number("best_val") == 0.1 + 0.2);  // exact: the double's bits
  CHECK(back.text("run") == "a run name longer than eight bytes");
  CHECK(back.text("empty").empty());
  CHECK(back.unsigned_integer("gen") == 0xfedcba9876543210ULL);
  CHECK(back.integers("steps") == std::vector<std::uint64_t>{0, 3, std::numeric_limits<std::uint64_t>::max()});
  CHECK(back.position("batches") == grad::BatchPosition{2, 5});
  CHECK(back.notes().size() == st.notes().size());

  CHECK_THROWS_WITH_AS((void)back.number("nope"), "LoopState: no value named 'nope'", std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)back.text("epoch"), "LoopState: 'epoch' holds an integer, not a string",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)back.position("steps"), doctest::Contains("holds 3 integers, not a batch position"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(st.set("long", std::string(300, 'x')), doctest::Contains("has 300 bytes; at most 256"),
                       std::invalid_argument);
  // Other notes (grad::dist's) pass through a state untouched; a missing piece is named.
  const grad::CheckpointNote foreign[] = {{"grad.dist.shards", 4}, {"loop.s:cut", 12}, {"loop.s0:cut", 0}};
  CHECK_THROWS_WITH_AS(grad::LoopState{foreign}, "LoopState: the notes lack piece 1 of 'cut'", std::invalid_argument);
}

TEST_CASE("Batches::resume: the same batches in the same order from any position; a position past the end is refused") {
  Tensor<double> x({10, 1});
  for (std::size_t i = 0; i < 10; ++i) x[i] = static_cast<double>(i);
  const std::vector<std::int32_t> y(10, 0);
  auto order = [&](grad::Batches<double>& b, std::size_t epochs) {
    std::vector<double> seen;
    for (std::size_t e = b.position().epoch; e < epochs; ++e)
      for (const auto& batch : b.epoch())
        seen.insert(seen.end(), batch.inputs.data().begin(), batch.inputs.data().end());
    return seen;
  };
  grad::Batches<double> straight(x, y, {.batch = 3, .seed = 9});
  const std::vector<double> all = order(straight, 3);
  CHECK(straight.position() == grad::BatchPosition{3, 0});
  grad::Batches<double> resumed(x, y, {.batch = 3, .seed = 9});
  resumed.resume({1, 2});  // epoch 1 from its third batch: 10 rows (4 per epoch's batches) in, plus 6
  const std::vector<double> rest = order(resumed, 3);
  CHECK(rest == std::vector<double>(all.begin() + 16, all.end()));
  CHECK_THROWS_WITH_AS(resumed.resume({0, 4}), doctest::Contains("batch 4 of epoch 0 does not exist: an epoch has 4"),
                       std::invalid_argument);
}

namespace {

// A small classifier trained with dropout, shuffled batches and input noise
// from a generator: every source of randomness a loop has.
struct Run {
  grad::Tape<double> tp;
  grad::SplitMix64 gen{21};
  nn::Sequential<double> model;
  grad::Adam<double> opt{0.02};
  grad::Batches<double> batches;
  grad::SplitMix64 noise{77};
  grad::Tape<double>::Mark mark;
  Run(const Tensor<double>& x, const std::vector<std::int32_t>& y)
      : model(nn::mlp<double>(tp, {4, 16, 3}, gen, nn::relu_layer<double>, 0.3)),
        batches(x, y, {.batch = 8, .last = grad::LastBatch::keep, .seed = 5}) {
    REQUIRE(nn::add_parameters(opt, model, {.weights = 1e-3, .others = 0}));
    mark = tp.mark();
  }
  // Trains to the end of epoch `epochs`, or stops after `limit` steps.
  void train(std::uint64_t epochs, std::uint64_t limit = std::numeric_limits<std::uint64_t>::max()) {
    std::uint64_t steps = 0;
    for (std::uint64_t e = batches.position().epoch; e < epochs; ++e)
      for (const auto& b : batches.epoch()) {
        tp.reset_to(mark);
        Tensor<double> in = b.inputs;
        for (double& v : in.data()) v += 0.05 * noise.normal();
        REQUIRE(tp.backward(grad::cross_entropy(model(tp.constant(in)), b.labels)));
        REQUIRE(opt.step());
        if (++steps == limit) return;
      }
  }
  grad::LoopState state() const {
    grad::LoopState st;
    st.set("batches", batches.position());
    st.set("noise", noise.state);
    st.set("dropout", model.random_steps());
    st.set("run", "resume test");
    return st;
  }
  void save(const std::string& path) const { REQUIRE(grad::save_checkpoint(path, tp, opt, state().notes()).ok()); }
  // Restores the loop state, all of it unless told to forget a part.
  void load(const std::string& path, std::string_view forget = "") {
    std::vector<grad::CheckpointNote> notes;
    REQUIRE(grad::load_checkpoint(path, tp, opt, {}, &notes).ok());
    const grad::LoopState st(notes);
    batches.resume(st.position("batches"));
    if (forget != "noise") noise.state = st.unsigned_integer("noise");
    if (forget != "dropout") model.set_random_steps(st.integers("dropout"));
  }
};

}  // namespace

TEST_CASE("stopping after epoch 2 (or mid-epoch) and resuming from the checkpoint gives the bytes of a straight run") {
  grad::SplitMix64 data(3);
  Tensor<double> x({60, 4});
  std::vector<std::int32_t> y(60);
  for (std::size_t r = 0; r < 60; ++r) {
    y[r] = static_cast<std::int32_t>(r % 3);
    for (std::size_t c = 0; c < 4; ++c) x[r * 4 + c] = data.uniform(-1, 1) + (c == r % 3 ? 1.0 : 0.0);
  }
  x = grad::standardize(x).first;
  Run straight(x, y);
  straight.train(4);
  const std::string want = scratch.file("straight.ckpt");
  straight.save(want);

  for (std::uint64_t stop : {16u, 19u}) {  // 8 batches per epoch: after epoch 2, and 3 batches into epoch 3
    CAPTURE(stop);
    const std::string mid = scratch.file("mid.ckpt"), end = scratch.file("resumed.ckpt");
    {
      Run first(x, y);
      first.train(4, stop);
      first.save(mid);
    }
    Run second(x, y);
    second.load(mid);
    second.train(4);
    second.save(end);
    CHECK(file_bytes(end) == file_bytes(want));
    for (const auto& p : straight.model.parameters())
      CHECK(values(second.tp.value(second.model.parameter(p.name))) == values(straight.tp.value(p.var)));
  }
  // Forgetting the noise generator's state or the dropout counters gives
  // another run: the checks above can fail.
  {
    Run first(x, y);
    first.train(4, 16);
    first.save(scratch.file("mid.ckpt"));
  }
  for (std::string_view part : {"noise", "dropout"}) {
    CAPTURE(part);
    Run forgetful(x, y);
    forgetful.load(scratch.file("mid.ckpt"), part);
    forgetful.train(4);
    const std::string other = scratch.file("forgetful.ckpt");
    forgetful.save(other);
    CHECK(file_bytes(other) != file_bytes(want));
    CHECK(values(forgetful.tp.value(forgetful.model.parameter("0.weight"))) !=
          values(straight.tp.value(straight.model.parameter("0.weight"))));
  }
}
