#!/usr/bin/env bash
# torch.distributed on drun's backend "drun" (python/drun/torch) beside "gloo", one run on this
# machine: all_reduce, all_gather and broadcast (float32) from 8 B to 64 MiB, and one DDP training
# step (the DDP tutorial's ToyModel, a small MLP and a small CNN; without a comm hook and with
# powerSGD_hook), the latency of an 8-byte all_reduce in several runs and the cost of
# DRUN_COMM_CHECK, on one node with 2 and 4 ranks and on two network-namespace
# hosts x 2 ranks (scripts/netns.sh). Each job runs both backends in the same processes
# (scripts/bench/torch_backend_bench.py: a drun world and a gloo group over the same ranks) and
# prints markdown tables. Targets: all_reduce busbw >= 3x gloo's from 64 KiB on one
# node; small-message latency <= 1/10 of gloo's.
#
#   scripts/bench/torch_backend.sh | tee -a docs/benchmarks/torch_backend.md
#   WORLDS="2 4" HOSTS=1 SIZES="8 64K 1M" OPS="all_reduce" scripts/bench/torch_backend.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
WORLDS=${WORLDS:-2 4}
HOSTS=${HOSTS:-1}  # 0: skip the two-host job
PYTHON=${PYTHON:-/usr/bin/python3}
export SIZES=${SIZES:-8 64 1K 8K 64K 256K 1M 4M 16M 64M}
export OPS=${OPS:-all_reduce all_gather broadcast}

cmake --build "$BUILD_DIR" --target drun drun_comm drun_python drun_torch_backend -j2 >/dev/null
abs_build=$(cd "$BUILD_DIR" && pwd)
export PYTHONPATH="$abs_build/lib/drun/python${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1
"$PYTHON" -c 'import drun.torch' || { echo "torch_backend.sh: drun.torch does not import" >&2; exit 1; }
bench=$PWD/scripts/bench/torch_backend_bench.py

echo "# drun vs gloo inside torch.distributed, $(date -u +%FT%TZ), $(getconf _NPROCESSORS_ONLN) cores, $(uname -r)"
for n in $WORLDS; do
  BENCH_LABEL="one node, $n ranks" timeout 1200 "$BUILD_DIR/bin/drun" --standalone \
    --nproc-per-node "$n" --prefix '' "$PYTHON" "$bench" 2>/dev/null
  echo
done

netns_prefix="dtb$$"
cleanup() { if ((HOSTS)); then scripts/netns.sh -p "$netns_prefix" down >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
if ((HOSTS)) && scripts/netns.sh -p "$netns_prefix" up 2 >/dev/null 2>&1; then
  endpoint="$(scripts/netns.sh -p "$netns_prefix" addr 0):29400"
  id="torch-bench-$RANDOM$RANDOM"
  tmp=$(mktemp -d)
  for h in 0 1; do
    # Every namespace host shares this machine's hostname: gloo needs the interface named.
    scripts/netns.sh -p "$netns_prefix" exec "$h" env GLOO_SOCKET_IFNAME=eth0 \
      BENCH_LABEL="two hosts x 2 ranks" PYTHONPATH="$PYTHONPATH" OMP_NUM_THREADS=1 SIZES="$SIZES" \
      OPS="$OPS" timeout 1200 "$abs_build/bin/drun" --nnodes 2 --nproc-per-node 2 \
      --rdzv-endpoint "$endpoint" --rdzv-id "$id" --prefix '' "$PYTHON" "$bench" \
      >"$tmp/host$h.out" 2>"$tmp/host$h.err" &
  done
  wait
  cat "$tmp/host0.out" "$tmp/host1.out"
  rm -rf "$tmp"
elif ((HOSTS)); then
  echo "# two-host part skipped: network namespaces unavailable (needs root and ip netns)" >&2
fi
