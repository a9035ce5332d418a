#!/usr/bin/env bash
# The GPU decode stage's whole check in one call on a lent GPU machine, from the project's root:
#   bash .gpu-kit/gpu-run.sh bash tests/gpu/run_decode_check.sh [tests|bench|all]
# `tests`: tests/gpu (every GPU test, their figures printed: about 3 minutes on an H200);
# `bench`: benchmarks/gpu_training.py with the feeds the decode stage's bars name (synthetic,
# the host path with 15 threads, decode="gpu" with 2 and 4 threads, decode="auto" with 15,
# DataLoader + PIL) on ResNet-50 and ResNet-18, nvImageCodec's own rates in the same run (about
# 5 minutes); `all` (the default): both. `buckets`: benchmarks/buckets.py --quick, which adds
# decode="gpu" on aspect buckets beside the host path and the bucketing DataLoader (about 3
# minutes; not in `all`). Results go to $OUT (gpu-run.sh's log folder).
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/gpu-kit-out}; mkdir -p "$out"
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -q -s -rs -p no:cacheprovider tests/gpu 2>&1 | tee "$out/tests-gpu.log"
  status=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 benchmarks/gpu_training.py --data /tmp/imagenet-like/train.csv --work /tmp/gpu-training \
    --models resnet50 resnet18 --steps 20 --warmup 6 --feed-batches 16 \
    --only "host, 15" 'decode="gpu"' 'decode="auto"' "PIL, 15" \
    --json "$out/gpu_training.json" --markdown "$out/gpu_training.md" 2>&1 | tee "$out/bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "$what" = buckets ]; then
  python3 benchmarks/buckets.py --quick 2>&1 | tee "$out/buckets.log"
  status=${PIPESTATUS[0]}
fi
exit $status
