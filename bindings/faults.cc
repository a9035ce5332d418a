// Fault injection (stoker/core/fault.h) for stoker.faults: the Python layer's acquisitions are
// counted with the engine's, so "the Nth thread started" means the same across both.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "stoker/core/fault.h"

namespace nb = nanobind;

namespace stoker::bindings {

void register_faults(nb::module_& m) {
  m.def("fault_arm", &fault::arm, nb::arg("kind"), nb::arg("nth"),
        "Count every kind's acquisitions from 0; the nth of `kind` fails (0: none does).");
  m.def("fault_disarm", &fault::disarm, "Stop counting and failing.");
  m.def("fault_due", &fault::due, nb::arg("kind"),
        "Count an acquisition of `kind`: whether it is the one to fail.");
  m.def("fault_describe", &fault::describe, nb::arg("kind"), nb::arg("what"),
        "The reason an injected failure of `kind` gives.");
  m.def("fault_counts", &fault::counts, "(kind, acquisitions) counted since fault_arm.");
  m.def("fault_fired", &fault::fired, "Whether the failure armed has happened.");
  m.def("fault_hold", &fault::hold, nb::arg("point"),
        "From now on, the first thread to reach hold point `point` waits there until "
        "fault_release().");
  m.def("fault_wait_held", &fault::wait_held, nb::arg("timeout_ms"),
        nb::call_guard<nb::gil_scoped_release>(),
        "Wait up to timeout_ms for a thread to reach the point held: whether one has.");
  m.def("fault_release", &fault::release, "Let the thread held go on; no point holds any more.");
}

}  // namespace stoker::bindings
