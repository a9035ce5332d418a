#include <algorithm>
#include <cstring>
#include <functional>

#include "fields/detail/decoders.h"
#include "stoker/core/error.h"
#include "stoker/fields/field.h"

namespace stoker::fields {

namespace {

size_t elements(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::vector<std::string> split_members(const std::string& member) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= member.size()) {
    const size_t end = std::min(member.find(';', start), member.size());
    if (end > start) out.push_back(member.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

const char* field_kind_name(FieldKind kind) {
  switch (kind) {
    case FieldKind::kImage: return "Image";
    case FieldKind::kMask: return "Mask";
    case FieldKind::kBoxes: return "Boxes";
    case FieldKind::kLabel: return "Label";
    case FieldKind::kArray: return "Array";
    case FieldKind::kBytes: return "Bytes";
    case FieldKind::kTokens: return "Tokens";
    case FieldKind::kVideo: return "Video";
    case FieldKind::kAudio: return "Audio";
  }
  return "?";
}

FieldSet::FieldSet(std::vector<FieldSpec> specs) : specs_(std::move(specs)) {
  const int n = static_cast<int>(specs_.size());
  STOKER_CHECK(n > 0, ErrorCode::kInvalidArgument, "a loader needs at least one field");
  auto bad = [](const FieldSpec& s, const std::string& why) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(field_kind_name(s.kind)) + " field '" + s.name + "': " + why);
  };
  auto check_geometry = [&bad](const FieldSpec& s, const GeometryOptions& g) {
    if (!(g.crop.scale_min > 0 && g.crop.scale_min <= g.crop.scale_max && g.crop.scale_max <= 1.0))
      bad(s, "scale must satisfy 0 < min <= max <= 1");
    if (!(g.crop.ratio_min > 0 && g.crop.ratio_min <= g.crop.ratio_max))
      bad(s, "ratio must satisfy 0 < min <= max");
    if (g.resize_size < 0 || g.resize_size > 65536) bad(s, "resize_size must be 0-65536");
    if (g.padding < 0 || g.padding > 65536) bad(s, "padding must be 0-65536");
    if (!(g.hflip >= 0 && g.hflip <= 1 && g.vflip >= 0 && g.vflip <= 1))
      bad(s, "flip probabilities must be in [0, 1]");
  };
  auto check_media_limits = [&bad](const FieldSpec& s, const MediaLimitOptions& l) {
    if (l.max_pixels < 1 || l.max_frames < 1 || !(l.max_seconds > 0) || l.max_decoded_frames < 1 ||
        l.max_sample_rate < 1 || l.max_channels < 1)
      bad(s, "media limits must be positive");
  };
  follow_.assign(static_cast<size_t>(n), -1);
  for (int i = 0; i < n; ++i) {
    const FieldSpec& s = specs_[static_cast<size_t>(i)];
    STOKER_CHECK(!s.name.empty(), ErrorCode::kInvalidArgument, "a field needs a name");
    for (int j = 0; j < i; ++j)
      if (specs_[static_cast<size_t>(j)].name == s.name) bad(s, "two fields have this name");
    members_.push_back(split_members(s.member));
    if (members_.back().empty()) bad(s, "no member name given (e.g. \"jpg\", \"seg.png\")");
    if (s.max_member_bytes <= 0) bad(s, "max_member_bytes must be positive");
    if (!s.follow.empty()) {
      for (int j = 0; j < n; ++j)
        if (specs_[static_cast<size_t>(j)].name == s.follow) follow_[static_cast<size_t>(i)] = j;
      const int f = follow_[static_cast<size_t>(i)];
      if (f < 0) bad(s, "follows '" + s.follow + "', which is not a field");
      if (f == i) bad(s, "follows itself");
      if (specs_[static_cast<size_t>(f)].kind != FieldKind::kImage)
        bad(s, "follows '" + s.follow + "', which is not an Image field");
      if (s.kind != FieldKind::kImage && s.kind != FieldKind::kMask && s.kind != FieldKind::kBoxes)
        bad(s, "only Image, Mask and Boxes fields follow a geometry");
    }
    switch (s.kind) {
      case FieldKind::kImage: {
        const ImageOptions& o = s.image;
        if (o.height < 1 || o.height > 16384 || o.width < 1 || o.width > 16384)
          bad(s, "size must be 1-16384 on each side");
        if (o.channels != 1 && o.channels != 3) bad(s, "channels must be 1 or 3");
        if (o.decode.max_scan_index_memory < 0) bad(s, "scan_index_memory must be >= 0");
        if (!o.augment.empty() && o.channels != 3) bad(s, "augment= takes RGB images (channels 3)");
        if (o.device_decode && !o.augment.empty())
          bad(s, "decode=\"gpu\"'s augment= runs on the device, not in the workers");
        if (o.device_max_scale_denom != 1 && o.device_max_scale_denom != 2 &&
            o.device_max_scale_denom != 4 && o.device_max_scale_denom != 8)
          bad(s, "device_max_scale_denom must be 1, 2, 4 or 8");
        if (o.device_decode && follow_[static_cast<size_t>(i)] >= 0)
          bad(s, "decode=\"gpu\" is for an Image that follows nothing");
        for (const augment::Step& step : o.augment) augment::check(step);
        check_geometry(s, o.geometry);
        if (const int f = follow_[static_cast<size_t>(i)]; f >= 0) {
          const ImageOptions& led = specs_[static_cast<size_t>(f)].image;
          if (led.height != o.height || led.width != o.width)
            bad(s, "an Image that follows another has its size");
        }
        break;
      }
      case FieldKind::kMask:
        if (follow_[static_cast<size_t>(i)] < 0) bad(s, "a Mask must follow an Image field");
        break;
      case FieldKind::kBoxes: {
        const BoxesOptions& o = s.boxes;
        if (o.max_boxes < 1 || o.max_boxes > 100000) bad(s, "max_boxes must be 1-100000");
        if (o.max_stored_boxes < o.max_boxes) bad(s, "max_stored_boxes must be >= max_boxes");
        if (!(o.min_visible >= 0 && o.min_visible <= 1)) bad(s, "min_visible must be in [0, 1]");
        if (follow_[static_cast<size_t>(i)] < 0 && (o.source_normalized || o.normalized))
          bad(s, "normalised boxes need an image to follow (its size)");
        break;
      }
      case FieldKind::kArray: {
        const ArrayOptions& o = s.array;
        if (o.shape.empty() && o.max_length != 0) bad(s, "max_length needs a shape [-1, ...]");
        if (o.shape.size() > 8) bad(s, "at most 8 dimensions");
        for (size_t d = 0; d < o.shape.size(); ++d)
          if (o.shape[d] < (d == 0 ? -1 : 0) || o.shape[d] > (int64_t{1} << 31))
            bad(s, "shape dimensions must be >= 0 (the first may be -1: variable)");
        if (!o.shape.empty() && o.shape[0] == -1 && (o.max_length < 1 || o.max_length > (1 << 30)))
          bad(s, "a variable first dimension needs max_length >= 1");
        break;
      }
      case FieldKind::kTokens: {
        const TokensOptions& o = s.tokens;
        if (o.seq_len < 1 || o.seq_len > (int64_t{1} << 24)) bad(s, "seq_len must be 1-2^24");
        if (o.positions && o.eos_id < 0) bad(s, "positions need eos_id (>= 0)");
        break;
      }
      case FieldKind::kVideo: {
        const VideoOptions& o = s.video;
        if (o.frames < 1 || o.frames > 4096) bad(s, "frames must be 1-4096");
        if (o.stride < 1 || o.stride > 4096) bad(s, "stride must be 1-4096");
        if (o.decoder_threads < 1 || o.decoder_threads > 16) bad(s, "decoder_threads must be 1-16");
        if (!(o.fps >= 0 && o.fps <= 1000)) bad(s, "fps must be in (0, 1000], or 0 for stride");
        if (o.fps > 0 && o.stride != 1) bad(s, "stride is for clips without fps");
        if (o.height < 1 || o.height > 16384 || o.width < 1 || o.width > 16384)
          bad(s, "size must be 1-16384 on each side");
        check_geometry(s, o.geometry);
        check_media_limits(s, o.limits);
        if (static_cast<int64_t>(o.frames - 1) * o.stride + 1 > o.limits.max_decoded_frames)
          bad(s, "a clip spans more frames than max_decoded_frames");
        break;
      }
      case FieldKind::kAudio: {
        const AudioOptions& o = s.audio;
        check_media_limits(s, o.limits);
        if (!(o.seconds > 0 && o.seconds <= 3600)) bad(s, "seconds must be in (0, 3600]");
        if (o.sample_rate < 1 || o.sample_rate > o.limits.max_sample_rate)
          bad(s, "sample_rate must be 1-max_sample_rate");
        if (o.channels < 1 || o.channels > o.limits.max_channels)
          bad(s, "channels must be 1-max_channels");
        break;
      }
      case FieldKind::kLabel:
      case FieldKind::kBytes: break;
    }
  }
  // Decoding order: a field after the one it follows (followed fields are Images that follow
  // nothing, or Images that follow one: a chain, never a cycle since a follower of a follower
  // is resolved depth first).
  std::vector<int> state(static_cast<size_t>(n), 0);  // 0 new, 1 visiting, 2 done
  std::function<void(int)> visit = [&](int i) {
    if (state[static_cast<size_t>(i)] == 2) return;
    if (state[static_cast<size_t>(i)] == 1)
      bad(specs_[static_cast<size_t>(i)], "the fields follow one another in a cycle");
    state[static_cast<size_t>(i)] = 1;
    if (follow_[static_cast<size_t>(i)] >= 0) visit(follow_[static_cast<size_t>(i)]);
    state[static_cast<size_t>(i)] = 2;
    order_.push_back(i);
  };
  for (int i = 0; i < n; ++i) visit(i);

  // Outputs, in field order.
  blob_index_.assign(static_cast<size_t>(n), -1);
  for (int i = 0; i < n; ++i) {
    const FieldSpec& s = specs_[static_cast<size_t>(i)];
    first_output_.push_back(static_cast<int>(outputs_.size()));
    auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape) {
      OutputSpec o;
      o.field = i;
      o.name = std::move(name);
      o.dtype = dtype;
      o.shape = std::move(shape);
      o.sample_bytes = elements(o.shape) * dtype_size(dtype);
      outputs_.push_back(std::move(o));
    };
    switch (s.kind) {
      case FieldKind::kImage:
        add("", DType::kUInt8, {s.image.height, s.image.width, s.image.channels});
        if (s.image.return_params || s.image.device_decode) add("params", DType::kFloat64, {14});
        if (s.image.device_decode) {
          add("plan", DType::kFloat64, {kRenderPlanValues});
          add("host_decoded", DType::kUInt8, {});
          blob_index_[static_cast<size_t>(i)] = num_blobs_++;
        }
        break;
      case FieldKind::kMask: {
        const ImageOptions& img =
            specs_[static_cast<size_t>(follow_[static_cast<size_t>(i)])].image;
        add("", DType::kUInt8, {img.height, img.width});
        break;
      }
      case FieldKind::kBoxes:
        add("", DType::kFloat32, {s.boxes.max_boxes, 4});
        add("classes", DType::kInt64, {s.boxes.max_boxes});
        add("count", DType::kInt64, {});
        break;
      case FieldKind::kLabel: add("", DType::kInt64, {}); break;
      case FieldKind::kArray: {
        std::vector<int64_t> shape = s.array.shape;
        const bool variable = !shape.empty() && shape[0] == -1;
        if (variable) shape[0] = s.array.max_length;
        add("", s.array.dtype, shape);
        if (variable) add("length", DType::kInt64, {});
        break;
      }
      case FieldKind::kBytes: blob_index_[static_cast<size_t>(i)] = num_blobs_++; break;
      case FieldKind::kVideo:
        add("", DType::kUInt8, {s.video.frames, s.video.height, s.video.width, 3});
        add("timestamps", DType::kFloat64, {s.video.frames});
        add("length", DType::kInt64, {});
        break;
      case FieldKind::kAudio:
        add("", DType::kFloat32, {s.audio.channels, s.audio.samples()});
        add("length", DType::kInt64, {});
        break;
      case FieldKind::kTokens:
        add("", DType::kInt64, {s.tokens.seq_len});
        add("targets", DType::kInt64, {s.tokens.seq_len});
        if (s.tokens.positions) {
          add("positions", DType::kInt64, {s.tokens.seq_len});
          add("cu_seqlens", DType::kInt32, {s.tokens.seq_len + 1});
          add("documents", DType::kInt64, {});
        }
        break;
    }
  }
  for (const FieldSpec& s : specs_) {
    const decode::DecodeOptions& d = s.image.decode;
    scan_indexes_.push_back(s.kind == FieldKind::kImage && d.scan_index &&
                                    d.max_scan_index_memory > 0
                                ? std::make_shared<decode::ScanIndexCache>(d.max_scan_index_memory)
                                : nullptr);
  }
}

int FieldSet::num_outputs(int field) const {
  const int next = field + 1 < static_cast<int>(specs_.size())
                       ? first_output_[static_cast<size_t>(field) + 1]
                       : static_cast<int>(outputs_.size());
  return next - first_output(field);
}

int FieldSet::image_stream(int field) const {
  // Each Image that draws its own geometry gets its own random stream: the first one the
  // stream ImageLoader always used.
  int stream = 0;
  for (int j = 0; j < field; ++j)
    stream += specs_[static_cast<size_t>(j)].kind == FieldKind::kImage &&
              follow_[static_cast<size_t>(j)] < 0;
  return stream;
}

Geometry FieldSet::draw_geometry(int field, uint64_t seed, int64_t epoch, int64_t sample, int width,
                                 int height) const {
  const FieldSpec& s = specs_.at(static_cast<size_t>(field));
  STOKER_CHECK(s.kind == FieldKind::kImage && follow_[static_cast<size_t>(field)] < 0,
               ErrorCode::kInvalidArgument, "draw_geometry: not an Image that follows nothing");
  return draw_image_geometry(s.image, image_stream(field), seed, epoch, sample, width, height);
}

std::pair<int64_t, int64_t> FieldSet::scan_indexes() const {
  std::pair<int64_t, int64_t> total{0, 0};
  for (const auto& cache : scan_indexes_)
    if (cache) total.first += cache->indexed(), total.second += cache->bytes();
  return total;
}

std::unique_ptr<FieldDecoder> FieldSet::make_decoder(int field) const {
  const FieldSpec& s = specs_.at(static_cast<size_t>(field));
  switch (s.kind) {
    case FieldKind::kImage:
      return detail::make_image_decoder(s, follow_[static_cast<size_t>(field)] >= 0,
                                        image_stream(field),
                                        scan_indexes_[static_cast<size_t>(field)]);
    case FieldKind::kMask: return detail::make_mask_decoder(s);
    case FieldKind::kBoxes:
      return detail::make_boxes_decoder(s, follow_[static_cast<size_t>(field)] >= 0);
    case FieldKind::kLabel: return detail::make_label_decoder();
    case FieldKind::kArray: return detail::make_array_decoder(s);
    case FieldKind::kBytes: return detail::make_bytes_decoder();
    case FieldKind::kTokens: return detail::make_tokens_decoder(s);
    case FieldKind::kVideo: return detail::make_video_decoder(s, field);
    case FieldKind::kAudio: return detail::make_audio_decoder(s, field);
  }
  throw Error(ErrorCode::kInternal, "unknown field kind");
}

void FieldSet::write_empty(int field, uint8_t* const* out, const size_t* bytes) const {
  const FieldSpec& s = specs_.at(static_cast<size_t>(field));
  const int first = first_output(field);
  auto size = [&](int k) {
    return bytes ? bytes[k] : outputs_[static_cast<size_t>(first + k)].sample_bytes;
  };
  for (int k = 0; k < num_outputs(field); ++k) std::memset(out[k], 0, size(k));
  if (s.kind == FieldKind::kMask) {
    std::memset(out[0], s.mask.fill, size(0));
  } else if (s.kind == FieldKind::kLabel) {
    const int64_t none = -1;
    std::memcpy(out[0], &none, sizeof none);
  } else if (s.kind == FieldKind::kBoxes) {
    auto* classes = reinterpret_cast<int64_t*>(out[1]);
    std::fill(classes, classes + s.boxes.max_boxes, int64_t{-1});
  } else if (s.kind == FieldKind::kVideo) {  // no frame: no time
    auto* timestamps = reinterpret_cast<double*>(out[1]);
    std::fill(timestamps, timestamps + size(1) / sizeof(double), -1.0);
  }
}

}  // namespace stoker::fields
