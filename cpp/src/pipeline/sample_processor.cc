#include "stoker/pipeline/sample_processor.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "stoker/core/clock.h"
#include "stoker/core/error.h"
#include "stoker/core/random.h"

namespace stoker::pipeline {

namespace {

// libjpeg's fancy upsampling treats a cropped region's border as an image border, so pixels within
// two of a crop edge may differ from a full decode; decoding this much extra keeps them unused.
constexpr int kCropMargin = 2;

}  // namespace

int TransformOptions::effective_resize_size() const {
  return resize_size > 0 ? resize_size : static_cast<int>(std::lround(size * 256.0 / 224.0));
}

transform::RegionView region_view(const decode::DecodedRegion& region) {
  return {region.pixels,   region.width,    region.height,       region.stride,
          region.origin_x, region.origin_y, region.scaled_width, region.scaled_height};
}

int choose_scale_denom(const transform::Box& box, int out, int max_denom) {
  int denom = 1;
  while (denom * 2 <= max_denom && box.width() / (denom * 2) >= out &&
         box.height() / (denom * 2) >= out)
    denom *= 2;
  return denom;
}

SampleProcessor::SampleProcessor(TransformOptions transform, decode::DecodeOptions decode)
    : transform_(transform), decoder_(decode) {
  STOKER_CHECK(transform.size > 0 && transform.size <= 8192, ErrorCode::kInvalidArgument,
               "size must be 1-8192");
}

void SampleProcessor::process(const uint8_t* data, size_t size, uint64_t seed, int64_t epoch,
                              int64_t sample_index, uint8_t* out, StageTimes& times) {
  const int64_t t0 = monotonic_ns();
  const decode::ImageInfo& info = decoder_.open(data, size);
  const int out_size = transform_.size;
  KeyedRandom rng(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(sample_index));
  transform::Box box;
  bool flip = false;
  if (transform_.train) {
    box = transform::random_resized_crop(info.width, info.height, rng, transform_.crop);
    flip = rng.uniform() < transform_.flip_probability;
  } else {
    box = transform::resize_center_crop(info.width, info.height, transform_.effective_resize_size(),
                                        out_size);
  }
  const int denom = transform_.allow_dct_scaling
                        ? choose_scale_denom(box, out_size, decoder_.max_scale_denom())
                        : 1;
  last_scale_denom_ = denom;
  const transform::Box scaled{box.x0 / denom, box.y0 / denom, box.x1 / denom, box.y1 / denom};
  const int scaled_w = decode::scaled_size(info.width, denom);
  const int scaled_h = decode::scaled_size(info.height, denom);
  transform::RegionView view;
  transform::Box resample_box = scaled;
  if (transform_.train) {
    // torchvision crops, then resizes: the filter sees only the crop's pixels, so the crop
    // (rounded out to whole pixels of the scaled image) is the image the resampler works on.
    const transform::PixelRect crop{std::max(0, static_cast<int>(std::floor(scaled.x0))),
                                    std::max(0, static_cast<int>(std::floor(scaled.y0))),
                                    std::min(scaled_w, static_cast<int>(std::ceil(scaled.x1))),
                                    std::min(scaled_h, static_cast<int>(std::ceil(scaled.y1)))};
    const decode::DecodedRegion& region =
        decoder_.decode(denom, crop.x0 - kCropMargin, crop.y0 - kCropMargin, crop.x1 + kCropMargin,
                        crop.y1 + kCropMargin);
    view.pixels = region.pixels +
                  static_cast<ptrdiff_t>(crop.y0 - region.origin_y) * region.stride +
                  static_cast<ptrdiff_t>(crop.x0 - region.origin_x) * 3;
    view.width = view.image_width = crop.width();
    view.height = view.image_height = crop.height();
    view.stride = region.stride;
    resample_box = {scaled.x0 - crop.x0, scaled.y0 - crop.y0, scaled.x1 - crop.x0,
                    scaled.y1 - crop.y0};
  } else {
    // Resize-then-crop reads pixels around the crop too: decode the filter's whole support.
    const transform::PixelRect need =
        transform::resample_support(scaled, out_size, out_size, scaled_w, scaled_h);
    const decode::DecodedRegion& region =
        decoder_.decode(denom, need.x0 - kCropMargin, need.y0 - kCropMargin, need.x1 + kCropMargin,
                        need.y1 + kCropMargin);
    view = region_view(region);
  }
  const int64_t t1 = monotonic_ns();
  resampler_.resize(view, resample_box, out, out_size, out_size,
                    static_cast<ptrdiff_t>(out_size) * 3, flip);
  const int64_t t2 = monotonic_ns();
  times.decode_ns += t1 - t0;
  times.transform_ns += t2 - t1;
}

}  // namespace stoker::pipeline
