// Private: a copy from a file mapping that survives the file being truncated under it. Reading a
// mapped page past a file's new end raises SIGBUS; inside guarded_copy that signal ends the copy
// (false) instead of the process. SIGBUS anywhere else goes to the handler that was installed
// before (Python's faulthandler, a sanitizer's), or to the default action.
#pragma once

#include <cstddef>

namespace stoker::io::detail {

// Copies n bytes from src (inside a mapping) to dst. False if a SIGBUS interrupted it: dst then
// holds garbage.
bool guarded_copy(void* dst, const void* src, size_t n);

}  // namespace stoker::io::detail
