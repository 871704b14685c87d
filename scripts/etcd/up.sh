#!/usr/bin/env bash
# A 3-member etcd cluster on loopback ports, for the etcd rendezvous backend's tests and users:
#   scripts/etcd/up.sh [DIR]      (DIR default: a fresh mktemp -d; BASE_PORT env, default 23790;
#                                  ETCD_HEARTBEAT_MS / ETCD_ELECTION_MS, default 50 / 500)
# Member i (0..2) serves clients on 127.0.0.1:BASE_PORT+2i and peers on BASE_PORT+2i+1; its data
# lives in DIR/m<i> and its pid in DIR/m<i>.pid (scripts/etcd/down.sh DIR kills them by PID).
# Prints "DIR ENDPOINTS" once every member answers; exits 77 (a test's skip) when no etcd is
# installed, 1 when the cluster does not come up within 20 s (its logs are in DIR/m<i>.log).
# TLS=1: clients talk https, with a throw-away CA (DIR/tls/ca.pem, for --rdzv-conf etcd_cacert)
# and a member certificate for 127.0.0.1 made with openssl.
# OWNER_PID=P: the cluster belongs to process P (a test): a watcher runs down.sh once P is gone,
# so a test that crashes, aborts on a sanitizer report or is killed at its timeout leaves no
# members running (its destructor would have run down.sh). down.sh DIR stops the watcher too.
# On namespace hosts (scripts/netns.sh): MEMBER_NETNS="ns0 ns1 ns2" runs member i inside network
# namespace ns_i and MEMBER_ADDRS="a0 a1 a2" gives its address there; it serves peers on a_i and
# clients on a_i and on that host's 127.0.0.1 (a node on the same host still reaches it when the
# host's link is down: "cut off from the majority"). ENDPOINTS are then a_i:port. Not with TLS=1.
set -euo pipefail
etcd_bin=$(command -v etcd || true)
if [[ -z "$etcd_bin" && -x /usr/bin/etcd ]]; then etcd_bin=/usr/bin/etcd; fi
if [[ -z "$etcd_bin" ]]; then
  echo "etcd is not installed (Debian: apt-get install etcd-server)" >&2
  exit 77
fi
# Data on tmpfs when there is one: etcd fsyncs every write.
tmp_root=/tmp
[[ -d /dev/shm && -w /dev/shm ]] && tmp_root=/dev/shm
# Not named "drun...": the comm tests check that no /dev/shm entry of that name is left behind,
# and an etcd of a test running beside them is none of theirs.
dir=${1:-$(mktemp -d "$tmp_root/etcd-cluster.XXXXXX")}
mkdir -p "$dir"
base=${BASE_PORT:-23790}
scheme=http
tls_flags=()
curl_tls=()
if [[ "${TLS:-0}" == 1 ]]; then
  command -v openssl >/dev/null || { echo "TLS=1 needs openssl" >&2; exit 77; }
  mkdir -p "$dir/tls"
  (
    cd "$dir/tls"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -subj /CN=drun-test-ca -days 2
    openssl req -newkey rsa:2048 -nodes -keyout member.key -out member.csr -subj /CN=127.0.0.1
    printf 'subjectAltName=IP:127.0.0.1\n' >ext
    openssl x509 -req -in member.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out member.pem \
      -days 2 -extfile ext
  ) >/dev/null 2>&1 || { echo "openssl could not make the test certificates" >&2; exit 1; }
  scheme=https
  tls_flags=(--cert-file "$dir/tls/member.pem" --key-file "$dir/tls/member.key")
  curl_tls=(--cacert "$dir/tls/ca.pem")
fi
read -r -a netns <<<"${MEMBER_NETNS:-}"
read -r -a addrs <<<"${MEMBER_ADDRS:-127.0.0.1 127.0.0.1 127.0.0.1}"
if [[ ${#netns[@]} -ne 0 && ( ${#netns[@]} -ne 3 || ${#addrs[@]} -ne 3 || "$scheme" != http ) ]]; then
  echo "MEMBER_NETNS needs 3 namespaces and MEMBER_ADDRS 3 addresses (and no TLS)" >&2
  exit 2
fi
# The prefix that runs a command on member i's host: inside its namespace, or here. A prefix,
# not a function: a simple command sent to the background execs in its fork, so $! is etcd's
# PID (a function would leave the PID of a subshell, and down.sh could not stop the member).
on_host() {
  host_prefix=()
  [[ ${#netns[@]} -eq 3 ]] && host_prefix=(ip netns exec "${netns[$1]}")
  return 0
}
cluster=""
for i in 0 1 2; do
  cluster+="${cluster:+,}m$i=http://${addrs[$i]}:$((base + 2 * i + 1))"
done
endpoints=""
for i in 0 1 2; do
  client=$((base + 2 * i))
  peer=$((base + 2 * i + 1))
  addr=${addrs[$i]}
  endpoints+="${endpoints:+,}$addr:$client"
  listen="$scheme://$addr:$client"
  [[ "$addr" != 127.0.0.1 ]] && listen+=",$scheme://127.0.0.1:$client"
  # Short heartbeat/election: a killed leader is replaced within about a second. A benchmark
  # that loads the machine's cores raises them (ETCD_HEARTBEAT_MS, ETCD_ELECTION_MS): starved
  # members otherwise miss heartbeats and elect leader after leader. (`ip netns exec` execs
  # etcd: the PID recorded is etcd's.)
  on_host "$i"
  "${host_prefix[@]}" setsid "$etcd_bin" --name "m$i" --data-dir "$dir/m$i" \
    --listen-client-urls "$listen" --advertise-client-urls "$scheme://$addr:$client" \
    "${tls_flags[@]}" \
    --listen-peer-urls "http://$addr:$peer" --initial-advertise-peer-urls "http://$addr:$peer" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "drun-$base" \
    --heartbeat-interval "${ETCD_HEARTBEAT_MS:-50}" --election-timeout "${ETCD_ELECTION_MS:-500}" --log-level error \
    >"$dir/m$i.log" 2>&1 </dev/null &
  echo $! >"$dir/m$i.pid"
done
echo "$endpoints" >"$dir/endpoints"
fail() {  # fail MESSAGE: stop what was started, say why, exit 1 (EtcdCluster tries other ports)
  echo "$1" >&2
  "$(dirname "$0")/down.sh" "$dir" >/dev/null 2>&1 || true
  exit 1
}
# Another cluster on these ports (two test suites at once) answers the health checks below while
# our members, unable to bind, exit: so a member must still run, and own its client port.
member_exited() {  # member_exited I: its process is gone (or a zombie)
  local state
  state=$(awk '{print $3}' "/proc/$(cat "$dir/m$1.pid")/stat" 2>/dev/null || echo gone)
  [[ "$state" == gone || "$state" == Z ]]
}
port_owner() {  # port_owner I: the PID listening on member I's client port on its host ("" unknown)
  command -v ss >/dev/null || return 0
  on_host "$1"
  "${host_prefix[@]}" ss -Hltnp "sport = :$((base + 2 * $1))" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2 || true
}
deadline=$((SECONDS + 20))
for i in 0 1 2; do
  on_host "$i"
  until "${host_prefix[@]}" curl -sf -m 1 "${curl_tls[@]}" "$scheme://127.0.0.1:$((base + 2 * i))/health" 2>/dev/null | grep -q '"health":"true"'; do
    member_exited "$i" && fail "etcd member m$i exited: $(tail -n 1 "$dir/m$i.log")"
    ((SECONDS >= deadline)) && fail "etcd member m$i did not come up in 20 s; see $dir/m$i.log"
    sleep 0.1
  done
done
for i in 0 1 2; do
  owner=$(port_owner "$i")
  member_exited "$i" && fail "etcd member m$i exited: $(tail -n 1 "$dir/m$i.log")"
  if [[ -n "$owner" && "$owner" != "$(cat "$dir/m$i.pid")" ]]; then
    fail "port $((base + 2 * i)) is held by process $owner, not by etcd member m$i: another cluster or program uses these ports"
  fi
done
if [[ -n "${OWNER_PID:-}" ]]; then
  # Checks once a second for as long as the owner lives (a test: ctest's timeout bounds it);
  # detached from the caller's output, which the caller reads to its end, and in a session of its
  # own: a kill of the caller's process group (a cancelled run) must not take the watcher along,
  # since the members (each in a group of their own) would outlive it. Named up.sh-watcher, which
  # down.sh looks for.
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; DRUN_ETCD_WATCHER=1 "$2" "$3"' \
    up.sh-watcher "$OWNER_PID" "$(dirname "$0")/down.sh" "$dir" </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/watcher.pid"
fi
echo "$dir $endpoints"
