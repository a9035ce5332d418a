#!/usr/bin/env bash
# Runs the libFuzzer targets built in $FUZZ_BUILD (default build/fuzz: make fuzz-build; or
# build/fuzz-deep: make fuzz-build-deep) from the seeds in build/fuzz/seeds (make fuzz-seeds).
# Corpora, logs and findings go under build/fuzz whichever build runs. See docs/RELIABILITY.md.
#
#   tests/fuzz/run_fuzzers.sh smoke SECONDS [TARGET...]   fresh corpus, stops at the first finding;
#                                                         logs in build/fuzz/smoke, findings in
#                                                         build/fuzz/artifacts/<target>
#   tests/fuzz/run_fuzzers.sh long  SECONDS [TARGET...]   corpus kept in build/fuzz/corpus/<target>;
#                                                         fork mode: carries on past findings;
#                                                         logs and findings in build/fuzz/long
#
# Each target first replays its kept inputs (tests/fuzz/regressions/<target>/), then fuzzes for
# SECONDS. Any crash, invariant failure, hang (-timeout) or memory blow-up (-rss_limit_mb) fails
# the run, which names the input and says what to do with it.
set -uo pipefail
cd "$(dirname "$0")/../.."

# All in a function, called on the last line: bash reads a script while it runs it, so editing
# this file under a campaign of several hours would otherwise make the running copy read garbage.
main() {
  mode=${1:?usage: $0 smoke|long SECONDS [TARGET...]}
  seconds=${2:?usage: $0 smoke|long SECONDS [TARGET...]}
  shift 2
  targets=("$@")
  [ ${#targets[@]} -gt 0 ] ||
    targets=(fuzz_tar fuzz_index fuzz_image_size fuzz_manifest fuzz_data_pack fuzz_decode
             fuzz_restart_roi fuzz_webp fuzz_mask)
  [ $# -gt 0 ] || targets+=(fuzz_npy fuzz_json_boxes)  # the parsers of sample fields
  [ $# -gt 0 ] || targets+=(fuzz_row_packing)          # packing plans of an index's lengths
  [ $# -gt 0 ] || targets+=(fuzz_row_group)            # a Parquet row group's decoded columns
  [ $# -gt 0 ] || targets+=(fuzz_video fuzz_audio)     # the media readers (FFmpeg)

  declare -A dict=([fuzz_tar]=tar [fuzz_index]=index [fuzz_manifest]=manifest
                   [fuzz_data_pack]=manifest [fuzz_decode]=jpeg
                   [fuzz_restart_roi]=jpeg [fuzz_webp]=webp [fuzz_mask]=png)
  dict+=([fuzz_npy]=npy [fuzz_json_boxes]=json_boxes)
  bin=${FUZZ_BUILD:-build/fuzz}
  build=build/fuzz
  # A small quarantine keeps ASan's RSS near the program's own, so that -rss_limit_mb measures
  # stoker's memory; decoder limits (max_pixels) must stop bombs well below it.
  export ASAN_OPTIONS=quarantine_size_mb=32:malloc_context_size=20:detect_leaks=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  limits=(-timeout=10 -rss_limit_mb=512 -print_final_stats=1)

  case $mode in
    smoke) logs=$build/smoke ;;
    long) logs=$build/long ;;
    *) echo "mode must be smoke or long, not '$mode'" >&2; exit 2 ;;
  esac
  mkdir -p "$logs"
  failed=()

  for t in "${targets[@]}"; do
    binary=$bin/$t
    seeds=$build/seeds/$t
    # Apart for the two modes: a smoke run (make test) must not mistake the findings of a long
    # campaign running beside it for its own.
    artifacts=$build/artifacts/$t
    [ "$mode" = long ] && artifacts=$build/long/artifacts/$t
    [ -x "$binary" ] || { echo "$binary is missing: run make fuzz-build (or fuzz-build-deep)" >&2; exit 2; }
    [ -d "$seeds" ] || { echo "$seeds is missing: run make fuzz-seeds" >&2; exit 2; }
    mkdir -p "$artifacts"

    mapfile -t kept < <(find "tests/fuzz/regressions/$t" -type f ! -name 'README*' 2>/dev/null | sort)
    if [ ${#kept[@]} -gt 0 ] && ! "$binary" "${kept[@]}" > "$logs/$t.replay.log" 2>&1; then
      echo "FAIL $t: a kept regression input fails again; see $logs/$t.replay.log" >&2
      failed+=("$t")
      continue
    fi

    if [ "$mode" = smoke ]; then
      corpus=$logs/corpus/$t
      rm -rf "$corpus"
      # A fixed seed: make test gives the same verdict on the same code. Campaigns (make fuzz)
      # draw their own and look further (tests/fuzz/open-bugs: what they found, not yet fixed).
      extra=(-seed=1)
    else
      corpus=$build/corpus/$t
      extra=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
      # libFuzzer's timeout is wall-clock time, and a campaign usually runs at low priority beside
      # other work (nice 19): 10 s gave inputs that run in 6 ms as timeouts while the machine was
      # busy. Inputs slower than 10 s are still kept, as slow-unit-* findings.
      extra+=(-timeout=60 -report_slow_units=10)
    fi
    mkdir -p "$corpus"
    stamp=$(mktemp)
    # A dictionary where the format has one (FFmpeg's containers have none here).
    words=()
    [ -n "${dict[$t]:-}" ] && words=(-dict="tests/fuzz/dict/${dict[$t]}.dict")
    "$binary" "${limits[@]}" "${extra[@]}" -max_total_time="$seconds" \
      "${words[@]}" -artifact_prefix="$artifacts/" \
      "$corpus" "$seeds" > "$logs/$t.log" 2>&1
    rc=$?
    found=$(find "$artifacts" -type f -newer "$stamp" | sort)
    rm -f "$stamp"
    # The last status line: "#RUNS DONE cov: ..." (smoke) or "#RUNS: cov: ... exec/s N ..." (fork).
    last=$(grep -E '^#[0-9]+:?[[:space:]]+(DONE|cov:)' "$logs/$t.log" | tail -1)
    runs=$(grep -oE '^#[0-9]+' <<< "$last" | tr -d '#')
    cov=$(grep -oE 'cov: [0-9]+' <<< "$last" | grep -oE '[0-9]+')
    rate=$(grep -oE 'exec/s:? [0-9]+' <<< "$last" | grep -oE '[0-9]+$')
    if [ $rc -eq 0 ] && [ -z "$found" ]; then
      echo "ok   $t: ${seconds}s, ${runs:-?} runs, ${rate:-?} exec/s, coverage ${cov:-?} edges"
      continue
    fi
    failed+=("$t")
    echo "FAIL $t (exit $rc); log: $logs/$t.log" >&2
    grep -E 'ERROR|invariant broken|SUMMARY' "$logs/$t.log" | head -5 >&2
    for input in $found; do
      cat >&2 <<EOF
  input: $input
    reproduce: $binary $input
    minimize:  $binary -minimize_crash=1 -max_total_time=60 -exact_artifact_path=$input.min $input
    then fix the bug and keep the input as a regression:
      cp $input.min tests/fuzz/regressions/$t/<what-the-bug-was>   (or the input itself for a
      timeout or an out-of-memory), and say in tests/fuzz/regressions/README.md what it was
EOF
    done
  done

  if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzzing found problems in: ${failed[*]}" >&2
    exit 1
  fi
}

main "$@"
