#!/usr/bin/env bash
# Set-up (packages + build), then the whole test suite through CTest.
# Extra arguments go to ctest (e.g. scripts/test.sh -L multinode, -R store).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure --timeout 300 -j "$(nproc)" "$@"
