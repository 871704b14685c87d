#!/usr/bin/env bash
# Rendezvous benchmark: N agents join one round of MIN=MAX=N; time until every agent has its
# rank. drun: rendezvous_bench's load generator (one Asio thread, one connection per agent, the
# store calls of C10dRendezvous::next()) against the drun-rendezvous daemon, and as a cross-check
# at small N the real thing (N threads, each a C10dRendezvous on its own TcpStore). torch: 1.13's c10d
# rendezvous (DynamicRendezvousHandler + C10dRendezvousBackend on a TCPStore), N threads, at the
# sizes it finishes within a cap. etcd: the same C10dRendezvous on the etcd backend (N threads,
# each its own EtcdStore and lease) against a 3-member etcd cluster on loopback
# (scripts/etcd/up.sh, data on tmpfs; skipped without etcd). Same run, same machine; one table.
#
# The 10000-agent row needs 10,000 descriptors in each process (the script raises the soft limit
# to the hard one). rendezvous_model checks the cost model beyond (docs/benchmarks/rendezvous.md).
#
#   scripts/bench/rendezvous.sh
#   BUILD_DIR=build-rdzv DRUN_SIZES=8,64,1024 REAL_SIZES=8,64 TORCH_SIZES=8,64 TORCH_CAP=60 \
#     SEQUENTIAL_SIZES=4096 \
#     scripts/bench/rendezvous.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
DRUN_SIZES=${DRUN_SIZES:-8,16,32,64,128,256,1024,4096,10000}
REAL_SIZES=${REAL_SIZES:-8,16,32,64,128,256}
SEQUENTIAL_SIZES=${SEQUENTIAL_SIZES:-1024,4096,10000}
TORCH_SIZES=${TORCH_SIZES:-8,16,32,64,128}
TORCH_CAP=${TORCH_CAP:-60}
ETCD_SIZES=${ETCD_SIZES-8,64,256,1024}  # set and empty: no etcd column
PYTHON=${PYTHON:-/usr/bin/python3}

cmake --build "$BUILD_DIR" --target drun-rendezvous rendezvous_bench etcd_rendezvous_bench -j2 >/dev/null
ulimit -n "$(ulimit -Hn)"

source "$(dirname "$0")/daemon.sh"
results=$bench_tmp/results

timeout 300 "$BUILD_DIR/bin/rendezvous_bench" --port "$port" --sizes "$DRUN_SIZES" --server-pid "$daemon_pid" \
  | grep '^RESULT' >>"$results"
# The same generator with the calls one by one (no StoreBatch: 9 round trips, not 5),
# against the same daemon: the "9 trips" columns.
if [[ -n "$SEQUENTIAL_SIZES" ]]; then
  timeout 300 "$BUILD_DIR/bin/rendezvous_bench" --port "$port" --sizes "$SEQUENTIAL_SIZES" \
    --server-pid "$daemon_pid" --sequential 1 | grep '^RESULT' | sed 's/^RESULT drun generator/RESULT drun sequential/' >>"$results"
fi
timeout 300 "$BUILD_DIR/bin/rendezvous_bench" --port "$port" --sizes "$REAL_SIZES" --mode real \
  | grep '^RESULT' >>"$results"
if "$PYTHON" -c 'import torch.distributed' 2>/dev/null; then
  "$PYTHON" scripts/bench/rendezvous_torch.py --sizes "$TORCH_SIZES" --cap "$TORCH_CAP" \
    | grep '^RESULT' >>"$results"
fi

# etcd's members share the 2 cores with 1024+ agents' threads: a heartbeat of 50 ms / election
# timeout of 500 ms (up.sh's default, for fast failover tests) elects leader after leader there.
if [[ -n "$ETCD_SIZES" ]] && etcd_out=$(BASE_PORT=${ETCD_BASE_PORT:-24790} ETCD_HEARTBEAT_MS=100 \
    ETCD_ELECTION_MS=2000 scripts/etcd/up.sh 2>/dev/null); then
  read -r etcd_dir etcd_endpoints <<<"$etcd_out"
  member_pids=$(cat "$etcd_dir"/m0.pid "$etcd_dir"/m1.pid "$etcd_dir"/m2.pid | paste -sd,)
  # RESULT lines for the table; COST lines (requests by kind, agents' and members' CPU) after it.
  timeout 600 "$BUILD_DIR/bin/etcd_rendezvous_bench" --endpoints "$etcd_endpoints" \
    --sizes "$ETCD_SIZES" --cap "${ETCD_CAP:-240}" --member-pids "$member_pids" \
    | grep -E '^(RESULT|COST)' >>"$results" || true
  scripts/etcd/down.sh "$etcd_dir"
fi

"$PYTHON" - "$results" "$TORCH_CAP" <<'PY'
import sys
drun, real, torch, etcd, seq = {}, {}, {}, {}, {}
costs = []
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "COST":                          # COST etcd N agents_cpu_ms=.. members_cpu_ms=.. kind=count...
        costs.append(f[2:])
    elif f[1] == "etcd":                          # RESULT etcd real N connect_ms|error next_ms
        etcd[int(f[3])] = "%.1f" % float(f[5]) if f[4] != "error" else "error"
    elif f[1] == "drun" and f[2] == "sequential":  # as generator, the calls one by one
        seq[int(f[3])] = "%.0f / %.0f" % (float(f[6]), float(f[9]))
    elif f[1] == "drun" and f[2] == "generator":  # RESULT drun generator N connect rank next calls bytes
        drun[int(f[3])] = (float(f[5]), float(f[6]), float(f[9]), int(f[7]), int(f[8]) / 1048576.0)
    elif f[1] == "drun":                        # RESULT drun real N connect rank next 0
        real[int(f[3])] = float(f[6])
    else:                                       # RESULT torch N seconds|timeout|error connect
        torch[int(f[2])] = f[3]
print("rendezvous: N agents join one round (MIN=MAX=N), from all-connected to every agent ranked")
print("(daemon CPU: ms of CPU the drun-rendezvous process spent on the round; load-independent)")
print("(9 trips: the same generator with the calls one by one, as next() before StoreBatch: next() ms / daemon CPU ms)")
print("%6s | %12s %14s %11s %12s %10s | %15s | %12s | %14s | %8s | %12s" % (
    "N", "drun rank ms", "drun next() ms", "daemon CPU", "store calls", "bytes MiB", "9 trips",
    "real next ms", "torch c10d ms", "speedup", "etcd next ms"))
print("-" * 153)
for n in sorted(set(drun) | set(torch) | set(real) | set(etcd)):
    d = drun.get(n)
    t = torch.get(n)
    rcol = "%.1f" % real[n] if n in real else "-"
    if t is None:
        tcol = "-"
    elif t in ("timeout", "error"):
        tcol = ">%ss cap" % sys.argv[2] if t == "timeout" else "error"
    else:
        tcol = "%.0f" % (float(t) * 1000)
    speed = "%7.0fx" % (float(t) * 1000 / d[1]) if d and t and t[0].isdigit() else "-"  # vs next()
    dcol = ("%12.1f %14.1f %11.0f %12d %10.1f" % d if d
            else "%12s %14s %11s %12s %10s" % ("-", "-", "-", "-", "-"))
    print("%6d | %s | %15s | %12s | %14s | %8s | %12s" % (n, dcol, seq.get(n, "-"), rcol, tcol,
                                                          speed, etcd.get(n, "-")))
if costs:
    print()
    print("etcd: what one round cost (requests per agent by kind; CPU between go and the last next())")
    for c in costs:
        n = int(c[0])
        fields = dict(x.split("=") for x in c[1:])
        per = lambda k: float(fields.get(k, 0)) / n
        total = sum(float(v) for k, v in fields.items() if k not in ("agents_cpu_ms", "members_cpu_ms", "txn_failed"))
        print("%6d | range %.2f  txn %.2f (failed %.2f)  watch %.2f  keepalive %.2f | %.1f requests/agent |"
              " agents CPU %s ms, etcd members CPU %s ms" % (
                  n, per("range"), per("txn"), per("txn_failed"), per("watch"), per("keepalive"), total / n,
                  fields.get("agents_cpu_ms"), fields.get("members_cpu_ms")))
PY
