"""drun.torch: torch.distributed's backend "drun", on libdrun_comm (shared memory within a host,
Gloo across hosts). Importing this module registers it; then one word changes:

    import torch.distributed as dist
    import drun.torch
    dist.init_process_group("drun", init_method="env://")   # or tcp://, file://, store=...
    dist.all_reduce(tensor)

In-process recovery (`drun --recovery in-process`, docs/recovery.md): `@drun.torch.resilient` and
`drun.torch.State` (resilient.py, state.py). With DRUN_WORKER_STORE set, importing this module
makes torch's env:// rendezvous use the workers' store (worker_store.py), so that rank 0's death
does not take the store along.

CPU tensors of float32/64, float16, bfloat16, int8, uint8, int32, int64 and bool (contiguous or
not); reduce ops SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR; new_group; timeouts from
init_process_group's `timeout`; drun's errors as RuntimeError (a dead peer named). CUDA tensors
raise a clear error (use "nccl" for them).
"""
import torch.distributed as _dist  # registers the Store / ProcessGroup types _backend uses

try:
    from . import _backend
except ImportError as e:  # the build found no libtorch-dev / pybind11-dev / python3-dev
    raise ImportError(f"drun.torch: the compiled backend is missing or unloadable ({e}); build "
                      "drun with libtorch-dev, pybind11-dev and python3-dev installed") from e

import atexit as _atexit
import os as _os
import weakref as _weakref

from .resilient import resilient
from .state import State

BACKEND = "drun"


def _in_process():
    return _os.environ.get("DRUN_RECOVERY") == "in-process" and bool(_os.environ.get("DRUN_WORKER_STORE"))


# Every drun group alive, for the exit hook below.
_groups = _weakref.WeakSet()


def _create(store, rank, size, timeout):
    if _in_process() and _dist.GroupMember.WORLD is None:  # the default group being made
        from . import recovery
        group = _backend.create_world_process_group(rank, size, timeout)
        recovery.coordinator().world_formed(_backend.generation(group), size)
    else:
        group = _backend.create_process_group(store, rank, size, timeout)
    _groups.add(group)
    return group


@_atexit.register
def _stop_queues():
    # A program that ends without destroy_process_group leaves its groups to the interpreter's
    # finalization; a group's queue thread completing a Future then would take the GIL as
    # Python ends threads, and the process would abort. Their threads end here, before that.
    for group in list(_groups):
        try:
            _backend.stop_queue(group)
        except Exception:  # the process is exiting: nothing to report to
            pass


def transport(group=None):
    """How the ranks of a drun process group talk: 'shm', 'tcp' or 'hierarchical'."""
    return _backend.transport(group if group is not None else _dist.distributed_c10d._get_default_group())


if not hasattr(_dist.Backend, BACKEND.upper()):  # importing twice (reload) registers once
    _dist.Backend.register_backend(BACKEND, _create)


def _install_env_rendezvous():
    from . import worker_store
    if _in_process():
        from . import recovery
        handler = worker_store.EnvRendezvous(lambda: recovery.coordinator().joining(),
                                             lambda *a: recovery.coordinator().on_torch_store(*a))
    else:
        generation = int(_os.environ.get(worker_store.GENERATION, "0") or "0")
        handler = worker_store.EnvRendezvous(lambda: generation, lambda *a: None)
    worker_store.install_env_rendezvous(handler)


if _os.environ.get("DRUN_WORKER_STORE"):
    _install_env_rendezvous()
if _in_process() and _dist.init_process_group.__module__ == "torch.distributed.distributed_c10d":
    from . import recovery as _recovery
    _dist.init_process_group = _recovery.retrying_init  # a program calls it as dist.init_process_group
