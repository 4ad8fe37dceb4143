// A program that uses grad the way a downstream project would.
#include <cstdio>
#include <grad/grad.hpp>

int main() {
  grad::Tape<double> tp;
  auto x = tp.param(grad::Tensor<double>({3}, {1, 2, 3}));
  if (!tp.backward(grad::sum(x * x))) return 1;
  const auto g = tp.grad(x);
  const bool ok = g[0] == 2 && g[1] == 4 && g[2] == 6;
  std::printf("consumer: d/dx sum(x^2) = [%g, %g, %g] %s\n", g[0], g[1], g[2], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
