// The only code that includes nanobind or Python.h. One file per topic, each with a register_*
// function called from module.cc.
#pragma once

#include <nanobind/nanobind.h>

namespace stoker::bindings {

void register_errors(nanobind::module_& m);
// stoker::Error as its stoker.errors class, for the functions of the module that calls it
// (stoker._core through register_errors; stoker._media).
void register_error_translator();
void register_augment(nanobind::module_& m);
void register_dataset(nanobind::module_& m);
void register_faults(nanobind::module_& m);
void register_fields(nanobind::module_& m);
void register_loader(nanobind::module_& m);
void register_sequence(nanobind::module_& m);
void register_tools(nanobind::module_& m);
void register_verify(nanobind::module_& m);

}  // namespace stoker::bindings
