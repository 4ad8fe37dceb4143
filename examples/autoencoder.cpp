// Trains a 6-64-32-64-6 tanh autoencoder on a noisy 2-D manifold in 6-D
// with Adam, minibatches on one tape rewound by mark/reset, and writes the
// loss curve as CSV and SVG.
//
// Each epoch line shows the minibatch loss (the mean of that epoch's batch
// losses, each before its step), the MSE over all 2,000 rows after the epoch
// and a smoothed step rate (examples/report.hpp).
//
//   autoencoder [--epochs 60] [--batch 200] [--lr 0.005] [--seed 7] [--f32]
//               [--save FILE] [--resume FILE] [--csv FILE] [--svg FILE]
// (autoencoder --help: every option with its default and range.)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "autoencoder.hpp"
#include "cli.hpp"
#include "report.hpp"

namespace {

struct Options {
  int epochs = 60;
  std::size_t batch = 200;
  double lr = 0.005;
  bool lr_given = false;
  std::uint64_t seed = autoencoder::default_seed;
  bool f32 = false;
  std::string save, resume;
  std::string csv = "autoencoder_loss.csv", svg = "autoencoder_loss.svg";
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--epochs", o.epochs, "passes over the 2,000 rows")->check(cli::range(0, 1'000'000));
  app.add_option("--batch", o.batch, "rows per Adam step")->check(cli::range<std::size_t>(1, autoencoder::rows));
  app.add_option("--lr", o.lr, "Adam learning rate (overrides a resumed checkpoint's)")
      ->check(cli::range(1e-12, 10.0))
      ->each([&o](const std::string&) { o.lr_given = true; });
  app.add_option("--seed", o.seed, "data and initial weights")->check(cli::seed());
  app.add_flag("--f32", o.f32, "train in float instead of double");
  app.add_option("--save", o.save, "write a checkpoint when training ends ('' for none)")->check(cli::output_file);
  app.add_option("--resume", o.resume, "start from a checkpoint written by --save (same --seed, --f32)")
      ->check(CLI::ExistingFile);
  app.add_option("--csv", o.csv, "loss curve as CSV ('' for none)")->check(cli::output_file);
  app.add_option("--svg", o.svg, "loss curve as an SVG plot ('' for none)")->check(cli::output_file);
}

struct EpochRecord {
  int epoch;
  std::uint64_t steps;
  double train_loss;  // mean of the epoch's minibatch losses
  double mse;         // reconstruction MSE over all rows after the epoch
  double seconds;
};

bool write_csv(const std::string& path, const std::vector<EpochRecord>& curve) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  std::fprintf(f, "epoch,steps,train_loss,mse,seconds\n");
  for (const EpochRecord& r : curve)
    std::fprintf(f, "%d,%llu,%.17g,%.17g,%.6f\n", r.epoch, static_cast<unsigned long long>(r.steps), r.train_loss,
                 r.mse, r.seconds);
  return std::fclose(f) == 0;
}

// A log-scale plot of both curves, one decade per grid line, with the noise
// floor: the data's noise (sigma 0.01 per coordinate) has variance 1e-4, so a
// reconstruction MSE below that line is fitting the manifold, not the noise.
bool write_svg(const std::string& path, const std::vector<EpochRecord>& curve, const std::string& title) {
  report::Series batch{"minibatch loss (mean over the epoch's batches)", "#1f77b4", {}, {}};
  report::Series all{"MSE over all 2,000 rows after the epoch", "#ff7f0e", {}, {}};
  for (const EpochRecord& r : curve) {
    batch.x.push_back(r.epoch), batch.y.push_back(r.train_loss);
    all.x.push_back(r.epoch), all.y.push_back(r.mse);
  }
  const double floor = autoencoder::noise_sigma * autoencoder::noise_sigma;
  return report::write_svg(path, {title,
                                  "epoch",
                                  "mean squared reconstruction error",
                                  true,
                                  {batch, all},
                                  {{floor, "noise floor 1e-4 (noise variance)"}}});
}

template <class T>
int train(const Options& o) {
  using clock = std::chrono::steady_clock;
  const grad::Tensor<T> data = autoencoder::make_data<T>(o.seed);
  grad::Tape<T> tp;
  const autoencoder::Model<T> model = autoencoder::make_model(tp, o.seed);
  grad::Adam<T> opt(static_cast<T>(o.lr));
  autoencoder::add_params(opt, model);
  if (!o.resume.empty()) {
    if (auto r = grad::load_checkpoint(o.resume, tp, opt); !r) {
      std::fprintf(stderr, "autoencoder: %s\n", r.error.c_str());
      return 1;
    }
    if (o.lr_given) opt.set_lr(static_cast<T>(o.lr));
    std::printf("resumed from %s after %llu steps\n", o.resume.c_str(), static_cast<unsigned long long>(opt.steps()));
  }

  // Inputs are leaves made once and refilled, so the loop below records the
  // same graph every step into capacity the first step reserved.
  const std::size_t full = autoencoder::rows / o.batch, rest = autoencoder::rows % o.batch;
  const grad::Var<T> batch = tp.constant(grad::Tensor<T>({o.batch, autoencoder::dim}));
  const grad::Var<T> tail = rest ? tp.constant(grad::Tensor<T>({rest, autoencoder::dim})) : grad::Var<T>{};
  const grad::Var<T> everything = tp.constant(data);
  const auto mark = tp.mark();
  auto full_mse = [&] {
    tp.reset_to(mark);
    const double mse = static_cast<double>(tp.scalar(autoencoder::record_step(model, everything)));
    tp.reset_to(mark);
    return mse;
  };

  const double initial = full_mse();
  std::printf("autoencoder %zu-64-32-64-%zu, %zu rows, batch %zu, Adam lr %g, %s, seed %llu\n", autoencoder::dim,
              autoencoder::dim, autoencoder::rows, o.batch, static_cast<double>(opt.lr()),
              o.f32 ? "float32" : "float64", static_cast<unsigned long long>(o.seed));
  std::printf("initial MSE %.6e\n", initial);

  std::vector<EpochRecord> curve;
  curve.push_back({0, opt.steps(), initial, initial, 0.0});
  report::Progress bar(o.epochs, 10);
  const auto start = clock::now();
  double train_seconds = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto epoch_start = clock::now();
    bar.resume();
    double loss_sum = 0;
    for (std::size_t k = 0; k < full + (rest ? 1 : 0); ++k) {
      const grad::Var<T> input = k < full ? batch : tail;
      tp.reset_to(mark);
      autoencoder::copy_rows(data, k * o.batch, k < full ? o.batch : rest, tp.leaf_value(input));
      const grad::Var<T> loss = autoencoder::record_step(model, input);
      if (!tp.backward(loss) || !opt.step()) {
        std::fprintf(stderr, "\nautoencoder: %s\n", tp.error().c_str());
        return 1;
      }
      loss_sum += static_cast<double>(tp.scalar(loss));
      bar.step(epoch, static_cast<double>(tp.scalar(loss)));
    }
    train_seconds += std::chrono::duration<double>(clock::now() - epoch_start).count();
    const double steps = static_cast<double>(full + (rest ? 1 : 0));
    const double train_loss = loss_sum / steps;
    curve.push_back(
        {epoch, opt.steps(), train_loss, full_mse(), std::chrono::duration<double>(clock::now() - start).count()});
    char line[96];
    std::snprintf(line, sizeof line, "minibatch loss %.3e  MSE (all rows) %.3e", train_loss, curve.back().mse);
    bar.epoch_done(epoch, line);
  }

  const double final_mse = curve.back().mse;
  const double total_steps = static_cast<double>(o.epochs) * static_cast<double>(full + (rest ? 1 : 0));
  // The per-epoch "minibatch loss" is the mean of that epoch's batch losses,
  // each taken before its step; the final MSE is over the whole set after training.
  std::printf("final MSE %.6e over all %zu rows (from %.6e) after %d epochs, %llu Adam steps\n", final_mse,
              autoencoder::rows, initial, o.epochs, static_cast<unsigned long long>(opt.steps()));
  std::printf("noise floor 1.0e-04 (the noise's variance): %s\n",
              final_mse < autoencoder::noise_sigma * autoencoder::noise_sigma ? "below" : "not reached");
  std::printf("time %.3f s training (%.0f steps/s over the run), %.3f s in all\n", train_seconds,
              train_seconds > 0 ? total_steps / train_seconds : 0.0, curve.back().seconds);

  int status = 0;
  if (!o.csv.empty()) {
    if (write_csv(o.csv, curve))
      std::printf("loss curve: %s\n", o.csv.c_str());
    else
      std::fprintf(stderr, "autoencoder: cannot write %s: %s\n", o.csv.c_str(), std::strerror(errno)), status = 1;
  }
  if (!o.svg.empty()) {
    const std::string title =
        "grad autoencoder: reconstruction loss (" + std::string(o.f32 ? "float32" : "float64") + ")";
    if (write_svg(o.svg, curve, title))
      std::printf("loss plot:  %s\n", o.svg.c_str());
    else
      std::fprintf(stderr, "autoencoder: cannot write %s: %s\n", o.svg.c_str(), std::strerror(errno)), status = 1;
  }
  if (!o.save.empty()) {
    if (auto r = grad::save_checkpoint(o.save, tp, opt); r)
      std::printf("checkpoint: %s\n", o.save.c_str());
    else
      std::fprintf(stderr, "autoencoder: %s\n", r.error.c_str()), status = 1;
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"autoencoder: a 6-64-32-64-6 tanh autoencoder trained with Adam; writes its loss curve", "autoencoder"};
  cli::setup(app);
  Options o;
  add_options(app, o);
  if (auto status = cli::parse(app, argc, argv)) return *status;
  // The defaults are checked too, before any training.
  for (const auto& [flag, path] : {std::pair{"--csv", o.csv}, {"--svg", o.svg}}) {
    if (std::string why = cli::output_file_problem(path); !why.empty()) {
      std::fprintf(stderr, "autoencoder: %s: %s\n", flag, why.c_str());
      return 2;
    }
  }
  return o.f32 ? train<float>(o) : train<double>(o);
}
