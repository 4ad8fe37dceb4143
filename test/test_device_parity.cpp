// Every op replayed by the device engine against the CPU tape, on every
// available backend: the forward value of the op's node, every node's
// gradient and the loss, bit for bit everywhere (every op is exact). The
// cases are the one case table's (op_cases.hpp, which covers every op in
// OpList), run in every mode (per-node, graph, fused: the fused kernels dispatch each op
// through their op table) and, on the CPU backend, under the race-checking
// schedules (blocks and threads out of order).
#include <doctest/doctest.h>

#include <cmath>
#include <grad/device/device.hpp>
#include <set>
#include <sstream>

#include "op_cases.hpp"
#include "test_device_support.hpp"

using namespace grad;
using namespace grad::testing;
namespace dev = grad::device;

namespace {

std::vector<dev::Backend> backends() { return device_backends("device parity on CUDA"); }

// Every way a program can run: each mode; on the CPU backend each schedule too.
struct Variant {
  dev::Mode mode;
  dev::Schedule schedule;
};
std::vector<Variant> variants(dev::Backend backend) {
  std::vector<Variant> v;
  for (dev::Mode m : {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused}) {
    v.push_back({m, dev::Schedule::in_order});
    if (backend == dev::Backend::cpu && m != dev::Mode::graph)
      for (dev::Schedule s : {dev::Schedule::reverse, dev::Schedule::shuffled}) v.push_back({m, s});
  }
  return v;
}
const char* schedule_name(dev::Schedule s) {
  return s == dev::Schedule::in_order ? "in_order" : s == dev::Schedule::reverse ? "reverse" : "shuffled";
}

// Bits for exact ops (and every op on the CPU backend); 1e-12 relative for
// transcendental ops on CUDA, whose exp/log/tanh differ in the last bit. An
// element far smaller than its tensor's largest (a gradient that cancels to
// near zero) is judged against 1e-6 of that largest instead of itself, as a
// last-bit difference in its terms is not small relative to it.
bool close(double want, double got, bool bitwise, double floor = 0) {
  if (bitwise) return std::memcmp(&want, &got, sizeof want) == 0;
  return want == got || std::abs(want - got) <= 1e-12 * std::max(std::abs(want), floor);
}

std::string first_difference(std::span<const double> want, std::span<const double> got, bool bitwise) {
  if (want.size() != got.size()) return "sizes differ";
  double largest = 0;
  for (double w : want) largest = std::max(largest, std::abs(w));
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!close(want[i], got[i], bitwise, 1e-6 * largest)) {
      std::ostringstream s;
      s.precision(17);
      s << "element " << i << ": tape " << want[i] << " device " << got[i];
      return s.str();
    }
  return "";
}

// Captures the tape's episode (backward already run on the tape), replays
// forward and backward on `backend` and checks the loss and the gradients of
// `vars` against the tape's. Returns the program for further checks.
dev::Program<double> replay_and_compare(const Tape<double>& tp, Var<double> loss, dev::Backend backend,
                                        const std::vector<Var<double>>& vars, Variant variant = {}) {
  auto prog = dev::capture(tp, loss, {.backend = backend, .mode = variant.mode, .schedule = variant.schedule});
  prog.forward();
  prog.backward();
  CHECK(close(tp.scalar(loss), prog.loss(), true));
  CHECK(prog.fallback_reason() == "");
  for (const Var<double>& v : vars) {
    const Tensor<double> g = prog.grad(v);
    CHECK(first_difference(tp.grad(v).data, g.data(), true) == "");
  }
  return prog;
}

}  // namespace

TEST_CASE("every op's forward value and every gradient match the CPU tape on every backend, in every mode") {
  std::size_t fused_runs = 0;
  for (dev::Backend backend : backends()) {
    for (const Variant& variant : variants(backend)) {
      for (const OpCase<double>& c : op_cases<double>()) {
        CAPTURE(c.name);
        CAPTURE(dev::backend_name(backend));
        CAPTURE(dev::mode_name(variant.mode));
        CAPTURE(schedule_name(variant.schedule));
        RecordedCase<double> r;
        REQUIRE(record_case(c, r));
        r.vars.push_back(r.out);
        dev::Program<double> prog = replay_and_compare(r.tp, r.loss, backend, r.vars, variant);
        fused_runs += prog.fused() && prog.plan().fused_launches() > 0;
        const Tensor<double> value = prog.value(r.out);
        CHECK(first_difference(r.tp.value(r.out).data, value.data(), true) == "");
      }
    }
  }
  // The fused variants did dispatch ops through the fused kernels' table.
  CHECK(fused_runs > 0);
}

TEST_CASE("a second replay with fresh inputs matches a fresh tape episode bit for bit") {
  Rng rng(11);
  const Tensor<double> w0 = random_tensor<double>({4, 3}, rng), x0 = random_tensor<double>({5, 4}, rng),
                       x1 = random_tensor<double>({5, 4}, rng);
  for (dev::Backend backend : backends()) {
    CAPTURE(dev::backend_name(backend));
    Tape<double> tp;
    Var<double> w = tp.param(w0), x = tp.constant(x0);
    Var<double> loss = mean(relu(matmul(x, w)) * 2.0);
    auto prog = dev::capture(tp, loss, {.backend = backend});
    prog.set_input(x, x1);
    prog.forward();
    prog.backward();

    Tape<double> ref;
    Var<double> rw = ref.param(w0), rx = ref.constant(x1);
    Var<double> rl = mean(relu(matmul(rx, rw)) * 2.0);
    REQUIRE(ref.backward(rl));
    CHECK(close(ref.scalar(rl), prog.loss(), true));
    CHECK(first_difference(ref.grad(rw).data, prog.grad(w).data(), true) == "");
  }
}

TEST_CASE("frozen branches get no device gradient buffers and read as zeros") {
  Rng rng(5);
  Tape<double> tp;
  Var<double> w = tp.param(random_tensor<double>({3, 3}, rng));
  Var<double> frozen = grad::tanh(tp.constant(random_tensor<double>({3, 3}, rng)) * 2.0);  // no param upstream
  Var<double> loss = sum(matmul(frozen, w));
  REQUIRE(tp.backward(loss));
  auto prog = dev::capture(tp, loss);
  prog.forward();
  prog.backward();
  CHECK_FALSE(prog.reaches(frozen));
  CHECK(prog.reaches(w));
  // Gradient buffers: w, matmul's output and the loss only (256-byte aligned).
  CHECK(prog.grad_bytes() == 3 * 256);
  const Tensor<double> g_frozen = prog.grad(frozen);
  for (double g : g_frozen.data()) CHECK(g == 0.0);
  CHECK(first_difference(tp.grad(w).data, prog.grad(w).data(), true) == "");
  // One backward launch per (node, input with a gradient): loss->matmul, matmul->w.
  CHECK(prog.backward_launches() == 2);
}

TEST_CASE("CUDA-only parity runs when a GPU is present") {
  // The table above already includes CUDA when present; this case states it
  // (probed here, at run time: never during static initialisation).
  if (!cuda_case("CUDA parity")) return;
  CHECK(backends().size() == 2);
}

TEST_CASE("an attention block built from nn layers replays bit for bit (transcendental within tolerance on CUDA)") {
  // t=6 tokens, 4 query heads over 2 key/value heads of width 4: RoPE,
  // causal mask, softmax, slices, concat, rmsnorm, swiglu, cross-entropy.
  constexpr std::size_t t = 6, d = 16, heads = 4, kv_heads = 2, hd = 4, vocab = 5;
  for (dev::Backend backend : backends()) {
    CAPTURE(dev::backend_name(backend));
    Rng rng(77);
    Tape<double> tp;
    auto r = [&](Shape s, double b) { return random_tensor<double>(std::move(s), rng, -b, b); };
    Var<double> x = tp.constant(r({t, d}, 1.0));
    Var<double> wq = tp.param(r({d, heads * hd}, 0.4)), wk = tp.param(r({d, kv_heads * hd}, 0.4)),
                wv = tp.param(r({d, kv_heads * hd}, 0.4)), wo = tp.param(r({heads * hd, d}, 0.4)),
                wg = tp.param(r({d, 8}, 0.4)), wu = tp.param(r({d, 8}, 0.4)), wd = tp.param(r({8, vocab}, 0.4)),
                norm = tp.param(Tensor<double>::ones({d}));
    Tensor<double> targets({t, vocab});
    for (std::size_t p = 0; p < t; ++p) targets[p * vocab + (p * 3) % vocab] = 1;
    const auto rope = nn::rope_tables(t, hd, 10000.0);
    Var<double> cos = tp.constant(rope.cos), sin = tp.constant(rope.sin),
                mask = tp.constant(nn::causal_mask<double>(t));
    Var<double> h = nn::rmsnorm(x, norm, 1e-6);
    Var<double> att =
        nn::gqa_attention(nn::linear(h, wq), nn::linear(h, wk), nn::linear(h, wv), cos, sin, mask, heads, kv_heads, hd);
    Var<double> y = x + nn::linear(att, wo);
    Var<double> logits = nn::linear(nn::swiglu(nn::linear(y, wg), nn::linear(y, wu)), wd);
    Var<double> loss = nn::cross_entropy(logits, tp.constant(targets));
    REQUIRE(tp.ok());
    REQUIRE(tp.backward(loss));
    replay_and_compare(tp, loss, backend, {wq, wk, wv, wo, wg, wu, wd, norm});
  }
}

TEST_CASE("a float tape replays bit for bit on the CPU backend and on CUDA, which agree with each other") {
  Rng rng(9);
  Tape<float> tp;
  Var<float> w1 = tp.param(random_tensor<float>({5, 8}, rng)), b1 = tp.param(random_tensor<float>({8}, rng)),
             w2 = tp.param(random_tensor<float>({8, 3}, rng));
  Var<float> x = tp.constant(random_tensor<float>({7, 5}, rng));
  Var<float> y = softmax(matmul(sigmoid(matmul(x, w1) + b1), w2), -1);
  Var<float> loss = mean(grad::log(y + 0.5f) * y);
  REQUIRE(tp.backward(loss));
  // Every op here is exact tier: f32 on CUDA must equal f32 on the CPU
  // backend (and the float tape) bit for bit, in every mode.
  for (dev::Backend backend : backends())
    for (dev::Mode mode : {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused}) {
      CAPTURE(dev::backend_name(backend));
      CAPTURE(dev::mode_name(mode));
      auto prog = dev::capture(tp, loss, {.backend = backend, .mode = mode});
      CHECK(prog.f32());
      prog.forward();
      prog.backward();
      const float want = tp.scalar(loss), got = prog.loss();
      CHECK(std::memcmp(&want, &got, sizeof want) == 0);
      CHECK(prog.fallback_reason() == "");
      for (Var<float> p : {w1, b1, w2}) {
        const Tensor<float> g = prog.grad(p);
        CHECK(bitwise_equal<float>(tp.grad(p).data, g.data()));
      }
    }
}

TEST_CASE("an f32 capture of a double tape gives the same bits on CUDA as on the CPU backend") {
  Rng rng(12);
  Tape<double> tp;
  Var<double> w = tp.param(random_tensor<double>({6, 9}, rng)), b = tp.param(random_tensor<double>({9}, rng));
  Var<double> x = tp.constant(random_tensor<double>({40, 6}, rng));
  Var<double> loss = mean(grad::tanh(matmul(x, w) + b) * 0.5);
  REQUIRE(tp.backward(loss));
  std::vector<std::vector<double>> runs;
  for (dev::Backend backend : backends()) {
    auto prog = dev::capture(tp, loss, {.backend = backend, .mode = dev::Mode::fused, .f32 = true});
    prog.forward();
    prog.backward();
    std::vector<double> r{prog.loss()};
    for (Var<double> p : {w, b}) {
      const Tensor<double> g = prog.grad(p);
      r.insert(r.end(), g.data().begin(), g.data().end());
    }
    runs.push_back(std::move(r));
  }
  CHECK(std::abs(runs[0][0] - tp.scalar(loss)) <= 1e-5 * std::abs(tp.scalar(loss)));
  for (std::size_t k = 1; k < runs.size(); ++k) CHECK(bitwise_equal<double>(runs[0], runs[k]));
}

// A frozen base held in 16 bits (Tape::constant(t, Storage::bf16 / f16)):
// the engines hold it widened (their kernels read T; widening is exact), so
// every reader of it (matmul's and matmul_nt's b, embedding's table,
// linear_cross_entropy's W) replays the tape's bits, in every mode; grad::emit
// writes its widened values. set_input refuses it (a weight, not an input).
// A quantized constant (llama.cpp's blocks): neither engine has kernels for
// it, so capture and grad::emit refuse it by name instead of holding a
// quantized base widened to T (4 to 8 times its memory).
TEST_CASE("capture and grad::emit refuse a quantized constant by name") {
  Tape<double> tp;
  Rng rng(5);
  const Var<double> x = tp.param(random_tensor<double>({3, 32}, rng));
  const Var<double> W = tp.constant(random_tensor<double>({32, 4}, rng), Storage::q8_0, true);
  const Var<double> loss = sum(matmul(x, W));
  REQUIRE_MESSAGE(tp.backward(loss), tp.error());
  CHECK_THROWS_WITH(dev::capture(tp, loss, {.backend = dev::Backend::cpu}),
                    doctest::Contains("held as q8_0 (llama.cpp's quantized blocks), which neither the device engine"));
  CHECK_THROWS_WITH(emit(tp, loss), doctest::Contains("held as q8_0"));
}

TEST_CASE("a tape with 16-bit constants replays bit for bit, and grad::emit writes their widened values") {
  for (const Storage storage : {Storage::bf16, Storage::f16}) {
    CAPTURE(storage_name(storage));
    Tape<double> tp;
    Rng rng(17);
    const Var<double> x = tp.param(random_tensor<double>({3, 8}, rng));
    const Var<double> h = tp.param(random_tensor<double>({4, 6}, rng));
    const Var<double> W = tp.constant(random_tensor<double>({8, 5}, rng), storage);
    const Var<double> Wt = tp.constant(random_tensor<double>({5, 8}, rng), storage);
    const Var<double> E = tp.constant(random_tensor<double>({11, 6}, rng), storage);
    const Var<double> ids = tp.constant(Tensor<double>({4}, {3, 0, 10, 3}));
    const Var<double> targets = tp.constant(Tensor<double>({4}, {1, 7, 2, 9}));
    const Var<double> loss = sum(matmul(x, W) * matmul_nt(x, Wt)) + sum(embedding(E, ids) * h) +
                             linear_cross_entropy(h, E, targets);
    REQUIRE_MESSAGE(tp.backward(loss), tp.error());
    for (dev::Backend backend : backends())
      for (const Variant& v : variants(backend)) {
        CAPTURE(static_cast<int>(v.mode));
        CAPTURE(schedule_name(v.schedule));
        auto prog = replay_and_compare(tp, loss, backend, {x, h}, v);
        CHECK_THROWS_WITH_AS(prog.set_input(W, Tensor<double>::full({8, 5}, 1.0)),
                             doctest::Contains(("is a constant held as " + std::string(storage_name(storage))).c_str()),
                             std::invalid_argument);
      }
    // grad::emit (which takes no linear_cross_entropy: its ids live on the tape's index pool).
    Tape<double> te;
    const Var<double> ex = te.param(tp.widened_value(x)), eh = te.param(tp.widened_value(h));
    const Var<double> eWt = te.constant(tp.widened_value(Wt), storage), eE = te.constant(tp.widened_value(E), storage);
    const Var<double> eloss = sum(matmul_nt(ex, eWt)) + sum(embedding(eE, te.constant(tp.widened_value(ids))) * eh);
    REQUIRE_MESSAGE(te.backward(eloss), te.error());
    const std::string source = emit(te, eloss).cpp;
    CHECK(source.find(emit_detail::literal(te.widened_value(eWt)[7])) != std::string::npos);
    CHECK(source.find(emit_detail::literal(te.widened_value(eE)[65])) != std::string::npos);
  }
}
