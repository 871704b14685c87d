"""A standby worker's wait for its rank (docs/recovery.md, "Standby workers").

Under `drun --recovery in-process` the agent keeps processes of the program started ahead of
need, DRUN_STANDBY naming each one's FIFO. `import drun` (drun/__init__.py) calls wait() in
them: it opens the FIFO for reading (which tells the agent this standby is ready) and blocks
until the agent writes the assignment, one line of JSON
{"env": {NAME: VALUE, ...}, "unset": [NAME, ...]}, puts it in os.environ and returns, so the
program goes on as the rank it was given (a replacement in the generation its DRUN_GENERATION
names). When the agent is gone (this process re-parented; the parent-death signal usually ends
it first) the standby exits. Standard library only.
"""
import json
import os
import select
import sys

VARIABLE = "DRUN_STANDBY"
_SLICE_MS = 1000  # each wait is bounded: the parent is checked at this pace
_MAX_LINE = 1 << 20


def _leave(reason, code):
    if reason:
        print(f"drun: standby worker: {reason}", file=sys.stderr, flush=True)
    sys.exit(code)


def _read_line(path):
    parent = os.getppid()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        _leave(f"cannot open {path}: {e.strerror}", 1)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        line = b""
        while b"\n" not in line:
            if os.getppid() != parent:
                _leave(None, 0)  # the agent is gone
            if not poller.poll(_SLICE_MS):
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                _leave(None, 0)  # the writer closed before a whole line: the agent is gone
            line += chunk
            if len(line) > _MAX_LINE:
                _leave(f"an assignment of more than {_MAX_LINE} bytes in {path}", 1)
        return line.split(b"\n", 1)[0]
    finally:
        os.close(fd)


def _parse(line):
    """(env, unset) of an assignment line; ValueError naming what is wrong."""
    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"the assignment is not JSON: {e}") from None
    env = message.get("env") if isinstance(message, dict) else None
    unset = message.get("unset", []) if isinstance(message, dict) else None
    if not isinstance(env, dict) or not isinstance(unset, list):
        raise ValueError("the assignment is not {\"env\": {...}, \"unset\": [...]}")
    names = list(env) + unset
    if not all(isinstance(v, str) for v in list(env.values()) + names) or not all(
            n and "=" not in n and "\0" not in n for n in names) or any("\0" in v for v in env.values()):
        raise ValueError("the assignment's names and values must be strings (names without '=')")
    return env, unset


def wait():
    """Blocks until this standby is assigned a rank, then sets its environment."""
    path = os.environ.get(VARIABLE, "")
    try:
        env, unset = _parse(_read_line(path))
    except ValueError as e:
        _leave(f"{path}: {e}", 1)
    for name in unset:
        os.environ.pop(name, None)
    os.environ.pop(VARIABLE, None)
    os.environ.update(env)
