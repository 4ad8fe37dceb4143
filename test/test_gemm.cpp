// The blocked matrix kernels (gemm.hpp) against the plain reference loops
// that define the summation order: bit for bit, over odd sizes, tails and
// blocking boundaries, on every instruction set this CPU has and on several
// thread counts.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support.hpp"

using namespace grad;
using namespace grad::testing;
using gemm_detail::Isa;

namespace {

struct Dims3 {
  std::size_t m, k, n;  // C[m,n] = A[m,k] B[k,n] for the forward product
};

// Small odd sizes, tails of every register tile, and sizes crossing the
// cache blocks (kc = 256, mc = 96, nc = 1024 floats / 512 doubles).
std::vector<Dims3> shapes() {
  std::vector<Dims3> s;
  const std::size_t small[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33};
  for (std::size_t m : small)
    for (std::size_t k : {1, 4, 13})
      for (std::size_t n : small) s.push_back({m, k, n});
  Rng rng(77);
  for (int i = 0; i < 24; ++i) {  // random mid-size shapes
    auto pick = [&](std::size_t lo, std::size_t hi) {
      return lo + static_cast<std::size_t>(rng.next() % (hi - lo + 1));
    };
    s.push_back({pick(1, 130), pick(1, 300), pick(1, 140)});
  }
  s.push_back({97, 257, 33});    // one row and one term past mc and kc
  s.push_back({8, 520, 1025});   // crosses kc twice and nc (f32 and f64)
  s.push_back({200, 6, 64});     // workload A's first layer
  s.push_back({200, 64, 6});     // and its last: one strip, a read straight from a
  s.push_back({130, 300, 600});  // large enough to be split across threads
  s.push_back({1, 520, 1031});   // one row (multiply_row): kc crossed twice, a ragged tail
  s.push_back({1, 257, 77});     // one row: whole strips, one-vector strips and scalar columns
  s.push_back({1, 700, 2003});   // one row, split across threads by columns
  s.push_back({40, 300, 24});    // an attention head's width: tail strips only, past kc (partial sums reloaded)
  s.push_back({13, 600, 30});
  s.push_back({20, 270, 60});  // a strip's width less a few columns, past kc
  s.push_back({25, 9, 113});   // a whole strip and ragged tail strips
  // Every tail strip's width (1 to 72 output columns: each multiple of a
  // half vector up to a full strip and past it, and the ragged ones between)
  // in every layout: the output is m x n (nn), m x k (nt), k x n (tn).
  for (std::size_t w = 1; w <= 72; ++w) {
    s.push_back({13, 11, w});
    s.push_back({13, w, 11});
  }
  return s;
}

// Values of mixed signs and magnitudes (so that any reordered sum would
// round differently), with some negative zeros (0 + -0 must give +0 as the
// reference's "start from zero" does).
template <class T>
std::vector<T> operand(std::size_t size, Rng& rng) {
  std::vector<T> v(size);
  for (T& x : v) {
    const double scale = std::ldexp(1.0, static_cast<int>(rng.next() % 20) - 10);
    x = static_cast<T>(rng.uniform(-1, 1) * scale);
    if (rng.next() % 17 == 0) x = T(-0.0);
  }
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return bitwise_equal<T>(std::span<const T>(a), std::span<const T>(b));
}

enum class Layout { nn, nt, tn };

// One product in one layout on one instruction set, checked against the
// reference; C starts as NaN so that a kernel must write every element.
template <class T>
bool blocked_equals_reference(Layout layout, Isa isa, const Dims3& d, Rng& rng) {
  const std::size_t m = d.m, k = d.k, n = d.n;
  std::vector<T> want, got;
  if (layout == Layout::nn) {  // C[m,n] = A[m,k] B[k,n]
    const auto A = operand<T>(m * k, rng), B = operand<T>(k * n, rng);
    want.assign(m * n, T(0));
    got.assign(m * n, std::numeric_limits<T>::quiet_NaN());
    reference::gemm_nn(A.data(), B.data(), want.data(), m, k, n);
    gemm_detail::multiply<T>(isa, {{A.data(), k, 1}, {B.data(), n, 1}, got.data(), m, n, k});
  } else if (layout == Layout::nt) {  // C[m,k] = G[m,n] B[k,n]^T
    const auto G = operand<T>(m * n, rng), B = operand<T>(k * n, rng);
    want.assign(m * k, T(0));
    got.assign(m * k, std::numeric_limits<T>::quiet_NaN());
    reference::gemm_nt(G.data(), B.data(), want.data(), m, n, k);
    gemm_detail::multiply<T>(isa, {{G.data(), n, 1}, {B.data(), 1, n}, got.data(), m, k, n});
  } else {  // C[k,n] = A[m,k]^T G[m,n]
    const auto A = operand<T>(m * k, rng), G = operand<T>(m * n, rng);
    want.assign(k * n, T(0));
    got.assign(k * n, std::numeric_limits<T>::quiet_NaN());
    reference::gemm_tn(A.data(), G.data(), want.data(), m, k, n);
    gemm_detail::multiply<T>(isa, {{A.data(), 1, k}, {G.data(), n, 1}, got.data(), k, n, m});
  }
  return same_bits(want, got);
}

template <class T>
void check_every_shape(std::size_t threads) {
  set_num_threads(threads);
  REQUIRE(num_threads() == threads);
  for (Isa isa : {Isa::baseline, Isa::avx2, Isa::avx512}) {
    if (!gemm_detail::supported(isa)) continue;
    Rng rng(1234);
    for (const Dims3& d : shapes())
      for (Layout layout : {Layout::nn, Layout::nt, Layout::tn}) {
        INFO("isa ", static_cast<int>(isa), " layout ", static_cast<int>(layout), " m ", d.m, " k ", d.k, " n ", d.n,
             " threads ", threads);
        CHECK(blocked_equals_reference<T>(layout, isa, d, rng));
      }
  }
  set_num_threads(1);
}

}  // namespace

TEST_CASE_TEMPLATE("blocked gemm equals the reference loops bit for bit on one thread", T, double, float) {
  check_every_shape<T>(1);
}

TEST_CASE_TEMPLATE("blocked gemm equals the reference loops bit for bit on three threads", T, double, float) {
  check_every_shape<T>(3);
}

// Problem::a_in_place: the row panels read where they lie, partial panels
// and tail strips included, on every instruction set; and multiply choosing
// it for a larger-than-L2 a whose columns are split over three threads.
TEST_CASE_TEMPLATE("reading a in place gives the packed blocks' bits", T, double, float) {
  Rng rng(31);
  for (Isa isa : {Isa::baseline, Isa::avx2, Isa::avx512}) {
    if (!gemm_detail::supported(isa)) continue;
    for (const Dims3& d : {Dims3{97, 300, 200}, Dims3{171, 520, 77}, Dims3{13, 11, 72}, Dims3{6, 257, 1025}}) {
      const std::size_t m = d.m, k = d.k, n = d.n;
      const auto A = operand<T>(m * k, rng), B = operand<T>(k * n, rng), Bt = operand<T>(n * k, rng);
      std::vector<T> want(m * n, T(0)), got(m * n, std::numeric_limits<T>::quiet_NaN());
      INFO("isa ", static_cast<int>(isa), " m ", m, " k ", k, " n ", n);
      reference::gemm_nn(A.data(), B.data(), want.data(), m, k, n);
      gemm_detail::Problem<T> nn{{A.data(), k, 1}, {B.data(), n, 1}, got.data(), m, n, k};
      nn.a_in_place = true;
      gemm_detail::multiply_range(isa, nn, 0, m, 0, n);
      CHECK(same_bits(want, got));
      std::fill(want.begin(), want.end(), T(0));
      std::fill(got.begin(), got.end(), std::numeric_limits<T>::quiet_NaN());
      reference::gemm_nt(A.data(), Bt.data(), want.data(), m, k, n);  // C[m,n] = A[m,k] Bt[n,k]^T
      gemm_detail::Problem<T> nt{{A.data(), k, 1}, {Bt.data(), 1, k}, got.data(), m, n, k};
      nt.a_in_place = true;
      gemm_detail::multiply_range(isa, nt, 0, m, 0, n);
      CHECK(same_bits(want, got));
    }
  }
  // Just past L2 (whatever this machine's is) by its length, split by columns (m <= n).
  const std::size_t m = 100, n = 203, k = gemm_detail::cache_blocking().l2_bytes / (m * sizeof(T)) + 3;
  const auto A = operand<T>(m * k, rng), B = operand<T>(k * n, rng);
  const gemm_detail::Problem<T> large{{A.data(), k, 1}, {B.data(), n, 1}, nullptr, m, n, k};
  CHECK(gemm_detail::a_in_place_when_split(large));
  // gemm_tn's a (A^T, columns contiguous) is packed whatever its size: only the choice is asked, nothing multiplied.
  const gemm_detail::Problem<T> transposed{{A.data(), 1, k}, {B.data(), n, 1}, nullptr, k, n, m};
  CHECK_FALSE(gemm_detail::a_in_place_when_split(transposed));
  std::vector<T> want(m * n, T(0)), got(m * n, std::numeric_limits<T>::quiet_NaN());
  reference::gemm_nn(A.data(), B.data(), want.data(), m, k, n);
  set_num_threads(3);
  gemm_nn(A.data(), B.data(), got.data(), m, k, n);
  set_num_threads(1);
  CHECK(same_bits(want, got));
}

// A b held in 16 bits (a frozen base, Storage::bf16 or f16) is widened while
// it is packed, or as it is loaded by the one-row kernels (a decoding step):
// the product's bits are the reference's over the widened values, in both b
// layouts (nn: rows of b contiguous; nt: b's terms contiguous, the
// transposed squares), on every instruction set and on one and three
// threads. The halves are any finite bits (subnormals to 65504).
TEST_CASE_TEMPLATE("a 16-bit b gives the bits of the product over its widened values", T, double, float) {
  Rng rng(41);
  for (const Storage storage : {Storage::bf16, Storage::f16})
    for (const std::size_t threads : {1, 3}) {
      set_num_threads(threads);
      for (Isa isa : {Isa::baseline, Isa::avx2, Isa::avx512}) {
        if (!gemm_detail::supported(isa)) continue;
        for (const Dims3& d : {Dims3{1, 520, 1031}, Dims3{1, 257, 77}, Dims3{1, 13, 5}, Dims3{1, 700, 2003},
                               Dims3{97, 300, 200}, Dims3{13, 11, 72}, Dims3{130, 300, 600}, Dims3{6, 17, 33}}) {
          const std::size_t m = d.m, k = d.k, n = d.n;
          const auto A = operand<T>(m * k, rng);
          std::vector<std::uint16_t> bits(k * n);
          std::vector<T> widened(k * n);
          for (std::size_t i = 0; i < bits.size(); ++i) {
            if (storage == Storage::f16) {
              do bits[i] = static_cast<std::uint16_t>(rng.next() >> 48);
              while ((bits[i] & 0x7c00u) == 0x7c00u);
            } else {
              bits[i] = round_to_bf16(rng.uniform(-2, 2));
            }
            widened[i] = widen<T>(storage, bits[i]);
          }
          const T* B16 = reinterpret_cast<const T*>(bits.data());
          INFO(storage_name(storage), " isa ", static_cast<int>(isa), " m ", m, " k ", k, " n ", n, " threads ",
               threads);
          std::vector<T> want(m * n, T(0)), got(m * n, std::numeric_limits<T>::quiet_NaN());
          reference::gemm_nn(A.data(), widened.data(), want.data(), m, k, n);  // b [k, n]
          gemm_detail::multiply<T>(isa, {{A.data(), k, 1}, {B16, n, 1, storage}, got.data(), m, n, k});
          CHECK(same_bits(want, got));
          std::fill(got.begin(), got.end(), std::numeric_limits<T>::quiet_NaN());
          reference::gemm_nt(A.data(), widened.data(), want.data(), m, k, n);  // the same bits read as b [n, k]
          gemm_detail::multiply<T>(isa, {{A.data(), k, 1}, {B16, 1, k, storage}, got.data(), m, n, k});
          CHECK(same_bits(want, got));
        }
      }
    }
  set_num_threads(1);
}

TEST_CASE("bfloat16 rounding: to nearest, ties to even; NaN and infinities kept; widening exact") {
  CHECK(round_to_bf16(1.0f) == 0x3f80);
  CHECK(round_to_bf16(std::bit_cast<float>(0x3f808000u)) == 0x3f80);  // a tie: to the even 0x3f80
  CHECK(round_to_bf16(std::bit_cast<float>(0x3f818000u)) == 0x3f82);  // a tie: to the even 0x3f82
  CHECK(round_to_bf16(std::bit_cast<float>(0x3f808001u)) == 0x3f81);  // past the tie: up
  CHECK(round_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(std::isnan(widen_bf16<float>(round_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(widen_bf16<float>(round_to_bf16(std::bit_cast<float>(0x7f800001u)))));  // a signalling NaN stays NaN
  CHECK(widen_bf16<double>(0xc0a0) == -5.0);
  CHECK(std::bit_cast<std::uint32_t>(widen_bf16<float>(0x8000)) == 0x80000000u);  // -0
}

// Half precision against the numbers themselves: a half with exponent field
// e and fraction f is (1 + f / 1024) 2^(e - 15), or f 2^-24 when e is 0.
TEST_CASE("half rounding: to nearest, ties to even, subnormals, overflow; widening exact") {
  const auto half_value = [](std::uint16_t h) {
    const int e = h >> 10 & 31, f = h & 1023;
    const double v = e == 0 ? std::ldexp(f, -24) : std::ldexp(1024 + f, e - 25);
    return h & 0x8000 ? -v : v;
  };
  for (std::uint32_t h = 0; h < 0x10000; ++h) {  // every finite half widens to its value and rounds back to itself
    const auto bits = static_cast<std::uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00) continue;
    INFO("half ", h);
    REQUIRE(widen_f16<double>(bits) == half_value(bits));
    REQUIRE(std::signbit(widen_f16<float>(bits)) == ((bits & 0x8000) != 0));
    REQUIRE(round_to_f16(widen_f16<float>(bits)) == bits);
    REQUIRE(round_to_f16(widen_f16<double>(bits)) == bits);
  }
  CHECK(round_to_f16(1.0f) == 0x3c00);
  CHECK(round_to_f16(65504.0f) == 0x7bff);
  CHECK(round_to_f16(65519.99f) == 0x7bff);
  CHECK(round_to_f16(65520.0f) == 0x7c00);  // the tie past the largest half: to the even, an infinity
  CHECK(round_to_f16(-1e30) == 0xfc00);
  CHECK(round_to_f16(std::ldexp(1.0, -24)) == 0x0001);  // the least subnormal
  CHECK(round_to_f16(std::ldexp(1.0, -25)) == 0x0000);  // a tie: to the even 0
  CHECK(round_to_f16(std::ldexp(3.0, -25)) == 0x0002);  // a tie: to the even 2
  CHECK(round_to_f16(std::ldexp(1.0, -25) + std::ldexp(1.0, -40)) == 0x0001);  // past the tie: up
  CHECK(round_to_f16(std::ldexp(1023.5, -24)) == 0x0400);  // the largest subnormal's tie: up to the least normal
  CHECK(round_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // a tie: to the even 0x3c00
  CHECK(round_to_f16(1.0f + std::ldexp(3.0f, -11)) == 0x3c02);  // a tie: to the even 0x3c02
  CHECK(round_to_f16(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)) == 0x3c01);  // a double past the tie
  CHECK(round_to_f16(-0.0f) == 0x8000);
  CHECK(round_to_f16(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(round_to_f16(std::numeric_limits<double>::quiet_NaN()) == 0x7e00);
  CHECK(std::isinf(widen_f16<float>(0x7c00)));
  CHECK(std::bit_cast<std::uint32_t>(widen_f16<float>(0x7e01)) == 0x7fc02000u);  // a NaN's payload kept
  CHECK(std::bit_cast<std::uint32_t>(widen_f16<float>(0xfd00)) == 0xffe00000u);  // a signalling one's, made quiet
}

// The kernels' vector widening (Terms::load, as each instruction set's
// width uses it; AVX-512's halves through vcvtph2ps, in a function of that
// target) gives the scalar widening's bits for every 16-bit pattern.
template <class T, std::size_t Lanes, class Format>
[[gnu::noinline]] typename gemm_detail::Terms<T, Lanes, Format>::V widen_vector(const std::uint16_t* p) {
  return gemm_detail::Terms<T, Lanes, Format>::load(p);
}
#if GRAD_HAS_ISA_TARGETS
[[gnu::noinline]] GRAD_TARGET_AVX512 void widen_f16_avx512(const std::uint16_t* p, float* out) {
  const auto v = gemm_detail::Terms<float, 16, F16>::load(p);
  std::memcpy(out, &v, sizeof(v));
}
#endif
template <class T, std::size_t Lanes, class Format>
void check_vector_widening() {
  std::vector<std::uint16_t> all(0x10000);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  for (std::size_t i = 0; i < all.size(); i += Lanes) {
    T got[Lanes];
#if GRAD_HAS_ISA_TARGETS
    if constexpr (std::is_same_v<T, float> && Lanes == 16 && std::is_same_v<Format, F16>) {
      if (!supported(Isa::avx512)) return;
      widen_f16_avx512(all.data() + i, got);
    } else
#endif
    {
      const auto v = widen_vector<T, Lanes, Format>(all.data() + i);
      std::memcpy(got, &v, sizeof(v));
    }
    for (std::size_t l = 0; l < Lanes; ++l) {
      INFO("bits ", i + l, " lanes ", Lanes);
      const T want = static_cast<T>(Format::widen(all[i + l]));
      REQUIRE(std::memcmp(&got[l], &want, sizeof(T)) == 0);
    }
  }
}
TEST_CASE("the kernels' vector widening equals the scalar one for every bfloat16 and half") {
  check_vector_widening<float, 4, F16>();
  check_vector_widening<float, 8, F16>();
  check_vector_widening<double, 8, F16>();
  check_vector_widening<float, 16, F16>();  // last: it returns early without AVX-512
  check_vector_widening<float, 16, Bf16>();
  check_vector_widening<double, 4, Bf16>();
}

TEST_CASE_TEMPLATE("the public gemm entry points match the reference on the best instruction set", T, double, float) {
  Rng rng(5);
  const std::size_t m = 37, k = 300, n = 41;
  const auto A = operand<T>(m * k, rng), B = operand<T>(k * n, rng), G = operand<T>(m * n, rng);
  std::vector<T> want(m * n), got(m * n);
  reference::gemm_nn(A.data(), B.data(), want.data(), m, k, n);
  gemm_nn(A.data(), B.data(), got.data(), m, k, n);
  CHECK(same_bits(want, got));
  std::vector<T> want_a(m * k), got_a(m * k);
  reference::gemm_nt(G.data(), B.data(), want_a.data(), m, n, k);
  gemm_nt(G.data(), B.data(), got_a.data(), m, n, k);
  CHECK(same_bits(want_a, got_a));
  std::vector<T> want_b(k * n), got_b(k * n);
  reference::gemm_tn(A.data(), G.data(), want_b.data(), m, k, n);
  gemm_tn(A.data(), G.data(), got_b.data(), m, k, n);
  CHECK(same_bits(want_b, got_b));
}

TEST_CASE_TEMPLATE("gemm_tn over rows in chunks, continued, gives one gemm_tn's bits (1 and 3 threads)", T, double,
                   float) {
  Rng rng(8);
  const std::size_t m = 300;  // m spans two of the kc blocks
  // k = 1: C is one row (multiply_row, continuing from what C holds); n = 24:
  // tail strips only, continued from C
  for (const auto& [k, n] : {std::pair<std::size_t, std::size_t>{45, 260}, {1, 260}, {45, 24}}) {
    const auto A = operand<T>(m * k, rng), G = operand<T>(m * n, rng);
    std::vector<T> want(k * n);
    reference::gemm_tn(A.data(), G.data(), want.data(), m, k, n);
    for (std::size_t threads : {1, 3}) {
      set_num_threads(threads);
      for (std::size_t chunk : {1, 7, 32, 299}) {
        CAPTURE(k);
        CAPTURE(threads);
        CAPTURE(chunk);
        std::vector<T> got(k * n, std::numeric_limits<T>::quiet_NaN());
        for (std::size_t r0 = 0; r0 < m; r0 += chunk) {
          const std::size_t rows = std::min(chunk, m - r0);
          (r0 == 0 ? gemm_tn<T> : gemm_tn_continue<T>)(A.data() + r0 * k, G.data() + r0 * n, got.data(), rows, k, n);
        }
        CHECK(same_bits(want, got));
      }
    }
  }
  set_num_threads(1);
  std::vector<T> kept(6, T(7));
  gemm_tn_continue<T>(nullptr, nullptr, kept.data(), 0, 2, 3);  // no rows: C as it was
  for (T x : kept) CHECK(x == T(7));
}

TEST_CASE_TEMPLATE("an empty sum (k = 0) gives zeros and empty outputs are left alone", T, double, float) {
  std::vector<T> c(12, T(7));
  gemm_nn<T>(nullptr, nullptr, c.data(), 3, 0, 4);
  for (T x : c) CHECK(x == T(0));
  gemm_nn<T>(nullptr, nullptr, nullptr, 0, 5, 0);  // nothing to write, must not touch memory
}

// The comparison is sharp enough to see a reordered sum: the same products
// summed in descending k differ from the reference somewhere.
TEST_CASE("summing in another order is detected by the bitwise comparison") {
  Rng rng(3);
  const std::size_t m = 16, k = 200, n = 16;
  const auto A = operand<float>(m * k, rng), B = operand<float>(k * n, rng);
  std::vector<float> want(m * n), reversed(m * n, 0.0f);
  reference::gemm_nn(A.data(), B.data(), want.data(), m, k, n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = k; p-- > 0;)
      for (std::size_t j = 0; j < n; ++j) reversed[i * n + j] = reversed[i * n + j] + A[i * k + p] * B[p * n + j];
  CHECK_FALSE(same_bits(want, reversed));
}

// The test runner runs this suite with GRAD_ISA unset, "baseline" and "avx2".
TEST_CASE("best_isa is the widest set the CPU has, capped by GRAD_ISA") {
  const Isa widest = supported(Isa::avx512) ? Isa::avx512 : supported(Isa::avx2) ? Isa::avx2 : Isa::baseline;
  const char* cap = std::getenv("GRAD_ISA");
  const std::string name = cap ? cap : "";
  if (name == "baseline")
    CHECK(best_isa() == Isa::baseline);
  else if (name == "avx2")
    CHECK(best_isa() == (widest == Isa::avx512 ? Isa::avx2 : widest));
  else
    CHECK(best_isa() == widest);
}

TEST_CASE("set_num_threads: 0 means one per hardware thread, and 1 restores the default") {
  set_num_threads(0);
  CHECK(num_threads() >= 1);
  set_num_threads(2);
  CHECK(num_threads() == 2);
  set_num_threads(1);
  CHECK(num_threads() == 1);
}

// The pool deals each job's parts out in contiguous shares, one per thread,
// and a thread that is done with its own helps with the others': whatever
// the count of parts (fewer than the threads, not a multiple of them, one
// per thread, many), every part runs exactly once, and jobs issued back to
// back (the workers spinning or asleep between them) never mix.
TEST_CASE("parallel_for: every part exactly once, for any count of parts and threads") {
  for (const std::size_t threads : {2, 3, 4}) {
    set_num_threads(threads);
    for (const std::size_t parts : {2, 3, 4, 5, 7, 8, 12, 13, 64, 1000}) {
      std::vector<std::atomic<int>> runs(parts);
      struct Job {
        std::vector<std::atomic<int>>* runs;
      } job{&runs};
      for (int repeat = 0; repeat < 50; ++repeat)
        parallel_for(parts, [](void* c, std::size_t p) { (*static_cast<Job*>(c)->runs)[p].fetch_add(1); }, &job);
      INFO("threads ", threads, " parts ", parts);
      CHECK(std::all_of(runs.begin(), runs.end(), [](const std::atomic<int>& r) { return r.load() == 50; }));
    }
  }
  set_num_threads(1);
}

// parallel_each gives every item its own part; a kernel called inside a part
// runs on that thread alone (a nested run is serial instead of locking the
// pool again), with the bits it has anywhere else.
TEST_CASE_TEMPLATE("parallel_each: every item once, and products inside its parts give their usual bits", T, double,
                   float) {
  Rng rng(5);
  const std::size_t items = 7, m = 40, k = 90, n = 130;  // m * n * k past the gemm's parallel threshold
  const Tensor<T> a = random_tensor<T>({items, m, k}, rng), b = random_tensor<T>({k, n}, rng);
  std::vector<T> alone(items * m * n), inside(items * m * n);
  const T *pa = a.data().data(), *pb = b.data().data();
  for (std::size_t i = 0; i < items; ++i) gemm_nn(pa + i * m * k, pb, &alone[i * m * n], m, k, n);
  for (const std::size_t threads : {2, 3}) {
    set_num_threads(threads);
    std::vector<int> visits(items, 0);
    std::fill(inside.begin(), inside.end(), T(-1));
    parallel_each(items, [&](std::size_t i) {
      ++visits[i];
      CHECK(parallel_detail::free_threads() == 1);
      gemm_nn(pa + i * m * k, pb, &inside[i * m * n], m, k, n);
      parallel_ranges(m * n, 1, [&](std::size_t lo, std::size_t hi) {  // nested elementwise loop: serial
        for (std::size_t e = lo; e < hi; ++e) inside[i * m * n + e] = inside[i * m * n + e] * T(1);
      });
    });
    CHECK(std::all_of(visits.begin(), visits.end(), [](int v) { return v == 1; }));
    CHECK(same_bits(alone, inside));
    CHECK(parallel_detail::free_threads() == threads);
  }
  set_num_threads(1);
}

// Elementwise loops long enough to be split over the pool (and a matmul
// large enough to be) give the same values and gradients on any thread count.
TEST_CASE_TEMPLATE("a training graph gives the same bits on one and three threads", T, double, float) {
  auto run = [](std::size_t threads) {
    set_num_threads(threads);
    Rng rng(11);
    Tape<T> tp;
    auto x = tp.param(random_tensor<T>({300, 260}, rng));
    auto w = tp.param(random_tensor<T>({260, 270}, rng));
    auto b = tp.param(random_tensor<T>({270}, rng));
    auto s = tp.param(random_tensor<T>({300, 1}, rng));  // broadcast along the last axis
    auto c = tp.param(random_tensor<T>({1, 270}, rng));  // broadcast on the left of a binary op
    auto h = relu(matmul(x, w) + b);
    auto u = c - h * s;
    auto loss = mean(h * h - h * T(0.5) + u * u);
    REQUIRE(tp.backward(loss));
    std::vector<T> out;
    for (auto v : {h, x, w, b, s, c}) {
      const View<T> g = v.index() == h.index() ? tp.value(v) : tp.grad(v);
      out.insert(out.end(), g.data.begin(), g.data.end());
    }
    set_num_threads(1);
    return out;
  };
  CHECK(same_bits(run(1), run(3)));
}

// The optimizers' loops (update.hpp) run on packs of the best instruction
// set, with the Adam step spelled out lane by lane: every element must get
// the bits of the GRAD_HD rules (opt.hpp) that the device engine runs, at
// every length (whole packs and ragged tails), special values included.
TEST_CASE_TEMPLATE("the SGD and Adam update loops give the rules' bits at every length", T, double, float) {
  Rng rng(41);
  const T scale = T(0.75), l2 = T(1e-3), lr = T(0.01), beta1 = T(0.9), beta2 = T(0.999), eps = T(1e-8);
  const AdamStepConstants<T> c = AdamRule::constants(lr, beta1, beta2, T(0.9 * 0.9), T(0.999 * 0.999));
  for (std::size_t n : {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 1000}) {
    std::vector<T> w = operand<T>(n, rng), g = operand<T>(n, rng), m = operand<T>(n, rng), v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = std::abs(operand<T>(1, rng)[0]);
    if (n > 4) {
      g[1] = T(0);
      v[2] = T(0);
      g[3] = std::numeric_limits<T>::quiet_NaN();
    }
    std::vector<T> w_sgd = w, want_sgd = w;
    kernels::sgd_update<ClipRule, SgdRule>(w_sgd.data(), g.data(), n, scale, l2, lr);
    for (std::size_t i = 0; i < n; ++i)
      want_sgd[i] = SgdRule::update(want_sgd[i], ClipRule::effective(g[i], want_sgd[i], scale, l2), lr);
    // Both forms of Adam; the PyTorch one with AdamW's decoupled decay too.
    const AdamStepConstants<T> torch_form =
        AdamRule::constants(lr, beta1, beta2, T(0.9 * 0.9), T(0.999 * 0.999), AdamForm::pytorch);
    for (const auto& [constants, decay] : {std::pair{c, T(1)}, std::pair{torch_form, AdamRule::decay_factor(lr, T(0.1))}}) {
      std::vector<T> w_adam = w, m_adam = m, v_adam = v, want_w = w, want_m = m, want_v = v;
      kernels::adam_update<ClipRule, AdamRule>(w_adam.data(), m_adam.data(), v_adam.data(), g.data(), n, scale, l2,
                                               beta1, beta2, eps, constants, decay);
      for (std::size_t i = 0; i < n; ++i)
        AdamRule::update(want_w[i], want_m[i], want_v[i], ClipRule::effective(g[i], want_w[i], scale, l2), beta1,
                         beta2, eps, constants, decay);
      INFO("n = " << n << ", decay " << decay);
      CHECK(same_bits(w_adam, want_w));
      CHECK(same_bits(m_adam, want_m));
      CHECK(same_bits(v_adam, want_v));
    }
    INFO("n = " << n);
    CHECK(same_bits(w_sgd, want_sgd));
  }
}

// The elementwise loops run whole packs, then the ragged tail through a
// padded pack; bias-style broadcasts go row by row. Every length from 1 to
// past two AVX-512 packs of floats, against the tags' scalar functors.
TEST_CASE_TEMPLATE("elementwise and broadcast loops give the scalar functors' bits at every length", T, double,
                   float) {
  Rng rng(43);
  for (std::size_t n = 1; n <= 40; ++n) {
    std::vector<T> a = operand<T>(3 * n, rng), b = operand<T>(3 * n, rng), row = operand<T>(n, rng);
    for (T& x : a) x = x + T(2);  // away from zero, for div and log
    NodeArgs<T> x;
    x.a.data = a.data();
    x.b.data = b.data();
    const std::size_t full[] = {3, n}, bias[] = {n};
    x.a.dims = Dims::of(full);
    x.b.dims = x.a.dims;
    x.out = x.a.dims;
    x.scalar = T(1.5);
    std::vector<T> y(3 * n), want(3 * n);
    Div::forward_tensor(x, y.data());
    for (std::size_t i = 0; i < 3 * n; ++i) want[i] = Div::forward(a[i], b[i]);
    CHECK(same_bits(y, want));
    Tanh::forward_tensor(x, y.data());
    for (std::size_t i = 0; i < 3 * n; ++i) want[i] = Tanh::forward(a[i], x.scalar);
    CHECK(same_bits(y, want));
    Log::forward_tensor(x, y.data());
    for (std::size_t i = 0; i < 3 * n; ++i) want[i] = Log::forward(a[i], x.scalar);
    CHECK(same_bits(y, want));
    std::vector<T> dx(3 * n);
    Sigmoid::backward_tensor<0>(x, b.data(), a.data(), dx.data());
    for (std::size_t i = 0; i < 3 * n; ++i) want[i] = Sigmoid::backward(a[i], b[i], a[i], x.scalar);
    CHECK(same_bits(dx, want));
    // a [3, n] + bias [n]: forward, and the bias gradient summed over rows.
    x.b.data = row.data();
    x.b.dims = Dims::of(bias);
    Add::forward_tensor(x, y.data());
    for (std::size_t i = 0; i < 3 * n; ++i) want[i] = a[i] + row[i % n];
    CHECK(same_bits(y, want));
    std::vector<T> db(n), want_db(n, T(0));
    Mul::backward_tensor<1>(x, y.data(), b.data(), db.data());
    for (std::size_t i = 0; i < 3 * n; ++i) want_db[i % n] = want_db[i % n] + b[i] * a[i];
    INFO("n = " << n);
    CHECK(same_bits(db, want_db));
  }
}
