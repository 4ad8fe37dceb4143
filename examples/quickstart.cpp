// Records a small graph, runs backward, prints values and gradients.
#include <cstdio>
#include <grad/grad.hpp>

int main() {
  using grad::Tensor;
  grad::Tape<double> tp;
  auto x = tp.constant(Tensor<double>({2, 3}, {1, 2, 3, 4, 5, 6}));
  auto w = tp.param(Tensor<double>({3, 2}, {0.1, -0.2, 0.3, 0.4, -0.5, 0.6}));
  auto b = tp.param(Tensor<double>({2}, {0.01, -0.02}));
  auto y = grad::tanh(grad::matmul(x, w) + b);  // [2, 2], bias broadcast over rows
  auto loss = grad::mean(y * y);

  if (!tp.backward(loss)) {
    std::fprintf(stderr, "%s\n", tp.error().c_str());
    return 1;
  }
  std::printf("loss = %.10f  (%zu nodes on the tape)\n", tp.scalar(loss), tp.size());
  auto print = [](const char* name, grad::View<double> v) {
    std::printf("%-8s", name);
    for (double e : v) std::printf(" % .8f", e);
    std::printf("\n");
  };
  print("y", tp.value(y));
  print("dL/dw", tp.grad(w));
  print("dL/db", tp.grad(b));
  print("dL/dx", tp.grad(x));  // a constant: no gradient flows into it (zeros)
}
