#!/usr/bin/env bash
# Collective benchmark, one run on this machine: drun::comm (drun-comm-bench, gloo backend) beside
# raw Gloo (drun-comm-bench-gloo: the same Gloo algorithm and transport, no drun code), OpenMPI's
# MPI_Allreduce (mpirun, its default transports: shared memory on one host) and torch.distributed
# with gloo, all_reduce float32 sum from 8 B to 64 MiB, for world sizes 2 and 4. Every program prints
# nccl-tests' table; this script joins them by size and checks drun's targets: busbw >= 95% of raw
# Gloo from 1 MiB, time <= 1.1x raw Gloo up to 64 KiB. With REPEAT > 1 each program runs that many
# times and the best time per size counts (this machine is shared: noise only ever adds time).
#
#   scripts/bench/comm.sh | tee comm/bench/results.txt
#   WORLDS="2 4" OP=all_reduce MIN_BYTES=8 MAX_BYTES=64M ITERS=20 WARMUP=5 REPEAT=3 scripts/bench/comm.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
WORLDS=${WORLDS:-2 4}
OP=${OP:-all_reduce}
MIN_BYTES=${MIN_BYTES:-8}
MAX_BYTES=${MAX_BYTES:-64M}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
REPEAT=${REPEAT:-1}
PYTHON=${PYTHON:-/usr/bin/python3}

cmake --build "$BUILD_DIR" --target drun drun-comm-bench drun-comm-bench-gloo -j2 >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--op "$OP" --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --factor 2 --iters "$ITERS"
      --warmup "$WARMUP")
have_mpi=0
if command -v mpicxx >/dev/null && mpicxx -O2 -std=c++20 -o "$tmp/mpi-comm-bench" comm/bench/mpi_bench.cpp 2>"$tmp/mpicxx.err"; then
  have_mpi=1
else
  echo "# OpenMPI column skipped: mpicxx failed (install libopenmpi-dev: scripts/setup.sh)" >&2
fi
have_torch=0
"$PYTHON" -c 'import torch.distributed' 2>/dev/null && have_torch=1

drun_launch() {  # drun_launch N program args...
  local n=$1
  shift
  timeout 600 "$BUILD_DIR/bin/drun" --standalone --nproc-per-node "$n" --prefix '' "$@" 2>/dev/null
}

for n in $WORLDS; do
  for ((rep = 0; rep < REPEAT; rep++)); do
    drun_launch "$n" "$BUILD_DIR/bin/drun-comm-bench" "${args[@]}" >>"$tmp/drun.$n"
    drun_launch "$n" "$BUILD_DIR/bin/drun-comm-bench-gloo" "${args[@]}" >>"$tmp/gloo.$n"
    if ((have_mpi)); then
      timeout 600 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" \
        "$tmp/mpi-comm-bench" "${args[@]}" >>"$tmp/mpi.$n" 2>/dev/null || true
    fi
    if ((have_torch)); then
      drun_launch "$n" "$PYTHON" scripts/bench/comm_torch.py "${args[@]}" >>"$tmp/torch.$n" || true
    fi
  done
done

"$PYTHON" - "$tmp" "$OP" "$WORLDS" "$REPEAT" <<'PY'
import math, os, platform, sys
tmp, op, worlds, repeat = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
impls = [("drun", "drun::comm"), ("gloo", "raw Gloo"), ("mpi", "OpenMPI"), ("torch", "torch+gloo")]

def table(path):
    """size -> (best time us, busbw at that time) over every repeat in the file."""
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path):
        f = line.split()
        if len(f) == 9 and f[0].isdigit():
            size, us, busbw = int(f[0]), float(f[5]), float(f[7])
            if size not in rows or us < rows[size][0]:
                rows[size] = (us, busbw)
    return rows

def human(b):
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale}{unit}"
    return str(b)

print(f"# {op}, float32 sum; time(us) and busbw(GB/s) per implementation; best of {repeat} run(s)")
print(f"# {platform.node()}: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
verdicts = []
for n in worlds:
    data = {k: table(os.path.join(tmp, f"{k}.{n}")) for k, _ in impls}
    present = [(k, name) for k, name in impls if data[k]]
    print(f"\n## world {n}")
    head = f"{'size':>6}" + "".join(f" {name + ' us':>15} {'busbw':>7}" for _, name in present)
    head += f" {'drun/gloo time':>15} {'drun/gloo busbw':>16}"
    print(head)
    worst_small, worst_big, small, big = 0.0, 10.0, [], []
    for size in sorted(data["drun"]):
        line = f"{human(size):>6}"
        for k, _ in present:
            us, bw = data[k].get(size, (float("nan"), float("nan")))
            line += f" {us:>15.1f} {bw:>7.3f}"
        d, g = data["drun"].get(size), data["gloo"].get(size)
        if d and g:
            t_ratio, bw_ratio = d[0] / g[0], (d[1] / g[1] if g[1] > 0 else float("nan"))
            line += f" {t_ratio:>15.2f} {bw_ratio:>16.2f}"
            if size <= 64 << 10:
                worst_small = max(worst_small, t_ratio)
                small.append(t_ratio)
            if size >= 1 << 20:
                worst_big = min(worst_big, bw_ratio)
                big.append(bw_ratio)
        print(line)
    for k, name in present:
        bws = [bw for _, bw in data[k].values()]
        print(f"# {name}: avg bus bandwidth {sum(bws) / len(bws):.3f} GB/s")
    gmean = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
    verdicts.append(f"# world {n}: drun/gloo time up to 64K: geomean {gmean(small):.2f}, worst {worst_small:.2f} "
                    f"(target <= 1.10); drun/gloo busbw from 1M: geomean {gmean(big):.2f}, worst {worst_big:.2f} "
                    f"(target >= 0.95)")
print()
print("\n".join(verdicts))
PY
