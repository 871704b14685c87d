#!/usr/bin/env bash
# Set-up (packages + build), then the whole test suite through CTest.
# Extra arguments go to ctest (e.g. scripts/test.sh -L multinode, -R store).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Two tests a core: the tests mostly wait (on processes, sockets, timeouts). On 2 cores the suite
# without its serial entries kept the CPUs 53% busy at -j2 and took 398 s; at -j4, 80% and 243 s.
# Timing bounds in tests are generous upper bounds for hangs, not measurements.
ctest --test-dir build --output-on-failure --timeout 300 -j "$((2 * $(nproc)))" "$@"
