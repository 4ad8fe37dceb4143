// Top-k and argmax on the GPU (grad/device/sampling.hpp) against the CPU's
// order (nn::top_k_order, which nn::generate samples from): the same ids
// and the same value bits, ties and signed zeros included. The argument
// checks run everywhere; the GPU cases skip (or fail under
// GRAD_REQUIRE_CUDA=1) where CUDA cannot run.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/device/sampling.hpp"
#include "grad/grad.hpp"
#include "support.hpp"
#include "test_device_support.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

// n logits from a few levels, so that many are equal; some -0.0 beside +0.0,
// some -inf. Seeded by n.
template <class T>
std::vector<T> tied_logits(std::size_t n) {
  Rng rng(n * 7919 + 1);
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng.next();
    switch (r % 16) {
      case 0: x[i] = T(-0.0); break;
      case 1: x[i] = T(0); break;
      case 2: x[i] = -std::numeric_limits<T>::infinity(); break;
      default: x[i] = static_cast<T>(static_cast<double>((r >> 8) % 64) * 0.25 - 8);  // 64 levels
    }
  }
  return x;
}

template <class T>
void check_against_cpu(const std::vector<T>& x, std::size_t k) {
  CAPTURE(x.size());
  CAPTURE(k);
  const device::TopK<T> got = device::cuda_top_k<T>(x, k);
  const std::vector<std::size_t> want = nn::top_k_order<T>(x, k);
  REQUIRE(got.ids.size() == k);
  REQUIRE(got.values.size() == k);
  REQUIRE(want.size() == k);
  for (std::size_t i = 0; i < k; ++i) {
    CAPTURE(i);
    CHECK(static_cast<std::size_t>(got.ids[i]) == want[i]);
    CHECK(std::memcmp(&got.values[i], &x[want[i]], sizeof(T)) == 0);
  }
  CHECK(static_cast<std::size_t>(device::cuda_argmax<T>(x)) == want[0]);
  CHECK(device::cuda_argmax<T>(x) == nn::argmax_token<T>(x));
}

}  // namespace

TEST_CASE("top_k_order: by value, largest first, equal values by id; its first is argmax_token's") {
  const std::vector<float> x{1, 3, -0.0f, 3, 0, 2, 3};
  CHECK(nn::top_k_order<float>(x, 4) == std::vector<std::size_t>{1, 3, 6, 5});
  CHECK(nn::top_k_order<float>(x) == std::vector<std::size_t>{1, 3, 6, 5, 0, 2, 4});  // -0.0 == +0.0: by id
  CHECK(nn::top_k_order<float>(x, 99).size() == 7);
  CHECK(nn::argmax_token<float>(x) == 1);
}

TEST_CASE("cuda_top_k refuses k = 0, k > n, k > top_k_most and an empty row, on every machine") {
  const std::vector<float> x(3000, 1.0f), three(3, 1.0f);
  CHECK_THROWS_WITH_AS(device::cuda_top_k<float>(x, 0),
                       doctest::Contains("k 0: expected 1 to 1024"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(device::cuda_top_k<float>(three, 4),
                       doctest::Contains("k 4: expected 1 to 3 (at most the 3 logits"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(device::cuda_top_k<float>(x, 1025),
                       doctest::Contains("top_k_most, 1024"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(device::cuda_argmax<double>(std::vector<double>{}), doctest::Contains("no logits"),
                       std::invalid_argument);
  CHECK(device::top_k_scratch_bytes<float>(151936, 50) == 2 * 75 * 50 * 8);
}

TEST_CASE("without CUDA, cuda_top_k says why it cannot run") {
  if (device::cuda_available()) return;
  const std::vector<float> x(10, 1.0f);
  const std::string why = device::cuda_unavailable_reason();
  CHECK_THROWS_WITH_AS(device::cuda_top_k<float>(x, 2), doctest::Contains(why.c_str()), std::runtime_error);
}

TEST_CASE_TEMPLATE("cuda_top_k gives top_k_order's ids and value bits (ties, signed zeros, -inf, several rounds)", T,
                   float, double) {
  if (!cuda_case("cuda_top_k")) return;
  // One tile, its edges, several tiles, Qwen2.5's vocabulary (75 tiles: two rounds at k 50, three at k 1024).
  for (std::size_t n : {1, 5, 2047, 2048, 2049, 9000, 151936})
    for (std::size_t k : {1, 2, 7, 50, 1024})
      if (k <= n) check_against_cpu(tied_logits<T>(n), k);
  // Every logit equal: ids in order.
  check_against_cpu(std::vector<T>(5000, T(1)), 1024);
  // Random, untied.
  Rng rng(3);
  std::vector<T> x(151936);
  for (T& v : x) v = static_cast<T>(rng.uniform(-10, 10));
  check_against_cpu(x, 40);
}
