// ProgramParallel through the NCCL reducer, on the CUDA backend, one rank
// (SoloGroup, no MPI): a small tanh MLP, S = 4 shards, 6 Adam steps with L2
// and global-norm clipping, float and double, in every mode (per_node, graph,
// fused). Its loss trace and final weights must equal, bit for bit,
//   (a) grad::dist::LocalShards on the CPU tape, and
//   (b) ProgramParallel with the default HostReduction on the CUDA backend.
// One line per case; exit status 1 on a difference, 2 on an error, 77 when no
// CUDA device answers (nothing was checked).
//   nccl_program_check
#include <cstdio>
#include <cstring>
#include <grad/device/device.hpp>
#include <grad/dist.hpp>
#include <grad/dist/program.hpp>
#include <grad/dist_nccl.hpp>
#include <grad/grad.hpp>
#include <grad/random.hpp>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace dist = grad::dist;
namespace dev = grad::device;
using grad::Tensor;
using grad::Var;

constexpr std::size_t rows = 12, shards = 4;  // equal shards of 3 rows: one program serves them all
constexpr int steps = 6;

template <class T>
Tensor<T> seeded(grad::Shape shape, std::uint64_t seed, double scale) {
  Tensor<T> t(std::move(shape));
  grad::SplitMix64 rng(seed);
  for (T& x : t.data()) x = static_cast<T>(rng.uniform(-scale, scale));
  return t;
}

// test_dist.cpp's Net, in T: shard s is shard_rows(rows, S, s).
template <class T>
struct Net {
  grad::Tape<T> tp;
  Var<T> w1, b1, w2;
  grad::Adam<T> opt{T(0.01)};
  Tensor<T> data = seeded<T>({rows, 3}, 11, 1.0);

  Net() {
    w1 = tp.param(seeded<T>({3, 5}, 12, 0.8));
    b1 = tp.param(seeded<T>({5}, 13, 0.3));
    w2 = tp.param(seeded<T>({5, 3}, 14, 0.8));
    opt.add(w1, T(1e-3));
    opt.add(b1);
    opt.add(w2, T(1e-3));
    opt.set_clip(T(0.1));
  }
  Tensor<T> batch(dist::Range r) const {
    Tensor<T> x({r.size(), 3});
    std::memcpy(x.data().data(), data.data().data() + 3 * r.begin, 3 * r.size() * sizeof(T));
    return x;
  }
  Var<T> loss_of(Var<T> in) { return grad::mse(grad::matmul(grad::tanh(grad::matmul(in, w1) + b1), w2), in); }
  Var<T> loss(dist::Range r) { return loss_of(tp.constant(batch(r))); }
  std::vector<T> params() const {
    std::vector<T> all;
    for (Var<T> v : {w1, b1, w2}) all.insert(all.end(), tp.value(v).begin(), tp.value(v).end());
    return all;
  }
};

// The Net's shard episode captured on the CUDA backend (shard 0's rows), with
// the device Adam in the tape optimizer's settings.
template <class T>
struct CapturedNet {
  Net<T> net;
  Var<T> in;
  std::optional<dev::Program<T>> program;
  std::optional<dev::Adam<T>> opt;

  explicit CapturedNet(dev::Mode mode) {
    in = net.tp.constant(net.batch(dist::shard_rows(rows, shards, 0)));
    program.emplace(dev::capture(net.tp, net.loss_of(in), {.backend = dev::Backend::cuda, .mode = mode}));
    opt.emplace(*program, T(0.01));
    opt->add(net.w1, T(1e-3));
    opt->add(net.b1);
    opt->add(net.w2, T(1e-3));
    opt->set_clip(T(0.1));
  }
  std::vector<T> params() {
    std::vector<T> all;
    for (Var<T> v : {net.w1, net.b1, net.w2}) {
      const Tensor<T> t = program->value(v);
      all.insert(all.end(), t.data().begin(), t.data().end());
    }
    return all;
  }
};

struct Run {
  std::vector<char> losses, params;  // the bits
  std::size_t count = 0;             // parameters
};
template <class T>
Run bits(const std::vector<T>& losses, const std::vector<T>& params) {
  Run r;
  r.losses.resize(losses.size() * sizeof(T));
  r.params.resize(params.size() * sizeof(T));
  std::memcpy(r.losses.data(), losses.data(), r.losses.size());
  std::memcpy(r.params.data(), params.data(), r.params.size());
  r.count = params.size();
  return r;
}

template <class T>
Run tape_run() {
  Net<T> net;
  dist::LocalShards<grad::Adam<T>> local(net.opt, {.shards = shards});
  std::vector<T> losses;
  for (int step = 0; step < steps; ++step)
    losses.push_back(local.step([&](std::size_t s) { return net.loss(dist::shard_rows(rows, shards, s)); }));
  return bits(losses, net.params());
}

// nccl: through the NCCL ShardReducer, else the default HostReduction.
template <class T>
Run program_run(dev::Mode mode, bool nccl) {
  CapturedNet<T> c(mode);
  dist::SoloGroup solo;
  const dist::ShardOptions options{.shards = shards, .check_every = 3};
  std::optional<dist::nccl::ShardReducer<T>> reducer;
  std::optional<dist::ProgramParallel<T>> ddp;
  if (nccl) {
    reducer.emplace(solo, 0, dist::ProgramParallel<T>::elements(*c.opt), options);
    ddp.emplace(solo, *c.opt, options, *reducer);
  } else {
    ddp.emplace(solo, *c.opt, options);
  }
  std::vector<T> losses;
  for (int step = 0; step < steps; ++step)
    losses.push_back(
        ddp->step([&](std::size_t s) { c.program->set_input(c.in, c.net.batch(dist::shard_rows(rows, shards, s))); }));
  return bits(losses, c.params());
}

// "losses", "weights", "losses and weights": what differs between two runs.
std::string differing(const Run& a, const Run& b) {
  const bool l = a.losses != b.losses, w = a.params != b.params;
  return l && w ? "losses and weights" : l ? "losses" : "weights";
}

template <class T>
bool check(dev::Mode mode) {
  const Run tape = tape_run<T>(), host = program_run<T>(mode, false), nccl = program_run<T>(mode, true);
  auto same = [](const Run& a, const Run& b) { return a.losses == b.losses && a.params == b.params; };
  const bool vs_tape = same(nccl, tape), vs_host = same(nccl, host);
  std::string what;
  if (vs_tape && vs_host) {
    what = "bitwise equal to LocalShards on the tape and to HostReduction";
  } else {
    if (!vs_tape) what = "DIFFERS from LocalShards on the tape (" + differing(nccl, tape) + ")";
    if (!vs_host)
      what += (what.empty() ? "" : "; ") + std::string("DIFFERS from HostReduction (") + differing(nccl, host) + ")";
    what += same(host, tape) ? "; HostReduction = tape" : "; HostReduction differs from the tape too";
  }
  std::printf("nccl_program_check: %s, %.*s, %zu shards, %d Adam steps, %zu weights: %s\n",
              sizeof(T) == 4 ? "float" : "double", static_cast<int>(dev::mode_name(mode).size()),
              dev::mode_name(mode).data(), shards, steps, nccl.count, what.c_str());
  return vs_tape && vs_host;
}

}  // namespace

int main() {
  if (!dev::cuda_available()) {
    std::printf("nccl_program_check: skipped, no CUDA device: %s\n", dev::cuda_unavailable_reason().c_str());
    return 77;
  }
  try {
    bool ok = true;
    for (dev::Mode mode : {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused}) {
      ok = check<float>(mode) && ok;
      ok = check<double>(mode) && ok;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_program_check: %s\n", e.what());
    return 2;
  }
}
