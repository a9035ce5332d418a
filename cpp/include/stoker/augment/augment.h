// Host augmentations in the worker threads: stoker.augment's ops (python/stoker/augment) on one
// uint8 RGB image (rows of width * 3 bytes), right after the image is rendered into its place
// in the batch, so that a host loader's augment= costs no time on the training thread.
//
// Each op computes what its Python (torch) form computes on a uint8 batch, in the same float32
// operations and order, and draws what it draws: a draw is Python's KeyedDraws(seed, epoch,
// sample) of a name, whose 64-bit id (blake2b of the name, python/stoker/augment/keyed.py) the
// Python side passes in `streams`. Kernels use no fused multiply-add where torch does not
// (built with -ffp-contract=off), and std::fma where torch does (its add with alpha).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace stoker::augment {

// One image: rows of width * 3 bytes, RGB.
struct ImageView {
  uint8_t* pixels = nullptr;
  int width = 0, height = 0;
};

// Pillow's resampling filters, for PIL's geometry (Image.transform's NEAREST, BILINEAR, BICUBIC).
enum class Resample : uint8_t { kNearest, kBilinear, kBicubic };

// timm's RandAugment (stoker.augment.TimmRandAugment): per layer, an op of timm's 15, applied
// with probability `prob`, at a magnitude drawn around `magnitude`; its geometry (rotate,
// shear, translate) resampled with a filter drawn from `interpolation` (timm's
// _RANDOM_INTERPOLATION: bilinear or bicubic, one each time; or create_transform's one).
struct TimmRandAugmentOptions {
  double magnitude = 9, magnitude_std = 0.5, prob = 0.5, magnitude_max = 10;
  std::array<uint8_t, 3> fill{124, 116, 104};  // geometry's outside pixels
  std::vector<Resample> interpolation{Resample::kBilinear, Resample::kBicubic};
  // Per layer, the draws "op", "apply", "level", "sign" and "filter" of that layer.
  std::vector<std::array<uint64_t, 5>> streams;
};

// torchvision's RandomErasing (stoker.augment.RandomErasing) with a constant value.
struct RandomErasingOptions {
  double p = 0.5;
  std::array<double, 2> scale{0.02, 0.33}, ratio{0.3, 3.3};
  std::array<uint8_t, 3> value{0, 0, 0};
  std::array<uint64_t, 4> streams{};  // the draws "apply", "area", "ratio", "at"
};

// torchvision's ColorJitter (stoker.augment.ColorJitter): four factors and an order per sample.
struct ColorJitterOptions {
  // [low, high] of each factor; an op whose range is its identity (1, or 0 for hue) is skipped.
  std::array<double, 2> brightness{1, 1}, contrast{1, 1}, saturation{1, 1}, hue{0, 0};
  std::array<uint64_t, 5> streams{};  // the draws "0" .. "3" (the factors) and "order"
};

struct RandomGrayscaleOptions {
  double p = 0.1;
  uint64_t stream = 0;  // the draw of the op's own name
};

struct GaussianBlurOptions {
  int kernel_width = 3, kernel_height = 3;  // odd
  double sigma_min = 0.1, sigma_max = 2.0;
  uint64_t stream = 0;  // the draw of the op's own name
};

// torchvision's RandAugment and TrivialAugmentWide (stoker.augment.RandAugment,
// TrivialAugmentWide): per round an op of torchvision's 14 (Identity, ShearX, ShearY,
// TranslateX, TranslateY, Rotate, Brightness, Color, Contrast, Sharpness, Posterize, Solarize,
// AutoContrast, Equalize), its magnitude a bin of `magnitudes`, signed ops negated with
// probability 1/2; geometry through torchvision's affine (nearest).
struct TorchvisionAugmentOptions {
  int bins = 1;  // RandAugment: 1 (its magnitude's bin); TrivialAugmentWide: a bin drawn
  std::vector<double> magnitudes;  // [14 * bins], op-major
  bool fill_outside = false;       // false: outside pixels 0, as torchvision with fill=None
  std::array<uint8_t, 3> fill{0, 0, 0};
  // Per round, the draws "op", "sign" and (bins > 1) "bin".
  std::vector<std::array<uint64_t, 3>> streams;
};

enum class StepKind : uint8_t {
  kTimmRandAugment,
  kRandomErasing,
  kColorJitter,
  kRandomGrayscale,
  kGaussianBlur,
  kTorchvisionAugment,
};

struct Step {
  StepKind kind = StepKind::kTimmRandAugment;
  TimmRandAugmentOptions timm_rand_augment;
  RandomErasingOptions random_erasing;
  ColorJitterOptions color_jitter;
  RandomGrayscaleOptions random_grayscale;
  GaussianBlurOptions gaussian_blur;
  TorchvisionAugmentOptions torchvision_augment;
};

// Applies `steps` in order to one sample's image. Throws Error(kInvalidArgument) for options
// out of range.
void apply(const std::vector<Step>& steps, ImageView image, uint64_t seed, int64_t epoch,
           int64_t sample);

// Checks a step's options (the loader does when it is built). Throws Error(kInvalidArgument).
void check(const Step& step);

// One op at a given magnitude (the per-op benchmark; the tests of each op's kernels), named as
// stoker.augment.functional names it: "brightness", "contrast", "saturation", "sharpness"
// (factors), "hue" (a turn in [-0.5, 0.5]), "grayscale", "posterize" (bits), "solarize" (the
// threshold), "solarize_add" (timm's: added below 128), "invert", "autocontrast", "equalize",
// "gaussian_blur" (sigma, a 9 x 9 kernel); torchvision's geometry (nearest, `fill` outside):
// "rotate" (degrees), "shear_x", "shear_y" (the shear factor), "translate_x", "translate_y"
// (pixels); PIL's, as timm runs it: "pil_rotate", "pil_shear_x", "pil_shear_y",
// "pil_translate_x", "pil_translate_y" (nearest; with "_bilinear" or "_bicubic" after the name,
// Pillow's filter), and Pillow's enhancers "pil_color", "pil_contrast", "pil_sharpness"
// (factors), "pil_autocontrast". Throws Error(kInvalidArgument) for another name.
void apply_op(ImageView image, std::string_view op, double magnitude,
              const std::array<uint8_t, 3>& fill);

// --- the ops, each on one image (stoker.augment.functional's names) ---------------------------
void adjust_brightness(ImageView image, float factor);
void adjust_saturation(ImageView image, double factor);
void adjust_contrast(ImageView image, double factor);
void adjust_sharpness(ImageView image, double factor);
void adjust_hue(ImageView image, float factor);
void rgb_to_grayscale(ImageView image);  // luma in all three channels
// Separable Gaussian blur, reflect padding, the taps torchvision's formula gives for sigma.
void gaussian_blur(ImageView image, int kernel_width, int kernel_height, float sigma_x,
                   float sigma_y, std::vector<float>& scratch);
void posterize(ImageView image, int bits);
void solarize(ImageView image, float threshold);
void solarize_add(ImageView image, int add);  // timm: values below 128 raised by `add`
void invert(ImageView image);
void autocontrast(ImageView image);
void equalize(ImageView image);
// Pillow's enhancers, as timm's Color, Contrast, Sharpness and AutoContrast call them on a PIL
// image (ImageEnhance.Color, Contrast, Sharpness(image).enhance(factor); ImageOps.autocontrast),
// byte for byte as Pillow 13 computes them: a blend with Image.blend's float32 arithmetic
// (degenerate + factor (image - degenerate), clipped, truncated) with Pillow's luma
// ((19595 R + 38470 G + 7471 B + 2^15) >> 16), the mean of that luma rounded to a level, or
// Pillow's SMOOTH filter (the border kept); autocontrast's table in Python's float64.
void pil_color(ImageView image, double factor);
void pil_contrast(ImageView image, double factor);
void pil_sharpness(ImageView image, double factor);
void pil_autocontrast(ImageView image);
// PIL's Image.transform(AFFINE, matrix, resample, fillcolor=fill): output pixel (x, y) samples
// the input under (a x' + b y' + c, d x' + e y' + f), x' = x + 0.5: NEAREST takes the pixel
// there, floored; BILINEAR and BICUBIC blend its neighbours with Pillow's own float64 filters
// (pil_filters.h), byte for byte; outside, `fill`.
void pil_affine(ImageView image, const std::array<double, 6>& matrix,
                const std::array<uint8_t, 3>& fill, std::vector<uint8_t>& scratch,
                Resample resample = Resample::kNearest);
// PIL's Image.rotate(degrees, resample, fillcolor=fill): its matrix (the angle modulo 360, its
// cosine and sine rounded to 15 decimal places, as Python's round), then pil_affine.
void pil_rotate(ImageView image, double degrees, const std::array<uint8_t, 3>& fill,
                std::vector<uint8_t>& scratch, Resample resample = Resample::kNearest);
// torchvision's affine with nearest sampling: `inverse` maps an output pixel (centred
// coordinates) to the input, as _get_inverse_affine_matrix gives it; outside, `fill` (or 0).
void torchvision_affine(ImageView image, const std::array<double, 6>& inverse, bool fill_outside,
                        const std::array<uint8_t, 3>& fill, std::vector<uint8_t>& scratch);
// Rows [top, top + h) and columns [left, left + w) (cut at the edges) set to `value`.
void erase(ImageView image, int64_t top, int64_t left, int64_t h, int64_t w,
           const std::array<uint8_t, 3>& value);

// MixUp and CutMix on a uint8 batch of n images of `image_bytes` bytes (pixels * channels,
// interleaved), each with its partner n - 1 - i (timm's flipped batch): out[i] =
// rint(x[i] * lam[i] + x[n-1-i] * (1 - lam[i])) in float32 (lam null: x[i]), then x[n-1-i]'s
// values at the pixels where paste[i] (bool [pixels], null: none) is set. `out` must not
// overlap `images`.
void blend_pairs(const uint8_t* images, uint8_t* out, int64_t n, int64_t pixels, int channels,
                 const float* lam, const bool* paste);

}  // namespace stoker::augment
