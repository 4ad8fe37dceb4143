// A 64-128-64-10 relu classifier with dropout on scikit-learn's handwritten
// digits (1,797 8x8 images, 10 classes), written with grad's everyday API.
//
//   digits [--data FILE] [--epochs 30] [--batch 64] [--lr 1e-3] [--weight-decay 0.01] [--dropout 0.2] [--seed 1] [--save FILE] [--svg FILE]
// (digits --help: every option with its default and range.)
//
// The data: Debian's python3-sklearn ships it (apt-get install python3-sklearn);
// --data defaults to its path. Any CSV with 64 pixel columns (0..16) and the
// class id last works. Split: every 5th row (row % 5 == 0) is the test set,
// the rest trains; bench/peer_torch_digits.py trains the same model on the
// same split in PyTorch.
#include <chrono>
#include <cstdio>
#include <grad/core.hpp>
#include <grad/csv.hpp>
#include <grad/data.hpp>
#include <grad/model_file.hpp>
#include <grad/modules.hpp>
#include <grad/tensor_math.hpp>
#include <string>

#include "args.hpp"
#include "report.hpp"

int main(int argc, char** argv) {
  args::Command app{"digits: a 64-128-64-10 relu classifier on scikit-learn's handwritten digits", "digits"};
  std::string data = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz", save, svg = "digits.svg";
  int epochs = 30;
  std::size_t batch_size = 64;
  float lr = 1e-3f;
  double dropout = 0.2, weight_decay = 0.01;
  std::uint64_t seed = 1;
  // A regular file, bounded: /dev/zero as --data would never end.
  app.option("--data", data, "CSV (or .csv.gz): 64 pixel columns (0..16), the class id last")
      .check(args::input_file(256u << 20));
  app.option("--epochs", epochs, "passes over the training rows").check(args::range(1, 100'000));
  app.option("--batch", batch_size, "rows per AdamW step").check(args::range<std::size_t>(1, 100'000));
  app.option("--lr", lr, "AdamW's peak learning rate (one-cycle schedule)").check(args::range(1e-7f, 10.0f));
  app.option("--weight-decay", weight_decay, "AdamW's decoupled weight decay on the weights (not biases)")
      .check(args::range(0.0, 1.0));
  app.option("--dropout", dropout, "dropout after each hidden relu (0: none)").check(args::range(0.0, 0.95));
  app.option("--seed", seed, "initial weights and batch order").check(args::seed());
  app.option("--save", save, "write the trained model ('' for none)").check(args::output_file());
  app.option("--svg", svg, "accuracy curves as an SVG plot ('' for none)").check(args::output_file());
  if (auto status = app.parse(argc, argv)) return *status;
  if (std::string why = args::output_file_problem(svg); !why.empty())  // the default is checked too
    return std::fprintf(stderr, "digits: --svg: %s\n", why.c_str()), 2;

  grad::LabeledData<float> all;
  try {
    all = grad::read_labeled_csv<float>(data);
  } catch (const std::exception& e) {
    return std::fprintf(stderr, "digits: %s\n  (apt-get install python3-sklearn, or pass --data FILE)\n", e.what()), 1;
  }
  all.inputs = all.inputs / 16.0f;  // pixels 0..16 -> 0..1
  const auto train = grad::select_rows(all, [](std::size_t r) { return r % 5 != 0; });
  const auto test = grad::select_rows(all, [](std::size_t r) { return r % 5 == 0; });
  const std::size_t cols = all.inputs.shape()[1];

  grad::Tape<float> tp;
  grad::SplitMix64 gen(seed);
  auto model = grad::nn::mlp<float>(tp, {cols, 128, 64, 10}, gen, grad::nn::relu_layer<float>, dropout);
  // AdamW (torch.optim.AdamW's rule) with decoupled weight decay on the
  // weights only, under a one-cycle schedule (torch's OneCycleLR) whose
  // peak is --lr, over every step of the run.
  grad::AdamW<float> opt(lr);
  grad::nn::add_parameters(opt, model, {.weights = weight_decay, .others = 0});
  grad::Batches<float> batches(train.inputs, train.labels, {.batch = batch_size, .seed = seed});
  opt.set_schedule(grad::LrSchedule::one_cycle(lr, static_cast<std::uint64_t>(epochs) * batches.size()));
  std::printf("digits: %zu train / %zu test rows, %zu-128-64-10 relu, dropout %g, AdamW peak lr %g (one-cycle), "
              "weight decay %g, batch %zu, seed %llu\n",
              train.labels.size(), test.labels.size(), cols, dropout, static_cast<double>(lr), weight_decay, batches.batch_size(),
              static_cast<unsigned long long>(seed));

  const auto mark = tp.mark();
  report::Progress bar(epochs);
  report::Series test_acc{"test accuracy", "#ff7f0e", {}, {}}, train_acc{"train accuracy", "#1f77b4", {}, {}};
  double seconds = 0;  // training only, evaluation excluded
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    grad::EpochMean loss;
    const auto start = std::chrono::steady_clock::now();
    bar.resume();
    for (const auto& b : batches.epoch()) {
      tp.reset_to(mark);
      const auto l = grad::cross_entropy(model(tp.constant(b.inputs)), b.labels);
      if (!tp.backward(l) || !opt.step()) return std::fprintf(stderr, "digits: %s\n", tp.error().c_str()), 1;
      loss.add(tp.scalar(l), b.rows);
      bar.step(epoch, tp.scalar(l));
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    model.eval();  // no dropout while measuring
    const double tr = grad::accuracy(grad::predict(tp, model, train.inputs), train.labels);
    const double te = grad::accuracy(grad::predict(tp, model, test.inputs), test.labels);
    model.train();
    train_acc.x.push_back(epoch), train_acc.y.push_back(100 * tr), test_acc.x.push_back(epoch);
    test_acc.y.push_back(100 * te);
    char line[96];
    std::snprintf(line, sizeof line, "loss %.4f  train %.2f%%  test %.2f%%", loss.value(), 100 * tr, 100 * te);
    bar.epoch_done(epoch, line);
  }

  model.eval();
  const auto predicted = grad::predict(tp, model, test.inputs);
  std::printf("test accuracy %.2f%% after %d epochs, %.3f s training\n%s", 100 * grad::accuracy(predicted, test.labels),
              epochs, seconds, grad::confusion_string(grad::confusion_matrix(predicted, test.labels, 10), 10).c_str());
  if (!save.empty()) {
    if (auto r = grad::save_model(save, model); !r) return std::fprintf(stderr, "digits: %s\n", r.error.c_str()), 1;
    std::printf("model: %s\n", save.c_str());
  }
  const report::Plot plot{"grad digits classifier", "epoch", "accuracy (%)", false, {train_acc, test_acc}, {}};
  if (!svg.empty()) {
    if (!report::write_svg(svg, plot)) return std::fprintf(stderr, "digits: cannot write %s\n", svg.c_str()), 1;
    std::printf("plot: %s\n", svg.c_str());
  }
  return 0;
}
