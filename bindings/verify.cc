// Verification of a range of samples: CRC32C against the index and a full decode, without the
// GIL, so that Python threads each running a range use every core (stoker.verify).
#include "stoker/pipeline/verify.h"

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "bindings.h"

namespace nb = nanobind;

namespace stoker::bindings {

void register_verify(nb::module_& m) {
  m.def(
      "verify_range",
      [](std::shared_ptr<const format::Dataset> dataset, int64_t begin, int64_t end, bool check_crc,
         bool decode, bool fail_on_warnings, int64_t max_pixels, int max_scans,
         int64_t max_decode_memory) {
        if (!dataset) throw nb::type_error("dataset must not be None");
        pipeline::VerifyOptions o;
        o.check_crc = check_crc;
        o.decode = decode;
        o.fail_on_warnings = fail_on_warnings;
        o.max_pixels = max_pixels;
        o.max_scans = max_scans;
        o.max_decode_memory = max_decode_memory;
        pipeline::VerifyResult r;
        {
          // A copy: the parameter keeps the last reference, dropped only once the GIL is back.
          nb::gil_scoped_release release;
          r = pipeline::verify_range(dataset, begin, end, o);
        }
        nb::list failures;
        for (const pipeline::VerifyFailure& f : r.failures)
          failures.append(nb::make_tuple(f.index, static_cast<int>(f.error.code()), f.error.shard(),
                                         f.error.key(), f.error.reason()));
        nb::dict out;
        out["failures"] = failures;
        out["checked"] = r.checked;
        out["bytes"] = r.bytes;
        out["crc_checked"] = r.crc_checked;
        return out;
      },
      nb::arg("dataset"), nb::arg("begin"), nb::arg("end"), nb::kw_only(),
      nb::arg("check_crc") = true, nb::arg("decode") = true, nb::arg("fail_on_warnings") = true,
      nb::arg("max_pixels") = int64_t{1} << 28, nb::arg("max_scans") = 256,
      nb::arg("max_decode_memory") = decode::DecodeOptions{}.max_decode_memory,
      "Checks samples [begin, end): CRC32C against the index (when the dataset has CRCs) and a "
      "full decode. Returns {'failures': [(index, error_code, shard, key, reason)], 'checked', "
      "'bytes', 'crc_checked'}. Releases the GIL.");
}

}  // namespace stoker::bindings
