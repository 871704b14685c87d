"""Runs the program its arguments name (argv[1:]) from a Python process that first imports drun,
for recovery_node_e2e_test.cpp: under `drun --recovery in-process` this makes a standby worker of a
program that is not Python (tests/recovery/recovery_worker). A standby waits in `import drun`
until the agent assigns it a rank (drun/_standby.py), then runs the program as that rank, with
the rank's environment; a worker started as a rank goes straight on.
"""
import os
import sys

print(f"SE importing pid={os.getpid()} standby={1 if os.environ.get('DRUN_STANDBY') else 0}", flush=True)
import drun  # noqa: E402,F401  a standby waits here for its rank

os.execve(sys.argv[1], sys.argv[1:], os.environ)
