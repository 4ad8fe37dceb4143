// Workload B (bench/mlp_workload.hpp: MLP 512-1024-1024-512, relu, batch 256,
// mse, Adam) trained data-parallel with grad::dist: the batch cut into S
// shards, run under `mpirun -np N` (bench/dist_scaling.sh runs 1 and 2
// ranks in the same run). Rank 0 prints the median step time, the median
// time per step inside collectives (waiting for the other rank included),
// the fold, and the bytes each rank sends per step.
//
//   mpirun -np 2 build/bench/bench_dist --shards 2 --steps 20 [--f64] [--threads N] [--model ae]
// (--model ae: workload A, the autoencoder, f64, batch 200; --model lm: tinylm's default model, f32, one
// sequence of 256 random bytes per shard.) --engine per_node|graph|fused: the
// shard episode as a captured device program (CPU backend) through
// grad::dist::ProgramParallel instead of the tape. --help: every option, its default and range.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <grad/device/device.hpp>
#include <grad/dist.hpp>
#include <grad/dist/program.hpp>
#include <grad/grad.hpp>
#include <memory>
#include <string>
#include <vector>

#include <grad/lm.hpp>

#include "../examples/autoencoder.hpp"
#include "../examples/cli.hpp"
#include "mlp_workload.hpp"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Shard s's rows of t as a constant.
template <class T>
grad::Var<T> rows_of(grad::Tape<T>& tp, const grad::Tensor<T>& t, std::size_t rows, std::size_t shards, std::size_t s) {
  const grad::dist::Range r = grad::dist::shard_rows(rows, shards, s);
  const std::size_t cols = t.shape()[1];
  grad::Tensor<T> part({r.size(), cols});
  std::memcpy(part.data().data(), t.data().data() + r.begin * cols, r.size() * cols * sizeof(T));
  return tp.constant(part);
}

// --engine MODE: shard 0's episode captured as a device program on the CPU
// backend and trained by ProgramParallel (the same shards and reduction;
// each shard = its rows written into the program's inputs). Shards must be
// equal (B % S == 0).
template <class T>
int run_program(grad::dist::Communicator& comm, grad::Tape<T>& tp, grad::Adam<T>& host, grad::Var<T> episode,
                const std::vector<grad::Var<T>>& targets, const std::vector<grad::Var<T>>& inputs,
                const std::string& engine, std::size_t shards, int steps, int warmup, const char* name) {
  namespace device = grad::device;
  const device::Mode mode = engine == "graph"   ? device::Mode::graph
                            : engine == "fused" ? device::Mode::fused
                                                : device::Mode::per_node;
  device::Program<T> program = device::capture(tp, episode, {.mode = mode});
  device::Adam<T> opt(program, host.lr());
  for (const auto& e : host.params()) opt.add(e.var);
  std::vector<grad::Tensor<T>> in, out;  // every shard's inputs, made once
  for (std::size_t s = 0; s < shards; ++s) {
    in.push_back(tp.value(inputs[s]).tensor());
    out.push_back(tp.value(targets[s]).tensor());
  }
  const bool same = inputs[0].index() == targets[0].index();  // the autoencoder's target is its input
  grad::dist::ProgramParallel<T> ddp(comm, opt, {.shards = shards});
  std::vector<double> step_s, comm_s;
  double last_loss = 0;
  for (int i = 0; i < warmup + steps; ++i) {
    comm.barrier("the step start");
    comm.reset_stats();
    const auto t0 = std::chrono::steady_clock::now();
    last_loss = static_cast<double>(ddp.step([&](std::size_t s) {
      program.set_input(inputs[0], in[s]);
      if (!same) program.set_input(targets[0], out[s]);
    }));
    program.loss();  // the queued optimizer phase runs (graph and fused modes)
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) {
      step_s.push_back(took);
      comm_s.push_back(comm.stats().seconds);
    }
  }
  if (comm.rank() == 0)
    std::printf(
        "bench_dist program %s %s %s ranks %d shards %zu steps %d: step median %.2f ms (min %.2f), "
        "communication median %.2f ms, final loss %.9g\n",
        engine.c_str(), name, sizeof(T) == 4 ? "f32" : "f64", comm.size(), shards, steps, 1e3 * median(step_s),
        1e3 * *std::min_element(step_s.begin(), step_s.end()), 1e3 * median(comm_s), last_loss);
  return 0;
}

template <class T>
int run(int argc, char** argv, const std::string& model, std::size_t shards, int steps, int warmup,
        const std::string& engine) {
  using namespace grad_bench;
  grad::Tape<T> tp;
  grad::Adam<T> opt(T(model == "ae" ? 0.005 : 1e-3));
  std::vector<grad::Var<T>> w, b, xs, ts;
  const bool ae = model == "ae";
  if (ae) {  // workload A: the autoencoder 6-64-32-64-6 tanh, batch 200 (examples/autoencoder.hpp)
    const grad::Tensor<T> data = autoencoder::make_data<T>();
    const autoencoder::Model<T> m = autoencoder::make_model(tp);
    for (std::size_t l = 0; l < 4; ++l) {
      w.push_back(m.w(l));
      b.push_back(m.b(l));
      opt.add(w.back());
      opt.add(b.back());
    }
    for (std::size_t s = 0; s < shards; ++s) xs.push_back(rows_of(tp, data, 200, shards, s));
  } else if (model != "lm") {  // workload B
    const grad::Tensor<T> x = mlp_filled<T>({mlp_batch, mlp_widths[0]}, T(1), 1);
    const grad::Tensor<T> target = mlp_filled<T>({mlp_batch, mlp_widths.back()}, T(0.5), 2);
    for (std::size_t l = 0; l + 1 < mlp_widths.size(); ++l) {
      const T scale = T(1) / T(mlp_widths[l]);
      w.push_back(tp.param(mlp_filled<T>({mlp_widths[l], mlp_widths[l + 1]}, scale * T(1.7), 10 + l)));
      b.push_back(tp.param(mlp_filled<T>({mlp_widths[l + 1]}, T(0.1), 20 + l)));
      opt.add(w.back());
      opt.add(b.back());
    }
    for (std::size_t s = 0; s < shards; ++s) {  // each shard's rows as constants, made once (before the mark)
      xs.push_back(rows_of(tp, x, mlp_batch, shards, s));
      ts.push_back(rows_of(tp, target, mlp_batch, shards, s));
    }
  }
  // The language model (grad/lm.hpp, tinylm's default size): one sequence of
  // random bytes per shard, as `tinylm bench` times it.
  const bool lm = model == "lm";
  std::unique_ptr<grad::nn::Lm<T>> net;
  std::vector<std::vector<int>> lm_in, lm_out;
  const std::size_t seq = 256;
  if (lm) {
    grad::nn::LmConfig c;
    c.max_seq = seq;
    net = std::make_unique<grad::nn::Lm<T>>(tp, c, 1);
    for (const auto& p : net->trainable()) opt.add(p.var);
    grad::SplitMix64 rng(5);
    for (std::size_t s = 0; s < shards; ++s) {
      lm_in.emplace_back(seq);
      lm_out.emplace_back(seq);
      for (int& x : lm_in.back()) x = static_cast<int>(rng.next() % 256);
      for (int& x : lm_out.back()) x = static_cast<int>(rng.next() % 256);
    }
  }
  auto loss_of = [&](std::size_t s) {
    if (lm) return net->forward(net->ids(lm_in[s], 1, seq), net->ids(lm_out[s], seq, 0)).loss;
    grad::Var<T> h = xs[s];
    for (std::size_t l = 0; l < w.size(); ++l) {
      h = grad::matmul(h, w[l]) + b[l];
      if (l + 1 < w.size()) h = ae ? grad::tanh(h) : grad::relu(h);
    }
    return grad::mse(h, ae ? xs[s] : ts[s]);
  };

  grad::dist::Communicator comm(&argc, &argv);
  if (!engine.empty()) {
    if (lm) {
      std::fprintf(stderr, "bench_dist: --engine takes --model ae or mlp\n");
      return 2;
    }
    return run_program<T>(comm, tp, opt, loss_of(0), ae ? xs : ts, xs, engine, shards, steps, warmup,
                          ae ? "autoencoder" : "workload-B");
  }
  grad::dist::DataParallel<grad::Adam<T>> ddp(comm, opt, {.shards = shards});
  std::vector<double> step_s, comm_s, fold_s, update_s;
  double last_loss = 0;
  std::uint64_t bytes = 0;
  for (int i = 0; i < warmup + steps; ++i) {
    ddp.reset_timers();
    comm.barrier("the step start");
    comm.reset_stats();
    const auto t0 = std::chrono::steady_clock::now();
    last_loss = static_cast<double>(ddp.backward(loss_of));
    const auto t1 = std::chrono::steady_clock::now();
    if (!opt.step()) return 1;  // the update, replicated on every rank
    const auto t2 = std::chrono::steady_clock::now();
    const double took = std::chrono::duration<double>(t2 - t0).count();
    if (i >= warmup) {
      step_s.push_back(took);
      comm_s.push_back(comm.stats().seconds);
      fold_s.push_back(ddp.fold_seconds());
      update_s.push_back(std::chrono::duration<double>(t2 - t1).count());
      bytes = comm.stats().bytes;
    }
  }
  // The exchange alone, after a barrier (no waiting for a slower rank's
  // compute): the same two collectives and sizes as a step's reduction.
  std::vector<double> exchange_s;
  {
    const int world = comm.size(), rank = comm.rank();
    const std::size_t p = opt.elements();
    const grad::dist::Range own = grad::dist::owned_shards(shards, world, rank);
    const grad::dist::Range mine = grad::dist::slice_of(p, world, rank);
    std::vector<std::size_t> sc(world), sd(world), rc(world), rd(world), gc(world), gd(world);
    std::size_t sent = 0, received = 0;
    for (int q = 0; q < world; ++q) {
      const grad::dist::Range slice = grad::dist::slice_of(p, world, q);
      sc[q] = q == rank ? 0 : own.size() * slice.size();
      sd[q] = sent;
      sent += own.size() * slice.size();
      rc[q] = q == rank ? 0 : grad::dist::owned_shards(shards, world, q).size() * mine.size();
      rd[q] = received;
      received += rc[q];
      gc[q] = slice.size();
      gd[q] = slice.begin;
    }
    std::vector<T> send(sent + 1), recv(received + 1), all(p);
    for (int i = 0; i < 3 + steps; ++i) {
      comm.barrier("the exchange probe");
      const auto t0 = std::chrono::steady_clock::now();
      comm.alltoallv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), "the exchange probe");
      comm.allgatherv(all.data() + mine.begin, mine.size(), all.data(), gc.data(), gd.data(), "the exchange probe");
      if (i >= 3) exchange_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  if (comm.rank() == 0) {
    std::printf("bench_dist   the exchange alone (after a barrier): median %.2f ms, min %.2f ms\n",
                1e3 * median(exchange_s), 1e3 * *std::min_element(exchange_s.begin(), exchange_s.end()));
    const double p = static_cast<double>(opt.elements());
    const double n = comm.size();
    const double ring = 2 * p * sizeof(T) * (n - 1) / n;
    std::printf(
        "bench_dist %s %s ranks %d shards %zu threads %zu steps %d: step median %.2f ms (min %.2f), communication "
        "median %.2f ms, fold %.2f ms, update %.2f ms, sent %.2f MB/step/rank (ring all-reduce %.2f MB), final loss "
        "%.9g, parameters fnv1a %016llx\n",
        ae   ? "autoencoder"
        : lm ? "tinylm"
             : "workload-B",
        sizeof(T) == 4 ? "f32" : "f64", comm.size(), shards, grad::num_threads(), steps, 1e3 * median(step_s),
        1e3 * *std::min_element(step_s.begin(), step_s.end()), 1e3 * median(comm_s), 1e3 * median(fold_s),
        1e3 * median(update_s), double(bytes) / 1e6, ring / 1e6, last_loss,
        static_cast<unsigned long long>(grad::dist::parameter_checksum(opt)));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "bench_dist: a workload trained data-parallel with grad::dist under mpirun; rank 0 prints the step "
      "and communication medians",
      "bench_dist"};
  cli::setup(app);
  std::size_t shards = 2, threads = 1;
  int steps = 20, warmup = 3;
  bool f64 = false;
  std::string model = "mlp", engine = "tape";
  app.add_option("--shards", shards, "shards per batch (the batch's rows cut into this many)")
      ->check(cli::range<std::size_t>(1, 200));
  app.add_option("--steps", steps, "timed steps")->check(cli::range(1, 100'000));
  app.add_option("--warmup", warmup, "untimed steps first")->check(cli::range(0, 10'000));
  app.add_option("--threads", threads, "worker threads per rank")->check(cli::range<std::size_t>(1, 256));
  app.add_flag("--f64", f64, "double instead of float (always for --model ae)");
  app.add_option("--model", model, "mlp: workload B; ae: workload A, the autoencoder; lm: tinylm's default model")
      ->check(CLI::IsMember({"mlp", "ae", "lm"}));
  app.add_option("--engine", engine, "tape, or the shard episode as a captured device program (CPU backend)")
      ->check(CLI::IsMember({"tape", "per_node", "graph", "fused"}));
  // Parsed before MPI starts: --help and a bad option need no MPI.
  if (auto status = cli::parse(app, argc, argv)) return *status;
  if (engine == "tape") engine.clear();
  grad::set_num_threads(threads);
  if (model == "ae") f64 = true;  // workload A's headline figures are f64
  return f64 ? run<double>(argc, argv, model, shards, steps, warmup, engine)
             : run<float>(argc, argv, model, shards, steps, warmup, engine);
}
