#!/usr/bin/env bash
# Launch benchmark: drun beside mpirun (OpenMPI) and torchrun (PyTorch 1.13), same run, same
# machine. Prints two tables:
#   1. median wall time of `<launcher> N x hostname` for N = 1, 4, 16, with drun/mpirun and
#      drun/torchrun ratios (torchrun with its default --monitor_interval 5 and with 0.1);
#   2. failover, N=4: from a worker's failure to the restarted group running (drun --max-restarts 1
#      vs torchrun --max_restarts 1, monitor interval 5 and 0.1), using tests/helpers/failover_probe.
# Targets: drun launch N=4 <= 20 ms, failover <= 50 ms.
#
#   scripts/bench/launch.sh                         # BUILD_DIR=build (scripts/setup.sh --tests if missing)
#   BUILD_DIR=build-e2e RUNS=15 TORCH_RUNS=3 FAILOVER_RUNS=7 TORCH_FAILOVER_RUNS=3 scripts/bench/launch.sh
#
# torchrun runs under /usr/bin/python3 through scripts/bench/torchrun_compat.py (1.13's CLI crashes
# on Python 3.11 while parsing --redirects). Every run has a timeout; the whole script takes about
# 2-3 minutes with the defaults, almost all of it torchrun.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
PYTHON=${PYTHON:-/usr/bin/python3}

if [[ ! -x "$BUILD_DIR/bin/drun" && "$BUILD_DIR" == build ]]; then
  bash scripts/setup.sh --tests
fi
cmake --build "$BUILD_DIR" --target drun failover_probe -j2 >/dev/null

for tool in mpirun "$PYTHON"; do
  command -v "$tool" >/dev/null || { echo "launch.sh: $tool not found (run scripts/setup.sh --tests)" >&2; exit 1; }
done

exec "$PYTHON" scripts/bench/launch_bench.py \
  --drun "$BUILD_DIR/bin/drun" \
  --probe "$BUILD_DIR/tests/helpers/failover_probe" \
  --torch-python "$PYTHON" \
  --nprocs "${NPROCS:-1,4,16}" \
  --runs "${RUNS:-15}" \
  --torch-runs "${TORCH_RUNS:-3}" \
  --failover-runs "${FAILOVER_RUNS:-7}" \
  --torch-failover-runs "${TORCH_FAILOVER_RUNS:-3}"
