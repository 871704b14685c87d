#!/usr/bin/env bash
# CTest fixture `slurm_cluster` of the [slurm] tests (tests/CMakeLists.txt).
#   ctest_fixture.sh up     bring the cluster up (up.sh); where it cannot run on this machine,
#                           write why to $DRUN_SLURM_DIR/unavailable and exit 0: the tests then
#                           exit 77 (SKIPPED) with that reason. A real failure of up.sh fails.
#   ctest_fixture.sh down   tear it down (down.sh): nothing of it is left running.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${DRUN_SLURM_DIR:-/tmp/drun-slurm}

unavailable() {
  local why=""
  if [ "$(id -u)" -ne 0 ]; then why="needs root (network namespaces, slurmd)"
  else
    for b in slurmctld slurmd srun sbatch munged ip nsenter unshare; do
      command -v "$b" >/dev/null 2>&1 || { why="'$b' is not installed (scripts/setup.sh --tests installs slurmctld slurmd slurm-client munge)"; break; }
    done
  fi
  if [ -z "$why" ]; then
    local probe="drunslurm-probe-$$"
    if ip netns add "$probe" 2>/dev/null; then ip netns del "$probe"; else why="cannot create network namespaces here (ip netns add failed)"; fi
  fi
  # shellcheck source=names.sh
  . "$HERE/names.sh"
  if [ -z "$why" ] && ip link show "$BR" >/dev/null 2>&1 && [ ! -f "$DIR/netns.created" ]; then
    why="a drun SLURM test cluster with this one's names runs on this machine (bridge $BR exists, not made for $DIR)"
  fi
  echo "$why"
}

case "${1:-}" in
  up)
    mkdir -p "$DIR" || exit 1
    rm -f "$DIR/unavailable"
    why=$(unavailable)
    if [ -n "$why" ]; then
      echo "$why" >"$DIR/unavailable"
      echo "ctest_fixture.sh: the [slurm] tests will be skipped: $why"
      exit 0
    fi
    timeout 150 bash "$HERE/up.sh" "$DIR"
    ;;
  down)
    [ -f "$DIR/unavailable" ] && { rm -f "$DIR/unavailable"; exit 0; }
    timeout 150 bash "$HERE/down.sh" "$DIR"
    ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
