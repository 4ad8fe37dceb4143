// exact_exp, exact_tanh, exact_sigmoid and exact_log (exact_math.hpp) against libm:
// error in ulps over dense sweeps and random bit patterns of the whole
// domain, and the special values bit for bit. The reference for double is
// long double libm (64-bit significand, so its own error is ~2^-11 of a
// double ulp); for float it is double libm. The ops' contract is <= 2 ulp
// from glibc (bit-pattern distance to libm's own results in T); the header
// documents < 1 ulp from the true value for exp, tanh and log, 1.5 for sigmoid.
// Both are asserted.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "grad/grad.hpp"
#include "grad/numerics/exact_math.hpp"
#include "support.hpp"

namespace {

using grad::exact_exp;
using grad::exact_log;
using grad::exact_sigmoid;
using grad::exact_tanh;

// The reference evaluates in R, a wider type than T.
template <class T>
using Wide = std::conditional_t<std::is_same_v<T, double>, long double, double>;

// |ours - ref| in units of T's ulp at ref (subnormal ulp below the normal
// range). Results that must round to inf must be inf; NaN must meet NaN.
template <class T>
double ulp_error(T ours, Wide<T> ref) {
  using W = Wide<T>;
  if (std::isnan(ref)) return std::isnan(ours) ? 0.0 : HUGE_VAL;
  const T rounded = static_cast<T>(ref);
  if (std::isinf(rounded)) return ours == rounded ? 0.0 : HUGE_VAL;
  if (!std::isfinite(ours)) return HUGE_VAL;
  constexpr int mantissa = std::numeric_limits<T>::digits - 1;
  constexpr int lowest = std::numeric_limits<T>::min_exponent - 1 - mantissa;  // exponent of denorm_min
  const int e = ref == 0 ? lowest : std::max(std::ilogb(ref) - mantissa, lowest);
  return static_cast<double>(std::fabs(static_cast<W>(ours) - ref) / std::ldexp(W(1), e));
}

// Number of representable T's between a and b (same sign handling as the
// ordering of IEEE bit patterns). Both finite or both the same inf.
template <class T>
std::uint64_t ulp_distance(T a, T b) {
  using Bits = std::conditional_t<std::is_same_v<T, double>, std::int64_t, std::int32_t>;
  auto ordered = [](T v) {
    const auto bits = std::bit_cast<Bits>(v);
    return bits < 0 ? static_cast<std::int64_t>(std::numeric_limits<Bits>::min()) - bits
                    : static_cast<std::int64_t>(bits);
  };
  const std::int64_t d = ordered(a) - ordered(b);
  return static_cast<std::uint64_t>(d < 0 ? -d : d);
}

template <class T>
T from_random_bits(grad::testing::Rng& rng) {
  if constexpr (std::is_same_v<T, double>)
    return std::bit_cast<double>(rng.next());
  else
    return std::bit_cast<float>(static_cast<std::uint32_t>(rng.next() >> 32));
}

struct Worst {
  double ulps = 0;
  double at = 0;
  std::uint64_t glibc_ulps = 0;  // bit-pattern distance to libm in T itself
  double glibc_at = 0;
  long count = 0;
};

// Records one input's errors against the wide reference and against libm in T.
template <class T, class Ours, class Ref>
void measure(Worst& w, T x, Ours ours, Ref ref) {
  const T y = ours(x);
  const double e = ulp_error<T>(y, ref(static_cast<Wide<T>>(x)));
  if (!(e <= w.ulps)) {
    w.ulps = e;
    w.at = static_cast<double>(x);
  }
  const T libm = static_cast<T>(ref(x));  // libm evaluated in T
  if (std::isfinite(libm) && std::isfinite(y)) {
    const std::uint64_t d = ulp_distance(y, libm);
    if (d > w.glibc_ulps) {
      w.glibc_ulps = d;
      w.glibc_at = static_cast<double>(x);
    }
  }
  ++w.count;
}

template <class T, class Ours, class Ref>
Worst sweep(Ours ours, Ref ref, double lo, double hi, long n) {
  Worst w;
  for (long i = 0; i <= n; ++i) measure<T>(w, static_cast<T>(lo + (hi - lo) * static_cast<double>(i) / n), ours, ref);
  return w;
}

// Geometric sweep over [lo, hi], lo > 0: every binade gets its share.
template <class T, class Ours, class Ref>
Worst geometric_sweep(Ours ours, Ref ref, double lo, double hi, long n) {
  Worst w;
  const double ratio = std::log(hi) - std::log(lo);  // hi / lo may overflow
  for (long i = 0; i <= n; ++i)
    measure<T>(w, static_cast<T>(lo * std::exp(ratio * static_cast<double>(i) / n)), ours, ref);
  return w;
}

template <class T, class Ours, class Ref>
Worst random_bits(Ours ours, Ref ref, long n, std::uint64_t seed) {
  Worst w;
  grad::testing::Rng rng(seed);
  for (long i = 0; i < n; ++i) measure<T>(w, from_random_bits<T>(rng), ours, ref);
  return w;
}

// Every float whose bit pattern is a multiple of `stride`, both signs: a
// uniform sample of all 2^32 patterns (an exhaustive run is ~1 minute at -O2).
template <class Ours, class Ref>
Worst strided_floats(Ours ours, Ref ref, std::uint32_t stride) {
  Worst w;
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += stride)
    measure<float>(w, std::bit_cast<float>(static_cast<std::uint32_t>(b)), ours, ref);
  return w;
}

// Prints the measurement (the suite doubles as the accuracy report) and
// holds it to the bounds: max_ulps from the truth, 2 ulp from libm.
template <class T>
void check(const Worst& w, const std::string& what, double max_ulps = 1.0) {
  MESSAGE(what << ": " << w.count << " inputs, max " << w.ulps << " ulp at " << w.at << "; max " << w.glibc_ulps
               << " ulp from libm, at " << w.glibc_at);
  CHECK(w.count > 0);
  CHECK(w.ulps < max_ulps);
  CHECK(w.glibc_ulps <= 2);
}

// One wrapper per function so that each is a distinct callable for templates.
template <class T>
T ours_exp(T x) {
  return exact_exp(x);
}
template <class T>
T ours_tanh(T x) {
  return exact_tanh(x);
}
template <class T>
T ours_sigmoid(T x) {
  return exact_sigmoid(x);
}
template <class T>
T ours_log(T x) {
  return exact_log(x);
}
template <class W>
W ref_exp(W x) {
  return std::exp(x);
}
template <class W>
W ref_tanh(W x) {
  return std::tanh(x);
}
template <class W>
W ref_sigmoid(W x) {
  return W(1) / (W(1) + std::exp(-x));
}
template <class W>
W ref_log(W x) {
  return std::log(x);
}

template <class T>
bool same_bits(T a, T b) {
  return std::bit_cast<std::conditional_t<std::is_same_v<T, double>, std::uint64_t, std::uint32_t>>(a) ==
         std::bit_cast<std::conditional_t<std::is_same_v<T, double>, std::uint64_t, std::uint32_t>>(b);
}

}  // namespace

TEST_CASE_TEMPLATE("exact_exp is within 1 ulp of the truth and 2 of libm: dense sweeps and random bit patterns", T,
                   double, float) {
  const double lo = std::is_same_v<T, double> ? -746.0 : -104.0, hi = std::is_same_v<T, double> ? 710.0 : 89.0;
  check<T>(sweep<T>(ours_exp<T>, ref_exp<Wide<T>>, lo, hi, 1'000'000), "exp, whole finite range");
  check<T>(sweep<T>(ours_exp<T>, ref_exp<Wide<T>>, -2.0, 2.0, 1'000'000), "exp, [-2, 2]");
  check<T>(sweep<T>(ours_exp<T>, ref_exp<Wide<T>>, lo, lo + 40, 300'000), "exp, subnormal results");
  check<T>(random_bits<T>(ours_exp<T>, ref_exp<Wide<T>>, 1'000'000, 7), "exp, random bit patterns");
}

TEST_CASE_TEMPLATE("exact_tanh is within 1 ulp of the truth and 2 of libm: dense sweeps and random bit patterns", T,
                   double, float) {
  check<T>(sweep<T>(ours_tanh<T>, ref_tanh<Wide<T>>, -25.0, 25.0, 1'000'000), "tanh, [-25, 25]");
  // Both sides of the switch from the odd series to the exp form at 0.625.
  check<T>(sweep<T>(ours_tanh<T>, ref_tanh<Wide<T>>, 0.4, 1.6, 1'000'000), "tanh, [0.4, 1.6]");
  check<T>(sweep<T>(ours_tanh<T>, ref_tanh<Wide<T>>, -1e-3, 1e-3, 300'000), "tanh, [-1e-3, 1e-3]");
  check<T>(random_bits<T>(ours_tanh<T>, ref_tanh<Wide<T>>, 1'000'000, 11), "tanh, random bit patterns");
}

// The quotient's own rounding is not corrected (that would take an exact
// product), so sigmoid is held to 1.5 ulp rather than 1.
TEST_CASE_TEMPLATE("exact_sigmoid is within 1.5 ulp of 1 / (1 + e^-x), including its subnormal tail", T, double,
                   float) {
  const double lo = std::is_same_v<T, double> ? -746.0 : -104.0;
  check<T>(sweep<T>(ours_sigmoid<T>, ref_sigmoid<Wide<T>>, lo, 40.0, 1'000'000), "sigmoid, [lo, 40]", 1.5);
  check<T>(sweep<T>(ours_sigmoid<T>, ref_sigmoid<Wide<T>>, -8.0, 8.0, 500'000), "sigmoid, [-8, 8]", 1.5);
  check<T>(random_bits<T>(ours_sigmoid<T>, ref_sigmoid<Wide<T>>, 500'000, 13), "sigmoid, random bit patterns", 1.5);
}

TEST_CASE_TEMPLATE("exact_log is within 1 ulp of the truth and 2 of libm: near 1, every binade, subnormals", T, double,
                   float) {
  using L = std::numeric_limits<T>;
  check<T>(sweep<T>(ours_log<T>, ref_log<Wide<T>>, 0.5, 2.0, 1'000'000), "log, [0.5, 2]");
  check<T>(geometric_sweep<T>(ours_log<T>, ref_log<Wide<T>>, static_cast<double>(L::min()),
                              static_cast<double>(L::max()), 1'000'000),
           "log, every normal binade");
  check<T>(geometric_sweep<T>(ours_log<T>, ref_log<Wide<T>>, static_cast<double>(L::denorm_min()),
                              static_cast<double>(L::min()), 200'000),
           "log, subnormal inputs");
  check<T>(random_bits<T>(ours_log<T>, ref_log<Wide<T>>, 1'000'000, 17), "log, random bit patterns");
}

TEST_CASE("float exp, tanh and log over a uniform sample of all 2^32 bit patterns") {
  // An odd stride, so that every exponent and many mantissa residues are hit.
  check<float>(strided_floats(ours_exp<float>, ref_exp<double>, 1021), "exp f32, every 1021st pattern");
  check<float>(strided_floats(ours_tanh<float>, ref_tanh<double>, 1021), "tanh f32, every 1021st pattern");
  check<float>(strided_floats(ours_log<float>, ref_log<double>, 1021), "log f32, every 1021st pattern");
}

TEST_CASE_TEMPLATE("exact_exp special values: zeros, subnormals, overflow, underflow, inf, NaN", T, double, float) {
  using L = std::numeric_limits<T>;
  CHECK(exact_exp(T(0)) == T(1));
  CHECK(exact_exp(-T(0)) == T(1));
  CHECK(exact_exp(L::denorm_min()) == T(1));
  CHECK(exact_exp(-L::denorm_min()) == T(1));
  CHECK(exact_exp(T(1)) == std::exp(T(1)));
  CHECK(exact_exp(L::infinity()) == L::infinity());
  CHECK(same_bits(exact_exp(-L::infinity()), T(0)));
  CHECK(std::isnan(exact_exp(L::quiet_NaN())));
  CHECK(std::isnan(exact_exp(-L::quiet_NaN())));
  CHECK(exact_exp(L::max()) == L::infinity());
  CHECK(same_bits(exact_exp(L::lowest()), T(0)));
  // The overflow edge: libm's last finite input and the next one up.
  const T last_finite = std::is_same_v<T, double> ? T(0x1.62e42fefa39efp+9) : T(0x1.62e42ep+6f);
  CHECK(std::isfinite(std::exp(last_finite)));
  CHECK(std::isinf(std::exp(std::nextafter(last_finite, L::infinity()))));
  CHECK(exact_exp(last_finite) == std::exp(last_finite));
  CHECK(exact_exp(std::nextafter(last_finite, L::infinity())) == L::infinity());
  // The underflow edge: the last input whose result rounds up to the smallest subnormal.
  const T last_nonzero = std::is_same_v<T, double> ? T(-0x1.74910d52d3051p+9) : T(-0x1.9fe368p+6f);
  CHECK(std::exp(last_nonzero) == L::denorm_min());
  CHECK(std::exp(std::nextafter(last_nonzero, -L::infinity())) == T(0));
  CHECK(exact_exp(last_nonzero) == L::denorm_min());
  CHECK(same_bits(exact_exp(std::nextafter(last_nonzero, -L::infinity())), T(0)));
  // Results between the normal range and zero are subnormal, rounded once.
  const T subnormal_in = std::is_same_v<T, double> ? T(-720) : T(-95);
  CHECK(exact_exp(subnormal_in) < L::min());
  CHECK(exact_exp(subnormal_in) > T(0));
  CHECK(ulp_distance(exact_exp(subnormal_in), std::exp(subnormal_in)) <= 1);
}

TEST_CASE_TEMPLATE("exact_tanh special values: signed zeros, subnormals, saturation to exactly +-1, inf, NaN", T,
                   double, float) {
  using L = std::numeric_limits<T>;
  CHECK(same_bits(exact_tanh(T(0)), T(0)));
  CHECK(same_bits(exact_tanh(-T(0)), -T(0)));
  for (T tiny : {L::denorm_min(), L::denorm_min() * T(3), L::min(), T(1e-30)}) {
    CHECK(same_bits(exact_tanh(tiny), tiny));
    CHECK(same_bits(exact_tanh(-tiny), -tiny));
  }
  CHECK(exact_tanh(L::infinity()) == T(1));
  CHECK(exact_tanh(-L::infinity()) == T(-1));
  CHECK(std::isnan(exact_tanh(L::quiet_NaN())));
  CHECK(std::isnan(exact_tanh(-L::quiet_NaN())));
  CHECK(exact_tanh(L::max()) == T(1));
  CHECK(exact_tanh(L::lowest()) == T(-1));
  // Saturation: from where 1 - tanh(x) drops below half an ulp of 1 on, the
  // result is exactly 1, as libm's is, and never more than 1 anywhere.
  const T saturated = std::is_same_v<T, double> ? T(19.1) : T(9.1);
  CHECK(std::tanh(saturated) == T(1));
  for (T x = saturated; x < T(1e6); x = x * T(1.001)) {
    REQUIRE(exact_tanh(x) == T(1));
    REQUIRE(exact_tanh(-x) == T(-1));
  }
  CHECK(exact_tanh(saturated * T(0.9)) < T(1));
}

TEST_CASE_TEMPLATE("exact_tanh is odd and exact_sigmoid(x) + exact_sigmoid(-x) is 1 within rounding", T, double,
                   float) {
  grad::testing::Rng rng(21);
  for (int i = 0; i < 200'000; ++i) {
    const T x = static_cast<T>(rng.uniform(-30.0, 30.0));
    REQUIRE(same_bits(exact_tanh(-x), -exact_tanh(x)));
    const T s = exact_sigmoid(x) + exact_sigmoid(-x);
    REQUIRE(std::fabs(s - T(1)) <= T(2) * std::numeric_limits<T>::epsilon());
  }
}

TEST_CASE_TEMPLATE("exact_sigmoid special values", T, double, float) {
  using L = std::numeric_limits<T>;
  CHECK(exact_sigmoid(T(0)) == T(0.5));
  CHECK(exact_sigmoid(-T(0)) == T(0.5));
  CHECK(exact_sigmoid(L::infinity()) == T(1));
  CHECK(same_bits(exact_sigmoid(-L::infinity()), T(0)));
  CHECK(std::isnan(exact_sigmoid(L::quiet_NaN())));
  CHECK(exact_sigmoid(T(50)) == T(1));
  // Far left the result is e^x itself, down into the subnormals.
  const T far_left = std::is_same_v<T, double> ? T(-730) : T(-100);
  CHECK(exact_sigmoid(far_left) == exact_exp(far_left));
  CHECK(exact_sigmoid(far_left) > T(0));
}

TEST_CASE_TEMPLATE("exact_log special values: zeros, one, subnormals, negatives, inf, NaN", T, double, float) {
  using L = std::numeric_limits<T>;
  CHECK(exact_log(T(0)) == -L::infinity());
  CHECK(exact_log(-T(0)) == -L::infinity());
  CHECK(same_bits(exact_log(T(1)), T(0)));
  CHECK(exact_log(T(2)) == std::log(T(2)));
  CHECK(exact_log(T(0.5)) == std::log(T(0.5)));
  CHECK(exact_log(L::infinity()) == L::infinity());
  CHECK(std::isnan(exact_log(-L::infinity())));
  CHECK(std::isnan(exact_log(T(-1))));
  CHECK(std::isnan(exact_log(-L::denorm_min())));
  CHECK(std::isnan(exact_log(L::quiet_NaN())));
  CHECK(exact_log(L::denorm_min()) == std::log(L::denorm_min()));
  CHECK(exact_log(L::min()) == std::log(L::min()));
  CHECK(ulp_distance(exact_log(L::max()), std::log(L::max())) <= 1);
  // Every power of two, subnormal ones included, is k ln 2 to within an ulp.
  for (int k = L::min_exponent - L::digits; k < L::max_exponent; ++k) {
    const T x = std::ldexp(T(1), k);
    REQUIRE(ulp_distance(exact_log(x), std::log(x)) <= 1);
  }
}

TEST_CASE("the tape's exp, log, tanh and sigmoid nodes compute exact_math's values") {
  grad::Tape<double> tp;
  const grad::Tensor<double> t({5}, {-800.0, -3.5, 0.25, 0.7, 30.0});
  auto x = tp.param(t);
  const auto e = tp.value(grad::exp(x)), th = tp.value(grad::tanh(x)), s = tp.value(grad::sigmoid(x));
  const auto lg = tp.value(grad::log(grad::exp(x)));
  for (std::size_t i = 0; i < t.size(); ++i) {
    const double v = t.data()[i];
    CHECK(same_bits(e.data[i], exact_exp(v)));
    CHECK(same_bits(th.data[i], exact_tanh(v)));
    CHECK(same_bits(s.data[i], exact_sigmoid(v)));
    CHECK(same_bits(lg.data[i], exact_log(exact_exp(v))));
  }
}

// The tags' loops are what the tape runs, auto-vectorised in optimised builds
// (-O3): every lane must give the scalar function's bits, special values too.
TEST_CASE_TEMPLATE("the tags' element loops give the scalar functions' bits, special values included", T, double,
                   float) {
  using L = std::numeric_limits<T>;
  grad::testing::Rng rng(29);
  std::vector<T> x;
  for (T v : {T(0), -T(0), L::denorm_min(), -L::denorm_min(), L::min(), L::max(), L::lowest(), L::infinity(),
              -L::infinity(), L::quiet_NaN(), T(0.625), T(20), T(-746), T(710)})
    x.push_back(v);
  while (x.size() < 20'000) {
    x.push_back(from_random_bits<T>(rng));
    x.push_back(static_cast<T>(rng.uniform(-30.0, 30.0)));
  }
  grad::NodeArgs<T> args;
  args.a.data = x.data();
  const std::size_t shape[] = {x.size()};
  args.a.dims = grad::Dims::of(shape);
  args.out = args.a.dims;
  std::vector<T> y(x.size());
  auto agrees = [&](T (*scalar)(T)) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      const T want = scalar(x[i]);
      if (!(same_bits(y[i], want) || (std::isnan(y[i]) && std::isnan(want)))) {
        INFO("x = " << x[i] << " (element " << i << "): loop " << y[i] << ", scalar " << want);
        return false;
      }
    }
    return true;
  };
  grad::Exp::forward_tensor(args, y.data());
  CHECK(agrees(ours_exp<T>));
  grad::Tanh::forward_tensor(args, y.data());
  CHECK(agrees(ours_tanh<T>));
  grad::Sigmoid::forward_tensor(args, y.data());
  CHECK(agrees(ours_sigmoid<T>));
  grad::Log::forward_tensor(args, y.data());
  CHECK(agrees(ours_log<T>));
}

// exact_tanh_array skips the arm a whole block of 16 does not need: blocks
// all below the split (NaN, zeros and subnormals among them), all at or
// above it (the split itself, inf, huge values) and mixed, at every block
// alignment and with ragged tails, must give exact_tanh's bits element by
// element.
TEST_CASE_TEMPLATE("exact_tanh_array gives exact_tanh's bits for near-only, far-only and mixed blocks", T, double,
                   float) {
  using L = std::numeric_limits<T>;
  grad::testing::Rng rng(31);
  const T split = T(0.625);
  const T near_specials[] = {T(0), -T(0), L::denorm_min(), -L::min(), std::nextafter(split, T(0)), L::quiet_NaN()};
  const T far_specials[] = {split, -split, T(20), L::infinity(), -L::infinity(), L::max(), std::nextafter(split, T(1))};
  std::vector<T> x;
  for (std::size_t block = 0; block < 30'000; ++block)
    for (std::size_t j = 0; j < 16; ++j) {
      const std::size_t kind = block % 3;  // 0 near, 1 far, 2 mixed
      const bool near = kind == 0 || (kind == 2 && rng.uniform(0, 1) < 0.5);
      const bool special = rng.uniform(0, 1) < 0.05;
      const T sign = rng.uniform(0, 1) < 0.5 ? T(-1) : T(1);
      if (near)
        x.push_back(special ? near_specials[block % 6] : sign * static_cast<T>(rng.uniform(0, 0.625)));
      else
        x.push_back(special ? far_specials[block % 7] : sign * static_cast<T>(rng.uniform(0.625, 30)));
    }
  std::vector<T> y(x.size());
  for (std::size_t offset : {0, 1, 7, 15}) {
    const std::size_t n = x.size() - offset - offset % 5;  // ragged tail too
    grad::exact_tanh_array(x.data() + offset, y.data(), n);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const T want = grad::exact_tanh(x[offset + i]);
      if (!(same_bits(y[i], want) || (std::isnan(y[i]) && std::isnan(want)))) ++wrong;
    }
    INFO("offset " << offset);
    CHECK(wrong == 0);
  }
}
