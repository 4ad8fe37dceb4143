// grad::emit: emitted programs compiled with the system C++ compiler during
// the run, executed, and compared bit for bit with the tape: the autoencoder's
// training step (f64 and f32, several Adam steps), the LoRA block's forward
// and backward, a linear regression's value_and_grad, and every case of the
// op table (every op in OpList). The CUDA source compiles with nvcc when it
// is there. Bad input is refused by name and writes nothing.
//
// GRAD_EMIT_CXX (the compiler meson configured), GRAD_EMIT_INCLUDE (grad's
// include/) and GRAD_EMIT_NVCC come from test/meson.build; without a compiler
// the compiling cases skip.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <grad/emit.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../examples/autoencoder.hpp"
#include "op_cases.hpp"
#include "support.hpp"

using namespace grad;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

testing::ScratchDir& scratch() {
  static testing::ScratchDir dir("emit");
  return dir;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Emitted code must stay clean under these (users build with -Werror).
const std::string strict_warnings = "-Wall -Wextra -Wshadow -Wconversion -Werror";

// Compiles `main_source` (next to the headers already written in the scratch
// directory) with the system compiler, runs it with the scratch directory as
// its argument and returns what it wrote to out.bin. Empty when no compiler.
std::vector<unsigned char> compile_and_run(const std::string& tag, const std::string& main_source,
                                           const std::string& flags = "", double* seconds = nullptr,
                                           const std::string& compiler = "") {
  const std::string cxx = compiler.empty() ? env("GRAD_EMIT_CXX") : compiler, inc = env("GRAD_EMIT_INCLUDE");
  const std::string dir = scratch().dir.string();
  const std::string src = scratch().file(tag + ".cpp"), exe = scratch().file(tag), log = scratch().file(tag + ".log");
  std::ofstream(src) << main_source;
  const std::string cmd = cxx + " -std=c++20 -O2 -ffp-contract=off " + strict_warnings + " " + flags + " -I " + inc +
                          " -I " + dir + " " + src + " -o " + exe + " > " + log + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = std::system(cmd.c_str());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (seconds) *seconds = s;
  MESSAGE(tag << ": compiled in " << s << " s");
  // GRAD_EMIT_KEEP=DIR keeps the emitted sources and the drivers there (to read, or time).
  if (const std::string keep = env("GRAD_EMIT_KEEP"); !keep.empty()) {
    std::filesystem::create_directories(keep);
    for (const auto& f : std::filesystem::directory_iterator(scratch().dir))
      if (f.is_regular_file() && f.path().extension() != "" && f.path().extension() != ".bin" &&
          f.path().extension() != ".in")
        std::filesystem::copy_file(f.path(), keep / f.path().filename(),
                                   std::filesystem::copy_options::overwrite_existing);
  }
  if (rc != 0) FAIL("compiling " << src << " failed:\n" << cmd << "\n" << slurp(log).substr(0, 6000));
  const std::string run = exe + " " + dir + " > " + log + " 2>&1";
  if (std::system(run.c_str()) != 0) FAIL("running " << exe << " failed:\n" << slurp(log));
  return testing::read_bytes(scratch().file("out.bin"));
}

// clang++ next to the configured compiler, when there is one: emitted code
// compiles warning-free with it too, and keeps its contraction off.
std::string clang() {
  static const std::string found = std::system("command -v clang++ > /dev/null 2>&1") == 0 ? "clang++" : "";
  return found;
}

bool have_compiler() {
  if (env("GRAD_EMIT_CXX").empty() || env("GRAD_EMIT_INCLUDE").empty()) {
    MESSAGE("GRAD_EMIT_CXX / GRAD_EMIT_INCLUDE not set: no compiler to build emitted programs with; skipped");
    return false;
  }
  return true;
}

// Values appended to an expected-output list, then compared bitwise with the program's bytes.
template <class T>
struct Expect {
  std::vector<T> values;
  std::vector<std::string> what;
  void add(std::string name, std::span<const T> v) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      values.push_back(v[i]);
      what.push_back(name + "[" + std::to_string(i) + "]");
    }
  }
  void add(std::string name, T v) { add(std::move(name), std::span<const T>(&v, 1)); }
};

// Compares `count` values of type T at `offset` bytes of `got`; returns the next offset.
template <class T>
std::size_t compare(const std::vector<unsigned char>& got, std::size_t offset, const Expect<T>& e,
                    const std::string& label) {
  REQUIRE(got.size() >= offset + e.values.size() * sizeof(T));
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < e.values.size(); ++i) {
    T v;
    std::memcpy(&v, got.data() + offset + i * sizeof(T), sizeof(T));
    if (std::memcmp(&v, &e.values[i], sizeof(T)) != 0 && mismatches++ < 5)
      FAIL_CHECK(label << ": " << e.what[i] << " emitted " << double(v) << " tape " << double(e.values[i]));
  }
  CHECK_MESSAGE(mismatches == 0, label << ": " << mismatches << " of " << e.values.size() << " values differ");
  MESSAGE(label << ": " << e.values.size() << " values compared bitwise");
  return offset + e.values.size() * sizeof(T);
}

const char* const ae_names[] = {"w0", "b0", "w1", "b1", "w2", "b2", "w3", "b3"};

// The autoencoder after two Adam steps on the tape: step 2's episode emitted
// (with its encoder's output as forward()'s), then five more steps on the
// tape. Expected: the encoding, the five losses, the parameters and Adam's moments.
template <class T>
Expect<T> autoencoder_case(const std::string& ns, std::vector<T>& batches, T clip = T(0)) {
  namespace ae = autoencoder;
  ae::Trainer<T> t;
  t.opt.set_clip(clip);
  t.step(0);
  t.step(1);
  const std::size_t steps = 5, first = 2;
  t.tp.reset_to(t.mark);
  ae::copy_rows(t.data, first * 200, 200, t.tp.leaf_value(t.batch));
  Var<T> h = t.batch, code;
  for (std::size_t layer = 0; layer < 3; ++layer) {
    h = grad::tanh(matmul(h, t.model.w(layer)) + t.model.b(layer));
    if (layer == 1) code = h;
  }
  const Var<T> loss = mse(matmul(h, t.model.w(3)) + t.model.b(3), t.batch);
  EmitOptions<T> o;
  o.name = ns;
  o.names = {{t.batch, "x"}, {code, "code"}};
  for (std::size_t i = 0; i < 8; ++i) o.names.push_back({t.model.params[i], ae_names[i]});
  o.outputs = {code};
  o.optimizer = &t.opt;
  emit_files(t.tp, loss, o, scratch().file(ns + ".hpp"), scratch().file(ns + ".cuh"));

  Expect<T> e;
  e.add("code", t.tp.value(code).data);
  REQUIRE(t.tp.backward(loss));
  if (clip != T(0)) CHECK_MESSAGE(t.opt.clip_scale() < T(1), "the clip threshold should bite");
  std::vector<T> losses{t.tp.scalar(loss)};
  REQUIRE(t.opt.step());
  for (std::size_t k = first; k < first + steps; ++k) {
    const auto rows = t.data.data().subspan(k * 200 * ae::dim, 200 * ae::dim);
    batches.insert(batches.end(), rows.begin(), rows.end());
    if (k > first) losses.push_back(t.step(k));
  }
  e.add("loss", losses);
  for (std::size_t i = 0; i < 8; ++i) e.add(ae_names[i], t.tp.value(t.model.params[i]).data);
  e.add("m", t.opt.first_moments());
  e.add("v", t.opt.second_moments());
  return e;
}

// The driver for one autoencoder namespace: forward on batch 0, then the steps.
std::string autoencoder_driver(const std::string& ns, const std::string& type, std::size_t steps) {
  std::string s = "  {\n    using T = " + type + ";\n    static " + ns + "::ParamStore ps;\n    static " + ns +
                  "::Optimizer opt;\n    static " + ns + "::Workspace ws;\n    ps.load();\n    opt.load();\n";
  s += "    static T batches[" + std::to_string(steps) + " * " + ns + "::size::x];\n";
  s += "    read(dir + \"/" + ns + ".in\", batches, sizeof batches);\n";
  s += "    " + ns + "::Params p = ps.view();\n    " + ns + "::Inputs in;\n    in.x = batches;\n";
  s += "    static T code[200 * 32];\n    " + ns + "::forward(in, p, code, ws);\n    put(code, sizeof code);\n";
  s += "    for (std::size_t k = 0; k < " + std::to_string(steps) + "; ++k) {\n      in.x = batches + k * " + ns +
       "::size::x;\n      const T loss = " + ns + "::step(in, p, opt, ws);\n      put(&loss, sizeof loss);\n    }\n";
  for (const char* n : ae_names) s += "    put(ps." + std::string(n) + ", sizeof ps." + n + ");\n";
  s += "    put(opt.m, " + ns + "::moment_size * sizeof(T));\n    put(opt.v, " + ns + "::moment_size * sizeof(T));\n";
  return s + "  }\n";
}

const char* const driver_head = R"(#include <cstdio>
#include <cstdlib>
#include <string>
static std::FILE* out;
static void put(const void* p, std::size_t n) { std::fwrite(p, 1, n, out); }
[[maybe_unused]] static void read(const std::string& path, void* p, std::size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f || std::fread(p, 1, n, f) != n) { std::fprintf(stderr, "cannot read %s\n", path.c_str()); std::exit(1); }
  std::fclose(f);
}
)";

template <class T>
void write_values(const std::string& path, const std::vector<T>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

// A linear regression's mean squared error over 16 rows.
Var<double> linreg_loss(Tape<double>& tp, const Tensor<double>& w, const Tensor<double>& b, Var<double>* params) {
  testing::Rng rng(99);
  const Tensor<double> X = testing::random_tensor<double>({16, 3}, rng),
                       y = testing::random_tensor<double>({16, 1}, rng);
  params[0] = tp.param(w);
  params[1] = tp.param(b);
  return mse(matmul(tp.constant(X), params[0]) + params[1], tp.constant(y));
}

// "a3" (appended, not "a" + string: GCC 12's -Wrestrict misfires on that).
std::string adapter_name(std::size_t i) { return std::string("a").append(std::to_string(i)); }

}  // namespace

TEST_CASE(
    "the emitted autoencoder step (f64, and f32 with clipping; six Adam steps) lands on the tape's bits, in both loop "
    "modes") {
  if (!have_compiler()) return;
  std::vector<double> b64;
  std::vector<float> b32;
  const Expect<double> e64 = autoencoder_case<double>("ae64", b64);
  const Expect<float> e32 = autoencoder_case<float>("ae32", b32, 0.05f);  // and global-norm clipping
  write_values(scratch().file("ae64.in"), b64);
  write_values(scratch().file("ae32.in"), b32);
  // Emitted headers name no Boost and no tape.
  const std::string text = slurp(scratch().file("ae64.hpp"));
  CHECK(text.find("boost") == std::string::npos);
  CHECK(text.find("tape.hpp") == std::string::npos);
  const std::string main = std::string(driver_head) + "#include \"ae64.hpp\"\n#include \"ae32.hpp\"\n" +
                           "int main(int, char** argv) {\n  const std::string dir = argv[1];\n" +
                           "  out = std::fopen((dir + \"/out.bin\").c_str(), \"wb\");\n" +
                           autoencoder_driver("ae64", "double", 5) + autoencoder_driver("ae32", "float", 5) +
                           "  std::fclose(out);\n}\n";
  const std::vector<unsigned char> got = compile_and_run("autoencoder", main);
  const std::size_t next = compare(got, 0, e64, "autoencoder f64");
  compare(got, next, e32, "autoencoder f32");
  // The same program through the tags' host loops (GRAD_EMITTED_HOST_LOOPS): the same bits.
  const std::vector<unsigned char> host =
      compile_and_run("autoencoder_host_loops", main, "-DGRAD_EMITTED_HOST_LOOPS -Wno-psabi");
  compare(host, compare(host, 0, e64, "autoencoder f64, host loops"), e32, "autoencoder f32, host loops");
  // Regression (D): the emitted header relied on -ffp-contract=off from the command line; GNU
  // mode with FMA (-march=native) changed thousands of values. It switches contraction off
  // itself now (g++: push_options/optimize; clang: fp contract(off), its default being "on").
  const std::vector<unsigned char> fused =
      compile_and_run("autoencoder_contract", main, "-std=gnu++20 -march=native -ffp-contract=fast");
  compare(fused, compare(fused, 0, e64, "autoencoder f64, gnu++20 -march=native -ffp-contract=fast"), e32,
          "autoencoder f32, gnu++20 -march=native -ffp-contract=fast");
  if (!clang().empty()) {
    const std::vector<unsigned char> c = compile_and_run("autoencoder_clang", main, "-march=native -ffp-contract=on", nullptr, clang());
    compare(c, compare(c, 0, e64, "autoencoder f64, clang++ -march=native"), e32,
            "autoencoder f32, clang++ -march=native");
  } else {
    MESSAGE("clang++ not found: the clang compile of the emitted autoencoder is skipped");
  }
}

TEST_CASE("the emitted LoRA block's forward and backward land on the tape's bits") {
  if (!have_compiler()) return;
  constexpr std::size_t t = 6, d = 16, heads = 4, kv_heads = 2, hd = 4, ffn = 24, vocab = 5, rank = 2;
  testing::Rng rng(5);
  auto r = [&](Shape s, double b) { return testing::random_tensor<double>(std::move(s), rng, -b, b); };
  Tape<double> tp;
  std::vector<Var<double>> params;
  Var<double> x = tp.constant(r({t, d}, 1.0));
  auto projection = [&](std::size_t in, std::size_t out) {
    Var<double> w = tp.constant(r({in, out}, 0.4)), a = tp.param(r({in, rank}, 0.4)), b = tp.param(r({rank, out}, 0.1));
    params.insert(params.end(), {a, b});
    return [=](Var<double> v) { return nn::lora_linear(v, w, a, b, 2.0); };
  };
  auto q = projection(d, heads * hd), k = projection(d, kv_heads * hd), v = projection(d, kv_heads * hd),
       o = projection(heads * hd, d), gate = projection(d, ffn), up = projection(d, ffn), down = projection(ffn, d);
  Tensor<double> targets({t, vocab});
  for (std::size_t p = 0; p < t; ++p) targets[p * vocab + (p * 3) % vocab] = 1;
  const auto rope = nn::rope_tables(t, hd, 10000.0);
  Var<double> cos = tp.constant(rope.cos), sin = tp.constant(rope.sin), mask = tp.constant(nn::causal_mask<double>(t));
  Var<double> norm = tp.constant(Tensor<double>::ones({d})), w_vocab = tp.constant(r({d, vocab}, 0.4));
  Var<double> h = nn::rmsnorm(x, norm, 1e-6);
  Var<double> x2 = x + o(nn::gqa_attention(q(h), k(h), v(h), cos, sin, mask, heads, kv_heads, hd));
  Var<double> h2 = nn::rmsnorm(x2, norm, 1e-6);
  Var<double> x3 = x2 + down(nn::swiglu(gate(h2), up(h2)));
  Var<double> logits = nn::linear(x3, w_vocab);
  Var<double> loss = nn::cross_entropy_rows(logits, tp.constant(targets), t - 1);
  REQUIRE(tp.ok());

  EmitOptions<double> opt;
  opt.name = "lora";
  opt.names = {{x, "x"}, {logits, "logits"}};
  for (std::size_t i = 0; i < params.size(); ++i) opt.names.push_back({params[i], adapter_name(i)});
  opt.outputs = {logits};
  const double t0 = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  emit_files(tp, loss, opt, scratch().file("lora.hpp"));
  MESSAGE("LoRA block: " << tp.size() << " nodes emitted in "
                         << std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() -
                                t0
                         << " s");

  Expect<double> e;
  REQUIRE(tp.backward(loss));
  e.add("loss", tp.scalar(loss));
  for (std::size_t i = 0; i < params.size(); ++i) e.add(adapter_name(i), tp.grad(params[i]).data);
  e.add("logits", tp.value(logits).data);

  std::string main = std::string(driver_head) + "#include \"lora.hpp\"\n" +
                     "int main(int, char** argv) {\n  const std::string dir = argv[1];\n" +
                     "  out = std::fopen((dir + \"/out.bin\").c_str(), \"wb\");\n" +
                     "  static lora::ParamStore ps;\n  static lora::Workspace ws;\n  ps.load();\n" +
                     "  lora::Params p = ps.view();\n  const lora::Inputs in;\n" +
                     "  const double loss = lora::step(in, p, ws);\n  put(&loss, sizeof loss);\n";
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string n = adapter_name(i);
    main += "  put(lora::gradient::" + n + "(ws), lora::size::" + n + " * sizeof(double));\n";
  }
  main += "  static double logits[" + std::to_string(t * vocab) +
          "];\n  lora::forward(in, p, logits, ws);\n  put(logits, sizeof logits);\n  std::fclose(out);\n}\n";
  compare(compile_and_run("lora", main), 0, e, "LoRA block");
}

TEST_CASE("value_and_grad of a linear regression's loss, and every op of the case table, land on the tape's bits") {
  if (!have_compiler()) return;
  std::string includes, body;
  Expect<double> e;

  // Linear regression: value_and_grad at the captured parameters and at a second point.
  const Tensor<double> w({3, 1}, {0.5, -0.25, 0.125}), b({1}, {0.1});
  const Tensor<double> w2({3, 1}, {-1.5, 0.75, 2.0}), b2({1}, {-0.3});
  {
    Tape<double> tp;
    Var<double> p[2];
    const Var<double> loss = linreg_loss(tp, w, b, p);
    EmitOptions<double> o;
    o.name = "linreg";
    o.names = {{p[0], "w"}, {p[1], "b"}};
    o.value_and_grad = true;
    emit_files(tp, loss, o, scratch().file("linreg.hpp"), scratch().file("linreg.cuh"));
    for (const Tensor<double>* at : {&w, &w2}) {
      Tape<double> t2;
      Var<double> q[2];
      const Var<double> l2 = linreg_loss(t2, *at, at == &w ? b : b2, q);
      REQUIRE(t2.backward(l2));
      e.add("linreg loss", t2.scalar(l2));
      e.add("linreg dw", t2.grad(q[0]).data);
      e.add("linreg db", t2.grad(q[1]).data);
    }
  }
  // SGD with a per-parameter L2 and clipping: three steps of the emitted step() against the tape's.
  {
    testing::Rng rng(99);
    const Tensor<double> X = testing::random_tensor<double>({16, 3}, rng),
                         y = testing::random_tensor<double>({16, 1}, rng);
    Tape<double> tp;
    const Var<double> pw = tp.param(w2), pb = tp.param(b2);
    const auto mark = tp.mark();
    auto record = [&] { return mse(matmul(tp.constant(X), pw) + pb, tp.constant(y)); };
    Var<double> loss = record();
    SGD<double> sgd(0.1);
    sgd.add(pw, 1e-2);
    sgd.add(pb);
    sgd.set_clip(0.5);
    EmitOptions<double> o;
    o.name = "linsgd";
    o.names = {{pw, "w"}, {pb, "b"}};
    o.optimizer = &sgd;
    emit_files(tp, loss, o, scratch().file("linsgd.hpp"));
    for (int k = 0; k < 3; ++k) {
      REQUIRE(tp.backward(loss));
      e.add("sgd loss", tp.scalar(loss));
      REQUIRE(sgd.step());
      tp.reset_to(mark);
      loss = record();
    }
    e.add("sgd w", tp.value(pw).data);
    e.add("sgd b", tp.value(pb).data);
  }
  includes += "#include \"linsgd.hpp\"\n";
  includes += "#include \"linreg.hpp\"\n";
  body += "  {\n    double x[4], g[4], x2[4] = {-1.5, 0.75, 2.0, -0.3};\n    linreg::captured_x(x);\n";
  body += "    double loss = linreg::value_and_grad(x, g);\n    put(&loss, sizeof loss);\n    put(g, sizeof g);\n";
  body += "    loss = linreg::value_and_grad(x2, g);\n    put(&loss, sizeof loss);\n    put(g, sizeof g);\n  }\n";

  body +=
      "  {\n    static linsgd::ParamStore ps;\n    static linsgd::Optimizer opt;\n    static linsgd::Workspace ws;\n"
      "    ps.load();\n    opt.load();\n    const linsgd::Inputs in;\n"
      "    for (int k = 0; k < 3; ++k) {\n      const double loss = linsgd::step(in, ps.view(), opt, ws);\n"
      "      put(&loss, sizeof loss);\n    }\n    put(ps.w, sizeof ps.w);\n    put(ps.b, sizeof ps.b);\n  }\n";
  // Every (small) case of the op table, each its own namespace: loss and gradients.
  std::set<std::uint8_t> ops;
  std::size_t emitted = 0;
  for (const auto& c : testing::op_cases<double>()) {
    if (c.large) continue;
    testing::RecordedCase<double> rc;
    REQUIRE(testing::record_case(c, rc));
    // linear_cross_entropy's ids, one per row, are refused (the next test case).
    if (std::any_of(rc.tp.nodes().begin(), rc.tp.nodes().end(),
                    [](const auto& n) { return n.op == op_code<LinearCrossEntropy>; }))
      continue;
    for (const auto& n : rc.tp.nodes()) ops.insert(n.op);
    const std::string ns = "case" + std::to_string(emitted++);
    EmitOptions<double> o;
    o.name = ns;
    o.value_and_grad = true;
    emit_files(rc.tp, rc.loss, o, scratch().file(ns + ".hpp"));
    includes += "#include \"" + ns + ".hpp\"\n";
    body += "  {\n    static double x[" + ns + "::value_and_grad_size + 1], g[" + ns +
            "::value_and_grad_size + 1];\n    " + ns + "::captured_x(x);\n    const double loss = " + ns +
            "::value_and_grad(x, g);\n    put(&loss, sizeof loss);\n    put(g, " + ns +
            "::value_and_grad_size * sizeof(double));\n  }\n";
    e.add(c.name + ": loss", rc.tp.scalar(rc.loss));
    for (const Var<double>& v : rc.vars)
      if (rc.tp.requires_grad(v)) e.add(c.name + ": grad", rc.tp.grad(v).data);
  }
  // Every op of OpList (Param and Const included) but linear_cross_entropy is in some emitted case.
  CHECK(ops.size() == op_count - 1);
  const std::string main =
      std::string(driver_head) + includes + "int main(int, char** argv) {\n  const std::string dir = argv[1];\n" +
      "  out = std::fopen((dir + \"/out.bin\").c_str(), \"wb\");\n" + body + "  std::fclose(out);\n}\n";
  compare(compile_and_run("cases", main), 0, e, "linear regression and " + std::to_string(emitted) + " op cases");
}

TEST_CASE("emit refuses what it cannot write exactly, by name, and writes nothing") {
  const std::string path = scratch().file("refused.hpp");
  auto refused = [&](auto&& call, const std::string& words) {
    std::filesystem::remove(path);
    CHECK_THROWS_WITH_AS(call(), doctest::Contains(words.c_str()), EmitError);
    CHECK_FALSE(std::filesystem::exists(path));
  };
  SUBCASE("a poisoned tape") {
    Tape<double> tp;
    Var<double> a = tp.param(Tensor<double>({2, 3})), b = tp.param(Tensor<double>({4, 5}));
    Var<double> loss = sum(a);
    (void)matmul(a, b);  // poisons
    refused([&] { emit_files(tp, loss, {}, path); }, "poisoned");
  }
  SUBCASE("linear_cross_entropy: one class id per row, which emitted code cannot hold") {
    Tape<double> tp;
    Var<double> h = tp.param(Tensor<double>({2, 3}, {1, 2, 3, 4, 5, 6})), w = tp.param(Tensor<double>({4, 3}));
    Var<double> loss = linear_cross_entropy(h, w, tp.constant(Tensor<double>({2}, {3, 0})));
    REQUIRE(tp.ok());
    refused([&] { emit_files(tp, loss, {}, path); },
            "node 3 is a 'linear_cross_entropy' op, which keeps one id per row on the tape's index pool");
  }
  SUBCASE("a loss of more than one element") {
    Tape<double> tp;
    Var<double> a = tp.param(Tensor<double>({2}, {1.0, 2.0}));
    refused([&] { emit_files(tp, a * a, {}, path); }, "expected a single element");
  }
  SUBCASE("an output recorded after the loss") {
    Tape<double> tp;
    Var<double> a = tp.param(Tensor<double>({2}, {1.0, 2.0}));
    Var<double> loss = sum(a);
    EmitOptions<double> o;
    o.outputs = {a * a};
    refused([&] { emit_files(tp, loss, o, path); }, "was recorded after the loss");
  }
  SUBCASE("an optimizer with a learning-rate schedule") {
    Tape<double> tp;
    Var<double> a = tp.param(Tensor<double>({2}, {1.0, 2.0}));
    Adam<double> adam(0.1);
    adam.add(a);
    adam.set_schedule({.base_lr = 0.1, .min_lr = 0.01, .warmup = 2, .total = 10});
    EmitOptions<double> o;
    o.optimizer = &adam;
    refused([&] { emit_files(tp, sum(a * a), o, path); }, "learning-rate schedule");
  }
  SUBCASE("an optimizer rule emitted code does not run: momentum, Adam's PyTorch form, AdamW") {
    Tape<double> tp;
    Var<double> a = tp.param(Tensor<double>({2}, {1.0, 2.0}));
    SGD<double> momentum(0.1, 0.9);
    Adam<double> torch_form(0.1, 0.9, 0.999, 1e-8, AdamForm::pytorch);
    AdamW<double> adamw(0.1);
    const std::pair<Optimizer<double>*, const char*> cases[] = {
        {&momentum, "the optimizer uses momentum, which emitted code does not run"},
        {&torch_form, "the optimizer uses the PyTorch form (AdamForm::pytorch), which emitted code does not run"},
        {&adamw, "the optimizer uses decoupled weight decay (AdamW), which emitted code does not run"}};
    for (const auto& [opt, words] : cases) {
      CHECK(opt->add(a));
      EmitOptions<double> o;
      o.optimizer = opt;
      refused([&] { emit_files(tp, sum(a * a), o, path); }, words);
    }
  }
  SUBCASE("a name that is not an identifier") {
    Tape<double> tp;
    Var<double> a = tp.param(Tensor<double>({2}, {1.0, 2.0}));
    EmitOptions<double> o;
    o.names = {{a, "my weights"}};
    refused([&] { emit_files(tp, sum(a * a), o, path); }, "'my weights' is not a C++ identifier");
  }
  SUBCASE("a name C++ reserves, and two names spelt alike") {
    Tape<double> tp;
    Var<double> a = tp.param(Tensor<double>({2}, {1.0, 2.0})), b = tp.param(Tensor<double>({2}, {3.0, 4.0}));
    EmitOptions<double> o;
    for (const char* name : {"a__b", "_Weights"}) {
      o.names = {{a, name}};
      refused([&] { emit_files(tp, sum(a * b), o, path); }, "cannot be represented: C++ reserves");
    }
    o.names = {{a, "int"}, {b, "int_"}};
    refused([&] { emit_files(tp, sum(a * b), o, path); }, "would both be written 'int_'");
    o.names = {{a, "w"}, {b, "w"}};
    refused([&] { emit_files(tp, sum(a * b), o, path); }, "the name 'w' is given to nodes 0 and 1");
    o.names = {};
    o.name = "std";
    refused([&] { emit_files(tp, sum(a * b), o, path); }, "cannot name the emitted namespace");
  }
  SUBCASE("an unwritable path: the error names it, and an existing file is left as it was") {
    Tape<double> tp;
    Var<double> a = tp.param(Tensor<double>({2}, {1.0, 2.0}));
    const Var<double> loss = sum(a * a);
    CHECK_THROWS_WITH_AS(emit_files(tp, loss, {}, "/nonexistent-dir/model.hpp"),
                         doctest::Contains("cannot write '/nonexistent-dir/model.hpp'"), EmitError);
    std::ofstream(path) << "previous";
    // An unwritable CUDA path is found before the C++ file is touched.
    CHECK_THROWS_WITH_AS(emit_files(tp, loss, {}, path, "/nonexistent-dir/model.cuh"),
                         doctest::Contains("cannot write '/nonexistent-dir/model.cuh'"), EmitError);
    CHECK(slurp(path) == "previous");
    // Regression (C): a CUDA path that is a directory used to be found after the C++ file was written.
    const std::string dir_path = scratch().file("a_directory.cuh");
    std::filesystem::create_directories(dir_path);
    CHECK_THROWS_WITH_AS(emit_files(tp, loss, {}, path, dir_path), doctest::Contains("is a directory"), EmitError);
    CHECK(slurp(path) == "previous");
    CHECK_THROWS_WITH_AS(emit_files(tp, loss, {}, dir_path), doctest::Contains("is a directory"), EmitError);
    // The same file for both outputs (the CUDA text used to be left in the .hpp), however it is spelled.
    const std::string link = scratch().file("link_to_refused.hpp");
    std::filesystem::remove(link);
    std::filesystem::create_symlink(path, link);
    const std::string other_spelling = scratch().dir.string() + "/./a_directory.cuh/../refused.hpp";
    for (const std::string& second : {path, other_spelling, link}) {
      CHECK_THROWS_WITH_AS(emit_files(tp, loss, {}, path, second), doctest::Contains("same file"), EmitError);
      CHECK(slurp(path) == "previous");
    }
    const std::string fresh = scratch().file("fresh.hpp");
    std::filesystem::remove(fresh);
    CHECK_THROWS_WITH_AS(emit_files(tp, loss, {}, fresh, scratch().dir.string() + "/./fresh.hpp"),
                         doctest::Contains("same file"), EmitError);
    CHECK_FALSE(std::filesystem::exists(fresh));
    for (const auto& f : std::filesystem::directory_iterator(scratch().dir))
      CHECK(f.path().filename().string().find(".tmp.") == std::string::npos);
  }
}

// Regression (A): a NaN op scalar used to be written as T() (0): the emitted
// loss was finite where the tape's is NaN. NaN (with a payload and a sign)
// and infinities, as op scalars and as leaf values, are written exactly.
template <class T>
Var<T> nan_case(Tape<T>& tp, Var<T>* a, Var<T>* c) {
  const T nan = std::bit_cast<T>(std::conditional_t<sizeof(T) == 8, std::uint64_t, std::uint32_t>(
      sizeof(T) == 8 ? 0xfff8000000001234ull : 0xffc01234u));  // negative, with a payload
  const T inf = std::numeric_limits<T>::infinity();
  *a = tp.param(Tensor<T>({3}, {T(1.5), T(-2.0), T(0.25)}));
  *c = tp.constant(Tensor<T>({3}, {nan, -inf, T(-0.0)}));
  return sum(*a * T(2) + std::numeric_limits<T>::quiet_NaN()) + sum(*a * *c) + sum(*a + inf);
}

TEST_CASE("NaN and infinite op scalars and leaf values are emitted exactly (the tape's bits, NaN payloads too)") {
  if (!have_compiler()) return;
  Expect<double> e64;
  Expect<float> e32;
  {
    Tape<double> tp;
    Var<double> a, c;
    const Var<double> loss = nan_case(tp, &a, &c);
    EmitOptions<double> o;
    o.name = "nan64";
    o.value_and_grad = true;
    emit_files(tp, loss, o, scratch().file("nan64.hpp"), scratch().file("nan64.cuh"));
    REQUIRE(tp.backward(loss));
    CHECK(std::isnan(tp.scalar(loss)));
    e64.add("loss", tp.scalar(loss));
    e64.add("grad", tp.grad(a).data);
  }
  {
    Tape<float> tp;
    Var<float> a, c;
    const Var<float> loss = nan_case(tp, &a, &c);
    EmitOptions<float> o;
    o.name = "nan32";
    o.value_and_grad = true;
    emit_files(tp, loss, o, scratch().file("nan32.hpp"));
    REQUIRE(tp.backward(loss));
    e32.add("loss", tp.scalar(loss));
    e32.add("grad", tp.grad(a).data);
  }
  std::string main = std::string(driver_head) + "#include \"nan64.hpp\"\n#include \"nan32.hpp\"\n" +
                     "int main(int, char** argv) {\n  const std::string dir = argv[1];\n" +
                     "  out = std::fopen((dir + \"/out.bin\").c_str(), \"wb\");\n";
  for (const char* ns : {"nan64", "nan32"})
    main += "  {\n    " + std::string(ns) + "::T x[3], g[3];\n    " + ns + "::captured_x(x);\n    const " + ns +
            "::T loss = " + ns + "::value_and_grad(x, g);\n    put(&loss, sizeof loss);\n    put(g, sizeof g);\n  }\n";
  main += "  std::fclose(out);\n}\n";
  const std::vector<unsigned char> got = compile_and_run("nan", main);
  compare(got, compare(got, 0, e64, "NaN case f64"), e32, "NaN case f32");
}

namespace {

// A block of driver code that runs the emitted namespace `ns` from its
// metadata tables alone (no member names): value_and_grad at the captured
// parameters and inputs, forward_flat, one step (with `optimizer`: its
// update) on flat buffers; then the tables' sizes, ranks, extents and offsets.
// Writes the names, one a line, to names.txt.
std::string generic_driver(const std::string& ns, bool optimizer) {
  std::string s = "  {\n    namespace M = " + ns + ";\n    using T = M::T;\n";
  s += R"(    static T x[M::parameter_elements + 1], g[M::parameter_elements + 1], data[M::input_elements + 1],
        outs[M::output_elements + 1];
    static M::Workspace ws;
    for (const auto& t : M::parameters) for (std::size_t i = 0; i < t.size; ++i) x[t.offset + i] = t.init[i];
    for (const auto& t : M::inputs) for (std::size_t i = 0; i < t.size; ++i) data[t.offset + i] = t.init[i];
    const T loss = M::value_and_grad(M::inputs_at(data), x, g);
    put(&loss, sizeof loss);
    put(g, M::parameter_elements * sizeof(T));
)";
  s += "    M::forward_flat(M::inputs_at(data), M::params_at(x), outs, ws);\n";
  s += "    put(outs, M::output_elements * sizeof(T));\n";
  if (optimizer) s += "    static M::Optimizer opt;\n    opt.load();\n";
  s += "    const T loss2 = M::step(M::inputs_at(data), M::params_at(x), " + std::string(optimizer ? "opt, " : "") +
       "ws);\n    put(&loss2, sizeof loss2);\n";
  s += R"(    for (const auto& t : M::parameters) put(ws.grad + t.grad_offset, t.size * sizeof(T));
    put(x, M::parameter_elements * sizeof(T));
    std::FILE* names = std::fopen((dir + "/names.txt").c_str(), "w");
    for (const auto* table : {&M::parameters[0], &M::inputs[0], &M::outputs[0]}) (void)table;
    auto describe = [&](const auto& tab) {
      for (const auto& t : tab) {
        std::fprintf(names, "%s %s\n", t.name, t.identifier);
        const T row[] = {T(t.size), T(t.shape.rank), T(t.shape.d[0]), T(t.offset)};
        put(row, sizeof row);
      }
    };
    describe(M::parameters);
    describe(M::inputs);
    describe(M::outputs);
    std::fclose(names);
  }
)";
  return s;
}

// What generic_driver writes, from the tape: value_and_grad (loss, gradients),
// the outputs, the step's loss and gradients, the parameters after it (the
// optimizer's step, if any, or unchanged), then each table row.
template <class T>
void generic_expect(Expect<T>& e, Tape<T>& tp, Var<T> loss, const std::vector<Var<T>>& params,
                    const std::vector<Var<T>>& inputs, const std::vector<Var<T>>& outputs, Adam<T>* opt) {
  REQUIRE(tp.backward(loss));
  e.add("loss", tp.scalar(loss));
  for (const auto& p : params) e.add("grad", tp.grad(p).data);
  for (const auto& o : outputs) e.add("output", tp.value(o).data);
  e.add("step loss", tp.scalar(loss));
  for (const auto& p : params) e.add("step grad", tp.grad(p).data);
  if (opt) REQUIRE(opt->step());
  for (const auto& p : params) e.add("parameter after the step", tp.value(p).data);
  for (const auto* group : {&params, &inputs, &outputs}) {
    std::size_t offset = 0;
    for (const auto& v : *group) {
      const auto s = tp.value(v).shape;
      e.add("size", T(tp.value(v).size()));
      e.add("rank", T(s.size()));
      e.add("extent 0", T(s.empty() ? 0 : s[0]));
      e.add("offset", T(offset));
      offset += tp.value(v).size();
    }
  }
}

}  // namespace

// Regression (B): names that collide with generated ones ("x" and "x_init",
// "x_size", "k"), C++ keywords and alternative tokens, macros (NULL, errno,
// INFINITY, GRAD_HD) and namespace names were accepted and the header read
// the wrong member or did not compile. (G): a caller that knows nothing of
// the model but its tables drives it.
TEST_CASE("hostile names: every keyword, macros, namespaces, the generated names; driven from the metadata alone") {
  if (!have_compiler()) return;
  std::vector<std::string> names = {
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
      "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr",
      "constinit", "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete",
      "do", "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for",
      "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
      "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register", "reinterpret_cast",
      "requires", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct",
      "switch", "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "union",
      "unsigned", "using", "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq", "final", "override",
      "import", "module", "NULL", "errno", "INFINITY", "NAN", "EOF", "assert", "stdin", "GRAD_HD", "GRAD_VERSION",
      "linux", "unix", "std", "grad", "T", "x", "x_init", "x_size", "x_grad_offset", "grad_x", "x_device", "size",
      "init", "gradient", "grad_offset", "device_init", "shapes", "s0", "p", "m", "v", "in", "ws", "opt", "stream",
      "step", "step_body", "load", "view", "value", "scratch", "moment", "value_size", "grad_size", "moment_size",
      "m_init", "v_init", "loss_offset", "Optimizer", "update",
      "forward", "forward_flat", "value_and_grad", "value_and_grad_size", "captured_x", "parameters", "inputs",
      "outputs", "params_at", "inputs_at", "data", "copy", "p0", "in1", "out0", "out_k", "k_", "k"};
  const std::vector<std::string> output_names = {"out_x", "i", "g", "loss"};  // products, forward()'s outputs
  if (names.size() % 2) names.push_back("odd_one");
  // A member named as its struct would be ill-formed: a parameter Params and ParamStore, an input Inputs.
  for (const char* n : {"Params", "Inputs", "ParamStore", "Workspace"}) names.push_back(n);
  Tape<double> tp;
  std::vector<Var<double>> params, inputs, outputs;
  EmitOptions<double> o;
  o.name = "hostile";
  Var<double> loss;
  for (std::size_t j = 0; j < names.size(); j += 2) {
    const double a = 0.25 + 0.125 * double(j % 7), c = -0.5 + 0.0625 * double(j % 5);
    params.push_back(tp.param(Tensor<double>({2}, {a, -a})));
    inputs.push_back(tp.constant(Tensor<double>({2}, {c, 2 * c})));
    o.names.push_back({params.back(), names[j]});
    o.names.push_back({inputs.back(), names[j + 1]});
    const Var<double> product = params.back() * inputs.back();
    if (outputs.size() < output_names.size()) {
      o.names.push_back({product, output_names[outputs.size()]});
      outputs.push_back(product);
    }
    const Var<double> term = sum(product * params.back());
    loss = j == 0 ? term : loss + term;
  }
  o.outputs = outputs;
  Adam<double> adam(0.05);
  for (const auto& p : params) adam.add(p);
  o.optimizer = &adam;
  o.value_and_grad = true;
  emit_files(tp, loss, o, scratch().file("hostile.hpp"), scratch().file("hostile.cuh"));
  // The captured values of a few leaves, read by name below (before the tape's Adam step changes them).
  auto captured = [&](const std::string& n) {
    for (const auto& [v, name] : o.names)
      if (name == n) {
        const auto d = tp.value(v).data;
        return std::vector<double>(d.begin(), d.end());
      }
    FAIL("no leaf named " << n);
    return std::vector<double>{};
  };
  const std::vector<std::string> read_by_name = {"x_init", "x_size", "x", "int", "load", "NULL", "k", "T", "in"};
  std::vector<std::vector<double>> by_value;
  for (const auto& n : read_by_name) by_value.push_back(captured(n));
  const auto first_output = tp.value(outputs[0]).data;
  Expect<double> e;
  e.add("forward's first output (by name)", first_output);
  for (std::size_t k = 0; k < read_by_name.size(); ++k)
    e.add(read_by_name[k] + " (by name)", std::span<const double>(by_value[k]));
  generic_expect(e, tp, loss, params, inputs, outputs, &adam);

  // The members by name first: Inputs' defaults, ParamStore, forward()'s arguments, init::.
  std::string by_name = "  {\n    static hostile::ParamStore ps;\n    static hostile::Workspace ws;\n    ps.load();\n";
  by_name += "    static double o0[2], o1[2], o2[2], o3[2];\n    hostile::Inputs in;\n";
  by_name += "    hostile::forward(in, ps.view(), o0, o1, o2, o3, ws);\n    put(o0, sizeof o0);\n";
  for (const auto& n : read_by_name) {
    bool param = false;
    for (const auto& [v, name] : o.names)
      if (name == n) param = tp.requires_grad(v);
    const std::string id = emit_detail::spelling(n);
    by_name += "    put(" + (param ? "ps." + id : "in." + id) + ", 2 * sizeof(double));\n";
  }
  by_name += "  }\n";
  const std::string main = std::string(driver_head) + "#include <cassert>\n#include <cerrno>\n#include <cmath>\n" +
                           "#include \"hostile.hpp\"\nint main(int, char** argv) {\n  const std::string dir = argv[1];\n" +
                           "  out = std::fopen((dir + \"/out.bin\").c_str(), \"wb\");\n" + by_name +
                           generic_driver("hostile", true) + "  std::fclose(out);\n}\n";
  compare(compile_and_run("hostile", main), 0, e, "hostile names");
  if (!clang().empty()) compare(compile_and_run("hostile_clang", main, "", nullptr, clang()), 0, e, "hostile names, clang++");
  // The tables keep the names as given, and say how each is spelt.
  std::string want;
  for (const auto* group : {&params, &inputs, &outputs})
    for (const auto& v : *group)
      for (const auto& [var, name] : o.names)
        if (var.index() == v.index()) want += name + " " + (emit_detail::needs_suffix(name) ? name + "_" : name) + "\n";
  CHECK(slurp(scratch().file("names.txt")) == want);
}

// Regression (F): value_and_grad took no inputs (the captured ones were baked
// in), so a caller could not pass its own per-example data. It takes an
// Inputs now (by name, or inputs_at over one buffer): three other data sets
// than the captured one, each against the tape recorded on that data.
TEST_CASE("value_and_grad with the caller's inputs lands on the tape's bits for data other than the captured") {
  if (!have_compiler()) return;
  auto record = [](Tape<double>& tp, std::uint64_t seed, Var<double>* w, Var<double>* b, Var<double>* X,
                   Var<double>* y) {
    testing::Rng rng(seed);
    *X = tp.constant(testing::random_tensor<double>({16, 3}, rng));
    *y = tp.constant(testing::random_tensor<double>({16, 1}, rng));
    *w = tp.param(Tensor<double>({3, 1}, {0.5, -0.25, 0.125}));
    *b = tp.param(Tensor<double>({1}, {0.1}));
    return mse(matmul(*X, *w) + *b, *y);
  };
  {
    Tape<double> tp;
    Var<double> w, b, X, y;
    const Var<double> loss = record(tp, 99, &w, &b, &X, &y);
    EmitOptions<double> o;
    o.name = "per_example";
    o.names = {{w, "w"}, {b, "b"}, {X, "X"}, {y, "y"}};
    o.value_and_grad = true;
    emit_files(tp, loss, o, scratch().file("per_example.hpp"), scratch().file("per_example.cuh"));
  }
  Expect<double> e;
  std::vector<double> data;  // per data set: X (48), y (16)
  for (std::uint64_t seed : {7u, 8u, 9u}) {
    Tape<double> tp;
    Var<double> w, b, X, y;
    const Var<double> loss = record(tp, seed, &w, &b, &X, &y);
    REQUIRE(tp.backward(loss));
    for (int twice = 0; twice < 2; ++twice) {  // by name, then through inputs_at
      e.add("loss", tp.scalar(loss));
      e.add("dw", tp.grad(w).data);
      e.add("db", tp.grad(b).data);
    }
    data.insert(data.end(), tp.value(X).data.begin(), tp.value(X).data.end());
    data.insert(data.end(), tp.value(y).data.begin(), tp.value(y).data.end());
  }
  write_values(scratch().file("per_example.in"), data);
  const std::string main = std::string(driver_head) + "#include \"per_example.hpp\"\n" + R"(int main(int, char** argv) {
  const std::string dir = argv[1];
  out = std::fopen((dir + "/out.bin").c_str(), "wb");
  namespace m = per_example;
  static double data[3 * 64];
  read(dir + "/per_example.in", data, sizeof data);
  static_assert(m::inputs.size() == 2 && m::input_elements == 64);
  double x[m::value_and_grad_size], g[m::value_and_grad_size];
  m::captured_x(x);
  for (int k = 0; k < 3; ++k) {
    m::Inputs in;
    in.X = data + 64 * k;
    in.y = data + 64 * k + 48;
    double loss = m::value_and_grad(in, x, g);
    put(&loss, sizeof loss);
    put(g, sizeof g);
    // The same through the table's flat layout: inputs in node order (X, then y).
    static_assert(m::inputs[0].offset == 0 && m::inputs[1].offset == 48);
    loss = m::value_and_grad(m::inputs_at(data + 64 * k), x, g);
    put(&loss, sizeof loss);
    put(g, sizeof g);
  }
  std::fclose(out);
}
)";
  compare(compile_and_run("per_example", main), 0, e, "value_and_grad on the caller's inputs");
}

// Last: it also compiles the CUDA sources the cases above wrote.
TEST_CASE("the emitted CUDA sources compile with nvcc") {
  const std::string nvcc = env("GRAD_EMIT_NVCC"), inc = env("GRAD_EMIT_INCLUDE");
  if (nvcc.empty()) {
    MESSAGE("nvcc not found: the CUDA compile check is skipped");
    return;
  }
  // The headers are those the cases above wrote; write them here if this case runs alone.
  if (!std::filesystem::exists(scratch().file("linreg.cuh"))) {
    Tape<double> tp;
    Var<double> p[2];
    const Var<double> loss =
        linreg_loss(tp, Tensor<double>({3, 1}, {0.5, -0.25, 0.125}), Tensor<double>({1}, {0.1}), p);
    EmitOptions<double> o;
    o.name = "linreg";
    o.value_and_grad = true;
    emit_files(tp, loss, o, "", scratch().file("linreg.cuh"));
  }
  if (!std::filesystem::exists(scratch().file("ae32.cuh"))) {
    std::vector<float> unused;
    autoencoder_case<float>("ae32", unused);
  }
  const std::string src = scratch().file("cuda_check.cu"), log = scratch().file("cuda_check.log");
  std::string cu = "#include \"linreg.cuh\"\n#include \"ae32.cuh\"\n"
                   "__global__ void per_thread(const double* x, double* g, double* loss) {\n"
                   "  const unsigned t = threadIdx.x;\n"
                   "  loss[t] = linreg::value_and_grad(x + 4 * t, g + 4 * t);\n}\n"
                   "void launch(ae32::Inputs in, ae32::Params p, ae32::DeviceOptimizer opt, "
                   "ae32::DeviceWorkspace ws) {\n  ae32::step(in, p, opt, ws);\n}\n";
  // Also (when the cases that write them ran): value_and_grad on each thread's own data (inputs_at),
  // the hostile names' and the NaN case's sources.
  if (std::filesystem::exists(scratch().file("per_example.cuh")))
    cu += "#include \"per_example.cuh\"\n"
          "__global__ void per_example_kernel(const double* data, const double* x, double* g, double* loss) {\n"
          "  const unsigned t = threadIdx.x;\n"
          "  loss[t] = per_example::value_and_grad(per_example::inputs_at(data + 64 * t), x, g + 4 * t);\n}\n";
  for (const char* f : {"hostile", "nan64"})
    if (std::filesystem::exists(scratch().file(std::string(f) + ".cuh")))
      cu += "#include \"" + std::string(f) + ".cuh\"\n__global__ void " + f +
            "_kernel(const double* x, double* g, double* loss) {\n  loss[threadIdx.x] = " + f +
            "::value_and_grad(x, g);\n}\n";
    else
      MESSAGE(f << ".cuh not written (its case did not run): not compiled");
  std::ofstream(src) << cu;
  const std::string cmd =
      nvcc + " -std=c++20 --fmad=false --expt-relaxed-constexpr -Xcompiler=-ffp-contract=off -arch=sm_90 -I " + inc +
      " -I " + scratch().dir.string() + " -c " + src + " -o " + scratch().file("cuda_check.o") + " > " + log + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = std::system(cmd.c_str());
  MESSAGE("nvcc: " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
  CHECK_MESSAGE(rc == 0, cmd << "\n" << slurp(log).substr(0, 6000));
}

// Regression (E): emitted functions left parameters unused in corner cases
// (forward() of a leaf, an update() whose parameters the loss does not reach,
// a program without inputs), which -Wall -Wextra -Werror users could not
// build. Compiled with -Wall -Wextra -Wshadow -Wconversion -Werror, by g++
// and by clang++ when it is there.
TEST_CASE("emitted corner cases compile warning-free under -Wall -Wextra -Wshadow -Wconversion -Werror") {
  if (!have_compiler()) return;
  Tape<double> tp;
  const Var<double> a = tp.param(Tensor<double>({2}, {1.0, 2.0})), unused = tp.param(Tensor<double>({2}, {3.0, 4.0}));
  const Var<double> loss = sum(a * a);
  SGD<double> sgd(0.1);
  sgd.add(unused);  // the loss does not reach it: update() has nothing to do
  EmitOptions<double> o;
  o.name = "corner";
  o.outputs = {unused};  // forward() copies a leaf
  o.optimizer = &sgd;
  o.value_and_grad = true;
  emit_files(tp, loss, o, scratch().file("corner.hpp"));
  Adam<double> adam(0.1);  // the same with Adam (its step constants unused)
  adam.add(unused);
  o.name = "corner_adam";
  o.optimizer = &adam;
  emit_files(tp, loss, o, scratch().file("corner_adam.hpp"));
  Expect<double> e;
  e.add("output", tp.value(unused).data);
  REQUIRE(tp.backward(loss));
  e.add("loss", tp.scalar(loss));
  e.add("grad", tp.grad(a).data);
  e.add("loss with Adam", tp.scalar(loss));
  const std::string main = std::string(driver_head) + "#include \"corner.hpp\"\n#include \"corner_adam.hpp\"\n" + R"(int main(int, char** argv) {
  const std::string dir = argv[1];
  out = std::fopen((dir + "/out.bin").c_str(), "wb");
  static corner::ParamStore ps;
  static corner::Optimizer opt;
  static corner::Workspace ws;
  ps.load();
  opt.load();
  double o0[2];
  corner::forward(corner::Inputs{}, ps.view(), o0, ws);
  put(o0, sizeof o0);
  const double loss = corner::step(corner::Inputs{}, ps.view(), opt, ws);
  put(&loss, sizeof loss);
  put(corner::gradient::p0(ws), 2 * sizeof(double));
  static corner_adam::ParamStore ps2;
  static corner_adam::Optimizer opt2;
  static corner_adam::Workspace ws2;
  ps2.load();
  opt2.load();
  const double loss2 = corner_adam::step(corner_adam::Inputs{}, ps2.view(), opt2, ws2);
  put(&loss2, sizeof loss2);
  std::fclose(out);
}
)";
  compare(compile_and_run("corner", main), 0, e, "corner cases, g++");
  if (!clang().empty()) compare(compile_and_run("corner_clang", main, "", nullptr, clang()), 0, e, "corner cases, clang++");
}
