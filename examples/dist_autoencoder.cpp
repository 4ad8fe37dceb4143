// The demo's autoencoder trained data-parallel with grad::dist: every
// minibatch of 200 rows is cut into --shards S shards, each rank computes
// the shards it owns, and the shards' gradients are summed in ascending
// shard order whoever computed them. The printed losses and the parameter
// fingerprint are the same bits for any number of ranks (and without
// mpirun) as long as S is the same.
//
//   mpirun -np 4 build/examples/dist_autoencoder --shards 8
//   mpirun -np 3 build/examples/dist_autoencoder --shards 8       # the same fingerprint
//   build/examples/dist_autoencoder --shards 8                     # one process, the same again
//   mpirun --hostfile hosts -np 8 build/examples/dist_autoencoder --shards 8 --save ae.ckpt
//   mpirun -np 2 build/examples/dist_autoencoder --shards 8 --resume ae.ckpt --steps 600
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <grad/dist.hpp>
#include <grad/grad.hpp>
#include <string>

#include "autoencoder.hpp"

int main(int argc, char** argv) {
  std::size_t shards = 8, steps = 300, batch = 200;
  std::string save, resume;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--shards" && i + 1 < argc)
      shards = std::stoul(argv[++i]);
    else if (k == "--steps" && i + 1 < argc)
      steps = std::stoul(argv[++i]);
    else if (k == "--save" && i + 1 < argc)
      save = argv[++i];
    else if (k == "--resume" && i + 1 < argc)
      resume = argv[++i];
  }

  grad::dist::Communicator comm(&argc, &argv);  // MPI_Init (also without mpirun: one rank)
  grad::Tape<double> tp;
  const grad::Tensor<double> data = autoencoder::make_data<double>();
  const autoencoder::Model<double> model = autoencoder::make_model(tp);  // the same seed on every rank
  grad::Adam opt(0.005);
  for (std::size_t p = 0; p < model.params.size(); ++p) opt.add(model.params[p], p % 2 == 0 ? 1e-4 : 0.0);
  opt.set_clip(1.0);

  try {
    // After the parameters: each shard is recorded after the mark it takes.
    grad::dist::DataParallel<grad::Adam<double>> ddp(comm, opt, {.shards = shards, .check_every = 50});
    if (!resume.empty()) ddp.load_checkpoint(resume);
    const std::size_t batches = autoencoder::rows / batch;
    double loss = 0;
    while (opt.steps() < steps) {
      const std::size_t first = (opt.steps() % batches) * batch;  // the step's minibatch, from the step count
      loss = ddp.step([&](std::size_t s) {
        const grad::dist::Range r = grad::dist::shard_rows(batch, shards, s);
        grad::Tensor<double> x({r.size(), autoencoder::dim});
        autoencoder::copy_rows(data, first + r.begin, r.size(), std::span<double>(x.data()));
        return autoencoder::record_step(model, tp.constant(x));  // the shard's mse
      });
      if (comm.rank() == 0 && (opt.steps() % 50 == 0 || opt.steps() == 1))
        std::printf("step %4" PRIu64 "  loss %.9g\n", opt.steps(), loss);
    }
    if (!save.empty()) ddp.save_checkpoint(save);
    if (comm.rank() == 0) {
      const auto& st = comm.stats();
      std::printf("%d rank(s), %zu shards: final loss %.17g, parameters fnv1a %016" PRIx64
                  "\n(communication %.3f s over %" PRIu64 " collectives, %.1f MB sent by rank 0)\n",
                  comm.size(), shards, loss, grad::dist::parameter_checksum(opt), st.seconds, st.calls,
                  double(st.bytes) / 1e6);
    }
  } catch (const grad::dist::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
