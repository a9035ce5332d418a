#include "stoker/augment/augment.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "stoker/core/error.h"
#include "stoker/core/random.h"

namespace stoker::augment {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// Python's KeyedDraws for one sample: a name's stream, its words in order.
class Draw {
 public:
  Draw(uint64_t stream, uint64_t seed, int64_t epoch, int64_t sample)
      : rng_(seed, stream ^ (static_cast<uint64_t>(epoch) * kGolden),
             static_cast<uint64_t>(sample)) {}

  uint64_t bits() { return rng_.next_u64(); }
  // uniform(name, low, high): float32 from the top 24 bits, low + (high - low) * u in float32.
  float uniform(double low = 0.0, double high = 1.0) {
    const float u = static_cast<float>(bits() >> 40) * (1.0f / 16777216.0f);
    return static_cast<float>(low) + static_cast<float>(high - low) * u;
  }
  bool bernoulli(double p) { return uniform() < static_cast<float>(p); }
  int64_t integers(int64_t high) {
    return static_cast<int64_t>(((bits() >> 33) * static_cast<uint64_t>(high)) >> 31);
  }

 private:
  KeyedRandom rng_;
};

uint8_t to_u8(float v) {  // clamp to [0, 255], then truncate (torch's cast)
  return static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f));
}

size_t pixels_of(const ImageView& im) {
  return static_cast<size_t>(im.width) * static_cast<size_t>(im.height);
}

// Luma as torchvision takes it for uint8 input: 0.2989 R, then + 0.587 G and + 0.114 B (torch's
// add with alpha, a fused multiply-add), floored.
float luma(const uint8_t* p) {
  const float r = static_cast<float>(p[0]) * 0.2989f;
  return std::floor(std::fma(static_cast<float>(p[2]), 0.114f,
                             std::fma(static_cast<float>(p[1]), 0.587f, r)));
}

// img * ratio + other * (1 - ratio), as torchvision's _blend in float32.
uint8_t blend(uint8_t x, float other, float ratio, float rest) {
  return to_u8(static_cast<float>(x) * ratio + other * rest);
}

enum TimmOp : int {
  kAutoContrast, kEqualize, kInvert, kRotate, kPosterize, kSolarize, kSolarizeAdd, kColor,
  kContrast, kBrightness, kSharpness, kShearX, kShearY, kTranslateXRel, kTranslateYRel,
  kNumTimmOps
};

bool signed_op(int op) {
  return op == kRotate || op == kShearX || op == kShearY || op == kTranslateXRel ||
         op == kTranslateYRel;
}

// timm's level (0..10) to the op's magnitude (LEVEL_TO_ARG), before the sign.
double timm_magnitude(int op, double level) {
  switch (op) {
    case kRotate: return level / 10.0 * 30.0;
    case kPosterize: return std::trunc(level / 10.0 * 4);
    case kSolarize: return std::trunc(level / 10.0 * 256);
    case kSolarizeAdd: return std::trunc(level / 10.0 * 110);
    case kColor: case kContrast: case kBrightness: case kSharpness:
      return level / 10.0 * 1.8 + 0.1;
    case kShearX: case kShearY: return level / 10.0 * 0.3;
    case kTranslateXRel: case kTranslateYRel: return level / 10.0 * 0.45;
    default: return level;
  }
}

void rotate_pil(ImageView image, double degrees, const std::array<uint8_t, 3>& fill,
                std::vector<uint8_t>& scratch) {
  // PIL's Image.rotate matrix, its cos and sin rounded to 15 places (torch.round(decimals=15)).
  const double angle = -(degrees * 0.017453292519943295);
  const double cos = std::nearbyint(std::cos(angle) * 1e15) / 1e15;
  const double sin = std::nearbyint(std::sin(angle) * 1e15) / 1e15;
  const double cx = image.width / 2.0, cy = image.height / 2.0;
  pil_affine(image, {cos, sin, -cos * cx - sin * cy + cx, -sin, cos, sin * cx - cos * cy + cy},
             fill, scratch);
}

void timm_op(ImageView image, int op, double m, const std::array<uint8_t, 3>& fill,
             std::vector<uint8_t>& scratch) {
  switch (op) {
    case kAutoContrast: autocontrast(image); break;
    case kEqualize: equalize(image); break;
    case kInvert: invert(image); break;
    case kRotate: rotate_pil(image, m, fill, scratch); break;
    case kPosterize: posterize(image, static_cast<int>(std::clamp(m, 0.0, 8.0))); break;
    case kSolarize: solarize(image, static_cast<float>(m)); break;
    case kSolarizeAdd: solarize_add(image, static_cast<int>(m)); break;
    case kColor: adjust_saturation(image, static_cast<float>(m)); break;
    case kContrast: adjust_contrast(image, static_cast<float>(m)); break;
    case kBrightness: adjust_brightness(image, static_cast<float>(m)); break;
    case kSharpness: adjust_sharpness(image, static_cast<float>(m)); break;
    case kShearX: pil_affine(image, {1, m, 0, 0, 1, 0}, fill, scratch); break;
    case kShearY: pil_affine(image, {1, 0, 0, m, 1, 0}, fill, scratch); break;
    case kTranslateXRel: pil_affine(image, {1, 0, m * image.width, 0, 1, 0}, fill, scratch); break;
    case kTranslateYRel:
      pil_affine(image, {1, 0, 0, 0, 1, m * image.height}, fill, scratch);
      break;
    default: break;
  }
}

void timm_rand_augment(const TimmRandAugmentOptions& o, ImageView image, uint64_t seed,
                       int64_t epoch, int64_t sample, std::vector<uint8_t>& scratch) {
  for (const auto& streams : o.streams) {
    const int op = static_cast<int>(Draw(streams[0], seed, epoch, sample).integers(kNumTimmOps));
    const bool active = Draw(streams[1], seed, epoch, sample).bernoulli(o.prob);
    double level = o.magnitude;
    if (o.magnitude_std > 0) {
      Draw d(streams[2], seed, epoch, sample);
      const double u1 = d.uniform(), u2 = d.uniform();
      const double normal =
          std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2 * std::numbers::pi * u2);
      level = level + o.magnitude_std * normal;
    }
    level = std::clamp(level, 0.0, o.magnitude_max);
    double m = timm_magnitude(op, level);
    if (Draw(streams[3], seed, epoch, sample).bernoulli(0.5) && signed_op(op)) m = -m;
    if (active) timm_op(image, op, m, o.fill, scratch);
  }
}

void random_erasing(const RandomErasingOptions& o, ImageView image, uint64_t seed, int64_t epoch,
                    int64_t sample) {
  constexpr int kTries = 10;
  const bool apply = Draw(o.streams[0], seed, epoch, sample).bernoulli(o.p);
  Draw area_draw(o.streams[1], seed, epoch, sample), ratio_draw(o.streams[2], seed, epoch, sample);
  const float area = static_cast<float>(static_cast<double>(image.height) * image.width);
  const double log_r0 = std::log(o.ratio[0]), log_r1 = std::log(o.ratio[1]);
  int64_t h = 0, w = 0;
  bool found = false;
  for (int k = 0; k < kTries; ++k) {  // every try drawn, as the batch op draws all ten
    const float target = area * area_draw.uniform(o.scale[0], o.scale[1]);
    const float aspect = std::exp(ratio_draw.uniform(log_r0, log_r1));
    const auto th = static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
    const auto tw = static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
    if (!found && th < image.height && tw < image.width) {
      found = true;
      h = th;
      w = tw;
    }
  }
  Draw at(o.streams[3], seed, epoch, sample);
  const float u_i = at.uniform(), u_j = at.uniform();
  if (!found || !apply) return;
  const int64_t i = std::max<int64_t>(
      0, static_cast<int64_t>(std::floor(u_i * static_cast<float>(image.height - h + 1))));
  const int64_t j = std::max<int64_t>(
      0, static_cast<int64_t>(std::floor(u_j * static_cast<float>(image.width - w + 1))));
  erase(image, i, j, h, w, o.value);
}

}  // namespace

void check(const Step& step) {
  if (step.kind == StepKind::kTimmRandAugment) {
    const auto& o = step.timm_rand_augment;
    STOKER_CHECK(o.prob >= 0 && o.prob <= 1 && o.magnitude_max >= 0 && o.magnitude_std >= 0 &&
                     std::isfinite(o.magnitude),
                 ErrorCode::kInvalidArgument,
                 "TimmRandAugment: prob in [0, 1], magnitude_max and magnitude_std >= 0");
  } else {
    const auto& o = step.random_erasing;
    STOKER_CHECK(o.p >= 0 && o.p <= 1 && o.scale[0] >= 0 && o.scale[0] <= o.scale[1] &&
                     o.ratio[0] > 0 && o.ratio[0] <= o.ratio[1],
                 ErrorCode::kInvalidArgument,
                 "RandomErasing: p in [0, 1], 0 <= scale[0] <= scale[1], 0 < ratio[0] <= ratio[1]");
  }
}

void apply(const std::vector<Step>& steps, ImageView image, uint64_t seed, int64_t epoch,
           int64_t sample) {
  if (image.width <= 0 || image.height <= 0) return;
  thread_local std::vector<uint8_t> scratch;
  for (const Step& step : steps) {
    if (step.kind == StepKind::kTimmRandAugment)
      timm_rand_augment(step.timm_rand_augment, image, seed, epoch, sample, scratch);
    else
      random_erasing(step.random_erasing, image, seed, epoch, sample);
  }
}

void adjust_brightness(ImageView image, float factor) {
  uint8_t* p = image.pixels;
  for (size_t k = 0, n = pixels_of(image) * 3; k < n; ++k)
    p[k] = to_u8(static_cast<float>(p[k]) * factor);
}

void adjust_saturation(ImageView image, float factor) {
  const float rest = 1.0f - factor;
  uint8_t* p = image.pixels;
  for (size_t k = 0, n = pixels_of(image); k < n; ++k, p += 3) {
    const float gray = luma(p);
    for (int c = 0; c < 3; ++c) p[c] = blend(p[c], gray, factor, rest);
  }
}

void adjust_contrast(ImageView image, float factor) {
  const size_t n = pixels_of(image);
  int64_t sum = 0;  // of integers: exact, as torch's float32 sum is while under 2^24
  const uint8_t* q = image.pixels;
  for (size_t k = 0; k < n; ++k, q += 3) sum += static_cast<int64_t>(luma(q));
  const float mean = static_cast<float>(sum) / static_cast<float>(n);
  const float rest = 1.0f - factor;
  uint8_t* p = image.pixels;
  for (size_t k = 0; k < n * 3; ++k) p[k] = blend(p[k], mean, factor, rest);
}

void adjust_sharpness(ImageView image, float factor) {
  const int w = image.width, h = image.height;
  if (w <= 2 || h <= 2) return;
  const size_t row = static_cast<size_t>(w) * 3;
  // The smoothed image, [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13 rounded, from the original rows:
  // k / 13 is never within 1 / 26 of a half, so torch's float convolution rounds the same.
  thread_local std::vector<uint8_t> original;
  original.assign(image.pixels, image.pixels + row * h);
  const float alpha = 1.0f - factor;
  for (int y = 1; y < h - 1; ++y) {
    const uint8_t* up = original.data() + (y - 1) * row;
    const uint8_t* mid = up + row;
    const uint8_t* down = mid + row;
    uint8_t* out = image.pixels + y * row;
    for (size_t x = 3; x < row - 3; ++x) {
      const int k = up[x - 3] + up[x] + up[x + 3] + mid[x - 3] + 5 * mid[x] + mid[x + 3] +
                    down[x - 3] + down[x] + down[x + 3];
      const float inner = static_cast<float>(mid[x]);
      const float smooth = static_cast<float>((2 * k + 13) / 26);
      out[x] = to_u8(inner + (smooth - inner) * alpha);
    }
  }
}

void posterize(ImageView image, int bits) {
  const auto mask = static_cast<uint8_t>(((1 << bits) - 1) << (8 - bits));
  uint8_t* p = image.pixels;
  for (size_t k = 0, n = pixels_of(image) * 3; k < n; ++k) p[k] &= mask;
}

void solarize(ImageView image, float threshold) {
  uint8_t* p = image.pixels;
  for (size_t k = 0, n = pixels_of(image) * 3; k < n; ++k)
    if (static_cast<float>(p[k]) >= threshold) p[k] = static_cast<uint8_t>(255 - p[k]);
}

void solarize_add(ImageView image, int add) {
  uint8_t* p = image.pixels;
  for (size_t k = 0, n = pixels_of(image) * 3; k < n; ++k)
    if (p[k] < 128) p[k] = to_u8(static_cast<float>(p[k]) + static_cast<float>(add));
}

void invert(ImageView image) {
  uint8_t* p = image.pixels;
  for (size_t k = 0, n = pixels_of(image) * 3; k < n; ++k) p[k] = static_cast<uint8_t>(255 - p[k]);
}

void autocontrast(ImageView image) {
  const size_t n = pixels_of(image);
  for (int c = 0; c < 3; ++c) {
    uint8_t lo = 255, hi = 0;
    const uint8_t* q = image.pixels + c;
    for (size_t k = 0; k < n; ++k, q += 3) {
      lo = std::min(lo, *q);
      hi = std::max(hi, *q);
    }
    if (lo == hi) continue;
    const float low = lo, inv_scale = static_cast<float>(hi - lo) * static_cast<float>(1.0 / 255.0);
    uint8_t* p = image.pixels + c;
    for (size_t k = 0; k < n; ++k, p += 3) *p = to_u8((static_cast<float>(*p) - low) / inv_scale);
  }
}

void equalize(ImageView image) {
  const size_t n = pixels_of(image);
  for (int c = 0; c < 3; ++c) {
    int64_t hist[256] = {};
    const uint8_t* q = image.pixels + c;
    for (size_t k = 0; k < n; ++k, q += 3) ++hist[*q];
    int top = 255;
    while (top > 0 && hist[top] == 0) --top;  // the top value
    const int64_t step = (static_cast<int64_t>(n) - hist[top]) / 255;
    if (step == 0) continue;
    uint8_t lut[256];
    lut[0] = 0;
    int64_t cum = 0;
    for (int k = 1; k < 256; ++k) {
      cum += hist[k - 1];
      lut[k] = static_cast<uint8_t>(std::min<int64_t>((cum + step / 2) / step, 255));
    }
    uint8_t* p = image.pixels + c;
    for (size_t k = 0; k < n; ++k, p += 3) *p = lut[*p];
  }
}

void pil_affine(ImageView image, const std::array<double, 6>& m,
                const std::array<uint8_t, 3>& fill, std::vector<uint8_t>& scratch) {
  const int w = image.width, h = image.height;
  const size_t row = static_cast<size_t>(w) * 3;
  scratch.assign(image.pixels, image.pixels + row * h);
  for (int y = 0; y < h; ++y) {
    const double yc = y + 0.5;
    const double by = m[1] * yc, ey = m[4] * yc;
    uint8_t* out = image.pixels + y * row;
    for (int x = 0; x < w; ++x, out += 3) {
      const double xc = x + 0.5;
      const double fx = std::floor(m[0] * xc + by + m[2]);
      const double fy = std::floor(m[3] * xc + ey + m[5]);
      if (fx >= 0 && fx < w && fy >= 0 && fy < h) {
        const uint8_t* in = scratch.data() + static_cast<size_t>(fy) * row +
                            static_cast<size_t>(fx) * 3;
        out[0] = in[0], out[1] = in[1], out[2] = in[2];
      } else {
        out[0] = fill[0], out[1] = fill[1], out[2] = fill[2];
      }
    }
  }
}

void erase(ImageView image, int64_t top, int64_t left, int64_t h, int64_t w,
           const std::array<uint8_t, 3>& value) {
  const int64_t y0 = std::max<int64_t>(top, 0), y1 = std::min<int64_t>(top + h, image.height);
  const int64_t x0 = std::max<int64_t>(left, 0), x1 = std::min<int64_t>(left + w, image.width);
  for (int64_t y = y0; y < y1; ++y) {
    uint8_t* p = image.pixels + (y * image.width + x0) * 3;
    for (int64_t x = x0; x < x1; ++x, p += 3) p[0] = value[0], p[1] = value[1], p[2] = value[2];
  }
}

void blend_pairs(const uint8_t* images, uint8_t* out, int64_t n, int64_t pixels, int channels,
                 const float* lam, const bool* paste) {
  const int64_t bytes = pixels * channels;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* a = images + i * bytes;
    const uint8_t* b = images + (n - 1 - i) * bytes;
    uint8_t* o = out + i * bytes;
    if (lam == nullptr) {
      std::copy(a, a + bytes, o);
    } else {
      const float w = lam[i], rest = 1.0f - w;
      for (int64_t k = 0; k < bytes; ++k) {
        const float v = std::nearbyint(static_cast<float>(a[k]) * w + static_cast<float>(b[k]) * rest);
        o[k] = static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f));
      }
    }
    if (paste == nullptr) continue;
    const bool* where = paste + i * pixels;
    for (int64_t p = 0; p < pixels; ++p)
      if (where[p]) std::copy(b + p * channels, b + (p + 1) * channels, o + p * channels);
  }
}

}  // namespace stoker::augment
