#!/usr/bin/env bash
# Terminal benchmark: drun beside torchrun (PyTorch 1.13) on a pseudo-terminal, same run, same
# machine: isatty in the workers, partial-line (progress bar) latency, stdin to rank 0, and
# `| head -2` (see terminal_bench.py). About 30 s with the defaults.
#
#   scripts/bench/terminal.sh                  # BUILD_DIR=build RUNS=5
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
cmake --build "$BUILD_DIR" --target drun -j2 >/dev/null
BUILD_DIR=$BUILD_DIR PYTHON=$PYTHON exec "$PYTHON" scripts/bench/terminal_bench.py
