// A frozen base held quantized (llama.cpp's blocks, Storage::q8_0 ... q6_k):
// every op that reads it dequantizes it exactly, so the products, the LM's
// loss, its adapters' gradients and the decoder give the bits of the same
// computation over a native base holding the dequantized values, on every
// instruction set and thread count; and what cannot be held so is refused
// by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "grad/grad.hpp"
#include "grad/numerics/gemm.hpp"
#include "grad/numerics/held.hpp"
#include "support.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

constexpr Storage all_quantized[] = {Storage::q8_0, Storage::q4_0, Storage::q4_k, Storage::q5_k, Storage::q6_k};

// Blocks for `rows` memory rows of `row` weights, quantized from values of
// varied scale per row (so blocks differ in their scales), laid out as the
// tape holds them (rows in groups of sixteen: numerics/quant_rows.hpp), and
// the exact values they hold.
struct Held {
  std::vector<std::uint8_t> blocks;
  std::vector<float> values;
};
Held make_held(Storage s, std::size_t rows, std::size_t row, std::uint64_t seed) {
  Rng rng(seed);
  const QuantFormat f = quant_format(s);
  Held h{std::vector<std::uint8_t>(held_bytes(s, rows * row, 4)), std::vector<float>(rows * row)};
  std::vector<float> x(row);
  std::vector<std::uint8_t> blocks(held_bytes(s, row, 4));
  for (std::size_t r = 0; r < rows; ++r) {
    const double scale = std::ldexp(1.0, static_cast<int>(r % 7) - 3);
    for (float& v : x) v = static_cast<float>(rng.uniform(-scale, scale));
    quantize(f, x.data(), blocks.data(), row);
    dequantize(f, blocks.data(), h.values.data() + r * row, row);
    put_row_blocks({f, rows, row}, h.blocks.data(), r, blocks.data());
  }
  return h;
}

struct Dims3 {
  std::size_t m, k, n;
};

}  // namespace

// b [k, n] held quantized with its rows in memory (blocks along n) or as its
// transpose (blocks along k, llama.cpp's projection layout): gemm_nn and
// gemm_nt over it give the reference's bits over the dequantized values, one
// row (a decoding step) and many, on every instruction set, 1 and 3 threads.
TEST_CASE_TEMPLATE("a quantized b gives the bits of the product over its dequantized values", T, float, double) {
  Rng rng(7);
  for (const Storage s : all_quantized) {
    const std::size_t B = block_elements(s);
    for (const std::size_t threads : {1, 3}) {
      set_num_threads(threads);
      for (Isa isa : {Isa::baseline, Isa::avx2, Isa::avx512}) {
        if (!gemm_detail::supported(isa)) continue;
        // One row (the decoder's) and many; k past one cache run (KC, 256 here) where blocks are short; a
        // column count that is no whole block (rows of b's transpose only).
        const std::size_t wide = B == 32 ? 130 : 19;
        for (const Dims3& d : {Dims3{1, 2 * B, 3 * B}, Dims3{3, B, 2 * B}, Dims3{wide, 2 * B, 2 * B},
                               Dims3{5, 1024 / B * B, B}, Dims3{1, 3 * B, 40}, Dims3{7, 2 * B, 2 * B}}) {
          const std::size_t m = d.m, k = d.k, n = d.n;
          INFO(storage_name(s), " isa ", static_cast<int>(isa), " m ", m, " k ", k, " n ", n, " threads ", threads);
          std::vector<T> A(m * k);
          for (T& x : A) x = static_cast<T>(rng.uniform(-1, 1));
          for (const bool transposed : {false, true}) {
            CAPTURE(transposed);
            // Memory rows: n long (b's rows) or k long (b's columns, transposed).
            const std::size_t rows = transposed ? n : k, row = transposed ? k : n;
            if (row % B != 0) continue;
            const Held h = make_held(s, rows, row, 100 + m + k + n);
            std::vector<T> b(k * n);  // b [k, n] row-major, the dequantized values
            for (std::size_t p = 0; p < k; ++p)
              for (std::size_t j = 0; j < n; ++j)
                b[p * n + j] = static_cast<T>(transposed ? h.values[j * k + p] : h.values[p * n + j]);
            const T* held = reinterpret_cast<const T*>(h.blocks.data());
            std::vector<T> want(m * n, T(0)), got(m * n, std::numeric_limits<T>::quiet_NaN());
            reference::gemm_nn(A.data(), b.data(), want.data(), m, k, n);
            const gemm_detail::Strided<T> nn =
                transposed ? gemm_detail::Strided<T>{held, 1, k, s, n} : gemm_detail::Strided<T>{held, n, 1, s, k};
            gemm_detail::multiply<T>(isa, {{A.data(), k, 1}, nn, got.data(), m, n, k});
            CHECK(bitwise_equal<T>(want, got));
            // dA = G b^T: the nt product over the same held b (G [m, n], C [m, k]).
            std::vector<T> G(m * n), want_t(m * k, T(0)), got_t(m * k, std::numeric_limits<T>::quiet_NaN());
            for (T& x : G) x = static_cast<T>(rng.uniform(-1, 1));
            reference::gemm_nt(G.data(), b.data(), want_t.data(), m, n, k);
            const gemm_detail::Strided<T> nt =
                transposed ? gemm_detail::Strided<T>{held, k, 1, s, n} : gemm_detail::Strided<T>{held, 1, n, s, k};
            gemm_detail::multiply<T>(isa, {{G.data(), n, 1}, nt, got_t.data(), m, k, n});
            CHECK(bitwise_equal<T>(want_t, got_t));
          }
        }
      }
    }
  }
  set_num_threads(1);
}

// The layout of numerics/quant_rows.hpp: whole groups of sixteen rows and a
// last one of fewer, each row's blocks back byte for byte, the lanes of one
// quant byte side by side, and the bytes of a group where its rows' were.
TEST_CASE("a quantized matrix's rows lie in groups of sixteen, interleaved field by field") {
  Rng rng(5);
  for (const Storage s : all_quantized) {
    const QuantFormat f = quant_format(s);
    const QuantInfo info = quant_info(f);
    for (const std::size_t rows : {std::size_t{1}, std::size_t{16}, std::size_t{40}}) {
      CAPTURE(storage_name(s));
      CAPTURE(rows);
      const QuantRows m{f, rows, 2 * info.block_elements};
      CHECK(m.row_bytes() == 2 * info.block_bytes);
      CHECK(m.groups() == (rows + 15) / 16);
      std::vector<std::uint8_t> plain(rows * m.row_bytes()), held(plain.size(), 0xEE), back(m.row_bytes());
      for (auto& b : plain) b = static_cast<std::uint8_t>(rng.next() >> 56);
      for (std::size_t r = 0; r < rows; ++r) put_row_blocks(m, held.data(), r, plain.data() + r * m.row_bytes());
      for (std::size_t r = 0; r < rows; ++r) {
        get_row_blocks(m, held.data(), r, back.data());
        CHECK(std::equal(back.begin(), back.end(), plain.begin() + static_cast<std::ptrdiff_t>(r * m.row_bytes())));
      }
      // The group's bytes are its rows' bytes, reordered (a permutation within the group).
      for (std::size_t g = 0; g < m.groups(); ++g) {
        const auto from = static_cast<std::ptrdiff_t>(g * 16 * m.row_bytes()),
                   to = from + static_cast<std::ptrdiff_t>(m.lanes(g) * m.row_bytes());
        std::vector<std::uint8_t> a(plain.begin() + from, plain.begin() + to), b(held.begin() + from, held.begin() + to);
        std::ranges::sort(a);
        std::ranges::sort(b);
        CHECK(a == b);
      }
      if (rows >= 16 && f == QuantFormat::q8_0) {  // group 0, block 0: 16 half scales, then quant 0 of every lane
        for (std::size_t l = 0; l < 16; ++l) {
          CHECK(held[2 * l] == plain[l * m.row_bytes()]);
          CHECK(held[32 + l] == plain[l * m.row_bytes() + 2]);
        }
      }
      // Element reads across rows and blocks: read_held's values are dequantize's of the row's own blocks.
      std::vector<float> want(m.row), got(3 * m.row / 2);
      const std::size_t r = rows - 1;
      dequantize(f, plain.data() + r * m.row_bytes(), want.data(), m.row);
      read_held(s, held.data(), rows, m.row, r * m.row + 3, m.row - 3, got.data());
      CHECK(std::memcmp(want.data() + 3, got.data(), (m.row - 3) * sizeof(float)) == 0);
    }
  }
}

TEST_CASE_TEMPLATE("a quantized constant: its values, its matmul, and what is refused", T, float, double) {
  for (const Storage s : all_quantized) {
    CAPTURE(storage_name(s));
    const std::size_t B = block_elements(s), in = 2 * B, out = 3;
    Rng rng(11);
    Tensor<T> w({in, out});
    for (T& x : w.data()) x = static_cast<T>(rng.uniform(-1, 1));
    Tape<T> tp;
    const Var<T> held = tp.constant(w, s, true);  // [in, out] held as [out, in] rows of blocks
    REQUIRE_MESSAGE(tp.ok(), tp.error());
    CHECK(tp.storage(held) == s);
    CHECK(tp.transposed(held));
    CHECK(tp.value(held).empty());
    CHECK(tp.leaf_blocks(held).size() == held_bytes(s, in * out, sizeof(T)));
    // Its values: each output's weights, rounded as ggml's reference rounds a row.
    const Tensor<T> widened = tp.widened_value(held);
    for (std::size_t j = 0; j < out; ++j) {
      std::vector<float> row(in), back(in);
      for (std::size_t p = 0; p < in; ++p) row[p] = static_cast<float>(w[p * out + j]);
      std::vector<std::uint8_t> blocks(held_bytes(s, in, 4));
      quantize(quant_format(s), row.data(), blocks.data(), in);
      dequantize(quant_format(s), blocks.data(), back.data(), in);
      for (std::size_t p = 0; p < in; ++p) CHECK(widened[p * out + j] == static_cast<T>(back[p]));
    }
    CHECK(tp.scalar(held) == widened[0]);
    // matmul over it: the bits of matmul over a native constant holding those values, and dA's too.
    Tensor<T> x({5, in});
    for (T& v : x.data()) v = static_cast<T>(rng.uniform(-1, 1));
    const Var<T> xv = tp.param(x), native = tp.constant(widened);
    const Var<T> y1 = matmul(xv, held), y2 = matmul(xv, native);
    REQUIRE_MESSAGE(tp.ok(), tp.error());
    CHECK(bitwise_equal<T>(tp.value(y1).data, tp.value(y2).data));
    const Var<T> loss = sum(y1 * y1);
    REQUIRE(tp.backward(loss));
    const std::vector<T> g1(tp.grad(xv).begin(), tp.grad(xv).end());
    REQUIRE(tp.backward(sum(y2 * y2)));
    CHECK(bitwise_equal<T>(g1, tp.grad(xv).data));
    // Refusals, by name: rows that are not whole blocks, a transposed 16-bit or vector constant, an op that
    // does not read quantized operands.
    {
      Tape<T> t2;
      t2.constant(Tensor<T>({B + 1, 4}), s, true);
      CHECK(!t2.ok());
      CHECK(t2.error().find("not whole " + std::string(storage_name(s)) + " blocks") != std::string::npos);
    }
    {
      Tape<T> t2;
      t2.constant(Tensor<T>({4, B}), Storage::bf16, true);
      CHECK(t2.error().find("only a quantized matrix may be held transposed") != std::string::npos);
    }
    {
      Tape<T> t2;
      const Var<T> q = t2.constant(Tensor<T>({2, B}), s);
      REQUIRE(t2.ok());
      exp(q);
      CHECK(t2.error().find(std::string(storage_name(s)) + " constant") != std::string::npos);
    }
    {
      Tape<T> t2;
      Tensor<T> bad({1, B});
      bad[3] = std::numeric_limits<T>::infinity();
      t2.constant(bad, s);
      CHECK(t2.error().find("quantized weights are finite") != std::string::npos);
    }
  }
}

namespace {

nn::LmConfig quantizable_config(std::size_t block) {
  nn::LmConfig c;
  c.vocab = 96;
  c.d_model = block;  // every projection's input width a whole number of blocks
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 2 * block;
  c.max_seq = 12;
  c.lora_rank = 4;
  c.lora_scale = 0.5;
  return c;
}

}  // namespace

// The LM over a quantized base: the loss, every adapter's gradient and the
// decoder's logits are the bits of a native base holding the dequantized
// values (tied and untied head, recompute on and off, 1 and 3 threads).
TEST_CASE_TEMPLATE("an Lm whose frozen base is quantized gives the bits of a native base holding its values", T,
                   float, double) {
  const std::size_t t = 6, Bt = 2;
  std::vector<int> in(Bt * t), out(Bt * t);
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int>((i * 37 + 5) % 96);
    out[i] = static_cast<int>((i * 53 + 11) % 96);
  }
  for (const Storage s : all_quantized)
    for (bool tied : {false, true})
      for (std::size_t threads : {1, 3}) {
        CAPTURE(storage_name(s));
        CAPTURE(tied);
        CAPTURE(threads);
        set_num_threads(threads);
        nn::LmConfig c = quantizable_config(block_elements(s) == 32 ? 64 : 256);
        c.tied_embeddings = tied;
        Tape<T> th, tn;
        using Lm = nn::Lm<T>;
        Lm held(th, c, 5, Lm::Train::lora, s), native(tn, c, 5, Lm::Train::lora);
        REQUIRE_MESSAGE(th.ok(), th.error());
        CHECK(held.base_storage() == s);
        Rng rng(3);
        for (std::size_t k = 0; k < held.adapters().size(); ++k)
          for (std::size_t i = 0; i < th.leaf_value(held.adapters()[k].var).size(); ++i)
            th.leaf_value(held.adapters()[k].var)[i] = tn.leaf_value(native.adapters()[k].var)[i] =
                static_cast<T>(rng.uniform(-0.3, 0.3));
        for (const auto& p : native.base()) {
          const Var<T> h = held.tensor(p.name);
          const Tensor<T> w = th.widened_value(h);
          std::copy(w.data().begin(), w.data().end(), tn.leaf_value(p.var).begin());
          CHECK(th.storage(h) == (w.rank() == 2 ? s : Storage::native));
          CHECK(th.transposed(h) == (w.rank() == 2 && p.name != "embed"));
        }
        for (bool recompute : {false, true}) {
          CAPTURE(recompute);
          held.set_recompute(recompute);
          native.set_recompute(recompute);
          const auto mh = th.mark(), mn = tn.mark();
          const Var<T> lh = held.forward_loss(held.ids(in, Bt, t), held.ids(out, Bt * t, 0));
          const Var<T> ln = native.forward_loss(native.ids(in, Bt, t), native.ids(out, Bt * t, 0));
          REQUIRE_MESSAGE(th.backward(lh), th.error());
          REQUIRE(tn.backward(ln));
          const T a = th.scalar(lh), b = tn.scalar(ln);
          CHECK(std::memcmp(&a, &b, sizeof(T)) == 0);
          for (std::size_t k = 0; k < held.adapters().size(); ++k) {
            CAPTURE(held.adapters()[k].name);
            CHECK(bitwise_equal<T>(th.grad(held.adapters()[k].var).data, tn.grad(native.adapters()[k].var).data));
          }
          th.reset_to(mh);
          tn.reset_to(mn);
        }
        nn::KvDecoder<T> dh(held), dn(native);
        for (std::size_t p = 0; p < t; ++p) {
          const std::span<const T> step = dh.step(in[p]);
          const std::vector<T> a_logits(step.begin(), step.end());
          const std::span<const T> other = dn.step(in[p]);
          CHECK(bitwise_equal<T>(a_logits, other));
        }
      }
  set_num_threads(1);
  // What cannot be held so: rows that are not whole blocks (d_model 48 for q8_0's 32; 64 for q4_K's 256).
  Tape<T> tp;
  nn::LmConfig c = quantizable_config(64);
  c.d_model = 48;
  c.heads = 3;
  c.kv_heads = 1;
  CHECK_THROWS_WITH_AS(nn::Lm<T>(tp, c, 1, nn::Lm<T>::Train::lora, Storage::q8_0),
                       doctest::Contains("the embedding's width (d_model) 48"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(nn::Lm<T>(tp, quantizable_config(64), 1, nn::Lm<T>::Train::lora, Storage::q4_k),
                       doctest::Contains("not whole q4_K blocks of 256"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(nn::Lm<T>(tp, quantizable_config(64), 1, nn::Lm<T>::Train::full, Storage::q8_0),
                       doctest::Contains("needs Train::lora"), std::invalid_argument);
}

// A GGUF's mix (Q4_K_M: q6_K for some matrices, q4_K for the rest) by name;
// a loader's base of zeros (nothing drawn, nothing rounded), its adapters
// still those the seed draws.
TEST_CASE("an Lm's base held per matrix, and a base of zeros for a loader") {
  using Lm = nn::Lm<float>;
  const nn::LmConfig c = quantizable_config(256);
  auto mix = [](const std::string& name) {
    const bool more_bits = name.ends_with(".v") || name.ends_with(".down") || name == "head";
    return name == "embed" ? Storage::q8_0 : more_bits ? Storage::q6_k : Storage::q4_k;
  };
  Tape<float> tm, tz, tr;
  Lm mixed(tm, c, 9, Lm::Train::lora, mix);
  Lm zeros(tz, c, 9, Lm::Train::lora, mix, Lm::Values::zeros);
  Lm random(tr, c, 9, Lm::Train::lora);
  REQUIRE(tm.ok());
  REQUIRE(tz.ok());
  CHECK(mixed.base_storage() == Storage::q4_k);  // the first projection's
  for (const auto& p : mixed.base()) {
    CAPTURE(p.name);
    const bool matrix = tm.dims(p.var).rank == 2;
    CHECK(tm.storage(p.var) == (matrix ? mix(p.name) : Storage::native));
    CHECK(tz.storage(zeros.tensor(p.name)) == tm.storage(p.var));
    CHECK(tz.transposed(zeros.tensor(p.name)) == (matrix && p.name != "embed"));
    if (matrix) {
      const Tensor<float> w = tz.widened_value(zeros.tensor(p.name));
      CHECK(std::all_of(w.data().begin(), w.data().end(), [](float x) { return x == 0.0f; }));
    }
  }
  for (std::size_t k = 0; k < mixed.adapters().size(); ++k) {
    CHECK(bitwise_equal<float>(tz.value(zeros.adapters()[k].var).data, tr.value(random.adapters()[k].var).data));
    CHECK(bitwise_equal<float>(tm.value(mixed.adapters()[k].var).data, tr.value(random.adapters()[k].var).data));
  }
  // The memory it takes: the held matrices at their formats' sizes.
  const Summary s = summarize(tm);
  std::size_t want = 0;
  for (const auto& p : mixed.named())
    want += held_bytes(tm.storage(p.var), tm.dims(p.var).size(), sizeof(float));
  CHECK(s.value_bytes >= want);
}
