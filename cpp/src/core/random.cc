#include "stoker/core/random.h"

namespace stoker {

KeyedRandom::KeyedRandom(uint64_t seed, uint64_t stream, uint64_t index)
    : key_(mix64(mix64(mix64(seed) ^ stream) ^ index)) {}

uint64_t KeyedRandom::next_u64() { return mix64(key_ + 0x632be59bd9b4e019ull * ++counter_); }

double KeyedRandom::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

uint64_t KeyedRandom::below(uint64_t bound) {
  // Lemire's nearly-divisionless method.
  unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * bound;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < bound) {
    const uint64_t threshold = -bound % bound;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(next_u64()) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace stoker
