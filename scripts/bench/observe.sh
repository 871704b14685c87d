#!/usr/bin/env bash
# What watching a job costs (docs/observe.md): the same work with the job's
# events and drun-rendezvous --http on and off, interleaved in one run on this machine:
#   1. launch of 16 x hostname, single node: off = no --events; on = --events FILE;
#   2. launch of 16 x hostname through a drun-rendezvous daemon (--nnodes 1 --rdzv-endpoint):
#      off = DRUN_JOB_HISTORY=0, daemon without --http; on = --events FILE + the job's history in
#      the store + a daemon with --http whose page is polled (/api/jobs, /metrics every 100 ms);
#   3. the 4096-agent rendezvous round (rendezvous_bench's load generator, as
#      scripts/bench/rendezvous.sh) against a daemon without / with --http, polled likewise.
# Prints one table of medians with on/off. Target: within 5%.
#
#   scripts/bench/observe.sh
#   BUILD_DIR=build RUNS=21 ROUNDS=5 AGENTS=4096 scripts/bench/observe.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
cmake --build "$BUILD_DIR" --target drun drun-rendezvous rendezvous_bench -j2 >/dev/null
ulimit -n "$(ulimit -Hn)"
exec "$PYTHON" scripts/bench/observe_bench.py --build "$BUILD_DIR" --runs "${RUNS:-21}" \
  --rounds "${ROUNDS:-5}" --agents "${AGENTS:-4096}"
