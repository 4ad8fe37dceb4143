// Calls the program examples/emit_model wrote (ae_model.hpp): no tape, no
// Boost, no grad library; only grad's headers for the op tags. Built by
// meson from the header it generates, or by hand:
//
//   build/examples/emit_model --out /tmp
//   g++ -std=c++20 -O2 -ffp-contract=off -I include -I /tmp examples/emit_model_call.cpp
//
// Continues training on the batch the header captured (100 Adam steps),
// then encodes it.
#include <cstdio>

#include "ae_model.hpp"

// Large buffers live in static storage: nothing is allocated.
static ae_model::ParamStore params;
static ae_model::Optimizer adam;
static ae_model::Workspace ws;
static ae_model::T code[ae_model::size::x / 6 * 32];

int main() {
  params.load();  // the trained weights the header holds
  adam.load();    // and Adam's moments and step count
  const ae_model::Params p = params.view();
  ae_model::Inputs in;  // in.x: a [batch, 6] minibatch (by default the captured one)
  const double first = ae_model::step(in, p, adam, ws);
  double last = first;
  for (int k = 1; k < 100; ++k) last = ae_model::step(in, p, adam, ws);
  ae_model::forward(in, p, code, ws);  // the encoder alone: code = tanh(tanh(x w0 + b0) w1 + b1)
  std::printf("mse %.6g -> %.6g after 100 steps; code of row 0: %.4f %.4f %.4f ...\n", first, last, double(code[0]),
              double(code[1]), double(code[2]));
  return last < first ? 0 : 1;
}
