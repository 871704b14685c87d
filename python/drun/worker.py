"""drun.worker: tell the drun agent that this worker makes progress, and where it is.

    import drun.worker
    for batch in loader:
        with drun.worker.section("step"):
            train(batch)            # a step that outlasts its --hang-timeout is a hang
        drun.worker.heartbeat()     # a rank silent for --hang-timeout is a hang

drun names a shared page per rank in DRUN_WORKER_CHANNEL; this module maps it and writes a
heartbeat counter, its CLOCK_MONOTONIC time and the current section (layout:
worker/include/drun/worker_channel.h) with no system call. Outside drun (the variable unset, the
file unusable) every call is a no-op. Standard library only.

Threading: any thread may beat; sections form one stack per process (the main loop's thread).
"""

import mmap
import os
import struct
import threading
import time

__all__ = ["enabled", "heartbeat", "section"]

_MAGIC = 0x43575244
_VERSION = 1
_SIZE = 4096
_SECTION_MAX = 64  # bytes, with the terminating NUL
_OFF_BEATS = 8  # beats (u64), last_beat_ns (i64)
_OFF_SEQ = 24  # seq (u64), section_seq (u64), section_start_ns (i64), section (64 bytes)
_OFF_PID = 112
_MAX_DEPTH = 8

_BEAT = struct.Struct("=Qq")
_U64 = struct.Struct("=Q")
_SECTION = struct.Struct("=Qq%ds" % _SECTION_MAX)  # section_seq, section_start_ns, section


def _map():
    path = os.environ.get("DRUN_WORKER_CHANNEL")
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < _SIZE:
            return None
        page = mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if struct.unpack_from("=II", page, 0) != (_MAGIC, _VERSION):
        page.close()
        return None
    struct.pack_into("=q", page, _OFF_PID, os.getpid())
    return memoryview(page)  # packs into a memoryview cost less than into the mmap itself


_page = _map()
_lock = threading.Lock()
_stack = []  # (name bytes, start ns)
_now = time.monotonic_ns


def enabled():
    """True when a drun agent listens."""
    return _page is not None


_beats = 0
_seq = 0
_section_seq = 0
_names = {}  # name -> its bytes in the page (a loop enters the same few sections)


def _beat(now):
    global _beats
    _beats = (_beats + 1) & 0xFFFFFFFFFFFFFFFF
    _BEAT.pack_into(_page, _OFF_BEATS, _beats, now)


def _publish(entered):
    # Seqlock: an odd sequence number while the section fields change. This process is the only
    # writer of its page, so the counters live here.
    global _seq, _section_seq
    _U64.pack_into(_page, _OFF_SEQ, _seq | 1)
    if entered:
        _section_seq = (_section_seq + 1) & 0xFFFFFFFFFFFFFFFF
    name, start = _stack[min(len(_stack), _MAX_DEPTH) - 1] if _stack else (b"", 0)
    _SECTION.pack_into(_page, _OFF_SEQ + 8, _section_seq, start, name)
    _seq = (_seq + 2) & 0xFFFFFFFFFFFFFFFE
    _U64.pack_into(_page, _OFF_SEQ, _seq)


def _encode(name):
    raw = _names.get(name)
    if raw is None:
        raw = str(name).encode("ascii", "replace")[: _SECTION_MAX - 1]
        raw = bytes(c if 0x20 <= c < 0x7F else 0x3F for c in raw)
        if len(_names) < 1024:
            _names[name] = raw
    return raw


class _Section:
    __slots__ = ("_name",)

    def __init__(self, name):
        self._name = _encode(name)

    def __enter__(self):
        now = _now()
        with _lock:
            _stack.append((self._name, now))
            if len(_stack) <= _MAX_DEPTH:
                _publish(True)
            _beat(now)
        return self

    def __exit__(self, *exc):
        with _lock:
            if _stack:
                _stack.pop()
                if len(_stack) < _MAX_DEPTH:
                    _publish(False)
            _beat(_now())
        return False


class _NoSection:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_SECTION = _NoSection()

if _page is None:

    def heartbeat():
        """One heartbeat: this rank makes progress (a no-op outside drun)."""

    def section(name):
        """A context manager: the rank is in section `name` while inside it."""
        return _NO_SECTION

else:

    def heartbeat():
        """One heartbeat: this rank makes progress (a no-op outside drun)."""
        global _beats
        _beats = (_beats + 1) & 0xFFFFFFFFFFFFFFFF
        _BEAT.pack_into(_page, _OFF_BEATS, _beats, _now())

    def section(name):
        """A context manager: the rank is in section `name` while inside it."""
        return _Section(name)
