// Bounding boxes read from an untrusted sample member (a Boxes field's source), as stored: four
// numbers per box in whatever convention the member uses (xywh, xyxy, ...: the caller knows and
// converts), and a class per box. Nothing is checked about the geometry here (a negative width
// is the caller's to judge); what is refused is what cannot be read as boxes at all.
//
// Thread safety: the functions are pure; call them from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stoker::fields {

struct RawBoxes {                // as stored: 4 numbers per box in the member's own format
  std::vector<double> coords;    // 4 * count, each finite
  std::vector<int64_t> classes;  // count; -1 where the member gives none, else >= 0
  int64_t count() const { return static_cast<int64_t>(classes.size()); }
};

struct BoxLimits {
  int64_t max_boxes = 10000;
  size_t max_member_bytes = size_t{64} << 20;
};

// JSON (RFC 8259, UTF-8; read as a stream, so memory stays within max_boxes whatever the member
// holds besides the boxes). Accepted shapes:
//   [{"bbox": [a, b, c, d], "category_id": n, ...}, ...]   COCO-style objects; other keys, of any
//                                                          value, are ignored; category_id may be
//                                                          left out (class -1)
//   {"annotations": [...], ...} or {"boxes": [...], ...}   such a list under one of those keys
//                                                          (not both); other keys ignored
//   [[a, b, c, d], ...]                                    plain boxes, no classes
// (a list may mix objects and 4-number lists). bbox items are JSON numbers (integers or floats;
// JSON has no inf or NaN, and numbers too large for a double are refused); category_id a JSON
// integer in [0, 2^63). Errors:
//   kCorruptData: not JSON, or not one of these shapes; the reason says what and where, boxes
//                 numbered from 0 in list order ("box 3: bbox must be 4 numbers"); a key that
//                 matters ("bbox", "category_id", "annotations", "boxes") given twice.
//   kResourceLimit: more than max_boxes boxes; a member larger than max_member_bytes.
//   kInvalidArgument: negative max_boxes.
RawBoxes parse_json_boxes(const uint8_t* data, size_t size, const BoxLimits& limits = {});

// .npy (see npy.h for the file format), any numeric dtype of the allow-list (int, uint, float16/
// 32/64; not bool), of shape
//   [N, 4]   boxes only (class -1)
//   [N, 5]   column 4 is the class
//   [N, 6]   column 4 is the class, column 5 is ignored (a score, say) and not checked
//   [0]      no boxes ([0, 4], [0, 5], [0, 6] too)
// The class must be integral-valued (for floats: finite, with no fraction) and in [-1, 2^63);
// -1 means none. Coordinates must be finite. Errors:
//   kCorruptData: any other shape, a 0-d array, non-finite coordinates, a bad class (the reason
//                 names the box), or a .npy that parse_npy refuses as corrupt.
//   kUnsupported: a dtype parse_npy refuses, or bool.
//   kResourceLimit: more than max_boxes rows; a member larger than max_member_bytes.
//   kInvalidArgument: negative max_boxes.
RawBoxes parse_npy_boxes(const uint8_t* data, size_t size, const BoxLimits& limits = {});

}  // namespace stoker::fields
