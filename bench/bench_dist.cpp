// Workload B (bench/mlp_workload.hpp: MLP 512-1024-1024-512, relu, batch 256,
// mse, Adam) trained data-parallel with grad::dist: the batch cut into S
// shards, run under `mpirun -np N` (bench/dist_scaling.sh runs 1 and 2
// ranks in the same run). Rank 0 prints the median step time, the median
// time per step inside collectives (waiting for the other rank included),
// the fold, and the bytes each rank sends per step.
//
//   mpirun -np 2 build/bench/bench_dist --shards 2 --steps 20 [--f64] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <grad/dist.hpp>
#include <grad/grad.hpp>
#include <string>
#include <vector>

#include "mlp_workload.hpp"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

template <class T>
int run(int argc, char** argv, std::size_t shards, int steps, int warmup) {
  using namespace grad_bench;
  grad::Tape<T> tp;
  grad::Adam<T> opt(T(1e-3));
  const grad::Tensor<T> x = mlp_filled<T>({mlp_batch, mlp_widths[0]}, T(1), 1);
  const grad::Tensor<T> target = mlp_filled<T>({mlp_batch, mlp_widths.back()}, T(0.5), 2);
  std::vector<grad::Var<T>> w, b, xs, ts;
  for (std::size_t l = 0; l + 1 < mlp_widths.size(); ++l) {
    const T scale = T(1) / T(mlp_widths[l]);
    w.push_back(tp.param(mlp_filled<T>({mlp_widths[l], mlp_widths[l + 1]}, scale * T(1.7), 10 + l)));
    b.push_back(tp.param(mlp_filled<T>({mlp_widths[l + 1]}, T(0.1), 20 + l)));
    opt.add(w.back());
    opt.add(b.back());
  }
  // Each shard's rows as constants, made once (before the mark).
  for (std::size_t s = 0; s < shards; ++s) {
    const grad::dist::Range r = grad::dist::shard_rows(mlp_batch, shards, s);
    auto rows = [&](const grad::Tensor<T>& t) {
      const std::size_t cols = t.shape()[1];
      grad::Tensor<T> part({r.size(), cols});
      std::memcpy(part.data().data(), t.data().data() + r.begin * cols, r.size() * cols * sizeof(T));
      return tp.constant(part);
    };
    xs.push_back(rows(x));
    ts.push_back(rows(target));
  }
  auto loss_of = [&](std::size_t s) {
    grad::Var<T> h = xs[s];
    for (std::size_t l = 0; l < w.size(); ++l) {
      h = grad::matmul(h, w[l]) + b[l];
      if (l + 1 < w.size()) h = grad::relu(h);
    }
    return grad::mse(h, ts[s]);
  };

  grad::dist::Communicator comm(&argc, &argv);
  grad::dist::DataParallel<grad::Adam<T>> ddp(comm, opt, {.shards = shards});
  std::vector<double> step_s, comm_s, fold_s;
  double last_loss = 0;
  std::uint64_t bytes = 0;
  for (int i = 0; i < warmup + steps; ++i) {
    ddp.reset_timers();
    comm.barrier("the step start");
    comm.reset_stats();
    const auto t0 = std::chrono::steady_clock::now();
    last_loss = static_cast<double>(ddp.step(loss_of));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) {
      step_s.push_back(took);
      comm_s.push_back(comm.stats().seconds);
      fold_s.push_back(ddp.fold_seconds());
      bytes = comm.stats().bytes;
    }
  }
  if (comm.rank() == 0) {
    const double p = static_cast<double>(opt.elements());
    const double n = comm.size();
    const double ring = 2 * p * sizeof(T) * (n - 1) / n;
    std::printf(
        "bench_dist %s ranks %d shards %zu threads %zu steps %d: step median %.2f ms (min %.2f), communication "
        "median %.2f ms, fold %.2f ms, sent %.2f MB/step/rank (ring all-reduce %.2f MB), final loss %.9g\n",
        sizeof(T) == 4 ? "f32" : "f64", comm.size(), shards, grad::num_threads(), steps, 1e3 * median(step_s),
        1e3 * *std::min_element(step_s.begin(), step_s.end()), 1e3 * median(comm_s), 1e3 * median(fold_s),
        double(bytes) / 1e6, ring / 1e6, last_loss);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t shards = 2, threads = 1;
  int steps = 20, warmup = 3;
  bool f64 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--shards" && i + 1 < argc)
      shards = std::stoul(argv[++i]);
    else if (k == "--steps" && i + 1 < argc)
      steps = std::stoi(argv[++i]);
    else if (k == "--warmup" && i + 1 < argc)
      warmup = std::stoi(argv[++i]);
    else if (k == "--threads" && i + 1 < argc)
      threads = std::stoul(argv[++i]);
    else if (k == "--f64")
      f64 = true;
  }
  grad::set_num_threads(threads);
  return f64 ? run<double>(argc, argv, shards, steps, warmup) : run<float>(argc, argv, shards, steps, warmup);
}
