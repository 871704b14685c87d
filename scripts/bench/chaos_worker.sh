#!/bin/bash
# chaos_worker.sh LIFE_MS: the worker of scripts/bench/chaos.sh. Appends one line per event to
# $CHAOS_LOG (the host's file; O_APPEND writes of one short line do not interleave):
#
#   <wall ns> <host> <pid> <ppid> <restart> <group rank> <rank> <world> <master addr:port> <event>
#
# event: start (first action), alive (every ~100 ms), term (SIGTERM received: it exits 143),
# end (after LIFE_MS milliseconds: it exits 0). The ppid is the agent's pid (drun forks workers itself),
# so two agents on one host stay apart. bash's $EPOCHREALTIME: no fork for a timestamp.
life_ms=${1:?usage: chaos_worker.sh LIFE_MS}
place="${CHAOS_HOST:-?} $$ $PPID ${TORCHELASTIC_RESTART_COUNT:-?} ${GROUP_RANK:-?} ${RANK:-?} ${WORLD_SIZE:-?} ${MASTER_ADDR:-?}:${MASTER_PORT:-?}"
note() {
  local t=${EPOCHREALTIME/./}
  echo "${t}000 $place $1" >>"$CHAOS_LOG"
}
trap 'note term; exit 143' TERM
note start
end=$(( ${EPOCHREALTIME/./} + life_ms * 1000 ))
while (( ${EPOCHREALTIME/./} < end )); do
  sleep 0.1 &
  wait $!   # wait (a builtin) returns at once on SIGTERM, so the trap runs without delay
  note alive
done
note end
exit 0
