# Instrumented builds, chosen at configure time so that every target (the stoker libraries, the
# tests, the Python extension, the fuzz targets) is built the same way. Included before any
# target is defined: add_compile_options applies to the targets created after it.
#
#   -DSTOKER_SANITIZE=address  AddressSanitizer + UndefinedBehaviorSanitizer, stopping at the
#                              first report (gcc or clang)
#   -DSTOKER_SANITIZE=thread   ThreadSanitizer (gcc or clang)
#   -DSTOKER_FUZZ=ON           libFuzzer targets (clang only, see cmake/StokerFuzz.cmake):
#                              everything instrumented for ASan + UBSan and coverage
set(STOKER_SANITIZE "" CACHE STRING "Sanitizer build: '', 'address' (ASan+UBSan) or 'thread'")
set_property(CACHE STOKER_SANITIZE PROPERTY STRINGS "" address thread)
option(STOKER_FUZZ "Build the libFuzzer targets in cpp/fuzz (clang)" OFF)

if(STOKER_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "STOKER_FUZZ needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  if(STOKER_SANITIZE)
    message(FATAL_ERROR "STOKER_FUZZ brings its own sanitizers; leave STOKER_SANITIZE empty")
  endif()
  set(stoker_sanitize_flags -fsanitize=fuzzer-no-link,address,undefined)
elseif(STOKER_SANITIZE STREQUAL "address")
  # gcc leaves float-cast-overflow out of "undefined" (clang has it): a double too large for the
  # int it is cast to, as a crop box or a JSON number from a file can be, is undefined behaviour.
  set(stoker_sanitize_flags -fsanitize=address,undefined,float-cast-overflow)
elseif(STOKER_SANITIZE STREQUAL "thread")
  set(stoker_sanitize_flags -fsanitize=thread)
elseif(STOKER_SANITIZE)
  message(FATAL_ERROR "STOKER_SANITIZE must be '', 'address' or 'thread', not '${STOKER_SANITIZE}'")
endif()

if(stoker_sanitize_flags)
  # Stop at the first report (a sanitizer that only logs makes a test that cannot fail), and keep
  # frame pointers so that reports show whole stacks.
  add_compile_options(${stoker_sanitize_flags} -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(${stoker_sanitize_flags})
  if(STOKER_SANITIZE STREQUAL "address")
    # libstdc++ annotates std::vector for ASan: reading a vector past size() (but within its
    # capacity) is reported too, which matters because the decoders reuse grown buffers.
    # Not in fuzz builds: libFuzzer's runtime carries its own, unannotated copies of
    # std::vector<uint8_t> members, and the linker may pick those, which then look like overflows.
    add_compile_definitions(_GLIBCXX_SANITIZE_VECTOR)
  endif()
endif()
