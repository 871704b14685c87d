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
dir=${1:-$(mktemp -d "$tmp_root/drun-etcd.XXXXXX")}
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
cluster=""
for i in 0 1 2; do
  cluster+="${cluster:+,}m$i=http://127.0.0.1:$((base + 2 * i + 1))"
done
endpoints=""
for i in 0 1 2; do
  client=$((base + 2 * i))
  peer=$((base + 2 * i + 1))
  endpoints+="${endpoints:+,}127.0.0.1:$client"
  # Short heartbeat/election: a killed leader is replaced within about a second. A benchmark
  # that loads the machine's cores raises them (ETCD_HEARTBEAT_MS, ETCD_ELECTION_MS): starved
  # members otherwise miss heartbeats and elect leader after leader.
  setsid "$etcd_bin" --name "m$i" --data-dir "$dir/m$i" \
    --listen-client-urls "$scheme://127.0.0.1:$client" --advertise-client-urls "$scheme://127.0.0.1:$client" \
    "${tls_flags[@]}" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "drun-$base" \
    --heartbeat-interval "${ETCD_HEARTBEAT_MS:-50}" --election-timeout "${ETCD_ELECTION_MS:-500}" --log-level error \
    >"$dir/m$i.log" 2>&1 </dev/null &
  echo $! >"$dir/m$i.pid"
done
echo "$endpoints" >"$dir/endpoints"
deadline=$((SECONDS + 20))
for i in 0 1 2; do
  until curl -sf -m 1 "${curl_tls[@]}" "$scheme://127.0.0.1:$((base + 2 * i))/health" 2>/dev/null | grep -q '"health":"true"'; do
    if ((SECONDS >= deadline)); then
      echo "etcd member m$i did not come up in 20 s; see $dir/m$i.log" >&2
      "$(dirname "$0")/down.sh" "$dir" >/dev/null 2>&1 || true
      exit 1
    fi
    sleep 0.1
  done
done
echo "$dir $endpoints"
