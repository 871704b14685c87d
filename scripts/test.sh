#!/usr/bin/env bash
# The tests through CTest, after the set-up (scripts/setup.sh --tests: packages, configure, build).
#   scripts/test.sh [ctest args]           the whole suite: every binary, entry and pass (CI: .ci/run)
#   scripts/test.sh --quick [ctest args]   the quick tier (below): builds only the binaries it runs
# Extra arguments go to ctest (scripts/test.sh -L multinode, -R store; --quick -R interleavings).
# docs/testing.md "Test tiers" says what each tier holds and how long it takes.
set -euo pipefail
cd "$(dirname "$0")/.."

# The quick tier, defined here and nowhere else: the unit tests, the in-process comm tests, the
# interleavings over the in-memory store and the single-node end-to-end tests. Each binary's tests
# carry its name as a CTest label; the tier is these binaries' tests less the ones below, which
# need network namespaces, an etcd cluster, torch, several processes of libdrun_comm or minutes.
quick_binaries=(common_tests store_tests rendezvous_tests daemon_tests agent_tests launcher_tests comm_tests e2e_tests)
quick_left_out=(
  '^etcd '                          # rendezvous_tests' etcd client and store: a 3-member cluster
  '^interleavings over etcd: '      # the same interleavings over a real etcd cluster
  ' - EtcdFixture$'                 # the Store conformance cases over etcd (the MemoryStore ones stay)
  '^resolve: a resolver that never answers'  # a network namespace with a silent DNS server
  '^comm: (two hosts|every op|a peer SIGKILLed|a rank SIGKILLed|every rank SIGKILLed|example|an installed)'
  '^(multinode|fault matrix|fault matrix over etcd): '  # namespace hosts
  '^(torch|torch backend drun|torchrun compat): '       # import torch, namespace hosts
  '^soak: '                         # 300 restarts
)

quick=0
if [[ ${1:-} == --quick ]]; then
  quick=1
  shift
fi

# Two tests a core: the tests mostly wait (on processes, sockets, timeouts), so one a core leaves
# the CPUs half idle (docs/benchmarks/build.md, "Two tests a core").
# Timing bounds in tests are generous upper bounds for hangs, not measurements.
slots=$((2 * $(nproc)))
ctest_args=(--test-dir build --output-on-failure --timeout 300)
# The packages, then build/ configured for testing: line tables only (DRUN_DEBUG_INFO=lines, the
# top CMakeLists.txt says what it keeps), as the sanitized trees are; DRUN_DEBUG_INFO=full keeps -g.
DRUN_SKIP_BUILD=1 bash scripts/setup.sh --tests
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=${DRUN_BUILD_TYPE:-RelWithDebInfo} \
  -DDRUN_DEBUG_INFO=${DRUN_DEBUG_INFO:-lines} >/dev/null
if ((quick)); then
  cmake --build build --parallel "$(nproc)" --target "${quick_binaries[@]}"
  labels=$(IFS='|'; echo "${quick_binaries[*]}")
  left_out=$(IFS='|'; echo "${quick_left_out[*]}")
  exec ctest "${ctest_args[@]}" -j "$slots" -L "^($labels)\$" -E "$left_out" "$@"
fi
cmake --build build --parallel "$(nproc)"
# One slot more for the whole suite: the sanitized trees' builds run as entries beside the tests
# (nice 19, one at a time: tests/CMakeLists.txt says why), and the tests keep their two a core.
exec ctest "${ctest_args[@]}" -j "$((slots + 1))" "$@"
