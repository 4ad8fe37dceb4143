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
//   mpirun -np 2 build/examples/dist_autoencoder --shards 8 --program   # a captured device program per
//                                       rank (CUDA when a GPU answers, else the CPU backend): the same fingerprint
//   build/examples/dist_autoencoder --help                         # every option, its default and range
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <grad/device/device.hpp>
#include <grad/dist.hpp>
#include <grad/dist/program.hpp>
#include <grad/grad.hpp>
#include <string>

#include "autoencoder.hpp"
#include "cli.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dist_autoencoder: the autoencoder trained data-parallel with grad::dist (under mpirun, or alone)",
               "dist_autoencoder"};
  cli::setup(app);
  std::size_t shards = 8, steps = 300, batch = 200;
  std::string save, resume;
  bool program = false;
  app.add_option("--shards", shards, "shards per 200-row minibatch (the results depend on it, not on the ranks)")
      ->check(cli::range<std::size_t>(1, batch));
  app.add_option("--steps", steps, "train until the optimizer has taken this many steps")
      ->check(cli::range<std::size_t>(1, 1'000'000));
  app.add_option("--save", save, "write a checkpoint at the end ('' for none)")->check(cli::output_file);
  app.add_option("--resume", resume, "continue from a checkpoint written by --save")->check(CLI::ExistingFile);
  app.add_flag("--program", program,
               "each rank replays a captured device program (CUDA when a GPU answers, else the CPU backend)");
  // Parsed before MPI starts: --help and a bad option need no MPI.
  if (auto status = cli::parse(app, argc, argv)) return *status;

  grad::dist::Communicator comm(&argc, &argv);  // MPI_Init (also without mpirun: one rank)
  grad::Tape<double> tp;
  const grad::Tensor<double> data = autoencoder::make_data<double>();
  const autoencoder::Model<double> model = autoencoder::make_model(tp);  // the same seed on every rank
  grad::Adam opt(0.005);
  for (std::size_t p = 0; p < model.params.size(); ++p) opt.add(model.params[p], p % 2 == 0 ? 1e-4 : 0.0);
  opt.set_clip(1.0);

  const std::size_t batches = autoencoder::rows / batch;
  auto shard_of = [&](std::uint64_t step, std::size_t s) {  // step's minibatch, from the step count
    const grad::dist::Range r = grad::dist::shard_rows(batch, shards, s);
    grad::Tensor<double> x({r.size(), autoencoder::dim});
    autoencoder::copy_rows(data, (step % batches) * batch + r.begin, r.size(), std::span<double>(x.data()));
    return x;
  };
  auto report = [&](double loss) {
    if (comm.rank() != 0) return;
    const auto& st = comm.stats();
    std::printf("%d rank(s), %zu shards: final loss %.17g, parameters fnv1a %016" PRIx64
                "\n(communication %.3f s over %" PRIu64 " collectives, %.1f MB sent by rank 0)\n",
                comm.size(), shards, loss, grad::dist::parameter_checksum(opt), st.seconds, st.calls,
                double(st.bytes) / 1e6);
  };

  if (program) try {
      // One shard's episode, captured; each shard writes its rows into the input.
      if (batch % shards != 0 || !save.empty() || !resume.empty())
        throw grad::dist::Error("--program needs equal shards (" + std::to_string(batch) +
                                " rows) and no --save/--resume (the device optimizer's state stays on its backend)");
      namespace device = grad::device;
      const grad::Var<double> x = tp.constant(shard_of(0, 0));
      device::Program<double> prog =
          device::capture(tp, autoencoder::record_step(model, x),
                          {.backend = device::cuda_available() ? device::Backend::cuda : device::Backend::cpu,
                           .mode = device::Mode::graph});
      device::Adam<double> dopt(prog, opt.lr());
      for (const auto& e : opt.params()) dopt.add(e.var, e.l2);
      dopt.set_clip(opt.clip());
      grad::dist::ProgramParallel<double> ddp(comm, dopt, {.shards = shards, .check_every = 50});
      double loss = 0;
      while (dopt.steps() < steps) {
        const std::uint64_t step = dopt.steps();
        loss = ddp.step([&](std::size_t s) { prog.set_input(x, shard_of(step, s)); });
        if (comm.rank() == 0 && (dopt.steps() % 50 == 0 || dopt.steps() == 1))
          std::printf("step %4" PRIu64 "  loss %.9g  (%s backend)\n", dopt.steps(), loss,
                      std::string(device::backend_name(prog.backend())).c_str());
      }
      prog.sync_params_to(tp);  // the fingerprint below reads the tape
      report(loss);
      return 0;
    } catch (const grad::dist::Error& e) {  // every rank throws it together
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    } catch (const std::exception& e) {  // this rank's own failure: stop the others now, not at their timeout
      comm.abort(std::string("dist_autoencoder: ") + e.what());
    }

  try {
    // After the parameters: each shard is recorded after the mark it takes.
    grad::dist::DataParallel<grad::Adam<double>> ddp(comm, opt, {.shards = shards, .check_every = 50});
    if (!resume.empty()) ddp.load_checkpoint(resume);
    double loss = 0;
    while (opt.steps() < steps) {
      const std::uint64_t step = opt.steps();
      loss = ddp.step([&](std::size_t s) {
        return autoencoder::record_step(model, tp.constant(shard_of(step, s)));  // the shard's mse
      });
      if (comm.rank() == 0 && (opt.steps() % 50 == 0 || opt.steps() == 1))
        std::printf("step %4" PRIu64 "  loss %.9g\n", opt.steps(), loss);
    }
    if (!save.empty()) ddp.save_checkpoint(save);
    report(loss);
  } catch (const grad::dist::Error& e) {  // every rank throws it together
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // this rank's own failure: stop the others now, not at their timeout
    comm.abort(std::string("dist_autoencoder: ") + e.what());
  }
  return 0;
}
