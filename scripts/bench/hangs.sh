#!/usr/bin/env bash
# Hang benchmark: drun's hang detection beside torchrun 1.13 with its FileTimer on and
# off; see scripts/bench/hangs_bench.py for what is measured. Needs the built drun (DRUN_BIN_DIR,
# default build/bin, with build/lib/drun/python beside it) and /usr/bin/python3 with torch.
#   scripts/bench/hangs.sh                       TRIALS=3 TORCH_TRIALS=2 WAIT_OFF=30 (about 6 min)
#   BLAME=1 scripts/bench/hangs.sh               the time to the right culprit named, gloo and
#                                                drun's backend beside torchrun's FileTimer
#                                                (scripts/bench/hangs_blame.py, TRIALS=2, ~3 min)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ -n "${BLAME:-}" ] && exec /usr/bin/python3 "$here/hangs_blame.py" "$@"
exec /usr/bin/python3 "$here/hangs_bench.py" "$@"
