// grad/numerics/quant.hpp against ggml itself: the block bytes its reference
// quantizers write and the floats its reference dequantizers compute, bit for
// bit, from fixtures made by ggml's own C (test/quant/README.md); then what
// must hold whatever ggml says: the same bits per block and per row, re-quantizing
// a dequantized block, the error of gaussian rows, refusals of bad input.
#include <doctest/doctest.h>

#include <grad/numerics/quant.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "quant/inputs.h"

using namespace grad;

namespace {

std::string fixture_dir() {
  const char* d = std::getenv("GRAD_QUANT_DIR");
  return d ? d : "test/quant";
}

std::uint32_t get_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}
std::uint64_t get_u64(const std::uint8_t* p) { return get_u32(p) | static_cast<std::uint64_t>(get_u32(p + 4)) << 32; }

// One format's fixture (layout in test/quant/README.md).
struct Fixture {
  std::uint32_t nq = 0, nr = 0;          // quantized blocks, random-byte blocks
  std::vector<std::uint8_t> blocks;      // ggml's bytes for quant_block_inputs(n, b), b < nq
  std::vector<std::uint64_t> q_hashes;   // quant_hash_floats of ggml's dequantization of those
  std::vector<std::uint64_t> r_hashes;   // ... of quant_random_block(bytes, b), b < nr
};

Fixture load_fixture(QuantFormat f) {
  const QuantInfo q = quant_info(f);
  const std::string path = fixture_dir() + "/" + std::string(q.name) + ".bin";
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  const std::vector<std::uint8_t> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE_MESSAGE(raw.size() >= 20, path << ": " << raw.size() << " bytes, shorter than the header");
  REQUIRE(std::memcmp(raw.data(), "GRADQNT1", 8) == 0);
  REQUIRE(get_u32(raw.data() + 8) == q.ggml_type);
  Fixture fx;
  fx.nq = get_u32(raw.data() + 12);
  fx.nr = get_u32(raw.data() + 16);
  REQUIRE_MESSAGE(raw.size() == 20 + fx.nq * q.block_bytes + 8 * (std::size_t{fx.nq} + fx.nr),
                  path << ": " << raw.size() << " bytes for " << fx.nq << " + " << fx.nr << " blocks");
  const std::uint8_t* p = raw.data() + 20;
  fx.blocks.assign(p, p + fx.nq * q.block_bytes);
  p += fx.nq * q.block_bytes;
  for (std::uint32_t b = 0; b < fx.nq; ++b, p += 8) fx.q_hashes.push_back(get_u64(p));
  for (std::uint32_t b = 0; b < fx.nr; ++b, p += 8) fx.r_hashes.push_back(get_u64(p));
  return fx;
}

std::vector<float> fixture_inputs(QuantFormat f, std::uint32_t nblocks) {
  const auto n = static_cast<std::uint32_t>(quant_info(f).block_elements);
  std::vector<float> x(std::size_t{n} * nblocks);
  for (std::uint32_t b = 0; b < nblocks; ++b) quant_block_inputs(n, b, x.data() + std::size_t{b} * n);
  return x;
}

std::vector<std::uint8_t> random_blocks(QuantFormat f, std::uint32_t nblocks) {
  const auto bytes = static_cast<std::uint32_t>(quant_info(f).block_bytes);
  std::vector<std::uint8_t> y(std::size_t{bytes} * nblocks);
  for (std::uint32_t b = 0; b < nblocks; ++b) quant_random_block(bytes, b, y.data() + std::size_t{b} * bytes);
  return y;
}

template <QuantFormat F>
void quantize_block_of(QuantFormat f, const float* x, std::uint8_t* y) {
  if (f == F) quantize_block<F>(x, y);
}
template <QuantFormat F>
void dequantize_block_of(QuantFormat f, const std::uint8_t* y, float* out) {
  if (f == F) dequantize_block<F>(y, out);
}
// The templates, reached from a runtime format.
void quantize_one(QuantFormat f, const float* x, std::uint8_t* y) {
  quantize_block_of<QuantFormat::q8_0>(f, x, y);
  quantize_block_of<QuantFormat::q4_0>(f, x, y);
  quantize_block_of<QuantFormat::q4_k>(f, x, y);
  quantize_block_of<QuantFormat::q5_k>(f, x, y);
  quantize_block_of<QuantFormat::q6_k>(f, x, y);
}
void dequantize_one(QuantFormat f, const std::uint8_t* y, float* out) {
  dequantize_block_of<QuantFormat::q8_0>(f, y, out);
  dequantize_block_of<QuantFormat::q4_0>(f, y, out);
  dequantize_block_of<QuantFormat::q4_k>(f, y, out);
  dequantize_block_of<QuantFormat::q5_k>(f, y, out);
  dequantize_block_of<QuantFormat::q6_k>(f, y, out);
}

const char* kind_of(std::uint32_t b) { return quant_kind_names[b % quant_kinds]; }

doctest::Contains contains(const std::string& s) { return doctest::Contains(s.c_str()); }

}  // namespace

TEST_CASE("quant_info names ggml's types, block sizes and bytes") {
  struct Row {
    QuantFormat f;
    const char* name;
    std::uint32_t type;
    std::size_t elements, bytes;
  };
  const Row rows[] = {{QuantFormat::q8_0, "q8_0", 8, 32, 34},
                      {QuantFormat::q4_0, "q4_0", 2, 32, 18},
                      {QuantFormat::q4_k, "q4_K", 12, 256, 144},
                      {QuantFormat::q5_k, "q5_K", 13, 256, 176},
                      {QuantFormat::q6_k, "q6_K", 14, 256, 210}};
  for (const Row& r : rows) {
    const QuantInfo q = quant_info(r.f);
    CHECK(q.name == r.name);
    CHECK(q.ggml_type == r.type);
    CHECK(q.block_elements == r.elements);
    CHECK(q.block_bytes == r.bytes);
    CHECK(quant_format_from_ggml(r.type) == r.f);
    CHECK(quant_bytes(r.f, 0) == 0);
    CHECK(quant_bytes(r.f, 3 * r.elements) == 3 * r.bytes);
  }
  static_assert(quant_info(QuantFormat::q6_k).block_bytes == 210);  // usable in constant expressions
  static_assert(quant_bytes(QuantFormat::q4_k, 4096) == 16 * 144);
  for (std::uint32_t t : {0u, 1u, 3u, 6u, 7u, 9u, 10u, 11u, 15u, 30u, 0xffffffffu})
    CHECK_MESSAGE(!quant_format_from_ggml(t).has_value(), "GGML type " << t);
}

TEST_CASE("quantize writes ggml's reference bytes, bit for bit") {
  for (const QuantFormat f : quant_formats) {
    const QuantInfo q = quant_info(f);
    CAPTURE(q.name);
    const Fixture fx = load_fixture(f);
    REQUIRE(fx.nq >= 100);
    const std::vector<float> x = fixture_inputs(f, fx.nq);
    // Block by block through the template,
    std::vector<std::uint8_t> y(fx.blocks.size(), 0xAA);
    int mismatches = 0;
    for (std::uint32_t b = 0; b < fx.nq; ++b) {
      quantize_one(f, x.data() + b * q.block_elements, y.data() + b * q.block_bytes);
      const std::uint8_t* want = fx.blocks.data() + b * q.block_bytes;
      const std::uint8_t* got = y.data() + b * q.block_bytes;
      if (std::memcmp(want, got, q.block_bytes) != 0 && ++mismatches <= 5) {
        std::size_t at = 0;
        while (want[at] == got[at]) ++at;
        FAIL_CHECK(q.name << " block " << b << " (" << std::string(kind_of(b)) << "): byte " << at << " is "
                          << int{got[at]} << ", ggml wrote " << int{want[at]});
      }
    }
    CHECK_MESSAGE(mismatches == 0, mismatches << " of " << fx.nq << " blocks differ");
    // and as one row through the entry point.
    std::vector<std::uint8_t> row(fx.blocks.size(), 0x55);
    quantize(f, x.data(), row.data(), x.size());
    CHECK(row == fx.blocks);
  }
}

TEST_CASE("dequantize gives ggml's reference floats, bit for bit") {
  for (const QuantFormat f : quant_formats) {
    const QuantInfo q = quant_info(f);
    CAPTURE(q.name);
    const Fixture fx = load_fixture(f);
    const auto n = static_cast<std::uint32_t>(q.block_elements);
    std::vector<float> y(q.block_elements);
    int mismatches = 0;
    for (std::uint32_t b = 0; b < fx.nq; ++b) {  // ggml's blocks of the fixture inputs
      dequantize_one(f, fx.blocks.data() + b * q.block_bytes, y.data());
      if (quant_hash_floats(y.data(), n) != fx.q_hashes[b] && ++mismatches <= 5)
        FAIL_CHECK(q.name << " quantized block " << b << " (" << std::string(kind_of(b)) << ") dequantizes to other floats");
    }
    const std::vector<std::uint8_t> random = random_blocks(f, fx.nr);
    for (std::uint32_t b = 0; b < fx.nr; ++b) {  // arbitrary bytes: every scale bit and level pattern
      dequantize_one(f, random.data() + b * q.block_bytes, y.data());
      if (quant_hash_floats(y.data(), n) != fx.r_hashes[b] && ++mismatches <= 5)
        FAIL_CHECK(q.name << " random block " << b << " dequantizes to other floats");
    }
    CHECK_MESSAGE(mismatches == 0, mismatches << " of " << fx.nq + fx.nr << " blocks differ");
  }
}

TEST_CASE("dequantize: per block, per row and through the entry point, the same bits") {
  for (const QuantFormat f : quant_formats) {
    const QuantInfo q = quant_info(f);
    CAPTURE(q.name);
    const std::uint32_t nb = 37;
    const std::vector<std::uint8_t> blocks = random_blocks(f, nb);
    const std::size_t n = nb * q.block_elements;
    std::vector<float> per_block(n), per_row(n + 1), entry(n + 3);
    for (std::size_t b = 0; b < nb; ++b)
      dequantize_one(f, blocks.data() + b * q.block_bytes, per_block.data() + b * q.block_elements);
    // Outputs one and three floats past an aligned start: the loops' vector
    // bodies and tails meet other boundaries.
    switch (f) {
      case QuantFormat::q8_0: dequantize_blocks<QuantFormat::q8_0>(blocks.data(), per_row.data() + 1, nb); break;
      case QuantFormat::q4_0: dequantize_blocks<QuantFormat::q4_0>(blocks.data(), per_row.data() + 1, nb); break;
      case QuantFormat::q4_k: dequantize_blocks<QuantFormat::q4_k>(blocks.data(), per_row.data() + 1, nb); break;
      case QuantFormat::q5_k: dequantize_blocks<QuantFormat::q5_k>(blocks.data(), per_row.data() + 1, nb); break;
      case QuantFormat::q6_k: dequantize_blocks<QuantFormat::q6_k>(blocks.data(), per_row.data() + 1, nb); break;
    }
    dequantize(f, blocks.data(), entry.data() + 3, n);
    CHECK(std::memcmp(per_block.data(), per_row.data() + 1, n * sizeof(float)) == 0);
    CHECK(std::memcmp(per_block.data(), entry.data() + 3, n * sizeof(float)) == 0);
  }
}

TEST_CASE("dequantize reads the documented layout (hand-made blocks)") {
  SUBCASE("q8_0: q * d") {
    std::uint8_t b[34] = {};
    b[0] = 0x00, b[1] = 0x3c;  // d = 1.0 (half 0x3c00), little-endian
    for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(j - 16));
    float y[32];
    dequantize_block<QuantFormat::q8_0>(b, y);
    for (int j = 0; j < 32; ++j) CHECK(y[j] == static_cast<float>(j - 16));
  }
  SUBCASE("q4_0: low nibbles first, then high nibbles, minus 8") {
    std::uint8_t b[18] = {};
    b[0] = 0x00, b[1] = 0x40;  // d = 2
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<std::uint8_t>(j | (15 - j) << 4);
    float y[32];
    dequantize_block<QuantFormat::q4_0>(b, y);
    for (int j = 0; j < 16; ++j) {
      CHECK(y[j] == 2.0f * static_cast<float>(j - 8));
      CHECK(y[16 + j] == 2.0f * static_cast<float>(7 - j));
    }
  }
  SUBCASE("q4_K: six-bit scales and mins of the eight sub-blocks") {
    std::uint8_t b[144] = {};
    b[1] = 0x3c;  // d = 1
    b[3] = 0x38;  // dmin = 0.5
    const int sc[8] = {1, 2, 63, 40, 17, 33, 5, 62}, mn[8] = {0, 3, 9, 63, 48, 1, 22, 31};
    for (int j = 0; j < 4; ++j) {  // the layout get_scale_min_k4 reads
      b[4 + j] = static_cast<std::uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
      b[8 + j] = static_cast<std::uint8_t>(mn[j] | (mn[j + 4] >> 4) << 6);
      b[12 + j] = static_cast<std::uint8_t>((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<std::uint8_t>((i % 16) | ((i + 5) % 16) << 4);
    float y[256];
    dequantize_block<QuantFormat::q4_k>(b, y);
    for (int s = 0; s < 8; ++s)
      for (int l = 0; l < 32; ++l) {
        const int byte = 32 * (s / 2) + l, q = s % 2 == 0 ? byte % 16 : (byte + 5) % 16;
        CHECK(y[32 * s + l] == static_cast<float>(sc[s] * q) - 0.5f * static_cast<float>(mn[s]));
      }
  }
  SUBCASE("q6_K: sixteen signed scales, six-bit levels minus 32") {
    std::uint8_t b[210] = {};
    int level[256];
    for (int i = 0; i < 256; ++i) level[i] = (i * 7 + 3) % 64;
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const int* L = level + 128 * h;
        b[64 * h + l] = static_cast<std::uint8_t>((L[l] & 15) | (L[l + 64] & 15) << 4);
        b[64 * h + 32 + l] = static_cast<std::uint8_t>((L[l + 32] & 15) | (L[l + 96] & 15) << 4);
        b[128 + 32 * h + l] =
            static_cast<std::uint8_t>(L[l] >> 4 | (L[l + 32] >> 4) << 2 | (L[l + 64] >> 4) << 4 | (L[l + 96] >> 4) << 6);
      }
    for (int k = 0; k < 16; ++k) b[192 + k] = static_cast<std::uint8_t>(static_cast<std::int8_t>(k % 2 ? -k : k));
    b[209] = 0x3c;  // d = 1
    float y[256];
    dequantize_block<QuantFormat::q6_k>(b, y);
    for (int i = 0; i < 256; ++i) {
      const int k = i / 16;
      CHECK(y[i] == static_cast<float>((k % 2 ? -k : k) * (level[i] - 32)));
    }
  }
}

TEST_CASE("re-quantizing a dequantized q8_0 or q4_0 block gives the same block") {
  // The largest weight comes back as level +-127 (q8_0) or -8 (q4_0) times
  // d, so the scale is found again exactly and every level with it.
  for (const QuantFormat f : {QuantFormat::q8_0, QuantFormat::q4_0}) {
    const QuantInfo q = quant_info(f);
    CAPTURE(q.name);
    const std::uint32_t nb = 14 * 20;
    const std::vector<float> x = fixture_inputs(f, nb);
    std::vector<std::uint8_t> once(quant_bytes(f, x.size())), twice(once.size());
    std::vector<float> y(x.size());
    quantize(f, x.data(), once.data(), x.size());
    dequantize(f, once.data(), y.data(), y.size());
    quantize(f, y.data(), twice.data(), y.size());
    for (std::uint32_t b = 0; b < nb; ++b) {
      // Blocks whose scale rounds to zero or a subnormal half lose their levels (tiny, subnormal).
      const float d = F16::widen(static_cast<std::uint16_t>(once[b * q.block_bytes] | once[b * q.block_bytes + 1] << 8));
      if (std::fabs(d) < 0x1p-14f) continue;
      CHECK_MESSAGE(std::memcmp(once.data() + b * q.block_bytes, twice.data() + b * q.block_bytes, q.block_bytes) == 0,
                    "block " << b << " (" << std::string(kind_of(b)) << ")");
    }
  }
}

TEST_CASE("re-quantizing dequantized gaussian rows moves no K-quant block more than quantizing did") {
  // The K-quants' scale searches need not find a dequantized block's own
  // scales again (q5_K moves 0.0027 RMS on these rows, q4_K and q6_K none),
  // but a second pass must not lose more than the first: a block's squared
  // change is at most its first squared error.
  const std::size_t n = 16 * 4096;
  std::vector<float> x(n), y(n), z(n);
  std::uint64_t s = 777;
  for (float& v : x) v = quant_gauss(&s);
  for (const QuantFormat f : {QuantFormat::q4_k, QuantFormat::q5_k, QuantFormat::q6_k}) {
    CAPTURE(quant_info(f).name);
    std::vector<std::uint8_t> blocks(quant_bytes(f, n));
    quantize(f, x.data(), blocks.data(), n);
    dequantize(f, blocks.data(), y.data(), n);
    quantize(f, y.data(), blocks.data(), n);
    dequantize(f, blocks.data(), z.data(), n);
    for (std::size_t b = 0; b < n / 256; ++b) {
      double first = 0, second = 0;
      for (std::size_t i = 256 * b; i < 256 * (b + 1); ++i) {
        first += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
        second += (static_cast<double>(z[i]) - y[i]) * (static_cast<double>(z[i]) - y[i]);
      }
      if (!(second <= first)) {
        FAIL_CHECK("block " << b << ": the second pass moves " << second << ", the first erred " << first);
        break;
      }
    }
  }
}

TEST_CASE("the error of gaussian rows, per format") {
  // 64 rows of 4096 unit gaussians (Irwin-Hall): the RMS error per format,
  // bounded 15% above what ggml's quantizers reach (the measured values are
  // printed); for q8_0 and q4_0 also every weight's bound from its scale.
  struct Bound {
    QuantFormat f;
    double rms;
  };
  const Bound bounds[] = {{QuantFormat::q8_0, 0.0061},   // measured 0.00525
                          {QuantFormat::q4_0, 0.097},    // 0.0845
                          {QuantFormat::q4_k, 0.081},    // 0.0703
                          {QuantFormat::q5_k, 0.041},    // 0.0357
                          {QuantFormat::q6_k, 0.0202}};  // 0.0175
  const std::size_t n = 64 * 4096;
  std::vector<float> x(n), y(n);
  std::uint64_t s = 12345;
  for (float& v : x) v = quant_gauss(&s);
  for (const Bound& bd : bounds) {
    const QuantInfo q = quant_info(bd.f);
    CAPTURE(q.name);
    std::vector<std::uint8_t> blocks(quant_bytes(bd.f, n));
    quantize(bd.f, x.data(), blocks.data(), n);
    dequantize(bd.f, blocks.data(), y.data(), n);
    double sum2 = 0, sumx2 = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double e = static_cast<double>(x[i]) - static_cast<double>(y[i]);
      sum2 += e * e;
      sumx2 += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    }
    const double rms = std::sqrt(sum2 / static_cast<double>(n)), rms_x = std::sqrt(sumx2 / static_cast<double>(n));
    MESSAGE(q.name << ": RMS error " << rms << " of unit gaussians (RMS " << rms_x << "), "
                   << 8.0 * static_cast<double>(q.block_bytes) / static_cast<double>(q.block_elements)
                   << " bits per weight");
    CHECK(rms < bd.rms);
    CHECK(rms > bd.rms / 4);  // a quantizer that stores the floats themselves is not one of these
    if (bd.f == QuantFormat::q8_0 || bd.f == QuantFormat::q4_0) {
      // |x - y| <= d/2 for q8_0, d for q4_0 (the level opposite the largest
      // weight is clamped at 7), plus the half's rounding of d (2^-11 relative) times the level.
      for (std::size_t b = 0; b < n / 32; ++b) {
        float amax = 0;
        for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
        const double d = bd.f == QuantFormat::q8_0 ? amax / 127.0 : amax / 8.0;
        const double bound = bd.f == QuantFormat::q8_0 ? d * (0.5 + 127.0 / 2048) : d * (1 + 8.0 / 2048);
        for (std::size_t j = 0; j < 32; ++j) {
          const std::size_t i = 32 * b + j;
          if (!(std::fabs(static_cast<double>(x[i]) - static_cast<double>(y[i])) <= bound)) {
            FAIL_CHECK(q.name << " weight " << i << ": " << x[i] << " -> " << y[i] << ", bound " << bound);
            break;
          }
        }
      }
    }
  }
}

TEST_CASE("bad input is refused with std::invalid_argument naming the function and the sizes") {
  std::vector<float> x(512, 1.0f);
  std::vector<std::uint8_t> blocks(1024);
  for (const QuantFormat f : quant_formats) {
    const QuantInfo q = quant_info(f);
    CAPTURE(q.name);
    const std::size_t bad = q.block_elements + 7;
    CHECK_THROWS_WITH_AS(quantize(f, x.data(), blocks.data(), bad),
                         contains("grad::quantize: " + std::string(q.name) + ": n = " + std::to_string(bad) +
                                  " elements is not a multiple of the block size " + std::to_string(q.block_elements)),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(dequantize(f, blocks.data(), x.data(), bad), doctest::Contains("grad::dequantize: "),
                         std::invalid_argument);
    CHECK_THROWS_AS(quant_check(f, 1, "caller"), std::invalid_argument);
    CHECK_NOTHROW(quant_check(f, 2 * q.block_elements, "caller"));
    const std::size_t too_many = std::numeric_limits<std::size_t>::max() / q.block_elements * q.block_elements;
    if (q.block_bytes > q.block_elements)  // only q8_0 stores more bytes than weights (34 per 32)
      CHECK_THROWS_WITH_AS(quant_check(f, too_many, "caller"), doctest::Contains("overflow"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(quantize(f, nullptr, blocks.data(), q.block_elements), doctest::Contains("null pointer"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(dequantize(f, blocks.data(), nullptr, q.block_elements), doctest::Contains("null pointer"),
                         std::invalid_argument);
    CHECK_NOTHROW(quantize(f, nullptr, nullptr, 0));  // nothing to do
    // Non-finite inputs: ggml's C is undefined on them; grad names the element.
    std::vector<float> nan_row(2 * q.block_elements, 0.5f);
    nan_row[q.block_elements + 3] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH_AS(quantize(f, nan_row.data(), blocks.data(), nan_row.size()),
                         contains("element " + std::to_string(q.block_elements + 3) + " is nan"),
                         std::invalid_argument);
    nan_row[q.block_elements + 3] = -std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH_AS(quantize(f, nan_row.data(), blocks.data(), nan_row.size()), doctest::Contains("is -inf"),
                         std::invalid_argument);
  }
  CHECK_THROWS_AS(quant_info(static_cast<QuantFormat>(17)), std::invalid_argument);
}

TEST_CASE("a block with an infinite or NaN scale dequantizes to infinities and NaNs") {
  // Such blocks come from weights beyond the half's range (ggml writes them
  // too); reading them is defined: IEEE products, no undefined behaviour.
  std::uint8_t b[34] = {};
  b[0] = 0x00, b[1] = 0x7c;  // d = +inf
  b[2] = 0;                  // 0 * inf
  b[3] = 1;
  b[4] = 0xff;  // -1
  float y[32];
  dequantize_block<QuantFormat::q8_0>(b, y);
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == std::numeric_limits<float>::infinity());
  CHECK(y[2] == -std::numeric_limits<float>::infinity());
  b[0] = 0x01;  // a NaN half
  dequantize_block<QuantFormat::q8_0>(b, y);
  for (float v : y) CHECK(std::isnan(v));
}
