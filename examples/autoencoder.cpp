// Trains a 6-64-32-64-6 tanh autoencoder on a noisy 2-D manifold in 6-D
// with Adam, minibatches on one tape rewound by mark/reset, and writes the
// loss curve as CSV and SVG.
//
//   autoencoder [--epochs 60] [--batch 200] [--lr 0.005] [--seed 7] [--f32]
//               [--save FILE] [--resume FILE] [--csv FILE] [--svg FILE]
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "autoencoder.hpp"

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

const char* usage =
    "usage: autoencoder [--epochs N] [--batch N] [--lr X] [--seed N] [--f32]\n"
    "                   [--save FILE] [--resume FILE] [--csv FILE] [--svg FILE]\n"
    "  --epochs N     passes over the 2,000 rows (default 60)\n"
    "  --batch N      rows per Adam step (default 200)\n"
    "  --lr X         Adam learning rate (default 0.005; overrides a resumed checkpoint's)\n"
    "  --seed N       data and initial weights (default 7)\n"
    "  --f32          train in float instead of double\n"
    "  --save FILE    write a checkpoint when training ends\n"
    "  --resume FILE  start from a checkpoint written by --save (same --seed, --f32)\n"
    "  --csv FILE     loss curve as CSV (default autoencoder_loss.csv; '' for none)\n"
    "  --svg FILE     loss curve as an SVG plot (default autoencoder_loss.svg; '' for none)\n";

[[noreturn]] void bad_usage(const std::string& why) {
  std::fprintf(stderr, "autoencoder: %s\n%s", why.c_str(), usage);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad_usage(arg + " needs a value");
      return argv[++i];
    };
    auto number = [&](double lo, double hi) {
      const std::string v = value();
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(x >= lo && x <= hi))
        bad_usage(arg + " " + v + ": expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return x;
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    } else if (arg == "--epochs") {
      o.epochs = static_cast<int>(number(0, 1e6));
    } else if (arg == "--batch") {
      o.batch = static_cast<std::size_t>(number(1, autoencoder::rows));
    } else if (arg == "--lr") {
      o.lr = number(1e-12, 10);
      o.lr_given = true;
    } else if (arg == "--seed") {
      o.seed = static_cast<std::uint64_t>(number(0, 9007199254740992.0));
    } else if (arg == "--f32") {
      o.f32 = true;
    } else if (arg == "--save") {
      o.save = value();
    } else if (arg == "--resume") {
      o.resume = value();
    } else if (arg == "--csv") {
      o.csv = value();
    } else if (arg == "--svg") {
      o.svg = value();
    } else {
      bad_usage("unknown option " + arg);
    }
  }
  return o;
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

// A log-scale plot of both curves, one decade per grid line.
bool write_svg(const std::string& path, const std::vector<EpochRecord>& curve, const char* title) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  const double W = 760, H = 440, left = 80, right = 24, top = 48, bottom = 56;
  double lo = INFINITY, hi = -INFINITY;
  for (const EpochRecord& r : curve)
    for (double v : {r.train_loss, r.mse})
      if (v > 0) {
        lo = std::min(lo, std::log10(v));
        hi = std::max(hi, std::log10(v));
      }
  if (!(lo <= hi)) lo = -1, hi = 0;
  lo = std::floor(lo), hi = std::ceil(hi);
  if (hi == lo) hi = lo + 1;
  const int last = curve.empty() ? 1 : std::max(1, curve.back().epoch);
  auto px = [&](double epoch) { return left + (W - left - right) * epoch / last; };
  auto py = [&](double v) { return top + (H - top - bottom) * (hi - std::log10(v)) / (hi - lo); };
  std::fprintf(
      f, "<svg xmlns='http://www.w3.org/2000/svg' width='%g' height='%g' font-family='sans-serif' font-size='12'>\n", W,
      H);
  std::fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
  std::fprintf(f, "<text x='%g' y='24' font-size='15'>%s</text>\n", left, title);
  for (int d = static_cast<int>(lo); d <= static_cast<int>(hi); ++d) {
    const double y = py(std::pow(10.0, d));
    std::fprintf(f, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='#ddd'/>\n", left, y, W - right, y);
    std::fprintf(f, "<text x='%g' y='%g' text-anchor='end'>1e%d</text>\n", left - 6, y + 4, d);
  }
  for (int k = 0; k <= 5; ++k) {
    const double e = last * k / 5.0, x = px(e);
    std::fprintf(f, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='#eee'/>\n", x, top, x, H - bottom);
    std::fprintf(f, "<text x='%g' y='%g' text-anchor='middle'>%g</text>\n", x, H - bottom + 18, std::round(e));
  }
  std::fprintf(f, "<text x='%g' y='%g' text-anchor='middle'>epoch</text>\n", (left + W - right) / 2, H - 14);
  std::fprintf(f, "<rect x='%g' y='%g' width='%g' height='%g' fill='none' stroke='#888'/>\n", left, top,
               W - left - right, H - top - bottom);
  auto polyline = [&](auto field, const char* color) {
    std::fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", color);
    for (const EpochRecord& r : curve)
      if (field(r) > 0) std::fprintf(f, "%.2f,%.2f ", px(r.epoch), py(field(r)));
    std::fprintf(f, "'/>\n");
  };
  polyline([](const EpochRecord& r) { return r.train_loss; }, "#1f77b4");
  polyline([](const EpochRecord& r) { return r.mse; }, "#ff7f0e");
  std::fprintf(f, "<text x='%g' y='%g' fill='#1f77b4'>minibatch loss (epoch mean)</text>\n", W - right - 300, top + 18);
  std::fprintf(f, "<text x='%g' y='%g' fill='#ff7f0e'>MSE over all rows</text>\n", W - right - 300, top + 34);
  std::fprintf(f, "</svg>\n");
  return std::fclose(f) == 0;
}

// On a terminal: one line redrawn in place. Otherwise: one plain line per epoch.
struct Progress {
  bool tty = isatty(fileno(stdout)) == 1;
  int epochs;
  void show(int epoch, double loss, double steps_per_s, bool epoch_done) {
    if (tty) {
      constexpr int width = 30;
      const int filled = epochs > 0 ? width * epoch / epochs : width;
      std::printf("\r epoch %4d/%d [%.*s%.*s] loss %.3e  %7.0f steps/s\033[K", epoch, epochs, filled,
                  "##############################", width - filled, "------------------------------", loss,
                  steps_per_s);
      std::fflush(stdout);
    } else if (epoch_done) {
      std::printf("epoch %d/%d loss %.6e %.0f steps/s\n", epoch, epochs, loss, steps_per_s);
    }
  }
  void finish() {
    if (tty) std::printf("\n");
  }
};

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
  Progress bar{.epochs = o.epochs};
  const auto start = clock::now();
  double train_seconds = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto epoch_start = clock::now();
    auto last_draw = epoch_start;
    double loss_sum = 0;
    for (std::size_t k = 0; k < full + (rest ? 1 : 0); ++k) {
      const grad::Var<T> input = k < full ? batch : tail;
      tp.reset_to(mark);
      autoencoder::copy_rows(data, k * o.batch, k < full ? o.batch : rest, tp.leaf_value(input));
      const grad::Var<T> loss = autoencoder::record_step(model, input);
      if (!tp.backward(loss) || !opt.step()) {
        bar.finish();
        std::fprintf(stderr, "autoencoder: %s\n", tp.error().c_str());
        return 1;
      }
      loss_sum += static_cast<double>(tp.scalar(loss));
      const auto now = clock::now();
      if (now - last_draw > std::chrono::milliseconds(100)) {
        const double s = std::chrono::duration<double>(now - epoch_start).count();
        bar.show(epoch - 1, static_cast<double>(tp.scalar(loss)), static_cast<double>(k + 1) / s, false);
        last_draw = now;
      }
    }
    const double epoch_seconds = std::chrono::duration<double>(clock::now() - epoch_start).count();
    train_seconds += epoch_seconds;
    const double steps = static_cast<double>(full + (rest ? 1 : 0));
    const double train_loss = loss_sum / steps;
    curve.push_back(
        {epoch, opt.steps(), train_loss, full_mse(), std::chrono::duration<double>(clock::now() - start).count()});
    bar.show(epoch, train_loss, steps / epoch_seconds, true);
  }
  bar.finish();

  const double final_mse = curve.back().mse;
  const double total_steps = static_cast<double>(o.epochs) * static_cast<double>(full + (rest ? 1 : 0));
  std::printf("final MSE %.6e (from %.6e) after %d epochs, %llu Adam steps\n", final_mse, initial, o.epochs,
              static_cast<unsigned long long>(opt.steps()));
  std::printf("time %.3f s training (%.0f steps/s), %.3f s in all\n", train_seconds,
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
    if (write_svg(o.svg, curve, title.c_str()))
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
  const Options o = parse(argc, argv);
  return o.f32 ? train<float>(o) : train<double>(o);
}
