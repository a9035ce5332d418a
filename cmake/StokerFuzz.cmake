# Fuzz targets, one per untrusted input path (cpp/fuzz/, docs/RELIABILITY.md).
#   STOKER_FUZZ=ON (clang): libFuzzer executables, run by `make fuzz-smoke` and `make fuzz`.
#   otherwise, with tests: each target's source linked with a replay main() instead, and a CTest
#   test that replays tests/fuzz/regressions/<target>/, so every kept input runs in every build
#   (plain, ASan+UBSan, fuzz).
set(STOKER_FUZZ_TARGETS fuzz_tar fuzz_index fuzz_image_size fuzz_manifest fuzz_data_pack
                        fuzz_decode fuzz_restart_roi fuzz_webp fuzz_mask)
set(stoker_fuzz_tar_deps stoker_format)
set(stoker_fuzz_index_deps stoker_format)
set(stoker_fuzz_image_size_deps stoker_format)
set(stoker_fuzz_manifest_deps stoker_format)
set(stoker_fuzz_data_pack_deps stoker_format)
set(stoker_fuzz_decode_deps stoker_pipeline)
set(stoker_fuzz_restart_roi_deps stoker_decode)
set(stoker_fuzz_webp_deps stoker_decode)
set(stoker_fuzz_mask_deps stoker_decode)
# The parsers of sample fields (cpp/src/fields).
list(APPEND STOKER_FUZZ_TARGETS fuzz_npy fuzz_json_boxes)
set(stoker_fuzz_npy_deps stoker_fields)
set(stoker_fuzz_json_boxes_deps stoker_fields)
# The packing plan of lengths from a document index (cpp/src/sequence).
list(APPEND STOKER_FUZZ_TARGETS fuzz_row_packing)
set(stoker_fuzz_row_packing_deps stoker_sequence)
# The decoded columns of a Parquet row group a fetcher hands to the engine (cpp/src/io).
list(APPEND STOKER_FUZZ_TARGETS fuzz_row_group)
set(stoker_fuzz_row_group_deps stoker_io)
# The media readers (cpp/src/media), where FFmpeg's libraries are found.
if(FFMPEG_FOUND)
  list(APPEND STOKER_FUZZ_TARGETS fuzz_video fuzz_audio)
  set(stoker_fuzz_video_deps stoker_media)
  set(stoker_fuzz_audio_deps stoker_media)
endif()

function(stoker_fuzz_executable name target)
  add_executable(${name} ${ARGN})
  target_compile_options(${name} PRIVATE -Wall -Wextra -Werror)
  target_link_libraries(${name} PRIVATE ${stoker_${target}_deps})
endfunction()

if(STOKER_FUZZ)
  foreach(target ${STOKER_FUZZ_TARGETS})
    stoker_fuzz_executable(${target} ${target} cpp/fuzz/${target}.cc)
    target_link_options(${target} PRIVATE -fsanitize=fuzzer)
  endforeach()
endif()

if(STOKER_BUILD_TESTS)
  foreach(target ${STOKER_FUZZ_TARGETS})
    stoker_fuzz_executable(${target}_replay ${target} cpp/fuzz/${target}.cc cpp/fuzz/replay_main.cc)
    add_test(NAME ${target}_regressions
             COMMAND ${target}_replay ${PROJECT_SOURCE_DIR}/tests/fuzz/regressions/${target})
  endforeach()
endif()
