// The language-model ladder: the embedding and id cross-entropy ops (bad
// input, host loops against the per-item bodies), then nn::Lm (forward,
// LoRA without base gradients, merge, model files), the KV-cache decoder
// (bitwise the tape's logits), memorisation through finetune + merge, and
// the device engine's capture of a training step.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <grad/classify.hpp>
#include <grad/device/device.hpp>
#include <grad/lm.hpp>
#include <limits>

#include "golden.hpp"
#include "support.hpp"

using namespace grad;
using namespace grad::testing;
namespace dev = grad::device;

namespace {

void expect_poisoned(const Tape<double>& tp, std::initializer_list<const char*> fragments) {
  REQUIRE_FALSE(tp.ok());
  CAPTURE(tp.error());
  for (const char* f : fragments) CHECK(tp.error().find(f) != std::string::npos);
}

bool same_bits(std::span<const double> a, std::span<const double> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

}  // namespace

// ------------------------------------------------------------ the two ops --

TEST_CASE("embedding refuses ids out of range, non-integer ids, bad shapes and ids with a gradient") {
  Rng rng(1);
  const Tensor<double> table = random_tensor<double>({5, 3}, rng);
  {
    Tape<double> tp;
    embedding(tp.param(table), tp.constant(Tensor<double>({3}, {1, 5, 0})));
    expect_poisoned(tp, {"embedding", "id 5", "position 1", "[0, 5)"});
  }
  {
    Tape<double> tp;
    embedding(tp.param(table), tp.constant(Tensor<double>({2}, {-1, 0})));
    expect_poisoned(tp, {"embedding", "id -1", "position 0"});
  }
  {
    Tape<double> tp;
    embedding(tp.param(table), tp.constant(Tensor<double>({2}, {0, 2.5})));
    expect_poisoned(tp, {"embedding", "2.5", "position 1", "integer"});
  }
  {
    Tape<double> tp;
    embedding(tp.param(Tensor<double>({15}, std::vector<double>(15, 0.0))), tp.constant(Tensor<double>({1}, {0})));
    expect_poisoned(tp, {"embedding", "table [15]", "[vocab, d]"});
  }
  {
    Tape<double> tp;
    Var<double> p = tp.param(Tensor<double>({1}, {0}));
    embedding(tp.param(table), p);
    expect_poisoned(tp, {"embedding", "ids require a gradient"});
  }
}

TEST_CASE("cross_entropy with ids refuses ids out of range, non-integer ids and mismatched shapes") {
  Rng rng(2);
  const Tensor<double> logits = random_tensor<double>({3, 4}, rng);
  {
    Tape<double> tp;
    grad::cross_entropy(tp.param(logits), tp.constant(Tensor<double>({3}, {0, 4, 1})), -100.0);
    expect_poisoned(tp, {"cross_entropy", "id 4", "row 1", "[0, 4)", "-100"});
  }
  {
    Tape<double> tp;
    grad::cross_entropy(tp.param(logits), tp.constant(Tensor<double>({3}, {0, 1, 0.5})), -100.0);
    expect_poisoned(tp, {"cross_entropy", "0.5", "row 2"});
  }
  {
    Tape<double> tp;
    grad::cross_entropy(tp.param(logits), tp.constant(Tensor<double>({2}, {0, 1})), -100.0);
    expect_poisoned(tp, {"cross_entropy", "[3, 4]", "ids [2]", "expected ids [3]"});
  }
  {
    Tape<double> tp;
    grad::cross_entropy(tp.param(logits), tp.constant(Tensor<double>({3}, {0, 1, 2})), 0.5);
    expect_poisoned(tp, {"cross_entropy", "ignore id 0.5"});
  }
}

TEST_CASE("cross_entropy with ids equals the one-hot and label forms, and leaves ignored rows out") {
  Rng rng(3);
  const Tensor<double> logits = random_tensor<double>({4, 6}, rng, -3, 3);
  const std::vector<int> labels = {5, 0, 2, 2};
  Tape<double> tp;
  Var<double> x = tp.param(logits);
  Tensor<double> ids({4}), onehot({4, 6});
  for (std::size_t r = 0; r < 4; ++r) {
    ids[r] = labels[r];
    onehot[r * 6 + static_cast<std::size_t>(labels[r])] = 1;
  }
  const double fused = tp.scalar(grad::cross_entropy(x, tp.constant(ids), -1.0));
  CHECK(fused == doctest::Approx(tp.scalar(nn::cross_entropy(x, tp.constant(onehot)))).epsilon(1e-14));
  CHECK(fused == doctest::Approx(tp.scalar(grad::cross_entropy(x, labels))).epsilon(1e-14));
  // The last row ignored: the mean of the first three.
  Tensor<double> ids3 = ids;
  ids3[3] = -1;
  const double three = tp.scalar(grad::cross_entropy(x, tp.constant(ids3), -1.0));
  const double want =
      tp.scalar(nn::cross_entropy(slice(x, {0, 0}, {3, 6}), slice(tp.constant(onehot), {0, 0}, {3, 6})));
  CHECK(three == doctest::Approx(want).epsilon(1e-14));
  // Every row ignored: loss 0, gradient 0.
  Tape<double> t2;
  Var<double> y = t2.param(logits);
  Var<double> none = grad::cross_entropy(y, t2.constant(Tensor<double>::full({4}, -1)), -1.0);
  CHECK(t2.scalar(none) == 0);
  REQUIRE(t2.backward(none));
  for (double g : t2.grad(y)) CHECK(g == 0);
}

TEST_CASE("the host loops of embedding and cross_entropy give the per-item bodies' bits") {
  Rng rng(4);
  const Tensor<double> table = random_tensor<double>({7, 5}, rng), g = random_tensor<double>({4, 3, 5}, rng);
  const Tensor<double> ids({4, 3}, {1, 6, 1, 0, 6, 2, 3, 3, 0, 5, 4, 1});
  NodeArgs<double> x;
  x.a = {table.data().data(), Dims::of(table.shape())};
  x.b = {ids.data().data(), Dims::of(ids.shape())};
  x.out = Dims::of(g.shape());
  std::vector<double> y1(60), y2(60), d1(35), d2(35);
  Embedding::forward_tensor(x, y1.data());
  for (std::size_t w = 0; w < forward_items<Embedding>(x); ++w) Embedding::forward_item(x, y2.data(), w);
  CHECK(same_bits(y1, y2));
  Embedding::backward_tensor<0>(x, y1.data(), g.data().data(), d1.data());
  for (std::size_t w = 0; w < backward_items<Embedding, 0>(x); ++w)
    Embedding::backward_item<0>(x, y1.data(), g.data().data(), d2.data(), w);
  CHECK(same_bits(d1, d2));

  const Tensor<double> logits = random_tensor<double>({6, 9}, rng, -4, 4), targets({6}, {2, 8, -100, 0, 8, 5});
  NodeArgs<double> c;
  c.a = {logits.data().data(), Dims::of(logits.shape())};
  c.b = {targets.data().data(), Dims::of(targets.shape())};
  c.out = Dims::of(std::array<std::size_t, 1>{1});
  c.scalar = -100;
  double loss1 = 0, loss2 = 0, up = 0.7;
  CrossEntropy::forward_tensor(c, &loss1);
  CrossEntropy::forward_item(c, &loss2, 0);
  CHECK(std::memcmp(&loss1, &loss2, sizeof loss1) == 0);
  std::vector<double> e1(54), e2(54);
  CrossEntropy::backward_tensor<0>(c, &loss1, &up, e1.data());
  for (std::size_t w = 0; w < backward_items<CrossEntropy, 0>(c); ++w)
    CrossEntropy::backward_item<0>(c, &loss1, &up, e2.data(), w);
  CHECK(same_bits(e1, e2));
}

// ------------------------------------------- linear_cross_entropy (fused) --

namespace {

template <class T>
bool same_bits_of(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The loss of h [rows, d] through W (trainable or a constant) against ids
// with every fourth row ignored, recorded fused or as the composite
// cross_entropy(matmul_nt(h, W)) (matmul for ClassAxis::columns); backward run
// from the loss times `upstream` (1: from the loss itself).
template <class T>
struct HeadLoss {
  Tape<T> tp;
  Var<T> h, w, loss;
  HeadLoss(bool fused, std::size_t rows, std::size_t classes, std::size_t d, ClassAxis along, bool train_w,
           std::uint64_t seed, T upstream = T(1)) {
    Rng rng(seed);
    const Tensor<T> h0 = random_tensor<T>({rows, d}, rng, -2, 2);
    const Tensor<T> w0 = random_tensor<T>(along == ClassAxis::rows ? Shape{classes, d} : Shape{d, classes}, rng, -2, 2);
    Tensor<T> ids({rows});
    for (std::size_t r = 0; r < rows; ++r) ids[r] = r % 4 == 1 ? T(-100) : static_cast<T>(rng.next() % classes);
    h = tp.param(h0);
    w = train_w ? tp.param(w0) : tp.constant(w0);
    const Var<T> scaled = h * T(3), targets = tp.constant(ids);  // h's gradient passes through a node
    if (fused)
      loss = linear_cross_entropy(scaled, w, targets, T(-100), along);
    else
      loss = grad::cross_entropy(along == ClassAxis::rows ? matmul_nt(scaled, w) : matmul(scaled, w), targets, T(-100));
    REQUIRE(tp.ok());
    REQUIRE(tp.backward(upstream == T(1) ? loss : loss * upstream));
  }
  // The fused node (the loss slices it: the form that keeps dh).
  const Node<T>& fused_node() const { return tp.nodes()[tp.nodes()[loss.index()].a]; }
};

}  // namespace

TEST_CASE_TEMPLATE("linear_cross_entropy is cross_entropy of matmul_nt (or matmul) bit for bit: loss, dh and dW", T,
                   double, float) {
  for (std::size_t threads : {1, 3}) {
    set_num_threads(threads);
    for (std::size_t rows : {1, 5, 67, 300})  // 300: three chunks of at most 128 rows
      for (std::size_t classes : {7, 301})
        for (ClassAxis along : {ClassAxis::rows, ClassAxis::columns})
          for (bool train_w : {true, false}) {
            CAPTURE(threads);
            CAPTURE(rows);
            CAPTURE(classes);
            CAPTURE(along == ClassAxis::rows);
            CAPTURE(train_w);
            const std::uint64_t seed = rows * 1000 + classes;
            // An upstream gradient of 1 reads the dh the forward pass kept; any other recomputes it.
            for (T upstream : {T(1), T(0.3)}) {
              CAPTURE(upstream);
              HeadLoss<T> fused(true, rows, classes, 9, along, train_w, seed, upstream),
                  unfused(false, rows, classes, 9, along, train_w, seed, upstream);
              CHECK(fused.tp.nodes()[fused.loss.index()].op == op_code<Slice>);
              CHECK(fused.fused_node().op == op_code<LinearCrossEntropy>);
              CHECK(fused.fused_node().dims.size() == 1 + rows * 9);
              CHECK(same_bits_of(fused.tp.value(fused.loss).data, unfused.tp.value(unfused.loss).data));
              CHECK(same_bits_of(fused.tp.grad(fused.h).data, unfused.tp.grad(unfused.h).data));
              CHECK(fused.tp.has_grad(fused.w) == train_w);
              if (train_w) CHECK(same_bits_of(fused.tp.grad(fused.w).data, unfused.tp.grad(unfused.w).data));
            }
          }
  }
  set_num_threads(1);
}

TEST_CASE("linear_cross_entropy: chunks bounded by 64 MiB of logits keep the bits (wide vocabulary)") {
  // 300,000 classes of floats: 55 rows per chunk, so 60 rows take two.
  CHECK(LinearCrossEntropy::chunk_rows<float>(300000) == 55);
  CHECK(LinearCrossEntropy::chunk_rows<float>(151936) == 110);  // Qwen2.5-0.5B's vocabulary
  CHECK(LinearCrossEntropy::chunk_rows<double>(7) == 128);
  CHECK(LinearCrossEntropy::chunk_rows<float>(std::size_t{1} << 25) == 1);
  HeadLoss<float> fused(true, 60, 300000, 2, ClassAxis::rows, true, 5),
      unfused(false, 60, 300000, 2, ClassAxis::rows, true, 5);
  CHECK(same_bits_of(fused.tp.value(fused.loss).data, unfused.tp.value(unfused.loss).data));
  CHECK(same_bits_of(fused.tp.grad(fused.h).data, unfused.tp.grad(unfused.h).data));
  CHECK(same_bits_of(fused.tp.grad(fused.w).data, unfused.tp.grad(unfused.w).data));
  // The tape keeps neither the logits nor their gradient.
  CHECK(fused.tp.arena_bytes() + 2 * 60 * 300000 * sizeof(float) <= unfused.tp.arena_bytes());
}

TEST_CASE("linear_cross_entropy's host loops give its per-item bodies' bits; the device CPU backend too") {
  for (ClassAxis along : {ClassAxis::rows, ClassAxis::columns}) {
    CAPTURE(along == ClassAxis::rows);
    HeadLoss<double> fused(true, 37, 11, 5, along, true, 9);
    const Node<double>& n = fused.fused_node();
    const NodeArgs<double> x = fused.tp.args(n);
    // The forward items: the loss, then the kept dh.
    std::vector<double> by_items(forward_items<LinearCrossEntropy>(x));
    REQUIRE(by_items.size() == 1 + 37 * 5);
    for (std::size_t w = 0; w < by_items.size(); ++w) LinearCrossEntropy::forward_item(x, by_items.data(), w);
    CHECK(by_items[0] == fused.tp.scalar(fused.loss));
    CHECK(same_bits(by_items, std::span<const double>(n.value, by_items.size())));
    // ... which is the gradient backward gave h * 3, the node's operand
    CHECK(same_bits(std::span<const double>(by_items).subspan(1), std::span<const double>(fused.tp.nodes()[n.a].grad, 37 * 5)));
    // Backward at an upstream gradient of 1 (reads the kept dh) and of 0.3 (computes it).
    for (const double up : {1.0, 0.3}) {
      CAPTURE(up);
      std::vector<double> dh(37 * 5), dw(11 * 5);
      for (std::size_t w = 0; w < dh.size(); ++w)
        LinearCrossEntropy::backward_item<0>(x, by_items.data(), &up, dh.data(), w);
      for (std::size_t w = 0; w < dw.size(); ++w)
        LinearCrossEntropy::backward_item<1>(x, by_items.data(), &up, dw.data(), w);
      std::vector<double> dh_host(dh.size()), dw_host(dw.size());
      LinearCrossEntropy::backward_tensor<0>(x, by_items.data(), &up, dh_host.data());
      LinearCrossEntropy::backward_tensor<1>(x, by_items.data(), &up, dw_host.data());
      CHECK(same_bits(dh, dh_host));
      CHECK(same_bits(dw, dw_host));
      if (up == 1.0) CHECK(same_bits(dw, fused.tp.grad(fused.w).data));
    }
    auto prog = dev::capture(fused.tp, fused.loss, {.backend = dev::Backend::cpu});
    prog.forward();
    prog.backward();
    CHECK(prog.loss() == fused.tp.scalar(fused.loss));
    const Tensor<double> gw = prog.grad(fused.w), gh = prog.grad(fused.h);
    CHECK(same_bits(gw.data(), fused.tp.grad(fused.w).data));
    CHECK(same_bits(gh.data(), fused.tp.grad(fused.h).data));
  }
}

TEST_CASE("linear_cross_entropy refuses bad shapes, ids out of range or not integers, and ids with a gradient") {
  auto h_of = [](Tape<double>& tp, Shape s) { return tp.param(Tensor<double>(std::move(s))); };
  auto ids_of = [](Tape<double>& tp, std::vector<double> v) {
    const std::size_t n = v.size();
    return tp.constant(Tensor<double>({n}, std::move(v)));
  };
  {
    Tape<double> tp;
    linear_cross_entropy(h_of(tp, {2, 3, 4}), h_of(tp, {5, 4}), ids_of(tp, {0, 1}));
    expect_poisoned(tp, {"linear_cross_entropy", "h [2, 3, 4]", "expected [rows, d]"});
  }
  {
    Tape<double> tp;
    linear_cross_entropy(h_of(tp, {3, 4}), h_of(tp, {5, 3}), ids_of(tp, {0, 1, 2}));
    expect_poisoned(tp, {"linear_cross_entropy", "h [3, 4] and W [5, 3]", "expected W [classes, 4]"});
  }
  {
    Tape<double> tp;
    linear_cross_entropy(h_of(tp, {3, 4}), h_of(tp, {5, 4}), ids_of(tp, {0, 1, 2}), -100.0, ClassAxis::columns);
    expect_poisoned(tp, {"linear_cross_entropy", "h [3, 4] and W [5, 4]", "expected W [4, classes]"});
  }
  {
    Tape<double> tp;
    linear_cross_entropy(h_of(tp, {3, 4}), h_of(tp, {5, 4}), ids_of(tp, {0, 1}));
    expect_poisoned(tp, {"linear_cross_entropy", "h [3, 4] and ids [2]", "expected ids [3]"});
  }
  {
    Tape<double> tp;
    linear_cross_entropy(h_of(tp, {3, 4}), h_of(tp, {5, 4}), ids_of(tp, {0, 5, 1}));
    expect_poisoned(tp, {"linear_cross_entropy", "id 5", "row 1", "[0, 5)", "-100"});
  }
  {
    Tape<double> tp;
    linear_cross_entropy(h_of(tp, {3, 4}), h_of(tp, {4, 5}), ids_of(tp, {0, 1, 0.5}), -1.0, ClassAxis::columns);
    expect_poisoned(tp, {"linear_cross_entropy", "0.5", "row 2"});
  }
  {
    Tape<double> tp;
    linear_cross_entropy(h_of(tp, {3, 4}), h_of(tp, {5, 4}), ids_of(tp, {0, 1, 2}), 0.5);
    expect_poisoned(tp, {"linear_cross_entropy", "ignore id 0.5"});
  }
  {
    Tape<double> tp;
    linear_cross_entropy(h_of(tp, {3, 4}), h_of(tp, {5, 4}), tp.param(Tensor<double>({3}, {0, 1, 2})));
    expect_poisoned(tp, {"linear_cross_entropy", "the ids require a gradient"});
  }
}

// ------------------------------------------------------------- the model --

namespace {

nn::LmConfig small_config(std::size_t lora_rank = 0) {
  nn::LmConfig c;
  c.vocab = 256;
  c.d_model = 12;
  c.layers = 2;
  c.heads = 3;
  c.kv_heads = 1;
  c.ffn = 20;
  c.max_seq = 16;
  c.lora_rank = lora_rank;
  c.lora_scale = 0.75;
  return c;
}

std::vector<int> some_tokens(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<int> t(n);
  for (int& x : t) x = static_cast<int>(rng.next() % 256);
  return t;
}

// Random values into every adapter B (they start at zero), so that the adapters matter.
template <class T>
void randomize_adapters(nn::Lm<T>& m, std::uint64_t seed) {
  Rng rng(seed);
  for (const auto& p : m.adapters())
    for (T& x : m.tape().leaf_value(p.var)) x = static_cast<T>(rng.uniform(-0.3, 0.3));
}

// One step() per token of each of the B sequences of t tokens: every
// position's logits bitwise the tape's (logits [B * t, 256]).
void check_steps(nn::KvDecoder<double>& dec, std::span<const int> in, std::span<const double> logits, std::size_t B,
                 std::size_t t) {
  for (std::size_t b = 0; b < B; ++b) {
    dec.reset();
    for (std::size_t p = 0; p < t; ++p) {
      CAPTURE(b);
      CAPTURE(p);
      CHECK(same_bits(dec.step(in[b * t + p]), logits.subspan((b * t + p) * 256, 256)));
    }
  }
}

}  // namespace

TEST_CASE("Lm records logits [batch * seq, vocab] and a loss near ln(vocab) at initialisation") {
  Tape<double> tp;
  nn::Lm<double> m(tp, small_config(), 7);
  const std::vector<int> in = some_tokens(2 * 9, 1), out = some_tokens(2 * 9, 2);
  auto r = m.forward(m.ids(in, 2, 9), m.ids(out, 18, 0));
  REQUIRE(tp.ok());
  CHECK(tp.value(r.logits).shape[0] == 18);
  CHECK(tp.value(r.logits).shape[1] == 256);
  CHECK(std::abs(tp.scalar(r.loss) - std::log(256.0)) < 1.0);
  REQUIRE(tp.backward(r.loss));
  for (const auto& p : m.named())
    if (p.name != "lm.config") CHECK(tp.has_grad(p.var));
}

TEST_CASE("Lm refuses a window longer than max_seq, tokens out of range and a wrong token count") {
  {
    Tape<double> tp;
    nn::Lm<double> m(tp, small_config(), 7);
    m.forward(m.ids(some_tokens(17, 1), 1, 17));
    expect_poisoned(tp, {"nn::Lm::forward", "17 positions", "max_seq 16"});
  }
  {
    Tape<double> tp;
    nn::Lm<double> m(tp, small_config(), 7);
    std::vector<int> in = some_tokens(8, 1);
    in[5] = 300;
    m.forward(m.ids(in, 1, 8));
    expect_poisoned(tp, {"embedding", "id 300", "position 5", "[0, 256)"});
  }
  {
    Tape<double> tp;
    nn::Lm<double> m(tp, small_config(), 7);
    m.ids(some_tokens(7, 1), 2, 4);
    expect_poisoned(tp, {"nn::Lm::ids", "7 tokens", "[2, 4]"});
  }
  nn::LmConfig bad = small_config();
  bad.kv_heads = 2;
  Tape<double> tp;
  CHECK_THROWS_WITH_AS(nn::Lm<double>(tp, bad, 1), doctest::Contains("kv_heads 2"), std::invalid_argument);
}

TEST_CASE("LoRA training: base weights are constants with no gradient buffer; only adapters get gradients") {
  const std::vector<int> in = some_tokens(2 * 12, 3), out = some_tokens(2 * 12, 4);
  Tape<double> full_tp;
  nn::Lm<double> full(full_tp, small_config(), 7);
  auto rf = full.forward(full.ids(in, 2, 12), full.ids(out, 24, 0));
  REQUIRE(full_tp.backward(rf.loss));

  Tape<double> tp;
  nn::Lm<double> m(tp, small_config(4), 7, nn::Lm<double>::Train::lora);
  auto r = m.forward(m.ids(in, 2, 12), m.ids(out, 24, 0));
  REQUIRE(tp.backward(r.loss));
  for (const auto& p : m.base()) {
    CAPTURE(p.name);
    CHECK_FALSE(tp.has_grad(p.var));
    CHECK_FALSE(tp.requires_grad(p.var));
  }
  for (const auto& p : m.adapters()) {
    CAPTURE(p.name);
    CHECK(tp.has_grad(p.var));
  }
  CHECK(m.trainable().size() == m.adapters().size());
  // With B = 0 the LoRA model is exactly the base model.
  CHECK(tp.scalar(r.loss) == full_tp.scalar(rf.loss));
  // Gradient buffers of the model's own tensors: every weight in full
  // training, the adapters alone under LoRA. (The activations' buffers are
  // the tape's grad_bytes less these; LoRA adds the adapter branches' nodes.)
  auto tensor_grad_bytes = [](const Tape<double>& t, const auto& named) {
    std::size_t n = 0;
    for (const auto& p : named)
      if (t.requires_grad(p.var)) n += t.value(p.var).size() * sizeof(double);
    return n;
  };
  const std::size_t full_bytes = tensor_grad_bytes(full_tp, full.named()),
                    lora_bytes = tensor_grad_bytes(tp, m.named());
  MESSAGE("weight gradient bytes: full finetune " << full_bytes << ", LoRA " << lora_bytes << "; whole tape "
                                                  << full_tp.grad_bytes() << " vs " << tp.grad_bytes());
  CHECK(lora_bytes * 4 < full_bytes);
}

TEST_CASE("the KV-cache decoder's logits are bitwise the tape's at every position (base and LoRA, batched)") {
  for (std::size_t rank : {std::size_t{0}, std::size_t{3}}) {
    CAPTURE(rank);
    Tape<double> tp;
    nn::LmConfig c = small_config(rank);
    c.lora_targets = nn::parse_projections("q,v,o,down");
    nn::Lm<double> m(tp, c, 11);
    randomize_adapters(m, 5);
    const std::size_t t = 16, B = 2;
    const std::vector<int> in = some_tokens(B * t, 9);
    auto r = m.forward(m.ids(in, B, t));
    REQUIRE(tp.ok());
    const View<double> logits = tp.value(r.logits);
    nn::KvDecoder<double> dec(m);
    check_steps(dec, in, logits.data, B, t);
    CHECK_THROWS_AS(dec.step(1), std::out_of_range);  // full
    dec.reset();
    CHECK_THROWS_WITH_AS(dec.step(256), doctest::Contains("token 256"), std::out_of_range);
    // A prompt at once: the last position's logits, then steps, bitwise the tape's.
    for (std::size_t b = 0; b < B; ++b) {
      CAPTURE(b);
      dec.reset();
      const std::span<const int> seq = std::span<const int>(in).subspan(b * t, t);
      CHECK(same_bits(dec.prefill(seq.first(5)), logits.data.subspan((b * t + 4) * 256, 256)));
      CHECK(same_bits(dec.prefill(seq.subspan(5, 6)), logits.data.subspan((b * t + 10) * 256, 256)));
      for (std::size_t p = 11; p < t; ++p)
        CHECK(same_bits(dec.step(seq[p]), logits.data.subspan((b * t + p) * 256, 256)));
    }
    dec.reset();
    CHECK_THROWS_WITH_AS(dec.prefill(std::vector<int>{1, 2, 300}), doctest::Contains("token 300 (index 2)"),
                         std::out_of_range);
    CHECK(dec.position() == 0);  // a refused prompt changes nothing
    CHECK_THROWS_AS(dec.prefill(std::vector<int>(c.max_seq + 1, 1)), std::out_of_range);
    CHECK_THROWS_AS(dec.prefill(std::span<const int>{}), std::invalid_argument);
  }
}

TEST_CASE("tied embeddings: the head is one matmul_nt node on the embedding, and the decoder reads it in place, bitwise") {
  Tape<double> tp;
  nn::LmConfig c = small_config();
  c.tied_embeddings = true;
  nn::Lm<double> m(tp, c, 17);
  const std::size_t t = 12, B = 2;
  const std::vector<int> in = some_tokens(B * t, 21);
  auto r = m.forward(m.ids(in, B, t), m.ids(some_tokens(B * t, 22), B * t, 0));
  REQUIRE(tp.ok());
  REQUIRE(tp.backward(r.loss));
  const Node<double>& head = tp.nodes()[r.logits.index()];
  CHECK(head.op == op_code<MatmulNt>);
  CHECK(head.b == m.embed().index());  // no transposed copy between them
  // The node against the composite it replaces, on the same operands.
  Tape<double> ref;
  const Node<double>& norm = tp.nodes()[head.a];
  Var<double> normed = ref.param(
      Tensor<double>(norm.dims.shape(), std::vector<double>(norm.value, norm.value + norm.dims.size())));
  Var<double> embed = ref.param(tp.value(m.embed()).tensor());
  CHECK(same_bits(tp.value(r.logits).data, ref.value(matmul(normed, transpose(embed))).data));
  nn::KvDecoder<double> dec(m);
  check_steps(dec, in, tp.value(r.logits).data, B, t);
  for (std::size_t b = 0; b < B; ++b) {
    dec.reset();
    CHECK(same_bits(dec.prefill(std::span<const int>(in).subspan(b * t, t)),
                    tp.value(r.logits).data.subspan((b * t + t - 1) * 256, 256)));
  }
}

TEST_CASE("Lm::forward_loss: forward's loss and every gradient bit for bit, without the logits (tied and untied)") {
  const std::size_t t = 12, B = 2;
  const std::vector<int> in = some_tokens(B * t, 31);
  std::vector<int> out = some_tokens(B * t, 32);
  out[5] = -100;  // a padded position
  for (bool tied : {false, true})
    for (std::size_t rank : {0, 4})
      for (bool recompute : {false, true}) {
        CAPTURE(tied);
        CAPTURE(rank);
        CAPTURE(recompute);
        nn::LmConfig c = small_config(rank);
        c.tied_embeddings = tied;
        const auto train = rank == 0 ? nn::Lm<double>::Train::full : nn::Lm<double>::Train::lora;
        Tape<double> tp, tf;
        nn::Lm<double> m(tp, c, 17, train), mf(tf, c, 17, train);
        mf.set_recompute(recompute);  // the layers in recompute scopes: the fused loss after them keeps the bits
        const Var<double> loss = m.forward(m.ids(in, B, t), m.ids(out, B * t, 0)).loss;
        const Var<double> fused = mf.forward_loss(mf.ids(in, B, t), mf.ids(out, B * t, 0));
        REQUIRE(tp.backward(loss));
        REQUIRE(tf.backward(fused));
        // The loss is the first element of the fused node, which keeps dh after it.
        CHECK(tf.nodes()[fused.index()].op == op_code<Slice>);
        CHECK(tf.nodes()[tf.nodes()[fused.index()].a].op == op_code<LinearCrossEntropy>);
        CHECK(tp.scalar(loss) == tf.scalar(fused));
        for (std::size_t k = 0; k < m.named().size(); ++k) {
          CAPTURE(m.named()[k].name);
          REQUIRE(tp.has_grad(m.named()[k].var) == tf.has_grad(mf.named()[k].var));
          if (tp.has_grad(m.named()[k].var))
            CHECK(same_bits(tp.grad(m.named()[k].var).data, tf.grad(mf.named()[k].var).data));
        }
        // Neither the [24, 256] logits nor their gradient on the tape: the
        // values and gradients its nodes hold differ by exactly those, less
        // the dh [24, d] the fused node keeps and the slice of its loss
        // (each a value and a gradient).
        auto node_bytes = [](const Tape<double>& tape) {
          std::size_t n = 0;
          for (const Node<double>& node : tape.nodes()) n += node.dims.size() * sizeof(double) * (node.grad ? 2 : 1);
          return n;
        };
        if (!recompute)
          CHECK(node_bytes(tf) + 2 * B * t * c.vocab * sizeof(double) ==
                node_bytes(tp) + 2 * (B * t * c.d_model + 1) * sizeof(double));
      }
}

TEST_CASE("merge folds every adapter into its base weight: logits within 1e-12 relative at f64") {
  Tape<double> tp;
  nn::Lm<double> lora(tp, small_config(4), 13, nn::Lm<double>::Train::lora);
  randomize_adapters(lora, 6);
  Tape<double> tp2;
  nn::Lm<double> merged(tp2, small_config(), 99);
  nn::merge_lora(lora, merged);
  const std::vector<int> in = some_tokens(2 * 10, 12);
  const View<double> a = tp.value(lora.forward(lora.ids(in, 2, 10)).logits);
  const View<double> b = tp2.value(merged.forward(merged.ids(in, 2, 10)).logits);
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    largest = std::max(largest, std::abs(a[i]));
  }
  MESSAGE("merged vs base+adapters: max |diff| " << worst << " of max |logit| " << largest);
  CHECK(worst <= 1e-12 * largest);
  Tape<double> tp3;
  nn::Lm<double> other(tp3, small_config(2), 1);
  CHECK_THROWS_WITH_AS(nn::merge_lora(lora, other), doctest::Contains("no adapters"), std::invalid_argument);
}

TEST_CASE("model files: round trip, a base file into a LoRA model, another config refused with nothing loaded") {
  ScratchDir dir("lm");
  Tape<double> tp;
  nn::Lm<double> m(tp, small_config(), 21);
  REQUIRE(nn::save_lm(dir.file("base.model"), m));
  nn::LmConfig read;
  REQUIRE(nn::read_lm_config(dir.file("base.model"), read) == "");
  CHECK(read.stored() == small_config().stored());

  Tape<double> tp2;
  nn::Lm<double> m2(tp2, small_config(), 22);
  const ModelFileResult loaded = nn::load_lm(dir.file("base.model"), m2);
  CAPTURE(loaded.error);
  REQUIRE(loaded.ok());
  for (const auto& p : m.base()) CHECK(same_bits(tp.value(p.var).data, tp2.value(m2.tensor(p.name)).data));

  Tape<double> tp3;
  nn::Lm<double> lora(tp3, small_config(2), 23, nn::Lm<double>::Train::lora);
  REQUIRE(nn::load_lm(dir.file("base.model"), lora));
  CHECK(same_bits(tp.value(m.head()).data, tp3.value(lora.head()).data));

  nn::LmConfig other = small_config();
  other.ffn = 24;
  Tape<double> tp4;
  nn::Lm<double> wrong(tp4, other, 24);
  const std::vector<double> before(tp4.value(wrong.head()).begin(), tp4.value(wrong.head()).end());
  const ModelFileResult r = nn::load_lm(dir.file("base.model"), wrong);
  REQUIRE_FALSE(r);
  CHECK(r.error.find("another model config") != std::string::npos);
  CHECK(r.error.find("ffn 20") != std::string::npos);
  CHECK(r.error.find("ffn 24") != std::string::npos);
  CHECK(r.error.find("nothing loaded") != std::string::npos);
  CHECK(same_bits(before, tp4.value(wrong.head()).data));
}

// -------------------------------------------- configs and files from outside --

namespace {

// A model file from a hand-written payload, checksummed as save_model would.
void write_model_file(const std::string& path, const std::vector<unsigned char>& payload) {
  const auto file = grad::detail::frame(grad::detail::model_magic, model_file_version, 1, 0, payload);
  REQUIRE(grad::detail::write_atomically(path, file, "model") == "");
}

// Rewrites field `field` of the lm.config a save_lm file ends with (its last
// tensor: the payload's last 12 doubles) and the checksum after it.
void edit_stored_config(const std::string& path, std::size_t field, double value) {
  std::vector<unsigned char> bytes = read_bytes(path);
  const std::size_t at = bytes.size() - 8 - nn::LmConfig::stored_fields * 8 + field * 8;
  std::memcpy(bytes.data() + at, &value, 8);
  const std::uint64_t hash = grad::detail::fnv1a(std::span(bytes).first(bytes.size() - 8));
  std::memcpy(bytes.data() + bytes.size() - 8, &hash, 8);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("read_lm_config checks every entry size against the payload before reading through it") {
  ScratchDir dir("lm_sizes");
  grad::detail::ByteWriter w;
  w.put(std::uint64_t{2});
  // 'a' claims 2^61 - 1 doubles: the offset of lm.config's values would wrap
  // around to 8 bytes before the buffer.
  w.put(std::uint32_t{1});
  w.put('a');
  w.put(std::uint32_t{1});
  w.put(std::uint64_t{(std::uint64_t{1} << 61) - 1});
  w.put(std::uint32_t{9});
  w.put_all(std::span<const char>("lm.config", 9));
  w.put(std::uint32_t{1});
  w.put(std::uint64_t{nn::LmConfig::stored_fields});
  for (double v : small_config().stored()) w.put(v);
  write_model_file(dir.file("wrapped.model"), w.bytes);
  nn::LmConfig c;
  const std::string why = nn::read_lm_config(dir.file("wrapped.model"), c);
  CHECK(why.find("wrapped.model': corrupted: parameter 1 has more values than the") != std::string::npos);
  CHECK(why.find("-byte payload holds") != std::string::npos);
  CHECK(c.stored() == nn::LmConfig{}.stored());  // untouched

  // Two entries that each fit, but not together.
  grad::detail::ByteWriter two;
  two.put(std::uint64_t{2});
  two.put(std::uint32_t{1});
  two.put('a');
  two.put(std::uint32_t{1});
  two.put(std::uint64_t{10});
  two.put(std::uint32_t{9});
  two.put_all(std::span<const char>("lm.config", 9));
  two.put(std::uint32_t{1});
  two.put(std::uint64_t{nn::LmConfig::stored_fields});
  for (double v : small_config().stored()) two.put(v);
  write_model_file(dir.file("short.model"), two.bytes);
  CHECK(nn::read_lm_config(dir.file("short.model"), c)
            .find("corrupted: the tensors up to parameter 2 have more values") != std::string::npos);
}

TEST_CASE("LmConfig::check refuses max_seq < 2, non-finite or out-of-range reals, and sizes nothing can hold") {
  auto refused = [](auto edit, const char* fragment) {
    nn::LmConfig c = small_config(2);
    edit(c);
    INFO(std::string(fragment));
    CHECK(c.check().find(fragment) != std::string::npos);
    Tape<double> tp;
    CHECK_THROWS_WITH_AS(nn::Lm<double>(tp, c, 1), doctest::Contains(fragment), std::invalid_argument);
  };
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  refused([](nn::LmConfig& c) { c.max_seq = 1; }, "max_seq 1: expected at least 2");
  refused([&](nn::LmConfig& c) { c.eps = inf; }, "eps inf: expected a finite value > 0");
  refused([&](nn::LmConfig& c) { c.eps = nan; }, "eps nan: expected a finite value > 0");
  refused([&](nn::LmConfig& c) { c.rope_base = inf; }, "rope_base inf: expected a finite value > 1");
  refused([&](nn::LmConfig& c) { c.lora_scale = inf; }, "lora_scale inf: expected a finite value");
  refused([&](nn::LmConfig& c) { c.lora_scale = -inf; }, "lora_scale -inf: expected a finite value");
  refused([](nn::LmConfig& c) { c.layers = std::size_t{1} << 40; }, "layers 1099511627776: expected at most 65536");
  refused([](nn::LmConfig& c) { c.vocab = std::size_t{1} << 30; }, "vocab 1073741824: expected at most 16777216");
  refused([](nn::LmConfig& c) { c.lora_targets = 1u << 9 | 1u; },
          "lora_targets 513: expected a set of the 7 projections");
  // Each size within its bound, the total past max_elements.
  refused(
      [](nn::LmConfig& c) {
        c.vocab = c.d_model = std::size_t{1} << 24;
        c.heads = c.kv_heads = 1;
      },
      "parameters (vocab 16777216, d_model 16777216");
  refused(
      [](nn::LmConfig& c) {
        c.layers = 65536;
        c.max_seq = std::size_t{1} << 24;
      },
      "a KV cache of layers * kv_heads * max_seq * 2 * head width");
  CHECK(small_config(2).check() == "");
}

TEST_CASE("an LM file whose config was edited is refused by read_lm_config, naming the field, before building") {
  ScratchDir dir("lm_edit");
  Tape<double> tp;
  nn::Lm<double> m(tp, small_config(), 3);
  const std::string path = dir.file("edited.model");
  nn::LmConfig c;
  auto edited = [&](std::size_t field, double value) {
    REQUIRE(nn::save_lm(path, m));
    edit_stored_config(path, field, value);
    return nn::read_lm_config(path, c);
  };
  CHECK(edited(2, 1e9).find("lm.config: layers 1000000000: expected at most 65536") != std::string::npos);
  // Within every bound, but the file holds two layers' tensors, not three.
  const std::string three = edited(2, 3);
  CHECK(three.find("lm.config says vocab 256, d_model 12, layers 3") != std::string::npos);
  CHECK(three.find("but the file's tensors hold") != std::string::npos);
  CHECK(edited(8, std::numeric_limits<double>::infinity()).find("lm.config: eps inf: expected a finite value > 0") !=
        std::string::npos);
  CHECK(edited(6, 1).find("lm.config: max_seq 1: expected at least 2") != std::string::npos);
  CHECK(edited(2, 2.5).find("lm.config: layers 2.5 is not a size") != std::string::npos);
  CHECK(edited(2, 1e300).find("lm.config: layers 1.0000000000000001e+300 is not a size") != std::string::npos);
  CHECK(c.stored() == nn::LmConfig{}.stored());  // never written by a refusal
  REQUIRE(nn::save_lm(path, m));
  CHECK(nn::read_lm_config(path, c) == "");
  CHECK(c.stored() == small_config().stored());
}

TEST_CASE("ByteTokenizer::decode refuses an id that is not a byte, naming it and its position") {
  const std::vector<int> ok = {104, 0, 255};
  CHECK(nn::ByteTokenizer::decode(ok) == std::string("h\0\xff", 3));
  CHECK_THROWS_WITH_AS(nn::ByteTokenizer::decode(std::vector<int>{104, 256, -1, 1000}),
                       "nn::ByteTokenizer::decode: id 256 at position 1 is not a byte (expected 0 .. 255)",
                       std::out_of_range);
  CHECK_THROWS_WITH_AS(nn::ByteTokenizer::decode(std::vector<int>{104, -1}),
                       "nn::ByteTokenizer::decode: id -1 at position 1 is not a byte (expected 0 .. 255)",
                       std::out_of_range);
}

TEST_CASE("generate refuses a NaN, infinite or negative temperature and top_k beyond the vocabulary") {
  Tape<double> tp;
  nn::Lm<double> m(tp, small_config(), 5);
  nn::KvDecoder<double> dec(m);
  const std::vector<int> prompt = {1, 2, 3};
  auto refused = [&](nn::SampleOptions o, const char* message) {
    CHECK_THROWS_WITH_AS(nn::generate(dec, prompt, 4, o), message, std::invalid_argument);
  };
  const double inf = std::numeric_limits<double>::infinity();
  refused({.temperature = std::numeric_limits<double>::quiet_NaN()},
          "nn::generate: temperature nan: expected 0 (greedy) or a finite value > 0");
  refused({.temperature = inf}, "nn::generate: temperature inf: expected 0 (greedy) or a finite value > 0");
  refused({.temperature = -0.5}, "nn::generate: temperature -0.5: expected 0 (greedy) or a finite value > 0");
  refused({.temperature = 1, .top_k = 257},
          "nn::generate: top_k 257: expected 0 (every token) or at most the vocabulary (256)");
  CHECK(nn::generate(dec, prompt, 4, {.temperature = 1, .top_k = 256}).size() == 4);
}

TEST_CASE("generate never picks an id that SampleOptions::allowed masks out (a checkpoint's padding rows)") {
  Tape<double> tp;
  nn::Lm<double> m(tp, small_config(), 5);
  const std::vector<int> prompt = {1, 2, 3};
  nn::KvDecoder<double> dec(m);
  const std::vector<int> free_run = nn::generate(dec, prompt, 12);
  // Ban what greedy chose first: it never comes out, greedy or sampled,
  // and the ids past `allowed` (as padding rows past a tokenizer's ids) never either.
  nn::SampleOptions o;
  o.allowed.assign(200, true);
  o.allowed[static_cast<std::size_t>(free_run[0])] = false;
  for (const double temperature : {0.0, 1.0, 50.0}) {
    CAPTURE(temperature);
    o.temperature = temperature;
    for (const std::size_t top_k : {std::size_t{0}, std::size_t{3}, std::size_t{256}}) {
      o.top_k = temperature > 0 ? top_k : 0;
      const std::vector<int> out = nn::generate(dec, prompt, 40, o);
      REQUIRE(out.size() == 40);
      for (int t : out) {
        CHECK(t != free_run[0]);
        CHECK((t >= 0 && t < 200));
      }
    }
  }
  // Only one id allowed: it is all that comes out.
  o.allowed.assign(256, false);
  o.allowed[42] = true;
  o.temperature = 1;
  o.top_k = 0;
  for (int t : nn::generate(dec, prompt, 8, o)) CHECK(t == 42);
  o.allowed.assign(256, false);
  CHECK_THROWS_WITH_AS(nn::generate(dec, prompt, 4, o),
                       "nn::generate: allowed: no id below the vocabulary (256) is allowed (expected at least one)",
                       std::invalid_argument);
}

TEST_CASE("generation past max_seq restarts on max_seq / 2 tokens, at the smallest max_seq (2)") {
  nn::LmConfig c = small_config();
  c.max_seq = 2;
  Tape<double> tp;
  nn::Lm<double> m(tp, c, 5);
  nn::KvDecoder<double> dec(m);
  const std::vector<int> prompt = {1, 2, 3, 4, 5};
  for (const nn::SampleOptions& o : {nn::SampleOptions{}, nn::SampleOptions{.temperature = 0.7, .top_k = 3}}) {
    const std::vector<int> out = nn::generate(dec, prompt, 9, o);
    REQUIRE(out.size() == 9);
    for (int t : out) CHECK((t >= 0 && t < 256));
  }
}

// ------------------------------------------------- finetune, merge, recall --

TEST_CASE("after a LoRA finetune and the merge, greedy generation from 16 bytes reproduces the text") {
  const std::string text = "grad keeps every step on its tape; LoRA learns this line.";
  const std::vector<int> tokens = nn::ByteTokenizer::encode(text);
  nn::LmConfig c = small_config(8);
  c.d_model = 16;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn = 32;
  c.max_seq = 64;
  c.lora_scale = 2.0;
  Tape<double> tp;
  nn::Lm<double> m(tp, c, 31, nn::Lm<double>::Train::lora);
  Adam<double> opt(0.02);
  for (const auto& p : m.trainable()) opt.add(p.var);
  const std::size_t n = tokens.size() - 1, prompt = 16;
  const std::span<const int> all(tokens);
  auto recalled = [&](const nn::Lm<double>& model) {
    nn::KvDecoder<double> dec(model);
    return nn::ByteTokenizer::decode(nn::generate(dec, all.first(prompt), tokens.size() - prompt));
  };
  const auto mark = tp.mark();
  int step = 0;
  for (; step < 400; ++step) {
    auto r = m.forward(m.ids(all.first(n), 1, n), m.ids(all.subspan(1, n), n, 0));
    REQUIRE(tp.backward(r.loss));
    REQUIRE(opt.step());
    tp.reset_to(mark);
    if (step % 20 == 19 && recalled(m) == text.substr(prompt)) break;
  }
  MESSAGE("recalled after " << step + 1 << " LoRA steps");
  CHECK(recalled(m) == text.substr(prompt));
  nn::LmConfig b = c;
  b.lora_rank = 0;
  Tape<double> tp2;
  nn::Lm<double> merged(tp2, b, 1);
  nn::merge_lora(m, merged);
  CHECK(recalled(merged) == text.substr(prompt));
  // Seeded sampling is reproducible.
  nn::KvDecoder<double> d1(merged), d2(merged);
  const nn::SampleOptions o{.temperature = 0.8, .top_k = 5, .seed = 9};
  CHECK(nn::generate(d1, all.first(4), 30, o) == nn::generate(d2, all.first(4), 30, o));
}

// ------------------------------------------------------------ the device --

namespace {

struct LmRun {
  std::vector<double> losses, params;
};

constexpr std::size_t dev_batch = 2, dev_seq = 8;
constexpr int dev_steps = 20;

std::pair<std::vector<int>, std::vector<int>> dev_window(int step) {
  const std::vector<int> s = some_tokens(dev_batch * dev_seq + 1, 100 + static_cast<std::uint64_t>(step));
  return {std::vector<int>(s.begin(), s.end() - 1), std::vector<int>(s.begin() + 1, s.end())};
}

LmRun tape_lm_run() {
  Tape<double> tp;
  nn::Lm<double> m(tp, small_config(), 41);
  Adam<double> opt(0.01);
  opt.set_clip(1.0);
  for (const auto& p : m.trainable()) opt.add(p.var);
  const auto mark = tp.mark();
  LmRun r;
  for (int s = 0; s < dev_steps; ++s) {
    const auto [in, out] = dev_window(s);
    auto o = m.forward(m.ids(in, dev_batch, dev_seq), m.ids(out, dev_batch * dev_seq, 0));
    REQUIRE(tp.backward(o.loss));
    r.losses.push_back(tp.scalar(o.loss));
    REQUIRE(opt.step());
    tp.reset_to(mark);
  }
  for (const auto& p : m.named()) r.params.insert(r.params.end(), tp.value(p.var).begin(), tp.value(p.var).end());
  return r;
}

LmRun device_lm_run(dev::Mode mode, bool f32) {
  Tape<double> tp;
  nn::Lm<double> m(tp, small_config(), 41);
  const auto [in0, out0] = dev_window(0);
  const Var<double> ids = m.ids(in0, dev_batch, dev_seq), targets = m.ids(out0, dev_batch * dev_seq, 0);
  const Var<double> loss = m.forward(ids, targets).loss;
  REQUIRE(tp.ok());
  auto prog = dev::capture(tp, loss, {.backend = dev::Backend::cpu, .mode = mode, .f32 = f32});
  dev::Adam<double> opt(prog, 0.01);
  opt.set_clip(1.0);
  for (const auto& p : m.trainable()) opt.add(p.var);
  LmRun r;
  for (int s = 0; s < dev_steps; ++s) {
    const auto [in, out] = dev_window(s);
    Tensor<double> a({dev_batch, dev_seq}), b({dev_batch * dev_seq});
    for (std::size_t i = 0; i < in.size(); ++i) {
      a[i] = in[i];
      b[i] = out[i];
    }
    prog.set_input(ids, a);
    prog.set_input(targets, b);
    prog.forward();
    prog.backward();
    opt.step();
    r.losses.push_back(prog.loss());
  }
  CHECK(prog.fallback_reason() == "");
  prog.sync_params_to(tp);
  for (const auto& p : m.named()) r.params.insert(r.params.end(), tp.value(p.var).begin(), tp.value(p.var).end());
  return r;
}

}  // namespace

TEST_CASE("the device engine captures the LM training step and trains bit-equal to the tape for 20 Adam steps") {
  const LmRun want = tape_lm_run();
  CHECK(want.losses.back() < want.losses.front());
  for (dev::Mode mode : {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused}) {
    CAPTURE(dev::mode_name(mode));
    const LmRun got = device_lm_run(mode, false);
    CHECK(same_bits(want.losses, got.losses));
    CHECK(same_bits(want.params, got.params));
  }
  // f32 capture of the f64 tape: the same run within a stated tolerance.
  const LmRun narrow = device_lm_run(dev::Mode::per_node, true);
  double worst = 0;
  for (std::size_t i = 0; i < want.losses.size(); ++i)
    worst = std::max(worst, std::abs(narrow.losses[i] - want.losses[i]) / std::abs(want.losses[i]));
  MESSAGE("f32 capture: worst relative loss difference over 20 steps " << worst);
  CHECK(worst < 1e-4);
}

// ----------------------------------------------------------- the oracle --

TEST_CASE("the LM matches PyTorch float64 (test/oracle/lm_oracle.py): logits, loss and every gradient") {
  auto g = load_golden(oracle_dir() + "/lm_golden.txt");
  const Tensor<double>& sz = g.at("sizes");
  auto n = [&](std::size_t i) { return static_cast<std::size_t>(sz[i]); };
  nn::LmConfig c;
  c.vocab = n(0);
  c.d_model = n(1);
  c.layers = n(2);
  c.heads = n(3);
  c.kv_heads = n(4);
  c.ffn = n(5);
  const std::size_t B = n(6), t = n(7);
  c.max_seq = t;
  c.eps = g.at("scalars")[0];
  c.rope_base = g.at("scalars")[1];
  Tape<double> tp;
  nn::Lm<double> m(tp, c, 1);
  for (const auto& p : m.named()) {
    CAPTURE(p.name);
    const Tensor<double>& want = g.at(p.name);
    const std::span<double> to = tp.leaf_value(p.var);
    REQUIRE(to.size() == want.size());
    std::copy(want.data().begin(), want.data().end(), to.begin());
  }
  std::vector<int> ids, targets;
  for (double x : g.at("ids").data()) ids.push_back(static_cast<int>(x));
  for (double x : g.at("targets").data()) targets.push_back(static_cast<int>(x));
  auto r = m.forward(m.ids(ids, B, t), m.ids(targets, B * t, 0), -100.0);
  REQUIRE(tp.ok());
  REQUIRE(tp.backward(r.loss));
  auto worst_relative = [](std::span<const double> got, std::span<const double> want) {
    double largest = 0, worst = 0;
    for (double w : want) largest = std::max(largest, std::abs(w));
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    return worst / largest;
  };
  const double loss_err = std::abs(tp.scalar(r.loss) - g.at("loss")[0]) / std::abs(g.at("loss")[0]);
  const double logit_err = worst_relative(tp.value(r.logits).data, g.at("logits").data());
  MESSAGE("loss relative error " << loss_err << ", logits " << logit_err);
  CHECK(loss_err < 1e-14);
  CHECK(logit_err < 1e-13);
  double grad_worst = 0;
  for (const auto& p : m.named()) {
    CAPTURE(p.name);
    const double e = worst_relative(tp.grad(p.var).data, g.at("grad." + p.name).data());
    grad_worst = std::max(grad_worst, e);
    CHECK(e < 1e-12);
  }
  MESSAGE("worst gradient error (relative to each tensor's largest) " << grad_worst);
}

// A frozen base held as bfloat16 or half (Lm's base_storage): the same model
// as a native one whose base holds the widened values, bit for bit: the loss
// and every adapter gradient (tied and untied, fused loss, recompute on and
// off, 1 and 3 threads, float and double), the decoder's logits at every
// position, the merge, and a model file written from it and read back.
template <class T>
void check_narrow_base(Storage storage) {
  CAPTURE(storage_name(storage));
  const std::size_t t = 10, B = 2;
  const std::vector<int> in = some_tokens(B * t, 41), out = some_tokens(B * t, 42);
  for (bool tied : {false, true})
    for (bool recompute : {false, true})
      for (std::size_t threads : {1, 3}) {
        CAPTURE(tied);
        CAPTURE(recompute);
        CAPTURE(threads);
        set_num_threads(threads);
        nn::LmConfig c = small_config(4);
        c.tied_embeddings = tied;
        Tape<T> th, tn;
        nn::Lm<T> held(th, c, 5, nn::Lm<T>::Train::lora, storage), native(tn, c, 5, nn::Lm<T>::Train::lora);
        CHECK(held.base_storage() == storage);
        CHECK(held.parameter_count() == native.parameter_count());
        randomize_adapters(held, 8);
        randomize_adapters(native, 8);
        for (const auto& p : native.base()) {  // the native base gets the 16-bit one's values, widened
          const Tensor<T> w = th.widened_value(held.tensor(p.name));
          std::copy(w.data().begin(), w.data().end(), tn.leaf_value(p.var).begin());
          CHECK(th.storage(held.tensor(p.name)) == (w.rank() == 2 ? storage : Storage::native));
        }
        held.set_recompute(recompute);
        native.set_recompute(recompute);
        const Var<T> lh = held.forward_loss(held.ids(in, B, t), held.ids(out, B * t, 0));
        const Var<T> ln = native.forward_loss(native.ids(in, B, t), native.ids(out, B * t, 0));
        REQUIRE_MESSAGE(th.backward(lh), th.error());
        REQUIRE(tn.backward(ln));
        const T a = th.scalar(lh), b = tn.scalar(ln);
        CHECK(std::memcmp(&a, &b, sizeof(T)) == 0);
        for (std::size_t k = 0; k < held.adapters().size(); ++k) {
          CAPTURE(held.adapters()[k].name);
          CHECK(bitwise_equal<T>(th.grad(held.adapters()[k].var).data, tn.grad(native.adapters()[k].var).data));
        }
        nn::KvDecoder<T> dh(held), dn(native);
        for (std::size_t p = 0; p < t; ++p) {
          const std::span<const T> step = dh.step(in[p]);
          const std::vector<T> a_logits(step.begin(), step.end());  // the next step reuses the decoder's buffer
          CHECK(bitwise_equal<T>(a_logits, dn.step(in[p])));
        }
      }
  set_num_threads(1);
  // The merge widens the base; a model file holds it widened and loads back into a 16-bit base exactly.
  nn::LmConfig c = small_config(4);
  Tape<T> th, tn, tm1, tm2;
  nn::Lm<T> held(th, c, 5, nn::Lm<T>::Train::lora, storage), native(tn, c, 5, nn::Lm<T>::Train::lora);
  randomize_adapters(held, 8);
  randomize_adapters(native, 8);
  for (const auto& p : native.base()) {
    const Tensor<T> w = th.widened_value(held.tensor(p.name));
    std::copy(w.data().begin(), w.data().end(), tn.leaf_value(p.var).begin());
  }
  nn::Lm<T> m1(tm1, small_config(), 0), m2(tm2, small_config(), 0);
  nn::merge_lora(held, m1);
  nn::merge_lora(native, m2);
  for (const auto& p : m1.named()) CHECK(bitwise_equal<T>(tm1.value(p.var).data, tm2.value(m2.tensor(p.name)).data));
  ScratchDir dir("lm_" + std::string(storage_name(storage)));
  REQUIRE(nn::save_lm(dir.file("held.model"), held));
  Tape<T> tr;
  nn::Lm<T> back(tr, c, 77, nn::Lm<T>::Train::lora, storage);
  REQUIRE(nn::load_lm(dir.file("held.model"), back));
  for (const auto& p : held.named()) {
    CAPTURE(p.name);
    CHECK(bitwise_equal<T>(th.widened_value(p.var).data(), tr.widened_value(back.tensor(p.name)).data()));
  }
  // Train::full trains every tensor in T: a 16-bit base is refused.
  Tape<T> tf;
  CHECK_THROWS_WITH_AS(nn::Lm<T>(tf, c, 1, nn::Lm<T>::Train::full, storage),
                       doctest::Contains("needs Train::lora"), std::invalid_argument);
}
TEST_CASE_TEMPLATE("an Lm whose frozen base is 16-bit gives the bits of a native base holding the widened values", T,
                   float, double) {
  check_narrow_base<T>(Storage::bf16);
  check_narrow_base<T>(Storage::f16);
}
