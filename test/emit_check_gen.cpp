// Writes what test/emit_cuda_check.cu (scripts/device-check.sh's emitted-CUDA
// step) is compiled from, into the directory given:
//
//   emit_check_ae.cuh        the autoencoder's training step (f64, batch 200,
//                            Adam) emitted after two tape steps
//   emit_check_linreg.cuh    a linear regression's loss with value_and_grad
//   emit_check_expected.hpp  the inputs and what the tape computed from them:
//                            five steps' losses and the parameters after
//                            them; value_and_grad's answers at two points
//
// so that the GPU machine only runs a binary and compares bits.
#include <cstdio>
#include <fstream>
#include <grad/emit.hpp>
#include <string>
#include <vector>

#include "../examples/autoencoder.hpp"

namespace {

std::string array(const std::string& name, const std::vector<double>& v) {
  std::string s = "inline constexpr double " + name + "[" + std::to_string(v.size()) + "] = {";
  for (std::size_t i = 0; i < v.size(); ++i) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%a,", v[i]);
    s += (i % 6 == 0 ? "\n    " : " ") + std::string(buf);
  }
  return s + "\n};\n";
}

grad::Var<double> linreg(grad::Tape<double>& tp, const std::vector<double>& x, grad::Var<double>* p) {
  grad::SplitMix64 rng(99);
  grad::Tensor<double> X({16, 3}), y({16, 1});
  for (double& v : X.data()) v = rng.uniform(-1, 1);
  for (double& v : y.data()) v = rng.uniform(-1, 1);
  p[0] = tp.param(grad::Tensor<double>({3, 1}, {x[0], x[1], x[2]}));
  p[1] = tp.param(grad::Tensor<double>({1}, {x[3]}));
  return grad::mse(grad::matmul(tp.constant(X), p[0]) + p[1], tp.constant(y));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: emit_check_gen DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  namespace ae = autoencoder;
  std::string expected =
      "// Written by emit_check_gen: the tape's answers for emit_cuda_check.\n#pragma once\n\n"
      "namespace expected {\n";
  try {
    // The autoencoder: two tape steps, then step 2's episode emitted, then five steps on the tape.
    ae::Trainer<double> t;
    t.step(0);
    t.step(1);
    t.tp.reset_to(t.mark);
    ae::copy_rows(t.data, 400, 200, t.tp.leaf_value(t.batch));
    const grad::Var<double> loss = ae::record_step(t.model, t.batch);
    grad::EmitOptions<double> o;
    o.name = "ck_ae";
    o.names = {{t.batch, "x"}};
    o.optimizer = &t.opt;
    grad::emit_files(t.tp, loss, o, "", dir + "/emit_check_ae.cuh");
    if (!t.tp.backward(loss) || !t.opt.step()) return 1;
    std::vector<double> losses{t.tp.scalar(loss)}, batches, params;
    for (std::size_t k = 2; k < 7; ++k) {
      const auto rows = t.data.data().subspan(k * 200 * ae::dim, 200 * ae::dim);
      batches.insert(batches.end(), rows.begin(), rows.end());
      if (k > 2) losses.push_back(t.step(k));
    }
    for (const auto& p : t.model.params) {
      const auto v = t.tp.value(p).data;
      params.insert(params.end(), v.begin(), v.end());
    }
    expected += "inline constexpr int ae_steps = 5;\n" + array("ae_batches", batches) + array("ae_losses", losses) +
                array("ae_params", params);

    // Linear regression: value_and_grad at two points.
    const std::vector<double> x0{0.5, -0.25, 0.125, 0.1}, x1{-1.5, 0.75, 2.0, -0.3};
    {
      grad::Tape<double> tp;
      grad::Var<double> p[2];
      const grad::Var<double> l = linreg(tp, x0, p);
      grad::EmitOptions<double> lo;
      lo.name = "ck_linreg";
      lo.names = {{p[0], "w"}, {p[1], "b"}};
      lo.value_and_grad = true;
      grad::emit_files(tp, l, lo, "", dir + "/emit_check_linreg.cuh");
    }
    std::vector<double> xs, answers;
    for (const auto* x : {&x0, &x1}) {
      grad::Tape<double> tp;
      grad::Var<double> p[2];
      const grad::Var<double> l = linreg(tp, *x, p);
      if (!tp.backward(l)) return 1;
      xs.insert(xs.end(), x->begin(), x->end());
      answers.push_back(tp.scalar(l));
      for (const auto& q : p) {
        const auto g = tp.grad(q).data;
        answers.insert(answers.end(), g.begin(), g.end());
      }
    }
    expected += array("linreg_x", xs) + array("linreg_answers", answers) + "}  // namespace expected\n";
    grad::write_source(dir + "/emit_check_expected.hpp", expected);
  } catch (const grad::EmitError& e) {
    std::fprintf(stderr, "emit_check_gen: %s\n", e.what());
    return 1;
  }
  return 0;
}
