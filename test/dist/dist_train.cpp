// The program test/dist/run.sh launches: trains the autoencoder or the LoRA
// block with S shards, either in one process through the library's
// reference (--reference: grad::dist::LocalShards, no MPI) or on every rank
// of `mpirun -np N` (grad::dist::DataParallel), and writes what must be the
// same bits whatever N is: every step's loss and, at the end, every
// parameter value and every Adam moment, as hex. Each rank writes its own
// file (OUT.rank<r>; the reference OUT.ref), so the launcher can compare every
// replica with the reference byte for byte.
//
// Faults on demand: --kill-rank R --kill-step K (rank R SIGKILLs itself
// before step K), --bad-rank R (rank R builds a hidden layer one unit
// wider), --drift-rank R --drift-step K (rank R nudges one weight after step K),
// --hang-rank R --hang-step K (rank R stops calling collectives; --timeout S),
// --hang-end-rank R (rank R hangs after its last collective, before MPI_Finalize),
// --poison-rank R --poison-step K (rank R's shard poisons its tape at step K).
// --engine per_node|graph|fused: the shard episode as a captured device
// program (CPU backend) trained by grad::dist::ProgramParallel instead.
// Checkpoints: --save-at K --ckpt PATH (rank 0 writes after step K, then
// every rank stops), --resume PATH (continue from it: the rank count may differ).
#include <signal.h>
#include <unistd.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <grad/device/device.hpp>
#include <grad/dist.hpp>
#include <grad/dist/program.hpp>
#include <grad/grad.hpp>
#include <string>
#include <vector>

#include "../../examples/autoencoder.hpp"

namespace {

using grad::Tape;
using grad::Tensor;
using grad::Var;
using T = double;

struct Args {
  std::string model = "ae", out = "dist_out", ckpt, resume, engine;
  bool reference = false, verbose = false;
  std::size_t shards = 6, steps = 24, save_at = 0;
  std::uint64_t check_every = 4;
  int kill_rank = -1, bad_rank = -1, drift_rank = -1, hang_rank = -1, poison_rank = -1, hang_end_rank = -1;
  std::size_t kill_step = 0, drift_step = 0, hang_step = 0, poison_step = 0;
  double timeout = 0;
  std::size_t threads = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "dist_train: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--model")
      a.model = next();
    else if (k == "--out")
      a.out = next();
    else if (k == "--engine")
      a.engine = next();
    else if (k == "--reference")
      a.reference = true;
    else if (k == "--verbose")
      a.verbose = true;
    else if (k == "--shards")
      a.shards = std::stoul(next());
    else if (k == "--steps")
      a.steps = std::stoul(next());
    else if (k == "--check-every")
      a.check_every = std::stoull(next());
    else if (k == "--save-at")
      a.save_at = std::stoul(next());
    else if (k == "--ckpt")
      a.ckpt = next();
    else if (k == "--resume")
      a.resume = next();
    else if (k == "--kill-rank")
      a.kill_rank = std::stoi(next());
    else if (k == "--kill-step")
      a.kill_step = std::stoul(next());
    else if (k == "--bad-rank")
      a.bad_rank = std::stoi(next());
    else if (k == "--drift-rank")
      a.drift_rank = std::stoi(next());
    else if (k == "--drift-step")
      a.drift_step = std::stoul(next());
    else if (k == "--poison-rank")
      a.poison_rank = std::stoi(next());
    else if (k == "--poison-step")
      a.poison_step = std::stoul(next());
    else if (k == "--hang-rank")
      a.hang_rank = std::stoi(next());
    else if (k == "--hang-step")
      a.hang_step = std::stoul(next());
    else if (k == "--hang-end-rank")
      a.hang_end_rank = std::stoi(next());
    else if (k == "--threads")
      a.threads = std::stoul(next());
    else if (k == "--timeout")
      a.timeout = std::stod(next());
    else {
      std::fprintf(stderr, "dist_train: unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

std::string hex(const void* p, std::size_t bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * bytes);
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i) {
    s += digits[b[i] >> 4];
    s += digits[b[i] & 15];
  }
  return s;
}

// ---- the autoencoder: 6-64-32-64-6 tanh (autoencoder.hpp's data), batch 200 ----
struct Autoencoder {
  static constexpr std::size_t batch = 200;
  Tensor<T> data = autoencoder::make_data<T>();
  std::vector<Var<T>> w, b;

  Autoencoder(Tape<T>& tp, grad::Adam<T>& opt, bool wider) {
    std::vector<std::size_t> widths(autoencoder::widths.begin(), autoencoder::widths.end());
    if (wider) widths[2] += 1;  // a rank with a different model
    grad::SplitMix64 rng{autoencoder::default_seed ^ 0x5eedull};
    for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
      const double bound = std::sqrt(6.0 / static_cast<double>(widths[l] + widths[l + 1]));
      Tensor<T> wt({widths[l], widths[l + 1]});
      for (T& v : wt.data()) v = static_cast<T>(rng.uniform(-bound, bound));
      w.push_back(tp.param(wt));
      b.push_back(tp.param(Tensor<T>({widths[l + 1]})));
      opt.add(w.back(), T(1e-4));
      opt.add(b.back(), T(0));
    }
  }
  // Shard s of step t's batch.
  Tensor<T> rows(std::size_t t, std::size_t shards, std::size_t s) const {
    const std::size_t first = ((t - 1) % (autoencoder::rows / batch)) * batch;
    const grad::dist::Range r = grad::dist::shard_rows(batch, shards, s);
    Tensor<T> x({r.size(), autoencoder::dim});
    autoencoder::copy_rows(data, first + r.begin, r.size(), std::span<T>(x.data()));
    return x;
  }
  // mse of the input's reconstruction (a mean over the shard's elements).
  Var<T> loss_of(Var<T> in) const {
    Var<T> h = in;
    for (std::size_t l = 0; l < w.size(); ++l) {
      h = grad::matmul(h, w[l]) + b[l];
      if (l + 1 < w.size()) h = grad::tanh(h);
    }
    return grad::mse(h, in);
  }
  Var<T> loss(Tape<T>& tp, std::size_t t, std::size_t shards, std::size_t s) const {
    return loss_of(tp.constant(rows(t, shards, s)));
  }
  // As a captured program (grad::dist::ProgramParallel): shard 0's episode
  // is recorded once; a shard is its rows written into the input.
  Var<T> episode(Tape<T>& tp, std::size_t shards) {
    input = tp.constant(rows(1, shards, 0));
    return loss_of(input);
  }
  void set_shard(grad::device::Program<T>& program, std::size_t t, std::size_t shards, std::size_t s) const {
    program.set_input(input, rows(t, shards, s));
  }
  Var<T> input;
};

// ---- the LoRA block of examples/lora_block.cpp, on 2 sequences per shard ----
struct LoraBlock {
  static constexpr std::size_t seq = 12, dim = 32, n_heads = 4, n_kv_heads = 2, head_dim = 8, ffn = 64, vocab = 16,
                               rank = 4, per_shard = 2;
  static constexpr double eps = 1e-6, lora_scale = 8.0 / rank;
  struct Projection {
    Var<T> w, a, b;
  };
  grad::SplitMix64 rng{2026};
  std::vector<Projection> proj;  // q, k, v, o, gate, up, down
  std::vector<Var<T>> x, onehot;
  Var<T> cos, sin, mask, norm_in, norm_post, w_vocab;

  Tensor<T> uniform(grad::Shape shape, double bound) {
    Tensor<T> t(std::move(shape));
    for (T& v : t.data()) v = static_cast<T>(rng.uniform(-bound, bound));
    return t;
  }

  LoraBlock(Tape<T>& tp, grad::Adam<T>& opt, std::size_t shards, bool wider) {
    const std::size_t sequences = shards * per_shard;
    const Tensor<T> embedding = uniform({vocab, dim}, 1.0);
    for (std::size_t q = 0; q < sequences; ++q) {
      Tensor<T> rows({seq, dim}), targets({seq - 1, vocab});
      std::vector<std::size_t> tokens(seq);
      for (auto& tk : tokens) tk = rng.next() % vocab;
      for (std::size_t p = 0; p < seq; ++p)
        for (std::size_t j = 0; j < dim; ++j) rows[p * dim + j] = embedding[tokens[p] * dim + j];
      for (std::size_t p = 0; p + 1 < seq; ++p) targets[p * vocab + tokens[p + 1]] = 1;
      x.push_back(tp.constant(rows));
      onehot.push_back(tp.constant(targets));
    }
    const auto rope = grad::nn::rope_tables<T>(seq, head_dim, 10000.0);
    cos = tp.constant(rope.cos);
    sin = tp.constant(rope.sin);
    mask = tp.constant(grad::nn::causal_mask<T>(seq));
    norm_in = tp.constant(Tensor<T>::ones({dim}));
    norm_post = tp.constant(Tensor<T>::ones({dim}));
    const std::size_t shapes[7][2] = {{dim, n_heads * head_dim},
                                      {dim, n_kv_heads * head_dim},
                                      {dim, n_kv_heads * head_dim},
                                      {n_heads * head_dim, dim},
                                      {dim, ffn},
                                      {dim, ffn},
                                      {ffn, dim}};
    for (const auto& s : shapes) {
      Projection p;
      p.w = tp.constant(uniform({s[0], s[1]}, 1.7 / std::sqrt(double(s[0]))));
      p.a = tp.param(uniform({s[0], wider ? rank + 1 : rank}, 1.0 / std::sqrt(double(s[0]))));
      // B starts small but not zero, so that A gets a gradient from step 1.
      p.b = tp.param(uniform({wider ? rank + 1 : rank, s[1]}, 0.01));
      opt.add(p.a, T(1e-4));
      opt.add(p.b, T(1e-4));
      proj.push_back(p);
    }
    w_vocab = tp.constant(uniform({dim, vocab}, 0.3 / std::sqrt(double(dim))));
  }

  Var<T> block(std::size_t q) const {
    namespace nn = grad::nn;
    auto apply = [&](std::size_t k, Var<T> h) {
      return nn::lora_linear(h, proj[k].w, proj[k].a, proj[k].b, T(lora_scale));
    };
    const Var<T> h = nn::rmsnorm(x[q], norm_in, T(eps));
    const Var<T> ctx =
        nn::gqa_attention(apply(0, h), apply(1, h), apply(2, h), cos, sin, mask, n_heads, n_kv_heads, head_dim);
    const Var<T> x2 = x[q] + apply(3, ctx);
    const Var<T> h2 = nn::rmsnorm(x2, norm_post, T(eps));
    const Var<T> x3 = x2 + apply(6, nn::swiglu(apply(4, h2), apply(5, h2)));
    return nn::cross_entropy_rows(nn::linear(x3, w_vocab), onehot[q], seq - 1);
  }
  // As a captured program: shard 0's sequences are the inputs; shard s
  // writes its own sequences' rows and targets into them.
  Var<T> episode(Tape<T>& tp, std::size_t) const { return loss(tp, 0, 0, 0); }
  void set_shard(grad::device::Program<T>& program, std::size_t, std::size_t, std::size_t s) const {
    for (std::size_t k = 0; k < per_shard; ++k) {
      program.set_input(x[k], value_of(x[s * per_shard + k]));
      program.set_input(onehot[k], value_of(onehot[s * per_shard + k]));
    }
  }
  static Tensor<T> value_of(Var<T> v) { return v.tape()->value(v).tensor(); }
  // Shard s: the sum of its sequences' losses.
  Var<T> loss(Tape<T>&, std::size_t, std::size_t, std::size_t s) const {
    Var<T> l = block(s * per_shard);
    for (std::size_t k = 1; k < per_shard; ++k) l = l + block(s * per_shard + k);
    return l;
  }
};

template <class Model>
int train(const Args& args, Tape<T>& tp, grad::Adam<T>& opt, Model& model, int argc, char** argv) {
  std::vector<std::string> lines;
  std::size_t clipped = 0;  // steps whose clip factor was below 1
  auto model_poison = [&](Tape<T>& t) { return t.constant(Tensor<T>({2, 3})); };
  auto write = [&](const std::string& path) {
    for (const auto& e : opt.params()) {
      const auto v = tp.value(e.var);
      lines.push_back("param " + hex(v.data.data(), v.size() * sizeof(T)));
    }
    lines.push_back("clipped " + std::to_string(clipped) + " steps");
    lines.push_back("m " + hex(opt.first_moments().data(), opt.first_moments().size_bytes()));
    lines.push_back("v " + hex(opt.second_moments().data(), opt.second_moments().size_bytes()));
    std::ofstream f(path);
    for (const auto& l : lines) f << l << "\n";
  };
  auto step_line = [&](std::uint64_t t, T loss) {
    char text[96];
    std::snprintf(text, sizeof text, "step %" PRIu64 " loss %.17g ", t, loss);
    lines.push_back(text + hex(&loss, sizeof loss));
    if (args.verbose) std::fprintf(stderr, "%s\n", lines.back().c_str());
  };

  if (args.reference) {
    grad::dist::LocalShards<grad::Adam<T>> shards(opt, {.shards = args.shards});
    if (!args.resume.empty())
      if (auto r = grad::load_checkpoint(args.resume, tp, opt); !r) {
        std::fprintf(stderr, "%s\n", r.error.c_str());
        return 1;
      }
    while (opt.steps() < args.steps) {
      const std::uint64_t t = opt.steps() + 1;
      const T loss = shards.backward([&](std::size_t s) { return model.loss(tp, t, args.shards, s); });
      clipped += opt.clip_scale() < T(1);
      if (!opt.step()) return 1;
      step_line(t, loss);
    }
    write(args.out + ".ref");
    return 0;
  }

  grad::dist::CommOptions copt;
  if (args.timeout > 0)
    copt.timeout_s = args.timeout;  // the first collective keeps its 60 s (ranks start at different times under load)
  grad::dist::Communicator comm(&argc, &argv, copt);
  const int rank = comm.rank();
  try {
    grad::dist::DataParallel<grad::Adam<T>> ddp(comm, opt, {.shards = args.shards, .check_every = args.check_every});
    if (!args.resume.empty()) ddp.load_checkpoint(args.resume);
    while (opt.steps() < args.steps) {
      const std::uint64_t t = opt.steps() + 1;
      if (rank == args.kill_rank && t == args.kill_step) {
        std::fprintf(stderr, "dist_train: rank %d kills itself before step %" PRIu64 " (test)\n", rank, t);
        std::fflush(stderr);
        ::raise(SIGKILL);
      }
      if (rank == args.hang_rank && t == args.hang_step) {
        std::fprintf(stderr, "dist_train: rank %d stops calling collectives before step %" PRIu64 " (test)\n", rank, t);
        std::fflush(stderr);
        for (;;) ::pause();
      }
      // backward, then the update, as loss.backward(); opt.step() in PyTorch (ddp.step does both and
      // the replica check); the clip factor is read in between.
      const T loss = ddp.backward([&](std::size_t s) {
        if (rank == args.poison_rank && t == args.poison_step) return grad::matmul(model_poison(tp), Var<T>());
        return model.loss(tp, t, args.shards, s);
      });
      clipped += opt.clip_scale() < T(1);
      if (!opt.step()) return 1;
      if (args.check_every > 0 && opt.steps() % args.check_every == 0) ddp.check_replicas();
      step_line(t, loss);
      if (rank == args.drift_rank && t == args.drift_step) {
        std::span<T> w = tp.leaf_value(opt.params()[0].var);
        w[0] = std::nextafter(w[0], T(1));  // one ulp: the smallest drift there is
      }
      if (args.save_at == t) {
        ddp.save_checkpoint(args.ckpt);
        break;
      }
    }
    if (args.verbose) {
      const auto& st = comm.stats();
      std::fprintf(stderr,
                   "rank %d: compute %.3f s, fold %.3f s, communication %.3f s in %" PRIu64 " calls, %.1f MB sent\n",
                   rank, ddp.compute_seconds(), ddp.fold_seconds(), st.seconds, st.calls, double(st.bytes) / 1e6);
    }
  } catch (const grad::dist::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
  write(args.out + ".rank" + std::to_string(rank));
  if (rank == args.hang_end_rank) {
    std::fprintf(stderr, "dist_train: rank %d hangs after its last collective (test)\n", rank);
    std::fflush(stderr);
    for (;;) ::pause();
  }
  return 0;
}

// --engine MODE: the shard episode captured as a device program on the CPU
// backend (per_node, graph or fused), trained by ProgramParallel with the
// host optimizer's settings. Writes the step losses and final parameters
// (the device optimizer's moments stay on its backend): the lines of the
// tape reference's file that begin with "step" or "param".
template <class Model>
int train_program(const Args& args, Tape<T>& tp, grad::Adam<T>& host, Model& model, int argc, char** argv) {
  namespace device = grad::device;
  const device::Mode mode = args.engine == "graph"   ? device::Mode::graph
                            : args.engine == "fused" ? device::Mode::fused
                                                     : device::Mode::per_node;
  device::Program<T> program = device::capture(tp, model.episode(tp, args.shards), {.mode = mode});
  device::Adam<T> opt(program, host.lr());
  for (const auto& e : host.params()) opt.add(e.var, e.l2);
  opt.set_clip(host.clip());
  grad::dist::Communicator comm(&argc, &argv);
  const int rank = comm.rank();
  std::vector<std::string> lines;
  try {
    grad::dist::ProgramParallel<T> ddp(comm, opt, {.shards = args.shards, .check_every = args.check_every});
    if (!args.resume.empty()) ddp.load_checkpoint(args.resume, tp, host);  // through the host Adam
    while (opt.steps() < args.steps) {
      const std::uint64_t t = opt.steps() + 1;
      const T loss = ddp.step([&](std::size_t s) { model.set_shard(program, t, args.shards, s); });
      char text[96];
      std::snprintf(text, sizeof text, "step %" PRIu64 " loss %.17g ", t, loss);
      lines.push_back(text + hex(&loss, sizeof loss));
      if (args.save_at == t) {
        ddp.save_checkpoint(args.ckpt, tp, host);
        break;
      }
    }
  } catch (const grad::dist::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
  for (const auto& e : host.params()) {
    const Tensor<T> v = program.value(e.var);
    lines.push_back("param " + hex(v.data().data(), v.size() * sizeof(T)));
  }
  std::ofstream f(args.out + ".rank" + std::to_string(rank));
  for (const auto& l : lines) f << l << "\n";
  return 0;
}

template <class Model>
int run(const Args& args, Tape<T>& tp, grad::Adam<T>& opt, Model& model, int argc, char** argv) {
  return args.engine.empty() ? train(args, tp, opt, model, argc, argv)
                             : train_program(args, tp, opt, model, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  // A rank's own identity before MPI starts: Open MPI's launcher says it in the environment.
  const char* env_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const int rank = args.reference || !env_rank ? 0 : std::atoi(env_rank);
  const bool wider = rank == args.bad_rank;
  // Odd ranks only: ranks with different thread counts must still agree (threads split outputs, never a sum).
  if (rank % 2 == 1) grad::set_num_threads(args.threads);
  Tape<T> tp;
  grad::Adam<T> opt(args.model == "ae" ? T(0.005) : T(0.01));
  opt.set_clip(args.model == "ae" ? T(0.05) : T(0.5));  // small enough that it clips
  if (args.model == "ae") {
    Autoencoder model(tp, opt, wider);
    return run(args, tp, opt, model, argc, argv);
  }
  if (args.model == "lora") {
    LoraBlock model(tp, opt, args.shards, wider);
    return run(args, tp, opt, model, argc, argv);
  }
  std::fprintf(stderr, "dist_train: unknown model %s (ae or lora)\n", args.model.c_str());
  return 2;
}
