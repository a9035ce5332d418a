// Counter-based randomness: every draw is a pure function of (seed, stream, counter), so what a
// sample gets never depends on which thread handled it or when.
#pragma once

#include <cstdint>

namespace stoker {

// splitmix64 finaliser: a bijective 64-bit mixer.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A small generator whose whole state derives from a key; cheap to create per sample.
class KeyedRandom {
 public:
  KeyedRandom(uint64_t seed, uint64_t stream, uint64_t index);

  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  // Uniform integer in [0, bound), unbiased (Lemire). bound must be > 0.
  uint64_t below(uint64_t bound);

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace stoker
