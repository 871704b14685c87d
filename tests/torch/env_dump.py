#!/usr/bin/python3
"""A worker for the torchrun compatibility test (tests/torchrun_compat_test.cpp): it writes its
arguments and environment to $COMPAT_DUMP_DIR/rank-$RANK-<pid>.txt, in the format of
tests/helpers/env_dump.cpp (`arg:<i>=...`, `env:KEY=VALUE`, a newline inside a value written as
\\n), then prints `COMPAT hello rank=R` on stdout and `COMPAT oops rank=R` on stderr (to see where
--redirects/--tee/--local-ranks-filter send them) and exits 0.

A file, not stdout: torchrun 1.13 does not prefix the workers' lines, and -r sends them away
from the console. Runs as `python3 env_dump.py`, `python3 -m env_dump` and, with --no-python,
as an executable (shebang). Imports nothing of torch: the launchers are what is compared.
"""
import os
import sys


def main():
    rank = os.environ.get("RANK", "none")
    lines = [f"arg:{i}={a}" for i, a in enumerate(sys.argv[1:], start=1)]
    lines += [f"env:{k}={v}".replace("\n", "\\n") for k, v in os.environ.items()]
    path = os.path.join(os.environ["COMPAT_DUMP_DIR"], f"rank-{rank}-{os.getpid()}.txt")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(path + ".tmp", path)  # whole or absent
    print(f"COMPAT hello rank={rank}", flush=True)
    print(f"COMPAT oops rank={rank}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
