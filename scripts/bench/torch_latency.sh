#!/usr/bin/env bash
# The steady latency of a synchronous 8-byte torch all_reduce on the backend "drun" (world
# WORLD, one node) beside gloo's, RUNS runs back to back in one job, and the cost of the default
# mismatch check (scripts/bench/torch_latency_bench.py), then the same runs through drun.comm alone
# (libdrun_comm without torch: the floor at that moment). Target: every run's drun median <= 10 us.
# PIN=1 pins the ranks to cores 0 and 1 (taskset) and runs them at nice -5 (needs root).
#
#   scripts/bench/torch_latency.sh | tee -a docs/benchmarks/torch_latency.md
#   RUNS=10 CALLS=2000 CHECK=0 PIN=1 scripts/bench/torch_latency.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
WORLD=${WORLD:-2}
PIN=${PIN:-0}
export RUNS=${RUNS:-10} CALLS=${CALLS:-2000} CHECK=${CHECK:-1}

cmake --build "$BUILD_DIR" --target drun drun_comm drun_python drun_torch_backend -j2 >/dev/null
abs_build=$(cd "$BUILD_DIR" && pwd)
export PYTHONPATH="$abs_build/lib/drun/python${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1
label="one node, $WORLD ranks"
runner=()
if ((PIN)); then
  label+=", pinned (taskset -c 0-1, nice -n -5)"
  runner=(taskset -c 0-1 nice -n -5)
fi
echo "# $(date -u +%FT%TZ), $(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)"
for comm_only in 0 1; do
  COMM_ONLY=$comm_only BENCH_LABEL="$label" timeout 900 "${runner[@]}" "$BUILD_DIR/bin/drun" \
    --standalone --nproc-per-node "$WORLD" --prefix '' "$PYTHON" scripts/bench/torch_latency_bench.py 2>/dev/null
  echo
done
