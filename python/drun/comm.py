"""drun.comm: libdrun_comm's collectives on Python buffers (numpy arrays, bytearray, memoryview,
array.array), through ctypes over the C API (drun/comm.h); no compiled step, no torch.

    import numpy as np, drun.comm
    with drun.comm.init() as world:             # env:// as drun (or torchrun) sets it
        grad = np.ones(4, np.float32)
        world.all_reduce(grad, op="sum")        # in place
        parts = np.empty(world.size * 4, np.float32)
        world.all_gather(grad, parts)

Buffers are C-contiguous objects exposing the buffer protocol; outputs must be writable. The
element type comes from the buffer (numpy's dtype, a memoryview's or array's format; bytearray
and bytes are uint8), or from `dtype=` ("float32", "bfloat16", ...) for raw bytes. Counts are
checked here (an output too small is a ValueError before anything is sent); the library checks
dtype x op (bitwise ops on floats, AVG on integers: InvalidArgument).

Errors: drun.comm.Error (a RuntimeError) and its kinds InvalidArgument (also a ValueError),
TimeoutError, CommError (a peer failed; the message names it), NetworkError, ProtocolError.
After a TimeoutError or CommError the communicator is broken, as in the C++ API.

Threading: a Communicator may be used from several threads; collectives run in call order. The
GIL is released during every call (ctypes does). Requests keep their buffers alive until done.
"""
import ctypes
import os
import threading

__all__ = ["init", "Communicator", "Request", "ANY_SOURCE", "DTYPES", "OPS", "Error",
           "InvalidArgument", "TimeoutError", "CommError", "NetworkError", "ProtocolError"]

ANY_SOURCE = -1

# drun/comm.h's enums (stable values).
DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "int64": 3, "float16": 4, "bfloat16": 5,
          "float32": 6, "float64": 7}
OPS = {"sum": 0, "product": 1, "min": 2, "max": 3, "avg": 4, "band": 5, "bor": 6, "bxor": 7}
_ITEMSIZE = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2,
             "float32": 4, "float64": 8}
# struct / buffer-protocol format characters (native sizes on Linux x86-64 and aarch64).
_FORMATS = {"b": "int8", "B": "uint8", "c": "uint8", "i": "int32", "l": "int64", "q": "int64",
            "e": "float16", "f": "float32", "d": "float64"}
_NUMPY_NAMES = {"int8", "uint8", "int32", "int64", "float16", "float32", "float64", "bool"}


class Error(RuntimeError):
    """A libdrun_comm failure; `status` is the DRUN_E* code."""

    def __init__(self, message, status=6):
        super().__init__(message)
        self.status = status


class InvalidArgument(Error, ValueError):
    pass


class TimeoutError(Error):  # noqa: A001 (drun's kind, as in the C++ API)
    pass


class NetworkError(Error):
    pass


class CommError(Error):
    pass


class ProtocolError(Error):
    pass


_ERRORS = {1: InvalidArgument, 2: TimeoutError, 3: NetworkError, 4: CommError, 5: ProtocolError}

_lib = None
_lib_lock = threading.Lock()


def _library_path():
    """DRUN_COMM_LIBRARY, else the library beside this package: <lib>/drun/python/drun ->
    <lib>/libdrun_comm.so (the build tree and an install share the layout)."""
    explicit = os.environ.get("DRUN_COMM_LIBRARY")
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    beside = os.path.normpath(os.path.join(here, "..", "..", "..", "libdrun_comm.so"))
    return beside if os.path.exists(beside) else "libdrun_comm.so"


def _load():
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = _library_path()
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise ImportError(f"drun.comm: cannot load libdrun_comm ({path}): {e}; set "
                              "DRUN_COMM_LIBRARY to its path") from e
        c_int, c_size, vp, pp = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER
        sigs = {
            "drun_comm_init": [ctypes.c_char_p, ctypes.c_char_p, c_int, c_int, c_int, pp(vp)],
            "drun_comm_rank": [vp], "drun_comm_size": [vp],
            "drun_comm_new_group": [vp, pp(c_int), c_int, pp(vp)],
            "drun_send": [vp, vp, c_size, c_int, c_int, c_int, c_int],
            "drun_recv": [vp, vp, c_size, c_int, c_int, c_int, c_int, pp(c_int)],
            "drun_isend": [vp, vp, c_size, c_int, c_int, c_int, c_int, pp(vp)],
            "drun_irecv": [vp, vp, c_size, c_int, c_int, c_int, c_int, pp(vp)],
            "drun_wait": [vp, c_int], "drun_test": [vp, pp(c_int)], "drun_request_source": [vp],
            "drun_broadcast": [vp, vp, c_size, c_int, c_int, c_int],
            "drun_reduce": [vp, vp, c_size, c_int, c_int, c_int, c_int],
            "drun_all_reduce": [vp, vp, c_size, c_int, c_int, c_int],
            "drun_all_reduce_async": [vp, vp, c_size, c_int, c_int, c_int, pp(vp)],
            "drun_scatter": [vp, vp, vp, c_size, c_int, c_int, c_int],
            "drun_gather": [vp, vp, vp, c_size, c_int, c_int, c_int],
            "drun_all_gather": [vp, vp, vp, c_size, c_int, c_int],
            "drun_reduce_scatter": [vp, vp, vp, c_size, c_int, c_int, c_int],
            "drun_all_to_all": [vp, vp, vp, c_size, c_int, c_int],
            "drun_barrier": [vp, c_int],
        }
        for name, args in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, c_int
        lib.drun_comm_generation.argtypes = [vp, pp(ctypes.c_uint64)]
        lib.drun_comm_generation.restype = c_int
        lib.drun_comm_reform.argtypes, lib.drun_comm_reform.restype = [vp, ctypes.c_int64], c_int
        for name in ("drun_comm_destroy", "drun_request_free"):
            getattr(lib, name).argtypes, getattr(lib, name).restype = [vp], None
        lib.drun_last_error.argtypes, lib.drun_last_error.restype = [], ctypes.c_char_p
        _lib = lib
        return lib


def _check(status, what):
    if status != 0:
        message = (_lib.drun_last_error() or b"").decode(errors="replace")
        raise _ERRORS.get(status, Error)(f"{what}: {message}", status)


def _timeout_ms(timeout):
    """None: the communicator's; seconds (float or timedelta) otherwise."""
    if timeout is None:
        return 0
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    if seconds <= 0:
        raise InvalidArgument(f"timeout must be positive, got {seconds} s", 1)
    return max(1, int(seconds * 1000))


def _dtype_of(view, obj, dtype):
    if dtype is not None:
        name = str(dtype)
        name = name[len("numpy."):] if name.startswith("numpy.") else name
    elif hasattr(obj, "dtype") and str(obj.dtype) in _NUMPY_NAMES:
        name = str(obj.dtype)
    elif hasattr(obj, "dtype"):
        raise InvalidArgument(f"dtype {obj.dtype} is not supported (supported: "
                              f"{', '.join(DTYPES)}, bool as uint8)", 1)
    else:
        fmt = view.format.lstrip("@=<")
        if fmt == "?":
            name = "bool"
        elif fmt not in _FORMATS:
            raise InvalidArgument(f"buffer format '{view.format}' has no drun dtype (supported: "
                                  f"{', '.join(DTYPES)}); pass dtype=", 1)
        else:
            name = _FORMATS[fmt]
    if name == "bool":
        name = "uint8"  # one byte per element, 0 or 1
    if name not in DTYPES:
        raise InvalidArgument(f"dtype '{name}' is not supported (supported: {', '.join(DTYPES)})", 1)
    return name


class _Buffer:
    """A Python buffer as (address, element count, dtype name); holds what keeps it alive."""

    def __init__(self, obj, dtype=None, writable=True, what="buffer"):
        if obj is None:
            self.address, self.count, self.dtype, self.keep = None, 0, dtype, None
            return
        try:
            view = memoryview(obj)
        except TypeError:
            raise InvalidArgument(f"{what}: {type(obj).__name__} does not expose a buffer", 1) from None
        if not view.c_contiguous:
            raise InvalidArgument(f"{what} is not C-contiguous (copy it first)", 1)
        if writable and view.readonly:
            raise InvalidArgument(f"{what} is read-only (the result is written into it)", 1)
        self.dtype = _dtype_of(view, obj, dtype)
        size = _ITEMSIZE[self.dtype]
        if view.nbytes % size:
            raise InvalidArgument(f"{what}: {view.nbytes} bytes is not a whole number of "
                                  f"{self.dtype} elements", 1)
        self.count = view.nbytes // size
        if view.nbytes == 0:
            self.address, self.keep = None, view
        elif view.readonly:  # a send buffer (bytes): the library only reads it
            raw = ctypes.c_char_p(view.tobytes())
            self.address, self.keep = ctypes.cast(raw, ctypes.c_void_p).value, raw
        else:
            arr = (ctypes.c_char * view.nbytes).from_buffer(view.cast("B"))
            self.address, self.keep = ctypes.addressof(arr), (view, arr)


class Request:
    """An asynchronous operation (torch's Work): wait(), test(), source for receives."""

    def __init__(self, handle, keep):
        self._handle, self._keep = handle, keep

    def wait(self, timeout=None):
        _check(_lib.drun_wait(self._handle, _timeout_ms(timeout)), "wait")
        self._keep = None

    def test(self):
        done = ctypes.c_int(0)
        _check(_lib.drun_test(self._handle, ctypes.byref(done)), "test")
        return bool(done.value)

    is_completed = test

    @property
    def source(self):
        return _lib.drun_request_source(self._handle)

    def __del__(self):
        if getattr(self, "_handle", None) and _lib is not None:
            _lib.drun_request_free(self._handle)
            self._handle = None


def _op(op):
    name = op.lower() if isinstance(op, str) else op
    if isinstance(name, int) and name in OPS.values():
        return name
    if name not in OPS:
        raise InvalidArgument(f"unknown reduce op {op!r} (expected one of {', '.join(OPS)})", 1)
    return OPS[name]


class Communicator:
    """A process group: the world from init(), or a group from new_group()."""

    def __init__(self, handle, parent=None):
        self._handle, self._parent = handle, parent
        self._groups = []

    @property
    def rank(self):
        return _lib.drun_comm_rank(self._handle)

    @property
    def size(self):
        return _lib.drun_comm_size(self._handle)

    @property
    def generation(self):
        """The in-process recovery generation this communicator belongs to (0 without recovery)."""
        out = ctypes.c_uint64()
        _check(_lib.drun_comm_generation(self._handle, ctypes.byref(out)), "generation")
        return out.value

    def reform(self, timeout=None):
        """World only, under drun --recovery in-process: move to the newest generation in place
        (same ranks, new transports). Groups made before must be made again."""
        _check(_lib.drun_comm_reform(self._handle, _timeout_ms(timeout)), "reform")
        self._groups = []

    def new_group(self, ranks, timeout=None):
        """Every rank calls it with the same ranks; a non-member gets a group whose rank is -1."""
        ranks = list(ranks)
        arr = (ctypes.c_int * len(ranks))(*ranks)
        out = ctypes.c_void_p()
        _check(_lib.drun_comm_new_group(self._handle, arr, len(ranks), ctypes.byref(out)),
               f"new_group({ranks})")
        group = Communicator(out, parent=self)
        self._groups.append(group)
        return group

    # ---- point to point ----
    def send(self, buf, dst, tag=0, timeout=None, dtype=None):
        b = _Buffer(buf, dtype, writable=False, what="send buffer")
        _check(_lib.drun_send(self._handle, b.address, b.count, DTYPES[b.dtype], dst, tag,
                              _timeout_ms(timeout)), f"send to {dst}")

    def recv(self, buf, src=ANY_SOURCE, tag=0, timeout=None, dtype=None):
        """Returns the rank the message came from."""
        b = _Buffer(buf, dtype, what="receive buffer")
        source = ctypes.c_int(-1)
        _check(_lib.drun_recv(self._handle, b.address, b.count, DTYPES[b.dtype], src, tag,
                              _timeout_ms(timeout), ctypes.byref(source)), f"recv from {src}")
        return source.value

    def isend(self, buf, dst, tag=0, timeout=None, dtype=None):
        b = _Buffer(buf, dtype, writable=False, what="send buffer")
        out = ctypes.c_void_p()
        _check(_lib.drun_isend(self._handle, b.address, b.count, DTYPES[b.dtype], dst, tag,
                               _timeout_ms(timeout), ctypes.byref(out)), f"isend to {dst}")
        return Request(out, b)

    def irecv(self, buf, src=ANY_SOURCE, tag=0, timeout=None, dtype=None):
        b = _Buffer(buf, dtype, what="receive buffer")
        out = ctypes.c_void_p()
        _check(_lib.drun_irecv(self._handle, b.address, b.count, DTYPES[b.dtype], src, tag,
                               _timeout_ms(timeout), ctypes.byref(out)), f"irecv from {src}")
        return Request(out, b)

    # ---- collectives ----
    def _pair(self, send, recv, dtype, send_blocks, recv_blocks, what, recv_needed=True):
        """Checks a (send, recv) pair; returns (send buffer, recv buffer, elements per block)."""
        s = _Buffer(send, dtype, writable=False, what=f"{what}: send buffer")
        r = _Buffer(recv, dtype, what=f"{what}: receive buffer")
        if recv is not None and s.dtype != r.dtype:
            raise InvalidArgument(f"{what}: send is {s.dtype}, receive is {r.dtype}", 1)
        if s.count % send_blocks:
            raise InvalidArgument(f"{what}: the send buffer's {s.count} elements do not split "
                                  f"into {send_blocks} blocks", 1)
        count = s.count // send_blocks
        if recv_needed and r.count != count * recv_blocks:
            raise InvalidArgument(f"{what}: the receive buffer holds {r.count} elements, "
                                  f"{count * recv_blocks} expected", 1)
        return s, r, count

    def broadcast(self, buf, root=0, timeout=None, dtype=None):
        b = _Buffer(buf, dtype, what="broadcast buffer")
        _check(_lib.drun_broadcast(self._handle, b.address, b.count, DTYPES[b.dtype], root,
                                   _timeout_ms(timeout)), "broadcast")

    def reduce(self, buf, op="sum", root=0, timeout=None, dtype=None):
        b = _Buffer(buf, dtype, what="reduce buffer")
        _check(_lib.drun_reduce(self._handle, b.address, b.count, DTYPES[b.dtype], _op(op), root,
                                _timeout_ms(timeout)), "reduce")

    def all_reduce(self, buf, op="sum", timeout=None, dtype=None):
        b = _Buffer(buf, dtype, what="all_reduce buffer")
        _check(_lib.drun_all_reduce(self._handle, b.address, b.count, DTYPES[b.dtype], _op(op),
                                    _timeout_ms(timeout)), "all_reduce")

    def all_reduce_async(self, buf, op="sum", timeout=None, dtype=None):
        b = _Buffer(buf, dtype, what="all_reduce buffer")
        out = ctypes.c_void_p()
        _check(_lib.drun_all_reduce_async(self._handle, b.address, b.count, DTYPES[b.dtype],
                                          _op(op), _timeout_ms(timeout), ctypes.byref(out)),
               "all_reduce_async")
        return Request(out, b)

    def scatter(self, send, recv, root=0, timeout=None, dtype=None):
        """root's send holds size blocks; every recv one block (others may pass send=None)."""
        r = _Buffer(recv, dtype, what="scatter: receive buffer")
        s = _Buffer(send, dtype or r.dtype, writable=False, what="scatter: send buffer")
        if self.rank == root and s.count != r.count * self.size:
            raise InvalidArgument(f"scatter: the root's send buffer holds {s.count} elements, "
                                  f"{r.count * self.size} expected", 1)
        _check(_lib.drun_scatter(self._handle, s.address, r.address, r.count, DTYPES[r.dtype],
                                 root, _timeout_ms(timeout)), "scatter")

    def gather(self, send, recv, root=0, timeout=None, dtype=None):
        """Every send one block; root's recv size blocks (others may pass recv=None)."""
        s, r, count = self._pair(send, recv, dtype, 1, self.size, "gather",
                                 recv_needed=self.rank == root)
        _check(_lib.drun_gather(self._handle, s.address, r.address, count, DTYPES[s.dtype], root,
                                _timeout_ms(timeout)), "gather")

    def all_gather(self, send, recv, timeout=None, dtype=None):
        s, r, count = self._pair(send, recv, dtype, 1, self.size, "all_gather")
        _check(_lib.drun_all_gather(self._handle, s.address, r.address, count, DTYPES[s.dtype],
                                    _timeout_ms(timeout)), "all_gather")

    def reduce_scatter(self, send, recv, op="sum", timeout=None, dtype=None):
        s, r, count = self._pair(send, recv, dtype, self.size, 1, "reduce_scatter")
        _check(_lib.drun_reduce_scatter(self._handle, s.address, r.address, count,
                                        DTYPES[s.dtype], _op(op), _timeout_ms(timeout)),
               "reduce_scatter")

    def all_to_all(self, send, recv, timeout=None, dtype=None):
        s, r, count = self._pair(send, recv, dtype, self.size, self.size, "all_to_all")
        _check(_lib.drun_all_to_all(self._handle, s.address, r.address, count, DTYPES[s.dtype],
                                    _timeout_ms(timeout)), "all_to_all")

    def barrier(self, timeout=None):
        _check(_lib.drun_barrier(self._handle, _timeout_ms(timeout)), "barrier")

    def destroy(self):
        """Orderly goodbye (destroy_process_group); groups first. Idempotent."""
        for g in self._groups:
            g.destroy()
        self._groups = []
        if self._handle:
            _lib.drun_comm_destroy(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __del__(self):
        if getattr(self, "_parent", None) is None and getattr(self, "_handle", None):
            self.destroy()


def init(backend="gloo", init_method="env://", rank=-1, world_size=-1, timeout=None):
    """init_process_group: env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), tcp://host:port
    or file:///path; rank / world_size -1 = from the environment; timeout in seconds or a
    timedelta (None: DRUN_COMM_TIMEOUT, default 300 s)."""
    lib = _load()
    out = ctypes.c_void_p()
    _check(lib.drun_comm_init(backend.encode(), init_method.encode(), rank, world_size,
                              _timeout_ms(timeout), ctypes.byref(out)), f"init({init_method})")
    return Communicator(out)
