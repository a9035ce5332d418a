// Packing plans for TokenLoader(packing="best_fit" | "first_fit") (stoker/sequence).
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <span>
#include <string>

#include "bindings.h"
#include "stoker/core/error.h"
#include "stoker/sequence/row_packing.h"

namespace nb = nanobind;

namespace stoker::bindings {

void register_sequence(nb::module_& m) {
  using Lengths = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  using Rows = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  m.def(
      "pack_rows",
      [](Lengths lengths, Rows row_of, int64_t capacity, int64_t max_segments, int64_t window,
         const std::string& fit) {
        STOKER_CHECK(fit == "best_fit" || fit == "first_fit", ErrorCode::kInvalidArgument,
                     "fit is 'best_fit' or 'first_fit', not '" + fit + "'");
        const sequence::RowPacking options{
            capacity, max_segments, window,
            fit == "best_fit" ? sequence::Fit::kBest : sequence::Fit::kFirst};
        std::span<const int64_t> in(lengths.data(), lengths.shape(0));
        std::span<int64_t> out(row_of.data(), row_of.shape(0));
        nb::gil_scoped_release release;
        return sequence::pack_rows(in, options, out);
      },
      nb::arg("lengths"), nb::arg("row_of"), nb::arg("capacity"), nb::arg("max_segments"),
      nb::arg("window"), nb::arg("fit"),
      "Writes each piece's row into row_of (int64, one per piece) and returns the number of "
      "rows: pieces taken `window` at a time, each window in decreasing length, into the "
      "tightest open row (best_fit) or the first (first_fit) of `capacity` tokens and at most "
      "`max_segments` pieces (0: no bound).");
}

}  // namespace stoker::bindings
