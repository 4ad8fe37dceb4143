// Inference without the tape: a KV-cache decoder over a grad::nn::Lm's
// weights, calling the op tags' own bodies in the tape's order (its logits
// are bitwise the tape forward's), and greedy / seeded top-k sampling.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "grad/lm/model.hpp"

namespace grad::nn {

// ---- inference without the tape ----

// A KV-cache decoder over an Lm's weights (read in place from its tape, so
// keep the model alive and its tensors unchanged while decoding). Each
// step() runs the same op functors, on the same operands in the same order,
// as Lm::forward records for that position (the tags' host loops on one
// row: matmul and matmul_nt accumulate ascending k, softmax over the positions so far,
// whose masked tail the tape adds as exact zeros), so its logits are
// bitwise the tape's logits at that position.
template <class T>
class KvDecoder {
 public:
  explicit KvDecoder(const Lm<T>& model) : m_(&model), c_(model.config()) {
    const std::size_t hd = c_.head_dim();
    rope_ = rope_tables<T>(c_.max_seq, hd, static_cast<T>(c_.rope_base));
    keys_.assign(c_.layers * c_.kv_heads * c_.max_seq * hd, T(0));
    values_.assign(keys_.size(), T(0));
    const std::size_t widest = std::max({c_.d_model, c_.heads * hd, c_.ffn, c_.vocab});
    for (auto* b : {&x_, &h_, &t1_, &t2_, &t3_, &q_, &k_, &v_, &ctx_, &gate_, &up_})
      b->assign(std::max(widest, c_.max_seq * hd), T(0));
    const std::size_t group = c_.heads / c_.kv_heads;
    queries_.assign(group * hd, T(0));
    scores_.assign(group * c_.max_seq, T(0));
    probs_.assign(scores_.size(), T(0));
    zeros_.assign(scores_.size(), T(0));
    logits_.assign(c_.vocab, T(0));
  }

  std::size_t position() const { return pos_; }
  std::size_t max_seq() const { return c_.max_seq; }
  std::size_t vocab() const { return c_.vocab; }
  void reset() { pos_ = 0; }

  // Feeds one token at the next position; the logits for the token after it.
  // Throws std::out_of_range for a token outside the vocabulary or a full
  // cache (max_seq positions).
  std::span<const T> step(int token) {
    check_token("step", token, 0);
    if (pos_ >= c_.max_seq)
      throw std::out_of_range("nn::KvDecoder::step: the cache is full (max_seq " + std::to_string(c_.max_seq) +
                              " positions); reset() and feed a shorter context");
    return feed(std::span<const int>(&token, 1));
  }

  // Feeds a whole prompt at the next positions; the logits for the token
  // after its last. The projections and the MLP run as [tokens, width]
  // matrix products (what makes a long prompt fast), attention position by
  // position; every row comes out of the very operations step() would give
  // it (an output of a matrix product accumulates in ascending k whatever
  // the row count, element-wise ops are per element), so the cache and the
  // logits are bitwise those of one step() per token. Throws
  // std::invalid_argument for no tokens, std::out_of_range for a token
  // outside the vocabulary or a prompt past max_seq (the decoder unchanged).
  std::span<const T> prefill(std::span<const int> tokens) {
    if (tokens.empty()) throw std::invalid_argument("nn::KvDecoder::prefill: no tokens (give at least one)");
    for (std::size_t i = 0; i < tokens.size(); ++i) check_token("prefill", tokens[i], i);
    if (tokens.size() > c_.max_seq - pos_)
      throw std::out_of_range("nn::KvDecoder::prefill: " + std::to_string(tokens.size()) + " tokens at position " +
                              std::to_string(pos_) + " do not fit the cache (max_seq " + std::to_string(c_.max_seq) +
                              " positions); reset() or feed a shorter prompt");
    return feed(tokens);
  }

 private:
  void check_token(const char* who, int token, std::size_t index) const {
    if (token < 0 || static_cast<std::size_t>(token) >= c_.vocab)
      throw std::out_of_range(std::string("nn::KvDecoder::") + who + ": token " + std::to_string(token) +
                              (std::string_view(who) == "step" ? "" : " (index " + std::to_string(index) + ")") +
                              " is out of range [0, " + std::to_string(c_.vocab) + ")");
  }

  // Rows n of tokens at positions pos_ .. pos_ + n - 1 (checked by the callers).
  std::span<const T> feed(std::span<const int> tokens) {
    const std::size_t d = c_.d_model, hd = c_.head_dim(), H = c_.heads, KV = c_.kv_heads, group = H / KV;
    const std::size_t rows = tokens.size(), p0 = pos_;
    const std::size_t widest = std::max({c_.d_model, c_.heads * hd, c_.ffn});
    for (auto* b : {&x_, &h_, &t1_, &t2_, &t3_, &q_, &k_, &v_, &ctx_, &gate_, &up_})
      if (b->size() < rows * widest) b->resize(rows * widest);
    ids_.resize(rows);
    for (std::size_t i = 0; i < rows; ++i) ids_[i] = static_cast<T>(tokens[i]);
    const Dims xd = dims({rows, d});
    run<Embedding>(weight(m_->embed()), {ids_.data(), dims({rows})}, x_.data(), xd);
    const T scale = T(1) / std::sqrt(static_cast<T>(hd));
    for (std::size_t l = 0; l < c_.layers; ++l) {
      const LmLayer<T>& L = m_->layer(l);
      rmsnorm_rows(x_.data(), val(L.attn_norm), h_.data(), rows);
      project(L, Proj::q, h_.data(), q_.data(), rows);
      project(L, Proj::k, h_.data(), k_.data(), rows);
      project(L, Proj::v, h_.data(), v_.data(), rows);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t j = 0; j < KV; ++j) {
          rope_row(k_.data() + (r * KV + j) * hd, p0 + r, key(l, j, p0 + r));
          const T* vr = v_.data() + (r * KV + j) * hd;
          std::copy(vr, vr + hd, value(l, j, p0 + r));
        }
      // A key-value head's `group` query heads at once: their scores against the
      // cached keys read in place ([n, hd] rows, as matmul_nt reads b), one
      // softmax row each, then their contexts against the cached values. Every
      // score and context element is the same ascending sum as the tape's.
      for (std::size_t r = 0; r < rows; ++r) {
        const std::size_t p = p0 + r, n = p + 1;
        const Dims gn = dims({group, n});
        for (std::size_t j = 0; j < KV; ++j) {
          for (std::size_t g = 0; g < group; ++g)
            rope_row(q_.data() + (r * H + j * group + g) * hd, p, queries_.data() + g * hd);
          run2<MatmulNt>(queries_.data(), dims({group, hd}), key(l, j, 0), dims({n, hd}), scores_.data(), gn);
          run1<MulScalar>(scores_.data(), gn, probs_.data(), scale);
          run2<Add>(probs_.data(), gn, zeros_.data(), gn, scores_.data(), gn);
          softmax_rows(scores_.data(), gn, probs_.data());
          run2<Matmul>(probs_.data(), gn, value(l, j, 0), dims({n, hd}), ctx_.data() + (r * H + j * group) * hd,
                       dims({group, hd}));
        }
      }
      project(L, Proj::o, ctx_.data(), t1_.data(), rows);
      run2<Add>(x_.data(), xd, t1_.data(), xd, t2_.data(), xd);
      std::copy(t2_.begin(), t2_.begin() + static_cast<std::ptrdiff_t>(rows * d), x_.begin());
      rmsnorm_rows(x_.data(), val(L.mlp_norm), h_.data(), rows);
      project(L, Proj::gate, h_.data(), gate_.data(), rows);
      project(L, Proj::up, h_.data(), up_.data(), rows);
      const Dims f = dims({rows, c_.ffn});
      run2<SiluMul>(gate_.data(), f, up_.data(), f, t3_.data(), f);
      project(L, Proj::down, t3_.data(), t1_.data(), rows);
      run2<Add>(x_.data(), xd, t1_.data(), xd, t2_.data(), xd);
      std::copy(t2_.begin(), t2_.begin() + static_cast<std::ptrdiff_t>(rows * d), x_.begin());
    }
    // Only the last position's logits: the final norm and the head on one row.
    rmsnorm_rows(x_.data() + (rows - 1) * d, val(m_->final_norm()), h_.data(), 1);
    if (c_.tied_embeddings)  // the embedding [vocab, d] read in place, as Lm::forward's matmul_nt reads it
      run<MatmulNt>({h_.data(), dims({1, d})}, weight(m_->embed()), logits_.data(), dims({1, c_.vocab}));
    else
      run<Matmul>({h_.data(), dims({1, d})}, weight(m_->head()), logits_.data(), dims({1, c_.vocab}));
    pos_ += rows;
    return logits_;
  }

  static Dims dims(std::initializer_list<std::size_t> s) {
    return Dims::of(std::span<const std::size_t>(s.begin(), s.size()));
  }
  const T* val(Var<T> v) const { return m_->tape().value(v).data.data(); }
  // A base matrix as the ops read it: where the tape holds it, as it is held (16-bit included).
  Operand<T> weight(Var<T> v) const {
    const Node<T>& n = m_->tape().nodes()[v.index()];
    return {n.value, n.dims, n.storage, n.transposed};
  }
  T* key(std::size_t l, std::size_t j, std::size_t s) {
    return keys_.data() + ((l * c_.kv_heads + j) * c_.max_seq + s) * c_.head_dim();
  }
  T* value(std::size_t l, std::size_t j, std::size_t s) {
    return values_.data() + ((l * c_.kv_heads + j) * c_.max_seq + s) * c_.head_dim();
  }

  template <class Op>
  static void run1(const T* a, const Dims& da, T* y, T scalar = T(0), const Dims* out = nullptr) {
    NodeArgs<T> x;
    x.a = {a, da};
    x.out = out ? *out : da;
    x.scalar = scalar;
    Op::forward_tensor(x, y);
  }
  template <class Op>
  static void run(const Operand<T>& a, const Operand<T>& b, T* y, const Dims& out) {
    NodeArgs<T> x;
    x.a = a;
    x.b = b;
    x.out = out;
    Op::forward_tensor(x, y);
  }
  template <class Op>
  static void run2(const T* a, const Dims& da, const T* b, const Dims& db, T* y, const Dims& out,
                   T scalar = T(0)) {
    NodeArgs<T> x;
    x.a = {a, da};
    x.b = {b, db};
    x.out = out;
    x.scalar = scalar;
    Op::forward_tensor(x, y);
  }

  // softmax along each row of a [rows, n] block (the tape's lanes: its host loop on packs).
  static void softmax_rows(const T* a, const Dims& d, T* y) {
    NodeArgs<T> x;
    x.a = {a, d};
    x.out = d;
    x.axis = 1;
    Softmax::forward_tensor(x, y);
  }
  // nn::rmsnorm on `rows` rows: its rms_norm node, x / sqrt(row_sum(x * x) / cols + eps) * w, row by row.
  void rmsnorm_rows(const T* x, const T* w, T* out, std::size_t rows) {
    const std::size_t d = c_.d_model;
    const Dims xd = dims({rows, d});
    run2<RmsNorm>(x, xd, w, dims({d}), out, xd, static_cast<T>(c_.eps));
  }
  // The projection p of `rows` rows (with its adapter, as nn::lora_linear), then its bias as Lm::proj adds it.
  void project(const LmLayer<T>& L, Proj p, const T* h, T* out, std::size_t rows) {
    const std::size_t i = static_cast<std::size_t>(p);
    const auto [in, o] = c_.proj_shape(p);
    const Dims ho = dims({rows, o});
    if (!L.bias[i].valid()) return project_unbiased(L, p, h, out, rows);
    bias_in_.resize(rows * o);
    project_unbiased(L, p, h, bias_in_.data(), rows);
    run2<Add>(bias_in_.data(), ho, val(L.bias[i]), dims({o}), out, ho);
  }
  void project_unbiased(const LmLayer<T>& L, Proj p, const T* h, T* out, std::size_t rows) {
    const std::size_t i = static_cast<std::size_t>(p);
    const auto [in, o] = c_.proj_shape(p);
    const Dims hin = dims({rows, in}), ho = dims({rows, o});
    if (!L.lora_a[i].valid()) {
      run<Matmul>({h, hin}, weight(L.w[i]), out, ho);
      return;
    }
    const std::size_t r = c_.lora_rank;
    std::vector<T>& base = lora_base_;
    base.resize(rows * o);
    lora_mid_.resize(rows * r);
    lora_low_.resize(rows * o);
    run<Matmul>({h, hin}, weight(L.w[i]), base.data(), ho);
    run2<Matmul>(h, hin, val(L.lora_a[i]), dims({in, r}), lora_mid_.data(), dims({rows, r}));
    run2<Matmul>(lora_mid_.data(), dims({rows, r}), val(L.lora_b[i]), dims({r, o}), lora_low_.data(), ho);
    run2<AddScaled>(base.data(), ho, lora_low_.data(), ho, out, ho, static_cast<T>(c_.lora_scale));
  }
  // nn::rope on one head's row at position p: h * cos + rotate_half(h) * sin.
  void rope_row(const T* h, std::size_t p, T* out) {
    const std::size_t hd = c_.head_dim(), half = hd / 2;
    const Dims row = dims({1, hd});
    rope_rot_.resize(3 * hd);
    T* rotated = rope_rot_.data();
    T* a = rotated + hd;
    T* b = rotated + 2 * hd;
    run1<Neg>(h + half, dims({1, half}), rotated);  // -h2, then h1
    std::copy(h, h + half, rotated + half);
    const T* cos = rope_.cos.data().data() + p * hd;
    const T* sin = rope_.sin.data().data() + p * hd;
    run2<Mul>(h, row, cos, row, a, row);
    run2<Mul>(rotated, row, sin, row, b, row);
    run2<Add>(a, row, b, row, out, row);
  }

  const Lm<T>* m_;
  LmConfig c_;
  RopeTables<T> rope_;
  std::size_t pos_ = 0;
  std::vector<T> keys_, values_;
  std::vector<T> x_, h_, t1_, t2_, t3_, q_, k_, v_, ctx_, gate_, up_, queries_, scores_, probs_, zeros_, logits_;
  std::vector<T> lora_base_, lora_mid_, lora_low_, rope_rot_, bias_in_, ids_;
};

// ---- sampling ----

struct SampleOptions {
  double temperature = 0;  // 0: greedy (the first largest logit); else finite and > 0
  std::size_t top_k = 0;   // 0: every token; else at most the vocabulary
  std::uint64_t seed = 1;
  // Empty: any id may come out. Else only the ids i with allowed[i] (ids at
  // or past its size never): the others are masked out before greedy choice
  // and sampling, as the padding rows of a checkpoint's embedding (Qwen2's
  // 151936 for 151665 tokens), which no tokenizer can decode, should be.
  std::vector<bool> allowed = {};  // (an initializer: designated initializers that leave it out draw no warning)
};

// "" or what is wrong with `o` for a vocabulary of `vocab` ids. A NaN
// temperature would make every weight NaN and always pick the last of the
// top k; a negative one would be greedy without saying so.
inline std::string invalid_sample_options(const SampleOptions& o, std::size_t vocab) {
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    char number[32];
    std::snprintf(number, sizeof number, "%.17g", o.temperature);
    return std::string("temperature ") + number + ": expected 0 (greedy) or a finite value > 0";
  }
  if (o.top_k > vocab)
    return "top_k " + std::to_string(o.top_k) + ": expected 0 (every token) or at most the vocabulary (" +
           std::to_string(vocab) + ")";
  if (!o.allowed.empty()) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < std::min(vocab, o.allowed.size()); ++i) n += o.allowed[i] ? 1 : 0;
    if (n == 0)
      return "allowed: no id below the vocabulary (" + std::to_string(vocab) + ") is allowed (expected at least one)";
  }
  return {};
}

template <class T>
int argmax_token(std::span<const T> logits) {
  if (logits.empty()) throw std::logic_error("nn::argmax_token: no logits (a decoder that was fed no token)");
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int>(best);
}

// The ids of the k largest logits (all of them when k is 0 or more than
// there are), by value, largest first, and among equal values by id,
// smallest first: the tokens generate samples from at top_k = k, and what
// device::cuda_top_k computes on a GPU. Its first is argmax_token's choice.
template <class T>
std::vector<std::size_t> top_k_order(std::span<const T> logits, std::size_t k = 0) {
  std::vector<std::size_t> order(logits.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (k == 0 || k > order.size()) k = order.size();
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
      [&](std::size_t a, std::size_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  order.resize(k);
  return order;
}

// Continues `prompt` by `count` tokens. When the context reaches max_seq,
// the decoder restarts on the latest max_seq / 2 tokens (LmConfig::check
// makes that at least 1). Throws std::invalid_argument for an empty prompt
// or options out of range (invalid_sample_options).
template <class T>
std::vector<int> generate(KvDecoder<T>& dec, std::span<const int> prompt, std::size_t count,
                          const SampleOptions& o = {}) {
  if (prompt.empty()) throw std::invalid_argument("nn::generate: the prompt is empty (give at least one token)");
  if (std::string why = invalid_sample_options(o, dec.vocab()); !why.empty())
    throw std::invalid_argument("nn::generate: " + why);
  std::vector<int> all(prompt.begin(), prompt.end());
  SplitMix64 rng(o.seed);
  const std::size_t cap = dec.max_seq();
  // (Re)starts the decoder on the latest tokens: all of them while they fit.
  auto refill = [&] {
    dec.reset();
    std::span<const T> l;
    const std::size_t from = all.size() > cap ? all.size() - std::max<std::size_t>(cap / 2, 1) : 0;
    l = dec.prefill(std::span<const int>(all).subspan(from));
    if (l.empty()) throw std::logic_error("nn::generate: the decoder produced no logits");
    return l;
  };
  std::span<const T> logits = refill();
  std::vector<double> w;
  std::vector<std::size_t> order;
  // With `allowed`: the logits with the other ids at -inf, and no more
  // candidates than there are allowed ids (a -inf one is never sampled).
  std::vector<T> masked;
  std::size_t allowed_count = dec.vocab();
  if (!o.allowed.empty()) {
    allowed_count = 0;
    for (std::size_t i = 0; i < std::min(dec.vocab(), o.allowed.size()); ++i) allowed_count += o.allowed[i] ? 1 : 0;
  }
  for (std::size_t n = 0; n < count; ++n) {
    if (!o.allowed.empty()) {
      masked.assign(logits.begin(), logits.end());
      for (std::size_t i = 0; i < masked.size(); ++i)
        if (i >= o.allowed.size() || !o.allowed[i]) masked[i] = -std::numeric_limits<T>::infinity();
      logits = masked;
    }
    int next;
    if (o.temperature <= 0) {
      next = argmax_token(logits);
    } else {
      order = top_k_order(logits, o.top_k == 0 ? allowed_count : std::min(o.top_k, allowed_count));
      const std::size_t k = order.size();
      w.assign(k, 0.0);
      const double top = static_cast<double>(logits[order[0]]);
      double total = 0;
      for (std::size_t i = 0; i < k; ++i)
        total += w[i] = exact_exp((static_cast<double>(logits[order[i]]) - top) / o.temperature);
      double u = rng.uniform(0, total);
      next = static_cast<int>(order[k - 1]);
      for (std::size_t i = 0; i < k; ++i) {
        if (u < w[i]) {
          next = static_cast<int>(order[i]);
          break;
        }
        u -= w[i];
      }
    }
    all.push_back(next);
    if (n + 1 < count) logits = dec.position() >= cap ? refill() : dec.step(next);
  }
  return std::vector<int>(all.begin() + static_cast<std::ptrdiff_t>(prompt.size()), all.end());
}

}  // namespace grad::nn
