#!/usr/bin/env bash
# Installs the Debian 12 packages drun needs, then builds. Two sets:
#   scripts/setup.sh           what drun needs to build (tests included: Catch2) and to run a job
#   scripts/setup.sh --tests   that, and what only the tests and benchmarks use (scripts/test.sh
#                              passes it): network namespaces, torch, SLURM, clang, etcd,
#                              OpenMPI, chromium
#   DRUN_SKIP_BUILD=1 scripts/setup.sh [--tests]   install only
# Idempotent and fast when everything is there: apt-get runs only for missing packages.
# A test whose package is missing reports SKIPPED with the package's name, it does not fail.
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
for arg in "$@"; do
  case $arg in
    --tests) with_tests=1 ;;
    *) echo "scripts/setup.sh: unknown argument '$arg' (--tests or nothing)" >&2; exit 2 ;;
  esac
done

# drun's build and run time.
packages=(
  build-essential cmake ninja-build pkg-config
  libboost-dev libcli11-dev libspdlog-dev nlohmann-json3-dev libgloo-dev
  catch2                                # the test binaries are part of the build
  libssl-dev                            # libcrypto: the store's HMAC-SHA256, nonces (common/crypto)
  python3                               # the interpreter for .py worker programs (DRUN_PYTHON)
  elfutils gdb                          # eu-stack, else gdb: a hung native worker's stack (docs/hangs.md)
  libhwloc-dev                          # the machine's topology for --numa-binding
)
# The tests' and benchmarks' own.
test_packages=(
  iproute2 procps util-linux            # namespace hosts (scripts/netns.sh), process checks
  libtorch-dev pybind11-dev python3-dev python3-torch  # drun.torch's compiled backend and its tests
  python3-numpy                         # drun.comm's Python tests on numpy buffers
  openmpi-bin libopenmpi-dev            # the OpenMPI column of scripts/bench/comm.sh
  slurmctld slurmd slurm-client munge   # the [slurm] tests' cluster (scripts/slurm/up.sh)
  clang-16 libclang-rt-16-dev           # the libFuzzer targets (scripts/fuzz.sh)
  etcd-server etcd-client               # the etcd rendezvous backend's tests (scripts/etcd/up.sh)
  python3-prometheus-client chromium    # "Watching a job" tests: /metrics' parser, the page in headless chromium
)
((with_tests)) && packages+=("${test_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ -z ${DRUN_SKIP_BUILD:-} ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=${DRUN_BUILD_TYPE:-RelWithDebInfo} >/dev/null
  cmake --build build --parallel "$(nproc)"
fi
