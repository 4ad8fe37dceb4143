// Fine-tunes a small Qwen2-style transformer block with LoRA adapters: the
// base weights are frozen constants, the 14 adapter tensors (A and B on q, k,
// v, o, gate, up, down) are the only parameters. Task: memorise the next
// token of one short sequence. Prints the loss curve and the final loss.
// `lora_block --graph block.svg` also draws the first step's tape with
// Graphviz (docs/inspect.md; docs/figures/lora_block_graph.svg is that picture).
#include <cmath>
#include <cstdio>
#include <grad/grad.hpp>
#include <grad/inspect.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

using grad::Tape;
using grad::Tensor;
using grad::Var;
namespace nn = grad::nn;

constexpr std::size_t seq = 12, dim = 32, n_heads = 4, n_kv_heads = 2, head_dim = 8, ffn = 64, vocab = 16, rank = 4;
constexpr double eps = 1e-6, lora_scale = 8.0 / rank;  // PEFT's alpha / r with alpha = 8

std::mt19937_64 rng(2026);

Tensor<double> uniform(grad::Shape shape, double bound) {
  std::uniform_real_distribution<double> u(-bound, bound);
  Tensor<double> t(std::move(shape));
  for (double& x : t.data()) x = u(rng);
  return t;
}

// One linear map of the block: a frozen weight and its adapter pair,
// recorded under its own name scope (q_proj, ...: a cluster of the picture).
struct Projection {
  Tape<double>* tape;
  const char* name;
  Var<double> w, a, b;
  Projection(Tape<double>& tp, const char* name_, std::size_t in, std::size_t out)
      : tape(&tp),
        name(name_),
        w(tp.constant(uniform({in, out}, 1.7 / std::sqrt(double(in))))),
        a(tp.param(uniform({in, rank}, 1.0 / std::sqrt(double(in))))),
        b(tp.param(Tensor<double>({rank, out}))) {}  // PEFT init: B = 0, so training starts from the base model
  Var<double> operator()(Var<double> x) const {
    grad::NameScope<double> scope(*tape, name);
    return nn::lora_linear(x, w, a, b, lora_scale);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const char* graph = argc == 3 && std::string(argv[1]) == "--graph" ? argv[2] : nullptr;
  Tape<double> tp;

  // The sequence, its embeddings (frozen) and next-token targets.
  std::vector<std::size_t> tokens(seq);
  for (auto& t : tokens) t = rng() % vocab;
  const Tensor<double> embedding = uniform({vocab, dim}, 1.0);
  Tensor<double> x_rows({seq, dim}), targets({seq - 1, vocab});
  for (std::size_t p = 0; p < seq; ++p)
    for (std::size_t j = 0; j < dim; ++j) x_rows[p * dim + j] = embedding[tokens[p] * dim + j];
  for (std::size_t p = 0; p + 1 < seq; ++p) targets[p * vocab + tokens[p + 1]] = 1;

  const auto rope = nn::rope_tables(seq, head_dim, 10000.0);
  Var<double> x = tp.constant(x_rows), onehot = tp.constant(targets);
  Var<double> cos = tp.constant(rope.cos), sin = tp.constant(rope.sin),
              mask = tp.constant(nn::causal_mask<double>(seq));
  Var<double> norm_in = tp.constant(Tensor<double>::ones({dim})), norm_post = tp.constant(Tensor<double>::ones({dim}));
  Projection q(tp, "q_proj", dim, n_heads * head_dim), k(tp, "k_proj", dim, n_kv_heads * head_dim),
      v(tp, "v_proj", dim, n_kv_heads * head_dim), o(tp, "o_proj", n_heads * head_dim, dim),
      gate(tp, "gate_proj", dim, ffn), up(tp, "up_proj", dim, ffn), down(tp, "down_proj", ffn, dim);
  Var<double> w_vocab = tp.constant(uniform({dim, vocab}, 0.3 / std::sqrt(double(dim))));

  grad::Adam opt(0.01);
  std::size_t adapter_values = 0;
  for (const Projection* p : {&q, &k, &v, &o, &gate, &up, &down})
    for (Var<double> adapter : {p->a, p->b}) {
      opt.add(adapter);
      adapter_values += tp.value(adapter).size();
    }

  // Everything above is kept; each step re-records the block after this mark.
  const auto episode = tp.mark();
  auto block_loss = [&] {
    Var<double> x2, x3;
    {  // name scopes: the clusters of the --graph picture
      grad::NameScope<double> scope(tp, "self_attn");
      Var<double> h = nn::rmsnorm(x, norm_in, eps);
      Var<double> ctx = nn::gqa_attention(q(h), k(h), v(h), cos, sin, mask, n_heads, n_kv_heads, head_dim);
      x2 = x + o(ctx);
    }
    {
      grad::NameScope<double> scope(tp, "mlp");
      Var<double> h2 = nn::rmsnorm(x2, norm_post, eps);
      x3 = x2 + down(nn::swiglu(gate(h2), up(h2)));
    }
    grad::NameScope<double> scope(tp, "lm_head");
    return nn::cross_entropy_rows(nn::linear(x3, w_vocab), onehot, seq - 1);
  };

  std::printf("LoRA on a Qwen2-style block: %zu tokens, vocab %zu, %zu adapter values trained, base frozen\n", seq,
              vocab, adapter_values);
  std::printf("initial loss should be near ln(vocab) = %.4f\n", std::log(double(vocab)));
  double loss = 0;
  const int steps = 60;
  for (int step = 0; step <= steps; ++step) {
    Var<double> l = block_loss();
    if (!tp.backward(l)) {
      std::fprintf(stderr, "%s\n", tp.error().c_str());
      return 1;
    }
    loss = tp.scalar(l);
    if (step % 5 == 0) {
      const int bar = static_cast<int>(40 * std::min(loss, 3.0) / 3.0);
      std::printf("step %3d  loss %.6f  %s\n", step, loss, std::string(static_cast<std::size_t>(bar), '#').c_str());
    }
    if (step == 0 && graph) {
      std::string why;
      if (grad::render_svg(grad::to_dot(tp), graph, &why))
        std::printf("          (the tape drawn to %s)\n", graph);
      else
        std::fprintf(stderr, "%s\n", why.c_str());
    }
    if (step == 0)
      std::printf("          (%zu nodes per step, gradient buffers %.1f KiB: none for the frozen base)\n",
                  tp.size() - episode.nodes, double(tp.grad_bytes()) / 1024);
    if (step < steps) opt.step();
    tp.reset_to(episode);
  }
  std::printf("final loss %.6f\n", loss);
  return loss < 1.0 ? 0 : 1;
}
