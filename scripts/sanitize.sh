#!/usr/bin/env bash
# Builds drun with sanitizers in a build directory of its own and runs tests there:
#   scripts/sanitize.sh address [build dir]   AddressSanitizer + UndefinedBehaviorSanitizer
#                                             (LeakSanitizer included): the suite, less what
#                                             needs no second pass (below)
#   scripts/sanitize.sh thread  [build dir]   ThreadSanitizer: the store, agent and in-process
#                                             comm tests
#   scripts/sanitize.sh --build KIND [dir]    only configure and build the tree (at nice 19)
#   scripts/sanitize.sh --test KIND [dir]     only run the tests of a tree --build made
# The whole suite runs the two halves as two CTest entries (tests/CMakeLists.txt): the build
# beside the other tests, in the CPU time they leave, the tests with no other test beside them.
# Any report fails the test that caused it: -fno-sanitize-recover=all aborts on the first one,
# and the runtime options below make the sanitizers exit non-zero.
#
# Left out of the address pass: the fuzz targets (already built with ASan+UBSan by clang), the
# [slurm] tests (one test cluster per machine: the main build's), the etcd end-to-end jobs (lease
# timing of a 3 s TTL against a 5x slower agent; the [etcd] store and client tests do run), the [torch] tests and resilient_tests (torch programs under drun --recovery in-process: the same
# agent paths as the e2e tests, with minutes of `import torch` under a loaded machine), the soaks
# (they measure growth, which ASan's quarantine makes meaningless; 300 restarts take minutes) and
# the multi-process comm matrix (megabytes of unoptimised reductions: minutes; the in-process
# unit tests run every op under ASan), and the install check (cpack and dpkg; the programs it
# installs run the e2e tests' paths). Tests that bound memory skip those bounds here
# (tests/support/process.hpp, kSanitizedBuild).
# Left out of both passes: the interleavings over etcd (the same round logic as the interleavings
# over MemoryStore, which do run, each point a real 3-member cluster's round trips: minutes
# sanitised, docs/benchmarks/build.md; the etcd store and client tests run).
# The agent spawns with fork() in these builds (agent/src/process_spawn.cpp says why).
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/sanitize.sh [--build|--test] address|thread [build dir]"
phase=all
case ${1:-} in
  --build) phase=build; shift ;;
  --test) phase=test; shift ;;
  -*) echo "scripts/sanitize.sh: unknown option '$1'; $usage" >&2; exit 2 ;;
esac
kind=${1:?$usage}
case $kind in
  address)
    sanitize=address,undefined
    targets=(common_tests store_tests etcd_tests rendezvous_tests daemon_tests agent_tests launcher_tests
             comm_tests e2e_tests hang_tests observe_tests)  # not slurm_tests, etcd_e2e_tests, resilient_tests
    # A binary not built here leaves a failing "<name>_NOT_BUILT" entry (Catch's discovery):
    # every binary is either in targets or excluded by name below.
    select=(-LE 'fuzz|gpu|resilient_tests' -E '^(torch|torchrun compat|soak|interleavings over etcd|install): |^comm: every op|^slurm_|^etcd_e2e_tests|^resilient_tests')
    # UBSan's vptr check (a member call or downcast on an object of the wrong dynamic type) costs
    # the address build much of its compile time (docs/benchmarks/build.md); such a call on a
    # freed object is ASan's use-after-free, which stays.
    extra_flags=-fno-sanitize=vptr
    jobs=$((2 * $(nproc)))  # two tests a core, as scripts/test.sh runs the suite (it says why)
    ;;
  thread)
    sanitize=thread
    extra_flags=
    # One test a core: ThreadSanitizer makes threads 5-15x slower, and at two a core timing bounds
    # (an etcd keepalive answer, a 200 ms tick) get missed without any defect.
    jobs=$(nproc)
    targets=(store_tests etcd_tests rendezvous_tests agent_tests comm_tests)
    # comm: the in-process tests (ranks as threads: every op, requests, groups, timeouts) and the
    # absent-rank timeout; not the multi-process matrices, kills and examples (processes of
    # their own, minutes of unoptimised reductions), nor the copy helpers' byte-by-byte check
    # (one thread: nothing for TSan to see, and long under TSan's instrumented loads).
    select=(-L '^(store_tests|etcd_tests|rendezvous_tests|agent_tests|comm_tests)$'
            -E '^comm: (every op|a peer SIGKILLed|every rank SIGKILLed|two hosts|example|an installed|shm copyBytes)|^comm recovery: hierarchical|^interleavings over etcd: ')
    ;;
  *) echo "scripts/sanitize.sh: unknown sanitizer '$kind' (address or thread)" >&2; exit 2 ;;
esac
dir=${2:-build-$kind}

# -O0 and line tables only: a sanitized tree is built once and run once, and its tests wait on
# processes and sockets far more than they compute, so compile time matters more than speed
# (-O0 compiles a test file faster than -O1 under ASan and than the main build's -O2 -g:
# docs/benchmarks/build.md).
# Quiet build and test runs, their logs kept in $dir: what this prints is only the verdict and,
# on failure, the failing tests' names and their reports first (CI shows the head of a failing
# test's output; a build log in front would hide the report).
build_log="$dir/sanitize-build.log"
if [[ $phase != test ]]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O0 -g1 $extra_flags" \
    -DDRUN_SANITIZE="$sanitize" >/dev/null
  # nice 19: in the whole suite this build runs beside the other tests, and takes only the CPU
  # time they leave.
  if ! nice -n 19 cmake --build "$dir" --target "${targets[@]}" --parallel "$(nproc)" \
       >"$build_log" 2>&1; then
    tail -n 60 "$build_log"
    echo "sanitize.sh: the $kind build failed (whole log: $build_log)" >&2
    exit 1
  fi
  if [[ $phase == build ]]; then
    echo "sanitize.sh: $kind: built ${targets[*]} in $dir"
    exit 0
  fi
elif [[ ! -f $dir/CTestTestfile.cmake ]]; then
  echo "sanitize.sh: $dir holds no $kind tree: build it first (scripts/sanitize.sh --build $kind $dir)" >&2
  exit 1
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:exitcode=86}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:exitcode=86:second_deadlock_stack=1}
# The test harness's hang bounds (tests/support/time_scale.hpp) twice as long: these builds run
# 5-15x slower, and each bound missed there without a sanitizer report costs a rerun (below).
export DRUN_TEST_TIME_SCALE=${DRUN_TEST_TIME_SCALE:-2}
# This pass looks for what only a sanitizer sees. Every test here also runs in the main build,
# where its timing bounds are judged; under a sanitizer (threads 5-15x slower, two tests at once)
# a bound can be missed without any defect. So a failure with a sanitizer report fails the pass at
# once, and a failure without one is run again, alone: it fails the pass only if it fails again.
log="$dir/Testing/Temporary/LastTest.log"
run_log="$dir/sanitize-tests.log"
# The failing tests' names, then each failure's output (Catch's message or the sanitizer's
# report), bounded.
report() {
  sed -n '/The following tests FAILED/,$p' "$1" | grep -v '^Errors while running'
  grep -n -A 60 -E '\*\*\*(Failed|Timeout|Exception)|WARNING: ThreadSanitizer|ERROR: (AddressSanitizer|LeakSanitizer)|runtime error: ' "$1" | head -n 400
}
if ctest --test-dir "$dir" --output-on-failure --timeout 300 -j "$jobs" "${select[@]}" \
     >"$run_log" 2>&1; then
  echo "sanitize.sh: $kind: $(grep -E 'tests passed' "$run_log") (log: $run_log)"
  exit 0
fi
if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error: ' "$log"; then
  echo "sanitize.sh: a sanitizer report (below) failed the $kind pass (whole log: $run_log)" >&2
  report "$run_log"
  exit 1
fi
rerun_log="$dir/sanitize-rerun.log"
if ctest --test-dir "$dir" --output-on-failure --timeout 300 --rerun-failed >"$rerun_log" 2>&1; then
  echo "sanitize.sh: $kind: the failures below carry no sanitizer report and passed when run again, alone"
  report "$run_log"
  exit 0
fi
echo "sanitize.sh: $kind: these failed again when run alone (whole logs: $run_log, $rerun_log)" >&2
report "$rerun_log"
grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error: ' "$rerun_log" \
  || { echo "sanitize.sh: their first failures:"; report "$run_log"; }
exit 1
