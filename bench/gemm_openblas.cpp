// grad's host gemm (numerics/gemm.hpp) against OpenBLAS's cblas_[sd]gemm on
// workload B's shapes (MLP 512-1024-1024-512, batch 256: forward nn, the
// backward's nt and tn), grad on `threads` (default 1) threads, OpenBLAS
// serial (one thread), the
// two interleaved shape by shape in one process so that load on a shared
// machine hits both alike. OpenBLAS is loaded with dlopen from the path in
// argv[1] (e.g. the libblas.so.3 of Debian's libopenblas0-serial), so the
// program needs no BLAS to build. bench/gemm_openblas.sh builds and runs it.
//
//   gemm_openblas /path/to/libblas.so.3 [rounds] [threads] [b | tinylm]
//
// "tinylm" times the LM's projections at d 96 instead (tinylm's shapes).
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <grad/numerics/gemm.hpp>

namespace {

enum Order { RowMajor = 101 };
enum Trans { NoTrans = 111, DoTrans = 112 };
using sgemm_t = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using dgemm_t = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double, double*,
                         int);
sgemm_t blas_sgemm;
dgemm_t blas_dgemm;

double now(clockid_t id) {
  timespec t;
  clock_gettime(id, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

template <class T>
void blas(int ta, int tb, int m, int n, int k, const T* a, int lda, const T* b, int ldb, T* c, int ldc) {
  if constexpr (sizeof(T) == 4)
    blas_sgemm(RowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  else
    blas_dgemm(RowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}

struct Shape {
  const char* layout;
  std::size_t m, k, n;  // the product's output is m x n, summing over k
};

// Workload B's nine products per step (forward nn, backward nt for the activations, tn for the weights).
const std::vector<Shape> workload_b = {
    {"nn", 256, 512, 1024}, {"nn", 256, 1024, 1024}, {"nn", 256, 1024, 512},
    {"nt", 256, 1024, 1024}, {"nt", 256, 512, 1024},  // dA of layers 2, 3 (layer 1's input needs none)
    {"tn", 512, 256, 1024}, {"tn", 1024, 256, 1024}, {"tn", 1024, 256, 512},
};
// tinylm's projections at d 96 (4 x 128 positions; q/o 96, k/v 48, gate/up 176, down, the 256-class head):
// forward nn, dA nt, dW tn.
const std::vector<Shape> tinylm_d96 = {
    {"nn", 512, 96, 96},  {"nn", 512, 96, 48},  {"nn", 512, 96, 176}, {"nn", 512, 176, 96}, {"nn", 512, 96, 256},
    {"nt", 512, 96, 96},  {"nt", 512, 48, 96},  {"nt", 512, 176, 96}, {"nt", 512, 96, 176}, {"nt", 512, 256, 96},
    {"tn", 96, 512, 96},  {"tn", 96, 512, 48},  {"tn", 96, 512, 176}, {"tn", 176, 512, 96}, {"tn", 96, 512, 256},
    {"nn", 256, 128, 24}, {"nn", 32, 128, 24},  {"tn", 128, 128, 24}, {"nt", 256, 24, 128},  // attention, hd 24
};

template <class T>
void run(const char* type, int rounds, const std::vector<Shape>& shapes) {
  double total_flop = 0, grad_best_sum = 0, blas_best_sum = 0;
  for (const Shape& s : shapes) {
    std::vector<T> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n);
    unsigned r = 1;
    for (auto* v : {&a, &b})
      for (T& x : *v) x = T((r = r * 1103515245u + 12345u) >> 9 & 0xffff) / T(65536) - T(0.5);
    // Small products repeat within one timing (at least ~20 MFLOP), so the clock's resolution does not count.
    const int reps = static_cast<int>(std::max(1.0, 2e7 / (2.0 * s.m * s.k * s.n)));
    const double flop = 2.0 * s.m * s.k * s.n * reps;
    std::vector<double> tg, tb;
    for (int i = 0; i < rounds; ++i) {
      double t0 = now(CLOCK_MONOTONIC);
      for (int rep = 0; rep < reps; ++rep) {
        // the same product in grad's argument convention for its layout
        if (s.layout[0] == 'n' && s.layout[1] == 'n')
          grad::gemm_nn(a.data(), b.data(), c.data(), s.m, s.k, s.n);
        else if (s.layout[1] == 't')  // C[m,n] = G[m,k] B[n,k]^T
          grad::gemm_nt(a.data(), b.data(), c.data(), s.m, s.k, s.n);
        else  // C[m,n] = A[k,m]^T G[k,n]
          grad::gemm_tn(a.data(), b.data(), c.data(), s.k, s.m, s.n);
      }
      tg.push_back(now(CLOCK_MONOTONIC) - t0);
      t0 = now(CLOCK_MONOTONIC);
      for (int rep = 0; rep < reps; ++rep) {
        if (s.layout[0] == 'n' && s.layout[1] == 'n')
          blas<T>(NoTrans, NoTrans, s.m, s.n, s.k, a.data(), s.k, b.data(), s.n, c.data(), s.n);
        else if (s.layout[1] == 't')
          blas<T>(NoTrans, DoTrans, s.m, s.n, s.k, a.data(), s.k, b.data(), s.k, c.data(), s.n);
        else
          blas<T>(DoTrans, NoTrans, s.m, s.n, s.k, a.data(), s.m, b.data(), s.n, c.data(), s.n);
      }
      tb.push_back(now(CLOCK_MONOTONIC) - t0);
    }
    const double g = *std::min_element(tg.begin(), tg.end()), o = *std::min_element(tb.begin(), tb.end());
    std::sort(tg.begin(), tg.end());
    std::sort(tb.begin(), tb.end());
    std::printf("%s %s m=%4zu k=%4zu n=%4zu  grad %6.1f GFLOP/s (median %6.1f)  openblas %6.1f (median %6.1f)  "
                "grad/openblas %.2f (median %.2f)\n",
                type, s.layout, s.m, s.k, s.n, flop / g * 1e-9, flop / tg[tg.size() / 2] * 1e-9, flop / o * 1e-9,
                flop / tb[tb.size() / 2] * 1e-9, o / g, tb[tb.size() / 2] / tg[tg.size() / 2]);
    total_flop += flop;
    grad_best_sum += g;
    blas_best_sum += o;
  }
  std::printf("%s all shapes (best of %d each): grad %.1f GFLOP/s, openblas %.1f GFLOP/s, grad/openblas %.2f\n", type,
              rounds, total_flop / grad_best_sum * 1e-9, total_flop / blas_best_sum * 1e-9,
              blas_best_sum / grad_best_sum);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s /path/to/openblas/libblas.so.3 [rounds]\n", argv[0]);
    return 2;
  }
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  blas_sgemm = reinterpret_cast<sgemm_t>(dlsym(h, "cblas_sgemm"));
  blas_dgemm = reinterpret_cast<dgemm_t>(dlsym(h, "cblas_dgemm"));
  auto corename = reinterpret_cast<const char* (*)()>(dlsym(h, "openblas_get_corename"));
  auto config = reinterpret_cast<const char* (*)()>(dlsym(h, "openblas_get_config"));
  if (!blas_sgemm || !blas_dgemm) {
    std::fprintf(stderr, "%s has no cblas_sgemm / cblas_dgemm\n", argv[1]);
    return 2;
  }
  if (argc > 3) grad::set_num_threads(static_cast<std::size_t>(std::atoi(argv[3])));
  std::printf("openblas: %s, core %s; grad threads %zu, isa %d\n", config ? config() : "?",
              corename ? corename() : "?", grad::num_threads(), static_cast<int>(grad::best_isa()));
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  const bool lm = argc > 4 && std::string(argv[4]) == "tinylm";
  run<float>("f32", rounds, lm ? tinylm_d96 : workload_b);
  run<double>("f64", rounds, lm ? tinylm_d96 : workload_b);
}
