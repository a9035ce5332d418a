#!/usr/bin/env bash
# make test and make check: runs make's targets as named stages, one after another, and prints
# each stage's wall time at the end, also when one fails (the run stops at the first failure,
# with its status). A stage "NAME=a+b" runs targets a and b side by side (make -j 2 a b): a
# disk- or network-bound target beside a CPU-bound one.
#
#   tests/stages.sh TIMES_FILE "NAME=target[+target...]" ...
#
# TIMES_FILE gets one line a stage (name, seconds, status), tab-separated; tests/count_tests.py
# prints the test counts of the run's JUnit files with the table.
set -uo pipefail

times=$1
shift
mkdir -p "$(dirname "$times")"
: > "$times"
make=${MAKE:-make}
status=0
start=$SECONDS

for stage in "$@"; do
  name=${stage%%=*}
  targets=${stage#*=}
  t0=$SECONDS
  echo "=== $name: make ${targets//+/ } ==="
  if [[ $targets == *+* ]]; then
    $make --no-print-directory -j 2 ${targets//+/ }
  else
    $make --no-print-directory "$targets"
  fi
  status=$?
  printf '%s\t%d\t%s\n' "$name" $((SECONDS - t0)) "$([ $status = 0 ] && echo ok || echo "FAILED ($status)")" >> "$times"
  [ $status = 0 ] || break
done

echo
echo "=== wall time by stage ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)) ==="
while IFS=$'\t' read -r name seconds result; do
  printf '  %-34s %5d s  %3d:%02d  %s\n' "$name" "$seconds" $((seconds / 60)) $((seconds % 60)) "$result"
done < "$times"
total=$((SECONDS - start))
printf '  %-34s %5d s  %3d:%02d\n' total "$total" $((total / 60)) $((total % 60))
exit $status
