// What running a point op on the resampler's rows as they are written (issue 37's item 3) could
// save against today's worker form, a pass over the whole image once it is written: a 224 x 224
// image is written (as the resampler writes its slot), then one 256-entry table per channel is
// applied (a) over the whole image afterwards, or (b) band by band, each 16-row band right after
// it is written, while it is in L1. Prints CPU microseconds an image, medians of 7 rounds of
// 2,000 images. Never a timed test.
//
//   c++ -O2 -std=c++20 -Icpp/src -Icpp/include benchmarks/table_pass.cc \
//       build/cpp/libstoker_augment.a build/cpp/libstoker_core.a -o build/table_pass
//   build/table_pass
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "augment/kernels.h"

namespace {

double cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  using stoker::augment::detail::apply_tables;
  constexpr int kSide = 224, kBand = 16, kImages = 2000, kRounds = 7;
  constexpr size_t kRow = kSide * 3, kPixels = size_t{kSide} * kSide;
  std::vector<uint8_t> image(kPixels * 3);
  stoker::augment::detail::Tables tables;
  for (auto& t : tables)
    for (int v = 0; v < 256; ++v) t[static_cast<size_t>(v)] = static_cast<uint8_t>(255 - v);
  std::vector<double> write, whole, banded;
  for (int round = 0; round < kRounds; ++round) {
    double w = 0, a = 0, b = 0;
    for (int i = 0; i < kImages; ++i) {
      const auto value = static_cast<uint8_t>(i);
      double t = cpu_us();
      for (int y = 0; y < kSide; y += kBand)
        std::memset(image.data() + y * kRow, value, kRow * kBand);
      w += cpu_us() - t;
      t = cpu_us();
      for (int y = 0; y < kSide; y += kBand)
        std::memset(image.data() + y * kRow, value, kRow * kBand);
      apply_tables(image.data(), kPixels, tables);
      a += cpu_us() - t;
      t = cpu_us();
      for (int y = 0; y < kSide; y += kBand) {
        std::memset(image.data() + y * kRow, value, kRow * kBand);
        apply_tables(image.data() + y * kRow, size_t{kSide} * kBand, tables);
      }
      b += cpu_us() - t;
    }
    write.push_back(w / kImages), whole.push_back(a / kImages), banded.push_back(b / kImages);
  }
  const double wr = median(write), wh = median(whole) - wr, ba = median(banded) - wr;
  std::printf(
      "writing the image: %.2f us; the table pass afterwards (the worker form): %.2f us; "
      "band by band as the rows are written: %.2f us; saved: %.2f us an image\n",
      wr, wh, ba, wh - ba);
  return 0;
}
