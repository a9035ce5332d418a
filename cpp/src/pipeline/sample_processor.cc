#include "stoker/pipeline/sample_processor.h"

#include <cmath>

#include "stoker/core/clock.h"
#include "stoker/core/error.h"
#include "stoker/core/random.h"

namespace stoker::pipeline {

namespace {

fields::GeometryOptions geometry_options(const TransformOptions& t) {
  fields::GeometryOptions g;
  g.kind =
      t.train ? fields::GeometryKind::kRandomResizedCrop : fields::GeometryKind::kResizeCenterCrop;
  g.crop = t.crop;
  g.resize_size = t.effective_resize_size();
  g.hflip = t.train ? t.flip_probability : 0.0;
  return g;
}

}  // namespace

int TransformOptions::effective_resize_size() const {
  return resize_size > 0 ? resize_size : static_cast<int>(std::lround(size * 256.0 / 224.0));
}

std::vector<fields::FieldSpec> classification_fields(const TransformOptions& transform,
                                                     const decode::DecodeOptions& decode) {
  fields::FieldSpec image;
  image.name = "image";
  image.kind = fields::FieldKind::kImage;
  image.member = "jpg;jpeg;png;webp";
  image.image.height = image.image.width = transform.size;
  image.image.geometry = geometry_options(transform);
  image.image.allow_dct_scaling = transform.allow_dct_scaling;
  image.image.decode = decode;
  fields::FieldSpec label;
  label.name = "label";
  label.kind = fields::FieldKind::kLabel;
  label.member = "cls";
  label.optional = true;
  return {image, label};
}

SampleProcessor::SampleProcessor(TransformOptions transform, decode::DecodeOptions decode)
    : transform_(transform), geometry_(geometry_options(transform)), renderer_(decode) {
  STOKER_CHECK(transform.size > 0 && transform.size <= 8192, ErrorCode::kInvalidArgument,
               "size must be 1-8192");
}

void SampleProcessor::process(const uint8_t* data, size_t size, uint64_t seed, int64_t epoch,
                              int64_t sample_index, uint8_t* out, StageTimes& times) {
  const int64_t t0 = monotonic_ns();
  const decode::ImageInfo& info = renderer_.open(data, size);
  times.decode_ns += monotonic_ns() - t0;
  KeyedRandom rng(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(sample_index));
  const fields::Geometry g = fields::draw_geometry(geometry_, info.width, info.height,
                                                   transform_.size, transform_.size, rng);
  renderer_.render(g, 3, 0, transform_.allow_dct_scaling, out, times.decode_ns, times.transform_ns);
  last_scale_denom_ = renderer_.last_scale_denom();
}

}  // namespace stoker::pipeline
