#!/usr/bin/env bash
# Installs every Debian 12 package drun's build, tests and benchmarks need, then builds.
# Idempotent and fast when everything is there: apt-get runs only for missing packages.
#   scripts/setup.sh            install + configure + build (build/)
#   DRUN_SKIP_BUILD=1 scripts/setup.sh   install only
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  libboost-dev libcli11-dev libspdlog-dev nlohmann-json3-dev libgloo-dev catch2
  libssl-dev                            # libcrypto: the store's HMAC-SHA256, nonces (common/crypto)
  iproute2 procps util-linux
  elfutils gdb                          # eu-stack / gdb: a hung native worker's stack (docs/hangs.md)
  openmpi-bin libopenmpi-dev python3 python3-torch
  libtorch-dev pybind11-dev python3-numpy python3-dev  # drun.torch (the "drun" backend, python/drun/torch)
  slurmctld slurmd slurm-client munge   # the [slurm] tests' cluster (scripts/slurm/up.sh)
  clang-16 libclang-rt-16-dev           # the libFuzzer targets (scripts/fuzz.sh)
  etcd-server etcd-client               # the etcd rendezvous backend's tests (scripts/etcd/up.sh)
  python3-prometheus-client chromium    # "Watching a job" tests: /metrics' parser, the page in headless chromium
)

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
