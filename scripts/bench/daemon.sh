# Sourced by the benchmark scripts: starts build/bin/drun-rendezvous on a free loopback port and
# stops it on exit. Sets $port. Needs $BUILD_DIR; the caller's own temp files go in $bench_tmp
# (removed on exit too).
bench_tmp=$(mktemp -d)
daemon_pid=
stop_daemon() {
  [[ -n "$daemon_pid" ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$bench_tmp"
}
trap stop_daemon EXIT

"$BUILD_DIR/bin/drun-rendezvous" --host 127.0.0.1 --port 0 --max-connections-per-peer 16384 --log-level warn >"$bench_tmp/daemon.out" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do                       # bounded: 5 s
  grep -q "listening on" "$bench_tmp/daemon.out" && break
  sleep 0.05
done
port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$bench_tmp/daemon.out")
[[ -n "$port" ]] || { echo "$(basename "$0"): drun-rendezvous did not start" >&2; exit 1; }
