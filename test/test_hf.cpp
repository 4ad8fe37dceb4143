// grad::hf: safetensors in and out (exact dtype conversions, every header
// check), Hugging Face Qwen2 / Llama directories as nn::Lm against the
// float64 PyTorch reference of test/oracle/hf_oracle.py (logits, loss, LoRA
// gradients), PEFT adapters in and out, merge and export.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <grad/hf/model.hpp>
#include <grad/hf/safetensors.hpp>
#include <grad/lm.hpp>
#include <nlohmann/json.hpp>

#include "golden.hpp"
#include "support.hpp"

using namespace grad;
using namespace grad::testing;
using nlohmann::json;

namespace {

// The message of the hf::Error that f throws ("" when it throws none).
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const hf::Error& e) {
    return e.what();
  }
  return "";
}
void expect_refused(const std::string& message, std::initializer_list<std::string> fragments) {
  CAPTURE(message);
  REQUIRE_FALSE(message.empty());
  for (const std::string& f : fragments) CHECK(message.find(f) != std::string::npos);
}

std::string slurp_text(const std::string& path) {
  const auto b = read_bytes(path);
  return {b.begin(), b.end()};
}
void write_text(const std::string& path, const std::string& text) {
  write_bytes(path, std::vector<unsigned char>(text.begin(), text.end()));
}

// A safetensors file from a header's JSON text and data bytes, as given (for the refusals).
void write_raw(const std::string& path, const std::string& header, std::size_t data_bytes,
               std::uint64_t claimed = 0) {
  std::vector<unsigned char> b(8);
  const std::uint64_t n = claimed ? claimed : header.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(n >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.resize(b.size() + data_bytes, 0);
  write_bytes(path, b);
}

}  // namespace

// ------------------------------------------------------------ the dtypes --

TEST_CASE("every F16 and BF16 value decodes exactly and encodes back to its bits") {
  for (const hf::Dtype d : {hf::Dtype::f16, hf::Dtype::bf16}) {
    CAPTURE(hf::dtype_name(d));
    std::size_t checked = 0;
    for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
      const auto b16 = static_cast<std::uint16_t>(bits);
      unsigned char in[2], out[2];
      std::memcpy(in, &b16, 2);
      const double v = hf::decode_element(d, in);
      if (std::isnan(v)) continue;
      REQUIRE(hf::encode_element(d, v, out));
      REQUIRE(std::memcmp(in, out, 2) == 0);
      ++checked;
    }
    CHECK(checked > 63000);
  }
  unsigned char b[2];
  const std::uint16_t one_f16 = 0x3c00, tiny_f16 = 0x0001, one_bf16 = 0x3f80;
  std::memcpy(b, &one_f16, 2);
  CHECK(hf::decode_element(hf::Dtype::f16, b) == 1.0);
  std::memcpy(b, &tiny_f16, 2);
  CHECK(hf::decode_element(hf::Dtype::f16, b) == std::ldexp(1.0, -24));  // the smallest subnormal
  std::memcpy(b, &one_bf16, 2);
  CHECK(hf::decode_element(hf::Dtype::bf16, b) == 1.0);
}

TEST_CASE("encoding rounds to nearest, ties to even, and refuses values beyond the dtype's range") {
  auto f16 = [](double v) {
    unsigned char b[2];
    REQUIRE(hf::encode_element(hf::Dtype::f16, v, b));
    return hf::decode_element(hf::Dtype::f16, b);
  };
  auto f32 = [](double v) {
    unsigned char b[4];
    REQUIRE(hf::encode_element(hf::Dtype::f32, v, b));
    return hf::decode_element(hf::Dtype::f32, b);
  };
  const double u = std::ldexp(1.0, -10);                 // F16's ulp at 1
  CHECK(f16(1 + u / 2) == 1.0);                          // a tie: to the even 1
  CHECK(f16(1 + 3 * u / 2) == 1 + 2 * u);                // a tie: to the even 1 + 2u
  CHECK(f16(1 + u / 2 + std::ldexp(1.0, -30)) == 1 + u);  // above the tie
  CHECK(f16(-65504.0) == -65504.0);
  CHECK(f16(std::ldexp(1.0, -25)) == 0.0);               // half the smallest subnormal: a tie to 0
  CHECK(f16(std::ldexp(1.5, -25)) == std::ldexp(1.0, -24));
  CHECK(f16(std::ldexp(1023.0, -24) + std::ldexp(1.0, -25)) == std::ldexp(1.0, -14));  // up into the normals
  for (const double v : {0.1, -3.7, 1e-40, 123456.789, std::ldexp(1.0, -149)})
    CHECK(f32(v) == static_cast<double>(static_cast<float>(v)));
  unsigned char b[4];
  CHECK_FALSE(hf::encode_element(hf::Dtype::f16, 65520.0, b));  // rounds to infinity
  CHECK(hf::encode_element(hf::Dtype::f16, 65519.0, b));
  CHECK_FALSE(hf::encode_element(hf::Dtype::bf16, 1e39, b));
  CHECK_FALSE(hf::encode_element(hf::Dtype::f32, 1e300, b));
  CHECK(hf::encode_element(hf::Dtype::f16, -INFINITY, b));
  CHECK(hf::decode_element(hf::Dtype::f16, b) == -INFINITY);
}

// ------------------------------------------------------- the file format --

TEST_CASE("safetensors round trip: every dtype, transposed matrices, metadata") {
  ScratchDir dir("hf");
  const std::vector<double> m = {1, 2, 3, 4, 5, 6};  // [2, 3]
  const std::vector<double> v = {0.5, -0.25};
  for (const hf::Dtype d : {hf::Dtype::f64, hf::Dtype::f32, hf::Dtype::f16, hf::Dtype::bf16}) {
    const std::vector<hf::TensorOut<double>> out = {{"m", {2, 3}, m}, {"mt", {3, 2}, m, true}, {"v", {2}, v}};
    const std::string path = dir.file("rt.safetensors");
    hf::write_safetensors<double>(path, out, d, {{"format", "pt"}});
    const hf::SafetensorsFile f(path);
    CHECK(f.metadata().at("format") == "pt");
    REQUIRE(f.tensors().size() == 3);
    const hf::TensorInfo* mt = f.find("mt");
    REQUIRE(mt);
    CHECK(mt->dtype == d);
    CHECK(mt->shape == std::vector<std::size_t>{3, 2});
    std::vector<double> got(6);
    f.read(*mt, std::span<double>(got));
    CHECK(got == std::vector<double>{1, 4, 2, 5, 3, 6});
    std::vector<float> vf(2);
    f.read(*f.find("v"), std::span<float>(vf));
    CHECK(vf == std::vector<float>{0.5f, -0.25f});
    CHECK(f.find("absent") == nullptr);
  }
}

TEST_CASE("a tensor larger than one read slice (16 MiB) converts whole, and a refusal names its element") {
  // The reader converts a tensor a slice at a time and hands each slice's pages back as it goes
  // (a model's tied embedding is hundreds of MB): every element lands, across the slices' seams.
  ScratchDir dir("hf");
  const std::size_t n = (std::size_t{24} << 20) / 4 + 3;  // 1.5 slices of F32, 3 of F64
  std::vector<double> big(n);
  for (std::size_t i = 0; i < n; ++i) big[i] = static_cast<double>(static_cast<float>(i % 4099) * 0.25f - 300.0f);
  const std::string path = dir.file("big.safetensors");
  for (const hf::Dtype d : {hf::Dtype::f64, hf::Dtype::f32, hf::Dtype::bf16}) {
    CAPTURE(hf::dtype_name(d));
    std::vector<double> values = big;
    if (d == hf::Dtype::bf16)  // values bf16 holds exactly: integers and halves below 256 in magnitude
      for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<double>(static_cast<int>(i % 401) - 200) * 0.5;
    hf::write_safetensors<double>(path, std::vector<hf::TensorOut<double>>{{"w", {n}, values}}, d);
    const hf::SafetensorsFile f(path);
    std::vector<float> got(n);
    f.read(*f.find("w"), std::span<float>(got));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += got[i] != static_cast<float>(values[i]);
    CHECK(wrong == 0);
  }
  // F64 into float: the first value that is not a float, in the third slice, is named by its index.
  const std::size_t bad = 5 * (std::size_t{1} << 20) + 17;
  std::vector<double> values = big;
  values[bad] = 0.1;
  hf::write_safetensors<double>(path, std::vector<hf::TensorOut<double>>{{"w", {n}, values}}, hf::Dtype::f64);
  const hf::SafetensorsFile f(path);
  std::vector<float> into(n);
  const std::string element = "'w' element " + std::to_string(bad) + " is";
  expect_refused(refusal([&] { f.read(*f.find("w"), std::span<float>(into)); }), {element.c_str(), "not a float value"});
  // check_read (a load's proof before it writes) refuses it alike, a slice at a time; into a 16-bit storage the
  // value 0.1 rounds, so only one beyond the storage's range is refused, named by its index.
  expect_refused(refusal([&] { f.check_read(*f.find("w"), Storage::native); }),
                 {element.c_str(), "not a float value"});
  CHECK_NOTHROW(f.check_read(*f.find("w"), Storage::f16));
  values[bad + 1] = -70000.0;
  const std::string path2 = dir.file("beyond.safetensors");
  hf::write_safetensors<double>(path2, std::vector<hf::TensorOut<double>>{{"w", {n}, values}}, hf::Dtype::f64);
  const hf::SafetensorsFile g(path2);
  const std::string beyond = "'w' element " + std::to_string(bad + 1) + " is -70000, beyond f16's range";
  expect_refused(refusal([&] { g.check_read(*g.find("w"), Storage::f16); }), {beyond.c_str()});
  CHECK_NOTHROW(g.check_read(*g.find("w"), Storage::bf16));
}

TEST_CASE("the writer refuses values beyond the dtype, mismatched counts and repeated names, writing nothing") {
  ScratchDir dir("hf");
  const std::string path = dir.file("w.safetensors");
  const std::vector<double> big = {1, 70000};
  std::vector<hf::TensorOut<double>> out = {{"x", {2}, big}};
  expect_refused(refusal([&] { hf::write_safetensors<double>(path, out, hf::Dtype::f16); }),
                 {"w.safetensors", "tensor 'x' element 1", "70000", "F16", "nothing written"});
  CHECK_FALSE(std::filesystem::exists(path));
  out = {{"x", {3}, big}};
  expect_refused(refusal([&] { hf::write_safetensors<double>(path, out, hf::Dtype::f32); }), {"'x'", "2 values"});
  out = {{"x", {2}, big}, {"x", {2}, big}};
  expect_refused(refusal([&] { hf::write_safetensors<double>(path, out, hf::Dtype::f32); }), {"'x' twice"});
  CHECK(std::filesystem::is_empty(dir.dir));  // no temporary left behind
}

TEST_CASE("a safetensors header is checked before anything is read through it") {
  ScratchDir dir("hf");
  const std::string p = dir.file("bad.safetensors");
  auto open = [&] { return refusal([&] { hf::SafetensorsFile f(p); }); };
  write_bytes(p, {1, 2, 3});
  expect_refused(open(), {"bad.safetensors", "3 bytes", "shorter"});
  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, 1000);
  expect_refused(open(), {"bad.safetensors", "header of 1000 bytes runs past the file's end"});
  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);
  expect_refused(open(), {"truncated: the header says 8 data bytes", "tensor 'a'", "[0, 8]", "the file has 4"});
  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12);
  expect_refused(open(), {"tensors 'a' and 'b' overlap"});
  write_raw(p, R"({"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})", 2);
  expect_refused(open(), {"tensor 'a'", "dtype 'I8'"});
  write_raw(p, R"({"a":{"dtype":"F16","shape":[3],"data_offsets":[0,4]}})", 4);
  expect_refused(open(), {"tensor 'a'", "needs 6 bytes", "hold 4"});
  write_raw(p, R"({"a":{"dtype":"F16","shape":[-3],"data_offsets":[0,4]}})", 4);
  expect_refused(open(), {"tensor 'a'", "shape"});
  write_raw(p, R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4);
  expect_refused(open(), {"tensor 'a'", "overflows"});
  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4);
  expect_refused(open(), {"tensor 'a'", "[4, 0] end before they begin"});
  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  expect_refused(open(), {"tensor 'a'", "twice"});
  write_raw(p, "{not json", 0);
  expect_refused(open(), {"bad.safetensors", "not JSON"});
  write_raw(p, "[1, 2]", 0);
  expect_refused(open(), {"not a JSON object"});
  expect_refused(refusal([&] { hf::SafetensorsFile f(dir.file("absent.safetensors")); }), {"absent.safetensors", "cannot open"});
  REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);  // refused, not waited on
  expect_refused(refusal([&] { hf::SafetensorsFile f(dir.file("fifo")); }), {"fifo", "is a FIFO, not a regular file"});
  // A double that is not a float value is never rounded into a float.
  const std::vector<double> x = {0.1};
  const std::vector<hf::TensorOut<double>> out = {{"x", {1}, x}};
  hf::write_safetensors<double>(p, out, hf::Dtype::f64);
  const hf::SafetensorsFile f(p);
  std::vector<float> into(1);
  expect_refused(refusal([&] { f.read(*f.find("x"), std::span<float>(into)); }), {"'x' element 0", "not a float value"});
}

// ------------------------------------------------ Hugging Face checkpoints --

namespace {

struct Checkpoint {
  hf::Architecture arch = hf::Architecture::qwen2;
  hf::Dtype dtype = hf::Dtype::f32;
  bool sharded = false, tied = false;
  std::size_t head_dim = 0;  // 0: hidden / heads, and config.json names none
};

json config_json(const Checkpoint& c) {
  const bool qwen2 = c.arch == hf::Architecture::qwen2;
  json j = {{"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
            {"model_type", qwen2 ? "qwen2" : "llama"},
            {"vocab_size", 37},
            {"hidden_size", 16},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"intermediate_size", 24},
            {"max_position_embeddings", 32},
            {"rope_theta", qwen2 ? 1000000.0 : 500000.0},
            {"rms_norm_eps", qwen2 ? 1e-6 : 1e-5},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", c.tied},
            {"torch_dtype", c.dtype == hf::Dtype::bf16 ? "bfloat16" : c.dtype == hf::Dtype::f16 ? "float16" : "float32"}};
  if (c.head_dim) j["head_dim"] = c.head_dim;
  return j;
}

// Writes a checkpoint with random weights as transformers would lay it out
// ([out, in] projections), split over two shards when asked.
void write_checkpoint(const std::string& dir, const Checkpoint& c, std::uint64_t seed) {
  std::filesystem::create_directories(dir);
  const json cfg = config_json(c);
  write_text(dir + "/config.json", cfg.dump(2));
  const std::size_t V = 37, d = 16, L = 2, H = 4, KV = 2, F = 24, hd = c.head_dim ? c.head_dim : d / H;
  Rng rng(seed);
  std::vector<std::vector<double>> store;
  std::vector<hf::TensorOut<double>> all;
  auto add = [&](std::string name, std::vector<std::size_t> shape, double lo, double hi) {
    std::size_t n = 1;
    for (std::size_t s : shape) n *= s;
    store.emplace_back(n);
    for (double& x : store.back()) x = rng.uniform(lo, hi);
    all.push_back({std::move(name), std::move(shape), {}});
  };
  add("model.embed_tokens.weight", {V, d}, -1, 1);
  for (std::size_t l = 0; l < L; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    add(pre + "input_layernorm.weight", {d}, 0.8, 1.2);
    add(pre + "post_attention_layernorm.weight", {d}, 0.8, 1.2);
    const double a = 1 / std::sqrt(double(d));
    add(pre + "self_attn.q_proj.weight", {H * hd, d}, -a, a);
    add(pre + "self_attn.k_proj.weight", {KV * hd, d}, -a, a);
    add(pre + "self_attn.v_proj.weight", {KV * hd, d}, -a, a);
    if (c.arch == hf::Architecture::qwen2) {
      add(pre + "self_attn.q_proj.bias", {H * hd}, -0.5, 0.5);
      add(pre + "self_attn.k_proj.bias", {KV * hd}, -0.5, 0.5);
      add(pre + "self_attn.v_proj.bias", {KV * hd}, -0.5, 0.5);
    }
    add(pre + "self_attn.o_proj.weight", {d, H * hd}, -a, a);
    add(pre + "mlp.gate_proj.weight", {F, d}, -a, a);
    add(pre + "mlp.up_proj.weight", {F, d}, -a, a);
    add(pre + "mlp.down_proj.weight", {d, F}, -0.2, 0.2);
  }
  add("model.norm.weight", {d}, 0.8, 1.2);
  if (!c.tied) add("lm_head.weight", {V, d}, -0.25, 0.25);
  for (std::size_t i = 0; i < all.size(); ++i) all[i].values = store[i];
  if (!c.sharded) {
    hf::write_safetensors<double>(dir + "/model.safetensors", all, c.dtype, {{"format", "pt"}});
    return;
  }
  const std::size_t half = all.size() / 2;
  const std::string names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (int s = 0; s < 2; ++s) {
    const std::span<const hf::TensorOut<double>> part(all.data() + (s ? half : 0), s ? all.size() - half : half);
    hf::write_safetensors<double>(dir + "/" + names[s], part, c.dtype, {{"format", "pt"}});
    for (const auto& t : part) index["weight_map"][t.name] = names[s];
  }
  write_text(dir + "/model.safetensors.index.json", index.dump(2));
}

}  // namespace

namespace {

// [batch, seq] inputs and their targets (one ignored), the same for every case.
constexpr std::size_t batch = 2, seq = 5;
std::vector<int> some_ids(std::uint64_t seed, std::size_t n) {
  Rng rng(seed);
  std::vector<int> v(n);
  for (int& x : v) x = static_cast<int>(rng.next() % 37);
  return v;
}
std::string joined(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s.push_back(',');
    s.append(std::to_string(x));
  }
  return s;
}

double largest_relative_error = 0;  // over every check_close, reported once

// |a - b| <= tol * max|b| over the tensor: relative to its scale.
void check_close(std::span<const double> got, const Tensor<double>& want, double tol, const std::string& what) {
  CAPTURE(what);
  REQUIRE(got.size() == want.size());
  double scale = 0, worst = 0;
  for (double w : want.data()) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  CAPTURE(worst);
  CAPTURE(scale);
  CHECK(scale > 0);
  CHECK(worst <= tol * scale);
  largest_relative_error = std::max(largest_relative_error, worst / scale);
}

// Random values into every adapter (B starts at zero) so that they matter.
template <class T>
void randomize_adapters(nn::Lm<T>& m, std::uint64_t seed) {
  Rng rng(seed);
  for (const auto& p : m.adapters())
    for (T& x : m.tape().leaf_value(p.var)) x = static_cast<T>(rng.uniform(-0.3, 0.3));
}

}  // namespace

namespace {

// What grad computed for one oracle case, in PEFT's layouts.
struct Computed {
  std::vector<double> logits;
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;  // PEFT name -> lora_A [r, in] / lora_B [out, r]
};

}  // namespace

TEST_CASE("Qwen2 and Llama checkpoints load as nn::Lm and match the float64 PyTorch reference") {
  if (!torch_available()) {
    MESSAGE("skipped: no torch for " << python());
    return;
  }
  ScratchDir dir("hf");
  const std::vector<int> ids = some_ids(11, batch * seq);
  std::vector<int> targets = some_ids(12, batch * seq);
  targets[3] = -100;
  const Checkpoint cases[] = {
      {hf::Architecture::qwen2, hf::Dtype::f32, false, false, 0},
      {hf::Architecture::qwen2, hf::Dtype::bf16, true, true, 0},
      {hf::Architecture::llama, hf::Dtype::f16, true, false, 6},  // heads * head_dim 24 != hidden 16
      {hf::Architecture::llama, hf::Dtype::bf16, false, true, 0},
  };
  std::vector<Computed> computed;
  std::string oracle_args;
  for (const Checkpoint& c : cases) {
    const std::string n = std::to_string(computed.size());
    const std::string model_dir = dir.file("model" + n), adapter_dir = dir.file("adapter" + n);
    CAPTURE(model_dir);
    write_checkpoint(model_dir, c, 100 + computed.size());
    hf::ModelInfo info = hf::read_config(model_dir);
    CHECK(info.architecture == c.arch);
    CHECK(info.dtype == c.dtype);
    CHECK(info.config.qkv_bias == (c.arch == hf::Architecture::qwen2));
    CHECK(info.config.tied_embeddings == c.tied);
    CHECK(info.config.head_dim() == (c.head_dim ? c.head_dim : 4));
    // LoRA on some projections or all, PEFT's alpha / r.
    const hf::AdapterConfig a{3, 6.0, nn::parse_projections(computed.size() % 2 ? "q,v,down" : "all")};
    const nn::LmConfig cfg = hf::with_adapters(info.config, a);
    Tape<double> tp;
    nn::Lm<double> m(tp, cfg, 1, nn::Lm<double>::Train::lora);
    hf::load_weights(model_dir, m);
    randomize_adapters(m, 7 + computed.size());
    hf::save_adapters(adapter_dir, m, hf::Dtype::f64);  // the oracle reads the adapters' exact values
    auto out = m.forward(m.ids(ids, batch, seq), m.ids(targets, batch * seq, 0));
    REQUIRE(tp.backward(out.loss));
    // The base is frozen: no gradient buffer anywhere below the adapters.
    for (const auto& p : m.base()) CHECK_FALSE(tp.requires_grad(p.var));
    Computed r;
    r.logits.assign(tp.value(out.logits).begin(), tp.value(out.logits).end());
    r.loss = tp.scalar(out.loss);
    for (std::size_t l = 0; l < cfg.layers; ++l)
      for (std::size_t p = 0; p < nn::proj_count; ++p) {
        const nn::LmLayer<double>& L = m.layer(l);
        if (!L.lora_a[p].valid()) continue;
        const std::string module = "base_model.model.model.layers." + std::to_string(l) +
                                   (p < 4 ? ".self_attn." : ".mlp.") + std::string(nn::proj_names[p]) + "_proj";
        // PEFT's A is [r, in], B [out, r]: grad's transposed.
        for (const auto& [suffix, var] : {std::pair{".lora_A.weight", L.lora_a[p]}, std::pair{".lora_B.weight", L.lora_b[p]}}) {
          const View<double> gv = tp.grad(var);
          const std::size_t rows = gv.shape[0], cols = gv.shape[1];
          std::vector<double>& t = r.grads[module + suffix];
          t.resize(rows * cols);
          for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t k = 0; k < cols; ++k) t[k * rows + i] = gv.data[i * cols + k];
        }
      }
    CHECK(r.grads.size() == m.adapters().size());
    // The KV decoder over the same model (biases, tied embeddings, a wide head, adapters): the tape's bits.
    nn::KvDecoder<double> dec(m);
    for (std::size_t p = 0; p < seq; ++p) {
      const std::span<const double> step = dec.step(ids[p]);
      CHECK(std::memcmp(step.data(), r.logits.data() + p * 37, 37 * sizeof(double)) == 0);
    }
    computed.push_back(std::move(r));
    oracle_args += " " + model_dir + " " + adapter_dir + " " + std::to_string(batch) + " " + std::to_string(seq) + " " +
                   joined(ids) + " " + joined(targets) + " " + dir.file("oracle" + n + ".txt");
  }
  REQUIRE(std::system((python() + " " + oracle_dir() + "/hf_oracle.py" + oracle_args).c_str()) == 0);
  for (std::size_t n = 0; n < computed.size(); ++n) {
    CAPTURE(n);
    const auto g = load_golden(dir.file("oracle" + std::to_string(n) + ".txt"));
    check_close(computed[n].logits, g.at("logits"), 1e-12, "logits");
    check_close(std::span<const double>(&computed[n].loss, 1), g.at("loss"), 1e-12, "loss");
    std::size_t compared = 0;
    for (const auto& [name, grad] : computed[n].grads) {
      REQUIRE(g.count("grad." + name) == 1);
      check_close(grad, g.at("grad." + name), 1e-12, name);
      ++compared;
    }
    CHECK(compared == g.size() - 2);  // every adapter gradient the oracle wrote
  }
  MESSAGE("largest difference from PyTorch, relative to the tensor's largest value: " << largest_relative_error);
}

TEST_CASE("a checkpoint that disagrees with config.json is refused by file and tensor, and nothing is loaded") {
  ScratchDir dir("hf");
  const std::string d = dir.file("m");
  const Checkpoint c{hf::Architecture::qwen2, hf::Dtype::bf16, true, false, 0};
  write_checkpoint(d, c, 5);
  const hf::ModelInfo info = hf::read_config(d);
  Tape<float> tp;
  nn::Lm<float> m(tp, info.config, 1);
  const std::vector<float> before(tp.value(m.embed()).begin(), tp.value(m.embed()).end());
  auto load = [&] { return refusal([&] { hf::load_weights(d, m); }); };
  auto unchanged = [&] {
    CHECK(std::equal(before.begin(), before.end(), tp.value(m.embed()).begin()));
  };
  const std::string shard2 = d + "/model-00002-of-00002.safetensors";
  const auto good_shard2 = read_bytes(shard2);
  // A missing tensor: shard 2 rewritten without the final norm (the index still names it).
  {
    const hf::SafetensorsFile f(shard2);
    std::vector<std::vector<double>> values;
    std::vector<hf::TensorOut<double>> keep;
    for (const auto& t : f.tensors()) values.emplace_back(t.elements);
    std::size_t i = 0;
    for (const auto& t : f.tensors()) {
      f.read(t, std::span<double>(values[i]));
      if (t.name != "model.norm.weight") keep.push_back({t.name, t.shape, values[i]});
      ++i;
    }
    hf::write_safetensors<double>(shard2 + ".new", keep, hf::Dtype::bf16);
  }
  std::filesystem::rename(shard2 + ".new", shard2);
  expect_refused(load(), {"tensor 'model.norm.weight' is missing", "[16]", "model-00002-of-00002.safetensors"});
  // A sentence: where it is missing from, then what the model has.
  expect_refused(load(), {"is missing from '", "which the index names for it: the model that config.json describes (",
                          ") has it, as a [16] tensor"});
  unchanged();
  write_bytes(shard2, good_shard2);
  // A shape that disagrees with config.json: intermediate_size 25 makes gate_proj [25, 16].
  json cfg = config_json(c);
  cfg["intermediate_size"] = 25;
  write_text(d + "/config.json", cfg.dump());
  {
    Tape<float> t2;
    nn::Lm<float> m2(t2, hf::read_config(d).config, 1);
    expect_refused(refusal([&] { hf::load_weights(d, m2); }),
                   {"model-00001-of-00002.safetensors", "'model.layers.0.mlp.gate_proj.weight' is [24, 16]", "[25, 16]"});
  }
  // The wrong architecture's tensors: a Llama config over Qwen2's biases.
  cfg = config_json(c);
  cfg["architectures"] = {"LlamaForCausalLM"};
  write_text(d + "/config.json", cfg.dump());
  {
    Tape<float> t2;
    nn::Lm<float> m2(t2, hf::read_config(d).config, 1);
    expect_refused(refusal([&] { hf::load_weights(d, m2); }),
                   {"model-0000", "_proj.bias' has no place in the model that config.json describes"});
  }
  // config.json itself.
  auto config_refusal = [&](const std::string& field, const json& value) {
    json j = config_json(c);
    j[field] = value;
    write_text(d + "/config.json", j.dump());
    return refusal([&] { hf::read_config(d); });
  };
  expect_refused(config_refusal("architectures", {"MistralForCausalLM"}), {"config.json", "MistralForCausalLM", "unknown architecture"});
  expect_refused(config_refusal("rope_scaling", {{"type", "linear"}, {"factor", 2.0}}), {"rope_scaling"});
  expect_refused(config_refusal("hidden_act", "gelu"), {"hidden_act", "gelu"});
  expect_refused(config_refusal("vocab_size", -3), {"vocab_size", "whole number"});
  expect_refused(config_refusal("num_key_value_heads", 3), {"kv_heads 3"});
  expect_refused(config_refusal("torch_dtype", "int8"), {"torch_dtype", "int8"});
  write_text(d + "/config.json", "{\"architectures\": [");
  expect_refused(refusal([&] { hf::read_config(d); }), {"config.json", "not JSON"});
  std::filesystem::remove(d + "/config.json");
  expect_refused(refusal([&] { hf::read_config(d); }), {"config.json", "cannot open", "No such file"});
  // An index that points outside the directory.
  write_text(d + "/model.safetensors.index.json", R"({"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}})");
  expect_refused(load(), {"index.json", "model.norm.weight", "a file name in the directory"});
  unchanged();
}

TEST_CASE("PEFT adapters: saved and loaded by PEFT's names, bit for bit; a config they do not fit is refused") {
  ScratchDir dir("hf");
  const std::string d = dir.file("m"), ad = dir.file("adapter");
  write_checkpoint(d, {hf::Architecture::llama, hf::Dtype::f32, false, false, 0}, 9);
  const hf::ModelInfo info = hf::read_config(d);
  const nn::LmConfig cfg = hf::with_adapters(info.config, {4, 8.0, nn::parse_projections("q,k,o,up")});
  CHECK(cfg.lora_scale == 2.0);
  Tape<float> tp;
  nn::Lm<float> m(tp, cfg, 1, nn::Lm<float>::Train::lora);
  hf::load_weights(d, m);
  randomize_adapters(m, 3);
  hf::save_adapters(ad, m);
  const json j = json::parse(slurp_text(ad + "/adapter_config.json"));
  CHECK(j["r"] == 4);
  CHECK(j["lora_alpha"] == 8);
  CHECK(j["target_modules"] == json({"q_proj", "k_proj", "o_proj", "up_proj"}));
  const hf::SafetensorsFile f(ad + "/adapter_model.safetensors");
  const hf::TensorInfo* a = f.find("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
  const hf::TensorInfo* b = f.find("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight");
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->shape == std::vector<std::size_t>{4, 16});
  CHECK(b->shape == std::vector<std::size_t>{24, 4});
  CHECK(f.tensors().size() == m.adapters().size());

  const hf::AdapterConfig read = hf::read_adapter_config(ad);
  Tape<float> t2;
  nn::Lm<float> m2(t2, hf::with_adapters(info.config, read), 2, nn::Lm<float>::Train::lora);
  hf::load_adapters(ad, m2);
  for (std::size_t i = 0; i < m.adapters().size(); ++i) {
    const View<float> x = tp.value(m.adapters()[i].var), y = t2.value(m2.adapters()[i].var);
    CHECK(std::memcmp(x.data.data(), y.data.data(), x.size() * sizeof(float)) == 0);
  }
  // A finetune of the loaded model: Adam on the adapters alone lowers the loss; the base never moves.
  {
    const std::vector<int> in = some_ids(31, batch * seq), next = some_ids(32, batch * seq);
    const std::vector<float> embed(tp.value(m.embed()).begin(), tp.value(m.embed()).end());
    Adam<float> opt(0.01f);
    for (const auto& p : m.trainable()) opt.add(p.var);
    const auto mark = tp.mark();
    float first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      auto r = m.forward(m.ids(in, batch, seq), m.ids(next, batch * seq, 0));
      REQUIRE(tp.backward(r.loss));
      (step == 0 ? first : last) = tp.scalar(r.loss);
      REQUIRE(opt.step());
      tp.reset_to(mark);
    }
    CAPTURE(first);
    CAPTURE(last);
    CHECK(last < 0.8f * first);
    CHECK(std::memcmp(embed.data(), tp.value(m.embed()).data.data(), embed.size() * sizeof(float)) == 0);
  }
  // Another rank: refused with both configs named, nothing loaded.
  Tape<float> t3;
  nn::Lm<float> m3(t3, hf::with_adapters(info.config, {2, 8.0, read.targets}), 2, nn::Lm<float>::Train::lora);
  const std::vector<float> before(t3.value(m3.adapters()[0].var).begin(), t3.value(m3.adapters()[0].var).end());
  expect_refused(refusal([&] { hf::load_adapters(ad, m3); }), {"adapter_config.json", "LoRA rank 4", "LoRA rank 2", "nothing loaded"});
  CHECK(std::equal(before.begin(), before.end(), t3.value(m3.adapters()[0].var).begin()));
  // What grad's adapters cannot be.
  auto with = [&](const std::string& field, const json& value) {
    json k = j;
    k[field] = value;
    write_text(ad + "/adapter_config.json", k.dump());
    return refusal([&] { hf::read_adapter_config(ad); });
  };
  expect_refused(with("use_rslora", true), {"use_rslora"});
  expect_refused(with("target_modules", {"q_proj", "lm_head"}), {"target_modules", "lm_head"});
  expect_refused(with("rank_pattern", {{"q_proj", 8}}), {"rank_pattern"});
  expect_refused(with("bias", "all"), {"bias"});
}

TEST_CASE("merge, export and load again: the same logits bit for bit; the KV decoder agrees with biases and tied embeddings") {
  ScratchDir dir("hf");
  const std::string d = dir.file("m"), out32 = dir.file("merged"), out16 = dir.file("again");
  write_checkpoint(d, {hf::Architecture::qwen2, hf::Dtype::bf16, false, true, 0}, 21);
  write_text(d + "/tokenizer.json", "{\"model\": {}}");
  const hf::ModelInfo info = hf::read_config(d);
  const std::vector<int> ids = some_ids(4, batch * seq);
  auto logits_of = [&](nn::Lm<float>& m) {
    auto o = m.forward(m.ids(ids, batch, seq));
    const View<float> v = m.tape().value(o.logits);
    return std::vector<float>(v.begin(), v.end());
  };
  // The base as loaded, exported in its own dtype (BF16): every value is one already.
  Tape<float> tb;
  nn::Lm<float> base(tb, info.config, 1);
  hf::load_weights(d, base);
  hf::SaveOptions as_bf16;
  as_bf16.dtype = hf::Dtype::bf16;
  as_bf16.copy_from = d;
  hf::save_pretrained(out16, base, as_bf16);
  CHECK(slurp_text(out16 + "/tokenizer.json") == "{\"model\": {}}");
  Tape<float> tb2;
  const hf::ModelInfo again = hf::read_config(out16);
  CHECK(again.config.describe() == info.config.describe());
  CHECK(again.dtype == hf::Dtype::bf16);
  nn::Lm<float> base2(tb2, again.config, 2);
  hf::load_weights(out16, base2);
  const std::vector<float> l1 = logits_of(base), l2 = logits_of(base2);
  CHECK(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)) == 0);

  // LoRA on top, merged, exported F32, loaded: the merged model's logits exactly.
  Tape<float> tl;
  nn::Lm<float> lora(tl, hf::with_adapters(info.config, {2, 4.0, nn::all_projections}), 1, nn::Lm<float>::Train::lora);
  hf::load_weights(d, lora);
  randomize_adapters(lora, 8);
  Tape<float> tm;
  nn::Lm<float> merged(tm, info.config, 3);
  nn::merge_lora(lora, merged);
  expect_refused(refusal([&] { hf::save_pretrained(out32, lora); }), {"merge them first", "nothing written"});
  hf::save_pretrained(out32, merged);
  const auto mode = std::filesystem::status(out32 + "/model.safetensors").permissions();
  CHECK((mode & std::filesystem::perms::others_read) != std::filesystem::perms::none);  // not mkstemp's 0600
  Tape<float> tr;
  nn::Lm<float> reloaded(tr, hf::read_config(out32).config, 4);
  hf::load_weights(out32, reloaded);
  const std::vector<float> lm = logits_of(merged), lr = logits_of(reloaded), ll = logits_of(lora);
  CHECK(std::memcmp(lm.data(), lr.data(), lm.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(lm.data(), l1.data(), lm.size() * sizeof(float)) != 0);  // the adapters mattered
  double worst = 0;
  for (std::size_t i = 0; i < lm.size(); ++i) worst = std::max(worst, double(std::abs(lm[i] - ll[i])));
  CHECK(worst < 1e-4);  // merging changes the order of the sums only

  // The KV decoder over a model with q/k/v biases and tied embeddings: the tape's logits at every position.
  nn::KvDecoder<float> dec(reloaded);
  for (std::size_t p = 0; p < seq; ++p) {
    const std::span<const float> step = dec.step(ids[p]);
    CHECK(std::memcmp(step.data(), lr.data() + p * 37, 37 * sizeof(float)) == 0);
  }
  // grad's own model files cannot hold these fields: refused, not half-saved.
  const ModelFileResult r = nn::save_lm(dir.file("x.model"), reloaded);
  CHECK_FALSE(r);
  CHECK(r.error.find("save_pretrained") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.file("x.model")));
}

// A BF16 (F16) checkpoint into a base held as bfloat16 (half; nn::Lm's
// base_storage): every matrix's bits exactly as stored (the projections
// transposed), so the model gives the logits of the same checkpoint loaded
// into float; an F32 checkpoint rounds to the nearest bfloat16 (half), and
// one with a value beyond the half's range is refused with nothing loaded.
// Written back out (in its dtype and F32), it gives the checkpoint's values.
TEST_CASE("a BF16 or F16 checkpoint loads into a 16-bit base bit for bit, and writes back out") {
  ScratchDir dir("hf_16bit");
  for (const Storage storage : {Storage::bf16, Storage::f16}) {
    CAPTURE(storage_name(storage));
    const hf::Dtype dtype16 = storage == Storage::f16 ? hf::Dtype::f16 : hf::Dtype::bf16;
    for (const bool tied : {false, true}) {
      CAPTURE(tied);
      const std::string d = dir.file(std::string(storage_name(storage)) + (tied ? "tied" : "untied"));
      write_checkpoint(d, {hf::Architecture::qwen2, dtype16, false, tied, 0}, 23);
      const hf::ModelInfo info = hf::read_config(d);
      CHECK(hf::storage_for(info.dtype) == storage);
      Tape<float> tf, th;
      nn::Lm<float> as_float(tf, info.config, 1, nn::Lm<float>::Train::none);
      nn::Lm<float> held(th, info.config, 1, nn::Lm<float>::Train::none, storage);
      CHECK(held.trainable().empty());
      hf::load_weights(d, as_float);
      hf::load_weights(d, held);
      for (const auto& p : held.base()) {
        CAPTURE(p.name);
        CHECK(th.storage(p.var) == (th.dims(p.var).rank == 2 ? storage : Storage::native));
        const Tensor<float> w = th.widened_value(p.var);
        CHECK(std::memcmp(w.data().data(), tf.value(as_float.tensor(p.name)).data.data(), w.size() * sizeof(float)) ==
              0);
      }
      const std::vector<int> ids = some_ids(9, 2 * 6);
      const View<float> a = tf.value(as_float.forward(as_float.ids(ids, 2, 6)).logits);
      const View<float> b = th.value(held.forward(held.ids(ids, 2, 6)).logits);
      REQUIRE(a.size() == b.size());
      CHECK(std::memcmp(a.data.data(), b.data.data(), a.size() * sizeof(float)) == 0);
      // Out again in its dtype and F32: the checkpoint's values.
      for (const hf::Dtype dtype : {dtype16, hf::Dtype::f32}) {
        const std::string out = dir.file(std::string(storage_name(storage)) + (tied ? "t" : "u") +
                                         std::string(hf::dtype_name(dtype)));
        hf::SaveOptions o;
        o.dtype = dtype;
        hf::save_pretrained(out, held, o);
        Tape<float> tr;
        nn::Lm<float> again(tr, hf::read_config(out).config, 2, nn::Lm<float>::Train::none);
        hf::load_weights(out, again);
        for (const auto& p : again.base()) {
          const View<float> v = tr.value(p.var);
          CHECK(std::memcmp(v.data.data(), tf.value(as_float.tensor(p.name)).data.data(), v.size() * sizeof(float)) ==
                0);
        }
      }
    }
    // An F32 checkpoint into a 16-bit base: each value rounded to the nearest.
    const std::string d32 = dir.file(std::string(storage_name(storage)) + "f32");
    write_checkpoint(d32, {hf::Architecture::qwen2, hf::Dtype::f32, false, false, 0}, 24);
    const hf::ModelInfo info = hf::read_config(d32);
    Tape<float> tf, th;
    nn::Lm<float> as_float(tf, info.config, 1, nn::Lm<float>::Train::none);
    nn::Lm<float> held(th, info.config, 1, nn::Lm<float>::Train::none, storage);
    hf::load_weights(d32, as_float);
    hf::load_weights(d32, held);
    const View<float> v = tf.value(as_float.tensor("layers.1.gate"));
    const Tensor<float> w = th.widened_value(held.tensor("layers.1.gate"));
    REQUIRE(v.size() == w.size());
    std::size_t changed = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      CHECK(w[i] == widen<float>(storage, round_to(storage, v[i])));
      changed += w[i] != v[i];
    }
    CHECK(changed > 0);  // random F32 values are not bfloat16s or halves
    if (storage != Storage::f16) continue;
    // A value beyond the half's range (65504): refused, naming the tensor
    // and element, and the base keeps the values it had.
    tf.leaf_value(as_float.tensor("layers.0.up"))[7] = 1e5f;
    const std::string big = dir.file("big");
    hf::SaveOptions o;
    o.dtype = hf::Dtype::f32;
    hf::save_pretrained(big, as_float, o);
    Tape<float> tb;
    nn::Lm<float> before(tb, info.config, 1, nn::Lm<float>::Train::none, storage);
    hf::load_weights(d32, before);
    const std::span<std::uint16_t> up = tb.leaf_bits(before.tensor("layers.0.up"));
    const std::vector<std::uint16_t> kept(up.begin(), up.end());
    CHECK_THROWS_WITH_AS(hf::load_weights(big, before), doctest::Contains("is 100000, beyond f16's range"),
                         hf::Error);
    CHECK(std::equal(kept.begin(), kept.end(), up.begin()));
  }
}

// ------------------------------------------------------ hostile input files --

namespace {

// `depth` arrays, one inside the next, around a 0.
std::string nested(std::size_t depth) { return std::string(depth, '[') + "0" + std::string(depth, ']'); }

// j's JSON with its "DEEP" string replaced by a value 200,000 arrays deep (400 KB).
std::string deepened(const json& j) {
  std::string text = j.dump();
  text.replace(text.find("\"DEEP\""), 6, nested(200000));
  return text;
}

// [1,1,...]: a shallow value of 200 KB.
std::string many_ones() {
  std::string s = "[1";
  for (int i = 0; i < 100000; ++i) s += ",1";
  return s + "]";
}

// f() run while this process holds the FIFO open for writing as well: a
// reader that waited on it (opened it blocking, read to its end) returns
// once the writer is closed, after 10 s, instead of hanging the suite.
// Whether f returned before then.
template <class F>
bool returns_at_once_beside_fifo(const std::string& fifo, F&& f) {
  const int writer = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  REQUIRE(writer >= 0);
  auto running = std::async(std::launch::async, std::forward<F>(f));
  const bool returned = running.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  ::close(writer);
  running.get();
  return returned;
}

}  // namespace

TEST_CASE("a safetensors header nested past 64 levels is refused before it is parsed; values are quoted cut short") {
  ScratchDir dir("hf");
  const std::string p = dir.file("deep.safetensors");
  auto open = [&] { return refusal([&] { hf::SafetensorsFile f(p); }); };
  // Dumped into the message, a shape or data_offsets 200,000 deep overflowed the stack.
  write_raw(p, R"({"a":{"dtype":"F32","shape":)" + nested(200000) + R"(,"data_offsets":[0,4]}})", 4);
  expect_refused(open(), {"deep.safetensors", "the header: arrays and objects nest deeper than 64 levels (at byte"});
  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":)" + nested(200000) + "}}", 4);
  expect_refused(open(), {"deep.safetensors", "nest deeper than 64 levels"});
  // Within the bound, the shape is read (and refused: not sizes).
  write_raw(p, R"({"a":{"dtype":"F32","shape":)" + nested(60) + R"(,"data_offsets":[0,4]}})", 4);
  expect_refused(open(), {"tensor 'a': shape [[[", "holds something other than a size"});
  // A long value or name is quoted in a few hundred bytes.
  write_raw(p, R"({"a":{"dtype":"F32","shape":)" + many_ones() + R"(,"data_offsets":[0,4]}})", 4);
  std::string message = open();
  expect_refused(message, {"tensor 'a': shape [1,1,1,", "... (cut) is not an array of at most 8 sizes"});
  CHECK(message.size() < 600);
  write_raw(p, "{\"" + std::string(1 << 20, 'n') + R"(":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 4);
  message = open();
  expect_refused(message, {"tensor 'nnnn", "... (1048576 bytes)'", "dtype 'I8'"});
  CHECK(message.size() < 600);
}

TEST_CASE("config.json, adapter_config.json and an index nested past 64 levels are refused; values are quoted cut short") {
  ScratchDir dir("hf");
  const std::string d = dir.file("m"), ad = dir.file("adapter");
  const Checkpoint c{hf::Architecture::qwen2, hf::Dtype::f32, true, false, 0};
  write_checkpoint(d, c, 3);
  const hf::ModelInfo info = hf::read_config(d);
  json cfg = config_json(c);
  cfg["rope_scaling"] = "DEEP";
  write_text(d + "/config.json", deepened(cfg));
  expect_refused(refusal([&] { hf::read_config(d); }), {"config.json", "arrays and objects nest deeper than 64 levels"});
  cfg = config_json(c);
  cfg["rope_scaling"] = json::parse(many_ones());
  write_text(d + "/config.json", cfg.dump());
  std::string message = refusal([&] { hf::read_config(d); });
  expect_refused(message, {"config.json", "rope_scaling [1,1,1,", "... (cut): grad's RoPE has no scaling"});
  CHECK(message.size() < 600);
  write_text(d + "/config.json", config_json(c).dump());

  json index = json::parse(slurp_text(d + "/model.safetensors.index.json"));
  const json good_index = index;
  index["weight_map"]["model.norm.weight"] = "DEEP";
  write_text(d + "/model.safetensors.index.json", deepened(index));
  Tape<float> tp;
  nn::Lm<float> m(tp, info.config, 1);
  expect_refused(refusal([&] { hf::load_weights(d, m); }), {"index.json", "nest deeper than 64 levels"});
  index = good_index;
  index["weight_map"]["model.norm.weight"] = json::parse(many_ones());
  write_text(d + "/model.safetensors.index.json", index.dump());
  message = refusal([&] { hf::load_weights(d, m); });
  expect_refused(message, {"index.json", "'model.norm.weight' maps to [1,1,1,", "... (cut) (expected a file name"});
  CHECK(message.size() < 600);

  std::filesystem::create_directories(ad);
  json adapter = {{"peft_type", "LORA"}, {"r", 4}, {"lora_alpha", 8}, {"target_modules", "DEEP"}};
  write_text(ad + "/adapter_config.json", deepened(adapter));
  expect_refused(refusal([&] { hf::read_adapter_config(ad); }), {"adapter_config.json", "nest deeper than 64 levels"});
}

TEST_CASE("a safetensors file truncated after it was opened is an hf::Error saying so, never SIGBUS") {
  // Read through a mapping, a page past the new end raised SIGBUS and killed the process.
  ScratchDir dir("hf");
  const std::string p = dir.file("cut.safetensors");
  const std::vector<double> values(1 << 16, 0.5);  // 256 KB of F32: many pages past the cut
  const std::vector<hf::TensorOut<double>> out = {{"big", {values.size()}, values}};
  hf::write_safetensors<double>(p, out, hf::Dtype::f32);
  const hf::SafetensorsFile f(p);
  const hf::TensorInfo& t = *f.find("big");
  std::filesystem::resize_file(p, std::filesystem::file_size(p) / 2);  // rewritten in place by another program
  std::vector<float> into(values.size());
  expect_refused(refusal([&] { f.read(t, std::span<float>(into)); }),
                 {"cut.safetensors", "tensor 'big'", "truncated", "the file now ends at byte"});
  std::vector<std::uint16_t> bits(values.size());
  expect_refused(refusal([&] { f.read_bits(t, Storage::bf16, std::span<std::uint16_t>(bits)); }), {"truncated"});
  expect_refused(refusal([&] { f.check_read(t, Storage::bf16); }), {"truncated"});
}

TEST_CASE("a tensor of zero bytes overlaps nothing, whatever its offsets and its name") {
  ScratchDir dir("hf");
  const std::string p = dir.file("empty.safetensors");
  // "z" sorts after "b", which starts where z points: it was refused as overlapping b.
  for (const char* name : {"z", "0"}) {
    CAPTURE(name);
    const std::string zero = std::string("\"") + name + R"(":{"dtype":"F32","shape":[0],"data_offsets":[8,8]})";
    write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)" +
                     zero + "}",
              16);
    CHECK(refusal([&] { hf::SafetensorsFile f(p); }).empty());
  }
  // Inside another tensor's bytes, and of shape [0, 5].
  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"BF16","shape":[0,5],"data_offsets":[4,4]}})", 8);
  const hf::SafetensorsFile f(p);
  CHECK(f.find("e")->elements == 0);
  std::vector<float> none;
  f.read(*f.find("e"), std::span<float>(none));
}

TEST_CASE("save_pretrained reads the files it copies before it writes: a FIFO or a device among them is refused") {
  ScratchDir dir("hf");
  const std::string d = dir.file("m"), out = dir.file("out");
  write_checkpoint(d, {hf::Architecture::qwen2, hf::Dtype::f32, false, false, 0}, 4);
  Tape<float> tp;
  nn::Lm<float> m(tp, hf::read_config(d).config, 1);
  write_text(d + "/tokenizer.json", "{}");
  hf::SaveOptions options;
  options.copy_from = d;
  // A merges.txt that is a FIFO hung the copy, leaving model.safetensors without config.json.
  REQUIRE(::mkfifo((d + "/merges.txt").c_str(), 0600) == 0);
  std::string message;
  REQUIRE(returns_at_once_beside_fifo(d + "/merges.txt",
                                      [&] { message = refusal([&] { hf::save_pretrained(out, m, options); }); }));
  expect_refused(message, {"cannot copy '" + d + "/merges.txt': is a FIFO, not a regular file", "nothing written"});
  CHECK_FALSE(std::filesystem::exists(out));
  std::filesystem::remove(d + "/merges.txt");
  // /dev/zero grew memory without bound.
  std::filesystem::create_symlink("/dev/zero", d + "/tokenizer_config.json");
  expect_refused(refusal([&] { hf::save_pretrained(out, m, options); }),
                 {"tokenizer_config.json': is a character device, not a regular file", "nothing written"});
  CHECK_FALSE(std::filesystem::exists(out));
  std::filesystem::remove(d + "/tokenizer_config.json");
  hf::save_pretrained(out, m, options);
  CHECK(slurp_text(out + "/tokenizer.json") == "{}");
}

TEST_CASE("the safetensors and Hugging Face writers refuse an output path that is a FIFO or a device") {
  // Renamed over it, a FIFO or a device node (as root, /dev/null) became a regular file.
  ScratchDir dir("hf");
  const std::string fifo = dir.file("fifo.safetensors"), null_link = dir.file("null.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::filesystem::create_symlink("/dev/null", null_link);
  const std::vector<double> x = {1, 2};
  const std::vector<hf::TensorOut<double>> tensors = {{"x", {2}, x}};
  expect_refused(refusal([&] { hf::write_safetensors<double>(fifo, tensors, hf::Dtype::f32); }),
                 {"cannot write '" + fifo + "': it is a FIFO, and only a regular file is replaced", "nothing written"});
  expect_refused(refusal([&] { hf::write_file_atomically(null_link, "{}"); }),
                 {"cannot write '" + null_link + "': it is a character device"});
  CHECK(std::filesystem::is_fifo(fifo));
  CHECK(std::filesystem::is_character_file(null_link));
  // save_pretrained checks every output path before it writes one: no model.safetensors beside a FIFO config.json.
  const std::string out = dir.file("out");
  std::filesystem::create_directories(out);
  REQUIRE(::mkfifo((out + "/config.json").c_str(), 0600) == 0);
  const Checkpoint c{hf::Architecture::llama, hf::Dtype::f32, false, false, 0};
  write_checkpoint(dir.file("m"), c, 6);
  Tape<float> tp;
  nn::Lm<float> m(tp, hf::read_config(dir.file("m")).config, 1);
  expect_refused(refusal([&] { hf::save_pretrained(out, m); }), {"config.json': it is a FIFO", "nothing written"});
  CHECK_FALSE(std::filesystem::exists(out + "/model.safetensors"));
  CHECK(std::filesystem::is_fifo(out + "/config.json"));
  CHECK(std::distance(std::filesystem::directory_iterator(dir.dir), {}) == 4);  // no temporary left behind
}
