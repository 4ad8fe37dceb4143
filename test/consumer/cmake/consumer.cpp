// test/consumer/cmake: linked with grad::kernels (and grad::hf when grad has it).
#include <grad/core.hpp>
#ifndef GRAD_COMPILED_KERNELS
#error "grad::kernels did not define GRAD_COMPILED_KERNELS"
#endif
#include <cstdio>
#ifdef CONSUMER_HF
#include <grad/hf/tokenizer.hpp>
#endif

int main() {
  // d/dw sum((w x)^2) for w [1x2] = [1 2], x [2x1] = [3 4]: 2 (w x) x^T = 2*11*[3 4] = [66 88]
  grad::Tape<double> tp;
  auto w = tp.param(grad::Tensor<double>({1, 2}, {1.0, 2.0}));
  auto x = tp.constant(grad::Tensor<double>({2, 1}, {3.0, 4.0}));
  auto y = grad::matmul(w, x);
  if (!tp.backward(grad::sum(y * y))) return 1;
  std::printf("kernels: grad %g %g\n", tp.grad(w).data[0], tp.grad(w).data[1]);
#ifdef CONSUMER_HF
  std::printf("hf: %s\n", grad::hf::byte_to_symbol(' ') == "\xC4\xA0" ? "byte 0x20 is U+0120" : "wrong symbol");
#endif
}
