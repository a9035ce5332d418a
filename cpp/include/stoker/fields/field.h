// A sample is a set of named fields, each read from one member of the sample (KEY.<member>) by a
// field kind that first declares its batch outputs (dtype and per-sample shape: fixed, or padded
// to a maximum with a count per sample) and then decodes one sample into its place in them.
//
// FieldSpec is the whole description of one field (its options are declared here and only here;
// bindings/ binds these structs as classes). A FieldSet checks a list of specs, orders them so that
// a field is decoded after the one whose geometry it follows, and lays out their outputs; each
// worker thread makes its own FieldDecoders from it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stoker/augment/augment.h"
#include "stoker/core/dtype.h"
#include "stoker/core/media_plugin.h"
#include "stoker/decode/image_decoder.h"
#include "stoker/fields/geometry.h"

namespace stoker::fields {

enum class FieldKind : uint8_t {
  kImage,   // JPEG, PNG or WebP -> uint8 [H, W, C] with a geometry
  kMask,    // grey or palette PNG -> uint8 [H, W], following an image's geometry, nearest
  kBoxes,   // .npy or JSON boxes -> boxes [N, 4], classes [N], count: following an image
  kLabel,   // .cls decimal -> int64
  kArray,   // .npy -> [shape] of dtype; a variable first dimension padded, with its length
  kBytes,   // the member's bytes, handed to Python as they are (bytes, text, JSON)
  kTokens,  // a window of seq_len + 1 tokens -> inputs and targets int64 [seq_len] (x, y)
  kVideo,   // a clip of a video member -> uint8 [T, H, W, 3], timestamps, length (media plugin)
  kAudio,   // a window of an audio member -> float32 [channels, samples], length (media plugin)
};

// Where a clip (Video) or a window (Audio) starts: drawn by the sample's keyed generator
// (training), or the middle or the start of the stream (evaluation).
enum class MediaStart : uint8_t { kRandom, kCenter, kStart };
// A video with fewer frames than a clip spans: its frames repeated from the first (kLoop), the
// clip's end left zero with a length (kPad), or the sample left out of its batch and counted with
// the missing ones (kSkip).
enum class ShortClip : uint8_t { kLoop, kPad, kSkip };

enum class BoxFormat : uint8_t { kXYXY, kXYWH, kCXCYWH };

struct ImageOptions {
  int height = 224, width = 224;
  int channels = 3;  // 3: RGB; 1: grey, PIL's convert("L") of the RGB output
  GeometryOptions geometry;
  uint8_t fill = 0;               // outside the image: Letterbox's bars, RandomCrop's padding
  bool allow_dct_scaling = true;  // off: always decode at full size (for comparisons)
  decode::DecodeOptions decode;
  // Adds an output "params", float64 [14]: box (x0, y0, x1, y1, source pixels), rect (x0, y0,
  // x1, y1, output pixels, before flips), scale (x, y), hflip, vflip, source width and height.
  bool return_params = false;
  // stoker.augment's ops run on the rendered image in the worker (3 channels; the loader's
  // augment= on the host, python/stoker/augment/pipeline.py).
  std::vector<augment::Step> augment;
  // decode="gpu": a sample whose file a device decoder takes (device_decodable) is not decoded
  // here: its compressed bytes become the field's blob, its geometry the "params" output (always
  // present then), how to render it the "plan" output (render_plan_params), and its pixels are
  // left zero; any other sample (progressive, CMYK, PNG, WebP, a raw row, one whose output shows
  // none of the image) is decoded here as usual. The output "host_decoded" (uint8 0 or 1) says
  // which. A sample the loader keeps on the host (SampleContext::device_allowed: decode="auto"'s
  // split) is decoded here too.
  bool device_decode = false;
  // The largest DCT scale denominator (1, 2, 4 or 8) the device decoder decodes at: the plan's
  // scale is chosen up to it.
  int device_max_scale_denom = 1;
};

struct MaskOptions {
  uint8_t fill = 0;  // outside the image (Letterbox's bars, RandomCrop's padding)
  decode::DecodeOptions decode;
};

struct BoxesOptions {
  BoxFormat source_format = BoxFormat::kXYWH;  // how the member stores them (COCO: xywh)
  bool source_normalized = false;              // stored in [0, 1] of the source image
  BoxFormat format = BoxFormat::kXYXY;         // the output's
  bool normalized = false;                     // output in [0, 1] of the output image
  int64_t max_boxes = 100;  // output boxes per sample; more after clipping: kResourceLimit
  // A box keeps its place only where at least this fraction of its area (after the geometry,
  // before clipping) stays inside the image; a box with no area left is always dropped.
  double min_visible = 0.0;
  int64_t max_stored_boxes = 10000;  // in one member, before any is dropped
};

struct ArrayOptions {
  DType dtype = DType::kFloat32;  // of the output; the member's is converted
  // Per-sample shape. A first dimension of -1 is variable: padded to max_length (zeros), with
  // a "length" output.
  std::vector<int64_t> shape;
  int64_t max_length = 0;
  int64_t max_elements = int64_t{1} << 26;  // in one member
};

struct TokensOptions {
  int64_t seq_len = 0;  // the window read is seq_len + 1 tokens
  // With eos_id >= 0 (the token ending each document) and positions: outputs "positions"
  // (int64 [seq_len], restarting at 0 after every eos_id in the inputs) and "cu_seqlens"
  // (int32 [seq_len + 1]: 0, the end of each document within the row (after its eos_id), and
  // seq_len, padded with seq_len) with "documents" (int64: the documents in the row, so
  // cu_seqlens[0 .. documents] are its boundaries).
  int64_t eos_id = -1;
  bool positions = false;
};

// The sizes a media member may state before anything is allocated for it
// (media_plugin.h's StokerMediaLimits).
struct MediaLimitOptions {
  int64_t max_pixels = int64_t{1} << 26;          // of one frame
  int64_t max_frames = int64_t{1} << 21;          // of a video stream
  double max_seconds = 24.0 * 3600.0;             // a stream's duration
  int64_t max_decoded_frames = int64_t{1} << 14;  // one clip's decode, from its keyframe
  int64_t max_sample_rate = 768000;
  int64_t max_channels = 64;
};

struct VideoOptions {
  int frames = 16;  // T: frames in a clip
  int stride = 1;   // S: the clip's frames are S apart in the stream (fps 0)
  // > 0: the clip's frames are 1/fps seconds apart, each the source frame whose presentation
  // time is nearest its own (the earlier on a tie), whatever the stream's rate
  double fps = 0.0;
  int height = 224, width = 224;
  // Drawn once per clip from the video's frame size and applied to every frame.
  GeometryOptions geometry;
  uint8_t fill = 0;
  MediaStart start = MediaStart::kRandom;
  ShortClip short_clip = ShortClip::kLoop;
  MediaLimitOptions limits;
  // FFmpeg's frame threads for each clip (1-16; 1: none, the loader's threads decode clips in
  // parallel): for few large clips, where the loader's threads would leave cores idle.
  int decoder_threads = 1;
};

struct AudioOptions {
  double seconds = 1.0;     // the window
  int sample_rate = 16000;  // the output's (resampled with soxr)
  int channels = 1;         // 1: the mean of the file's channels; else the file's own count
  MediaStart start = MediaStart::kRandom;
  MediaLimitOptions limits;
  int64_t samples() const;  // per channel: round(seconds * sample_rate)
};

struct FieldSpec {
  std::string name;  // the key in the batch
  FieldKind kind = FieldKind::kImage;
  std::string member;  // "jpg", "seg.png"; alternatives separated by ';' ("jpg;png"): the first
                       // the sample has
  std::string follow;  // the field whose geometry a Mask, Boxes or Image follows ("": none)
  // A sample without the member gets the field's empty value (zeros, a label of -1, no boxes,
  // b"") instead of going to the loader's missing-member policy.
  bool optional = false;
  int64_t max_member_bytes = int64_t{256} << 20;  // larger: kResourceLimit
  ImageOptions image;
  MaskOptions mask;
  BoxesOptions boxes;
  ArrayOptions array;
  TokensOptions tokens;
  VideoOptions video;
  AudioOptions audio;
};

// One output tensor of a field: [batch, shape...] of dtype.
struct OutputSpec {
  int field = 0;     // index into FieldSet::specs()
  std::string name;  // within the field: "" for the main output, or "classes", "count", ...
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;  // per sample
  size_t sample_bytes = 0;
};

// What a field decoder is given for one sample.
struct SampleContext {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t sample = 0;       // position in pack order
  int64_t label = -1;       // from the index (a .cls member already parsed)
  std::string_view member;  // the member's name (of the field's alternatives, the one found)
  // A raw member's layout (an array pack's row, a window of tokens): its bytes are bare elements;
  // null for an encoded member (JPEG, PNG, WebP, .npy, JSON, text).
  const RawLayout* raw = nullptr;
  // decode="gpu" or "auto": whether this sample may go to the device decoder (decode="auto" keeps
  // a share of each batch on the host).
  bool device_allowed = true;
  // The output size an Image that follows nothing (or a Video) draws its geometry for, when the
  // sample's batch sets it (an aspect bucket's: pipeline::LoaderOptions::group_image_sizes); 0: the
  // field's own. Its followers take it with the geometry.
  int out_width = 0, out_height = 0;
  // A Video's clip length when the sample's batch sets it (a video bucket's); 0: the field's.
  int out_frames = 0;
};

struct FieldTimes {
  int64_t decode_ns = 0, transform_ns = 0;
  // Images rendered on the host at DCT scale 1/1, 1/2, 1/4, 1/8 (PNG, WebP and raw pixels count
  // at 1/1): whether the outputs are small enough beside the images for the decoder to skip most
  // of their pixels.
  std::array<int64_t, 4> scales{};
};

// Thrown by a field decoder for a sample its options leave out (a Video's ShortClip::kSkip): the
// loader leaves the sample out of its batch and counts it with the missing ones.
struct SkipSample {
  std::string reason;
};

// Decodes one field of one sample. One per field per worker thread.
class FieldDecoder {
 public:
  virtual ~FieldDecoder() = default;
  // `data` is the member's bytes (nullptr when absent and the field is optional, or a label taken
  // from the index). `geometry` is the followed field's (for a follower) or this field's own to
  // fill (an Image that follows nothing). `out[i]` is this sample's place in output i of the
  // field; `blob` receives a Bytes field's bytes. Throws Error.
  virtual void decode(const uint8_t* data, size_t size, const SampleContext& context,
                      Geometry& geometry, uint8_t* const* out, std::string* blob,
                      FieldTimes& times) = 0;
};

class FieldSet {
 public:
  // Throws Error(kInvalidArgument) naming the field and what is wrong with it.
  explicit FieldSet(std::vector<FieldSpec> specs);

  const std::vector<FieldSpec>& specs() const { return specs_; }
  const std::vector<OutputSpec>& outputs() const { return outputs_; }
  // Decoding order: every field after the one it follows.
  const std::vector<int>& order() const { return order_; }
  int follows(int field) const { return follow_[static_cast<size_t>(field)]; }  // -1: none
  // Outputs of a field: [first, first + count) of outputs().
  int first_output(int field) const { return first_output_[static_cast<size_t>(field)]; }
  int num_outputs(int field) const;
  // The member alternatives of a field ("jpg;png" -> {"jpg", "png"}).
  const std::vector<std::string>& members(int field) const {
    return members_[static_cast<size_t>(field)];
  }
  int num_blob_fields() const { return num_blobs_; }
  int blob_index(int field) const { return blob_index_[static_cast<size_t>(field)]; }  // -1: none

  std::unique_ptr<FieldDecoder> make_decoder(int field) const;
  // JPEGs the Image fields' decoders hold a ScanIndex for, and its bytes (decode/scan_index.h).
  std::pair<int64_t, int64_t> scan_indexes() const;
  // The geometry Image field `field` (one that follows nothing) draws for a sample of
  // width x height pixels, as its decoder draws it: for callers that apply it themselves (a
  // resident dataset on the GPU). Its params output's 14 values: geometry_params().
  Geometry draw_geometry(int field, uint64_t seed, int64_t epoch, int64_t sample, int width,
                         int height) const;
  // Writes a field's empty value (an optional field's member is absent): `bytes`, each
  // output's bytes for the sample where its batch sets them (a bucket's), else the field's own.
  void write_empty(int field, uint8_t* const* out, const size_t* bytes = nullptr) const;

 private:
  std::vector<FieldSpec> specs_;
  std::vector<OutputSpec> outputs_;
  std::vector<int> order_, follow_, first_output_, blob_index_;
  std::vector<std::vector<std::string>> members_;
  int num_blobs_ = 0;
  // Per field (null but for Image fields): the ScanIndexes its decoders share.
  std::vector<std::shared_ptr<decode::ScanIndexCache>> scan_indexes_;

  int image_stream(int field) const;
};

// Whether decode="gpu" hands a file with this header to the device decoder (a sequential JPEG of
// 1 component or of 3 coded as YCbCr: what nvJPEG's hardware and GPU back ends decode) rather than
// decoding it here.
bool device_decodable(const decode::ImageInfo& info);

// "Image", "Mask", ...: the Python class's name, for messages.
const char* field_kind_name(FieldKind kind);

// An Image's "params" output: box (x0, y0, x1, y1, source pixels), rect (x0, y0, x1, y1, output
// pixels, before flips), scale (x, y), hflip, vflip, source width and height.
void geometry_params(const Geometry& g, double out[14]);
// An Image's "plan" output (decode="gpu"): the RenderPlan (image_renderer.h) as kRenderPlanValues
// numbers: scale_denom, decode (x0, y0, x1, y1), view (x0, y0, x1, y1), box (x0, y0, x1, y1),
// rect (x0, y0, x1, y1), hflip, vflip.
inline constexpr int kRenderPlanValues = 19;
struct RenderPlan;
void render_plan_params(const RenderPlan& plan, double out[kRenderPlanValues]);
// The geometry an Image field with these options, drawing from random stream `stream` (0 for a
// loader's first Image that follows nothing), draws for one sample.
Geometry draw_image_geometry(const ImageOptions& options, int stream, uint64_t seed, int64_t epoch,
                             int64_t sample, int width, int height);
// The same for an output of out_width x out_height instead of the field's own size.
Geometry draw_image_geometry(const ImageOptions& options, int stream, uint64_t seed, int64_t epoch,
                             int64_t sample, int width, int height, int out_width, int out_height);

// The media plugin the Video and Audio fields decode with (null until one is installed).
// Installing checks its version (Error kUnsupported for another); the table must outlive every
// loader.
void install_media_plugin(const StokerMediaPlugin* plugin);
const StokerMediaPlugin* media_plugin();

}  // namespace stoker::fields
