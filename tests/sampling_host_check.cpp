// Host build of csrc/include/kog/philox.cuh (the GPU's Philox, row key, column words and uniforms) for
// tests/test_sampling_reference.py. Reads queries from stdin, one section after another, each a count followed
// by that many lines, and prints one line per query (decimal):
//   philox:  c0 c1 c2 c3 k0 k1  ->  w0 w1 w2 w3
//   row key: seed position      ->  key
//   column:  key col            ->  w0 w1 w2 w3 bits(uniform_f32) bits(uniform_f64)
//   word:    w                  ->  bits(uint_to_uniform(w))
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "kog/philox.cuh"

namespace {

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

uint64_t f64_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

bool read_count(long* n) { return std::scanf("%ld", n) == 1 && *n >= 0; }

}  // namespace

int main() {
  using namespace kog::rng;
  long n = 0;
  if (!read_count(&n)) return 2;
  for (long i = 0; i < n; ++i) {
    uint32_t c0, c1, c2, c3, k0, k1;
    if (std::scanf("%" SCNu32 " %" SCNu32 " %" SCNu32 " %" SCNu32 " %" SCNu32 " %" SCNu32, &c0, &c1, &c2, &c3, &k0,
                   &k1) != 6)
      return 3;
    const Words w = philox4x32_10({c0, c1, c2, c3}, k0, k1);
    std::printf("%" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu32 "\n", w.w0, w.w1, w.w2, w.w3);
  }
  if (!read_count(&n)) return 2;
  for (long i = 0; i < n; ++i) {
    int64_t seed, position;
    if (std::scanf("%" SCNd64 " %" SCNd64, &seed, &position) != 2) return 3;
    std::printf("%" PRIu32 "\n", row_key(seed, position));
  }
  if (!read_count(&n)) return 2;
  for (long i = 0; i < n; ++i) {
    uint32_t key, col;
    if (std::scanf("%" SCNu32 " %" SCNu32, &key, &col) != 2) return 3;
    const Words w = column_words(key, col);
    std::printf("%" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu32 " %" PRIu64 "\n", w.w0, w.w1, w.w2, w.w3,
                f32_bits(uniform_f32(key, col)), f64_bits(uniform_f64(key, col)));
  }
  if (!read_count(&n)) return 2;
  for (long i = 0; i < n; ++i) {
    uint32_t w;
    if (std::scanf("%" SCNu32, &w) != 1) return 3;
    std::printf("%" PRIu32 "\n", f32_bits(uint_to_uniform(w)));
  }
  return 0;
}
