# STOKER_VENDOR_DECODERS (make wheel): the wheel carries the decoder libraries the extension links
# (auditwheel repair copies them into stoker.libs/), so it ships their licences too. For each
# pkg-config module found in CMakeLists.txt this finds the Debian package that owns the library
# file, and installs that package's /usr/share/doc/PACKAGE/copyright as
# stoker/_vendor_licenses/PACKAGE.copyright, with an index (README.txt) of library, package,
# version and licence. Generated at build time from the system the wheel is built on: no
# third-party text is committed to this repository.
find_program(STOKER_DPKG_QUERY dpkg-query)
if(NOT STOKER_DPKG_QUERY)
  message(FATAL_ERROR "STOKER_VENDOR_DECODERS takes the decoders' licences from their Debian "
                      "packages (dpkg-query): build the vendoring wheel on Debian (make wheel)")
endif()

# prefix (pkg_check_modules), what the library is, its licence (SPDX)
set(stoker_vendored
    "LIBJPEG|libjpeg-turbo (libjpeg API)|IJG AND BSD-3-Clause AND Zlib"
    "TURBOJPEG|libjpeg-turbo (TurboJPEG API)|IJG AND BSD-3-Clause AND Zlib"
    "SPNG|libspng|BSD-2-Clause"
    "WEBP|libwebp|BSD-3-Clause")
set(stoker_license_dir ${CMAKE_CURRENT_BINARY_DIR}/vendor_licenses)
file(REMOVE_RECURSE ${stoker_license_dir})
set(stoker_license_index "Libraries bundled in this wheel (stoker.libs/), copied from the \
Debian packages below by auditwheel repair. Each package's copyright file is beside this one.\n\n")
foreach(entry IN LISTS stoker_vendored)
  string(REPLACE "|" ";" entry "${entry}")
  list(GET entry 0 prefix)
  list(GET entry 1 what)
  list(GET entry 2 spdx)
  list(GET ${prefix}_LINK_LIBRARIES 0 lib)
  file(REAL_PATH "${lib}" lib_real)
  execute_process(COMMAND ${STOKER_DPKG_QUERY} -S "${lib_real}" OUTPUT_VARIABLE owner
                  RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "STOKER_VENDOR_DECODERS: no Debian package owns ${lib_real} (${prefix})")
  endif()
  string(REGEX REPLACE ":.*" "" package "${owner}")  # "libspng0:amd64: /usr/lib/..." -> libspng0
  execute_process(COMMAND ${STOKER_DPKG_QUERY} -W -f=\${Version} "${package}"
                  OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  set(copyright /usr/share/doc/${package}/copyright)
  if(NOT EXISTS ${copyright})
    message(FATAL_ERROR "STOKER_VENDOR_DECODERS: ${copyright} is missing (${package})")
  endif()
  configure_file(${copyright} ${stoker_license_dir}/${package}.copyright COPYONLY)
  get_filename_component(soname "${lib_real}" NAME)
  string(APPEND stoker_license_index
         "${what}: ${soname}, Debian package ${package} ${version}, licence ${spdx}, "
         "text in ${package}.copyright\n")
endforeach()
string(APPEND stoker_license_index
       "\nlibz.so.1 (zlib), which libspng needs, is not bundled: the manylinux policy counts it "
       "among the system's libraries.\n")
file(WRITE ${stoker_license_dir}/README.txt "${stoker_license_index}")
install(DIRECTORY ${stoker_license_dir}/ DESTINATION stoker/_vendor_licenses)
