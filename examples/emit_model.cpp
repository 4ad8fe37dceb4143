// Trains the README's autoencoder briefly on the tape, then writes one
// training step's episode as standalone source with grad::emit:
//
//   DIR/NAME.hpp  a C++ header: forward() (the encoder: the 32-wide code of a
//                 batch) and step() (forward, mse, backward, Adam), every
//                 shape a constant, the trained weights and Adam's state as
//                 they are now; compiles with g++ and grad's include/ alone
//   DIR/NAME.cuh  the same program as CUDA kernels
//
// examples/emit_model_call.cpp calls the header (README, "Emitting a program").
//
//   emit_model [--out DIR] [--name NAME] [--steps N] [--batch N] [--f32]   (--help: defaults and ranges)
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <grad/emit.hpp>
#include <string>

#include "autoencoder.hpp"
#include "cli.hpp"

namespace {

template <class T>
int run(const std::string& dir, const std::string& name, std::size_t steps, std::size_t batch) {
  namespace ae = autoencoder;
  ae::Trainer<T> t(batch);
  double loss = 0;
  for (std::size_t k = 0; k < steps; ++k) loss = static_cast<double>(t.step(k));
  // One more episode, recorded with the encoder's output kept as a Var.
  t.tp.reset_to(t.mark);
  ae::copy_rows(t.data, 0, batch, t.tp.leaf_value(t.batch));
  grad::Var<T> h = t.batch, code;
  for (std::size_t layer = 0; layer < 3; ++layer) {
    h = grad::tanh(grad::matmul(h, t.model.w(layer)) + t.model.b(layer));
    if (layer == 1) code = h;
  }
  const grad::Var<T> mse = grad::mse(grad::matmul(h, t.model.w(3)) + t.model.b(3), t.batch);

  grad::EmitOptions<T> o;
  o.name = name;
  o.names = {{t.batch, "x"}, {code, "code"}};
  const char* params[] = {"w0", "b0", "w1", "b1", "w2", "b2", "w3", "b3"};
  for (std::size_t i = 0; i < 8; ++i) o.names.push_back({t.model.params[i], params[i]});
  o.outputs = {code};
  o.optimizer = &t.opt;
  try {
    grad::emit_files(t.tp, mse, o, dir + "/" + name + ".hpp", dir + "/" + name + ".cuh");
  } catch (const grad::EmitError& e) {
    std::fprintf(stderr, "emit_model: %s\n", e.what());
    return 1;
  }
  std::printf("trained %zu steps (last loss %.6g); wrote %s/%s.hpp and %s/%s.cuh\n", steps, loss, dir.c_str(),
              name.c_str(), dir.c_str(), name.c_str());
  return 0;
}

bool is_identifier(const std::string& s) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  return !s.empty() && !std::isdigit(static_cast<unsigned char>(s[0])) && std::all_of(s.begin(), s.end(), word);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"emit_model: trains the autoencoder briefly, then writes its training step as C++ and CUDA source",
               "emit_model"};
  cli::setup(app);
  std::string dir = ".", name = "ae_model";
  std::size_t steps = 50, batch = 200;
  bool f32 = false;
  app.add_option("--out", dir, "directory for NAME.hpp and NAME.cuh")->check(cli::output_dir);
  app.add_option("--name", name, "the files' name and the emitted namespace (a C++ identifier)")
      ->check(CLI::Validator(
          [](const std::string& v) { return is_identifier(v) ? std::string() : "'" + v + "' is not a C++ identifier"; },
          "IDENTIFIER"));
  app.add_option("--steps", steps, "training steps before the step is emitted")
      ->check(cli::range<std::size_t>(0, 1'000'000));
  app.add_option("--batch", batch, "rows per step (every shape in the emitted code is a constant)")
      ->check(cli::range<std::size_t>(1, autoencoder::rows));
  app.add_flag("--f32", f32, "float instead of double");
  if (auto status = cli::parse(app, argc, argv)) return *status;
  if (std::string why = cli::output_dir_problem(dir); !why.empty())  // the default is checked too
    return std::fprintf(stderr, "emit_model: --out: %s\n", why.c_str()), 2;
  return f32 ? run<float>(dir, name, steps, batch) : run<double>(dir, name, steps, batch);
}
