// Fuzz target: a JSON box member of a sample (COCO-style objects, a list under "annotations" or
// "boxes", or plain 4-number lists), as a Boxes field reads it with parse_json_boxes
// (fields/box_source.h). The input is the whole member.
//
// Beyond "no crash": boxes come 4 finite numbers and a class >= -1 each; a lower max_boxes refuses
// exactly the members with more boxes (kResourceLimit) and changes nothing else; and whatever the
// streaming reader accepts, a plain reading of nlohmann's DOM of the same bytes gives the same
// numbers and classes.
#include <cmath>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "stoker/core/error.h"
#include "stoker/fields/box_source.h"

using namespace stoker;
using namespace stoker::fields;

namespace {

constexpr int64_t kFewBoxes = 2;

// The accepted shapes, read the obvious way from a DOM; only called on members
// parse_json_boxes accepted, so each expectation is an invariant.
RawBoxes read_dom(const nlohmann::json& j) {
  const nlohmann::json* list = &j;
  if (j.is_object()) {
    const auto a = j.find("annotations");
    const auto b = j.find("boxes");
    FUZZ_CHECK((a == j.end()) != (b == j.end()));
    list = a != j.end() ? &*a : &*b;
  }
  FUZZ_CHECK(list->is_array());
  RawBoxes out;
  for (const nlohmann::json& item : *list) {
    const nlohmann::json* bbox = &item;
    int64_t klass = -1;
    if (item.is_object()) {
      const auto box = item.find("bbox");
      FUZZ_CHECK(box != item.end());
      bbox = &*box;
      const auto category = item.find("category_id");
      if (category != item.end()) {
        FUZZ_CHECK(category->is_number_integer());
        klass = category->get<int64_t>();
      }
    }
    FUZZ_CHECK(bbox->is_array() && bbox->size() == 4);
    for (const nlohmann::json& v : *bbox) {
      FUZZ_CHECK(v.is_number());
      out.coords.push_back(v.get<double>());
    }
    out.classes.push_back(klass);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const BoxLimits limits;
  RawBoxes boxes;
  try {
    boxes = parse_json_boxes(data, size, limits);
  } catch (const Error&) {
    return 0;
  }
  FUZZ_CHECK(boxes.count() <= limits.max_boxes);
  FUZZ_CHECK(boxes.coords.size() == static_cast<size_t>(boxes.count()) * 4);
  for (double c : boxes.coords) FUZZ_CHECK(std::isfinite(c));
  for (int64_t k : boxes.classes) FUZZ_CHECK(k >= -1);

  try {
    const RawBoxes few = parse_json_boxes(data, size, {.max_boxes = kFewBoxes});
    FUZZ_CHECK(boxes.count() <= kFewBoxes);
    FUZZ_CHECK(few.coords == boxes.coords && few.classes == boxes.classes);
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == ErrorCode::kResourceLimit && boxes.count() > kFewBoxes);
  }

  const nlohmann::json dom = nlohmann::json::parse(data, data + size, nullptr, false);
  FUZZ_CHECK(!dom.is_discarded());
  const RawBoxes expected = read_dom(dom);
  FUZZ_CHECK(expected.coords == boxes.coords && expected.classes == boxes.classes);
  return 0;
}
