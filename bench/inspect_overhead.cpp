// Workload A (the README autoencoder's training step, examples/autoencoder.hpp)
// in steps/s with the inspection hooks off, with anomaly detection on, and
// with profiling on: what docs/inspect.md reports. Built by
// scripts/inspect_overhead.sh header-only at -O2, against this tree and
// against a tree without the hooks (GRAD_NO_INSPECT: the modes are skipped).
//   inspect_overhead [steps] [rounds]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../examples/autoencoder.hpp"

namespace {
double steps_per_second(const char* mode, std::size_t steps) {
  autoencoder::Trainer<double> trainer(200);
#if !defined(GRAD_NO_INSPECT)
  if (std::string(mode) == "anomaly") trainer.tp.detect_anomalies(true);
  if (std::string(mode) == "profile") trainer.tp.profile(true);
#endif
  (void)mode;
  std::size_t k = 0;
  trainer.step(k++);  // reserves the tape's capacity
  const auto start = std::chrono::steady_clock::now();
  double sink = 0;
  for (std::size_t i = 0; i < steps; ++i) {
#if !defined(GRAD_NO_INSPECT)
    trainer.tp.clear_profile();
#endif
    sink += trainer.step(k++);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!(sink == sink)) std::fprintf(stderr, "%s: the loss is not finite: %s\n", mode, trainer.tp.error().c_str());
  return static_cast<double>(steps) / s;
}
}  // namespace

int main(int argc, char** argv) {
  const std::size_t steps = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 200;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
#if defined(GRAD_NO_INSPECT)
  const char* modes[] = {"baseline"};
#else
  const char* modes[] = {"off", "anomaly", "profile"};
#endif
  for (int r = 0; r < rounds; ++r)  // interleaved rounds, so load changes hit every mode alike
    for (const char* mode : modes) std::printf("%s %.1f\n", mode, steps_per_second(mode, steps));
}
