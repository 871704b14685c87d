"""The process side of an in-process recovery (docs/recovery.md): which generation this process is
in, the watcher of `recovery/generation`, and moving the default process group to a new
generation.

The watcher is a thread of this module (one per process, started by the first resilient call,
stopped and joined at exit): it watches `recovery/generation` over a connection of its own and,
when a new generation begins, fails what the old group is waiting for at once: a gloo group's
sockets are shut down (abort_gloo), an nccl group is aborted where torch has an abort (torch 1.13
has none: its work ends at the group's timeout, NCCL_ASYNC_ERROR_HANDLING), a "drun" group needs
nothing (libdrun_comm's own watcher fails its operations). A store still waiting for the peers of
a superseded generation is abandoned.

Moving on (rejoin): "drun" re-forms the default group's communicator in place; gloo and nccl
destroy the default group and call init_process_group again with env://, which recovery's
rendezvous handler points at the workers' store under `torch/g<g>/`; each rank then sets
`recovery/<g>/joined/<rank>` before connecting and adds to `recovery/<g>/formed` once connected
(the rank whose add reaches the world size sets `recovery/<g>/outcome` = formed).

A shrink (docs/recovery.md "Elastic in place": a lost node's place that no spare took) renumbers
the survivors: `recovery/<g>/world` holds the ranks and node ranks of the generation before that
g keeps, in their new order. A grow (a node that arrived later, taken in) keeps every rank and
adds the newcomer's after them; it loses nobody, so the watcher aborts nothing for it and no
error is taken for it (began()): the resilient function moves to the larger world after its
next commit (grow_due(), state.commit()). Each init of a generation (rejoin, init_newest) first applies the
records up to it to os.environ (RANK, WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK,
ROLE_WORLD_SIZE), so gloo and nccl groups are re-created with the new rank and size. The "drun"
backend re-forms its communicator in place, renumbered; torch's group object keeps the rank and
size it was made with, so after a resize the communicator is handed to a new default group
(hand_over, _install_default_group).

A replacement joins the newest generation it knows of when its init_process_group asks for the
store (joining()), not the one it was started for: a generation that began while it started
(a second death during the recovery) supersedes its own, and one that begins while it connects
makes its init fail and run again for the newer one (drun.torch wraps init_process_group:
retrying_init). On "drun", the world group's
communicator forms the newest generation itself; torch's store-based barrier that ends
init_process_group is then passed at once (world_formed()): forming was the barrier, as every rank
of the world connected, and counting ranks in the store cannot be right when replacements of
several generations and survivors that never call init_process_group meet.
"""
import atexit
import datetime
import os
import threading
import time

import torch.distributed as dist

from . import _backend, worker_store

GENERATION_KEY = "recovery/generation"
# How long an exception waits for the generation to move before it counts as not a recovery: a
# peer's death reaches a collective through its sockets at once, the agent's compareSet follows.
RECOVERY_GRACE = datetime.timedelta(seconds=10)
# A watch's slice: the watcher ends within it after close().
_WATCH_SLICE = datetime.timedelta(seconds=5)
# Re-forming the "drun" group: the deadline when the group's own timeout is not known.
_REFORM_TIMEOUT = datetime.timedelta(seconds=300)
# Inits in a row that newer generations may supersede before one forms (each a death meanwhile,
# so the job's restart budget ends it first).
_MAX_SUPERSEDED = 64
# torch's own init_process_group (drun.torch wraps the module's under --recovery in-process).
_ORIGINAL_INIT = dist.init_process_group


def retrying_init(*args, **kwargs):
    """torch.distributed.init_process_group under --recovery in-process: a replacement's init
    that a newer generation superseded while it connected is made again for the newest one
    (Coordinator.init_newest), as a survivor's rejoin() does."""
    return coordinator().init_newest(_ORIGINAL_INIT, *args, **kwargs)


def parse_world(value):
    """recovery/<g>/world: "<ranks>\t<node ranks>", each a comma-separated list of the ranks
    (node ranks) kept, then for a grow "\t<ranks added>\t<nodes added>". Returns (ranks, node
    ranks, ranks added, nodes added); ValueError naming the value for anything else."""
    bad = ValueError(f"drun.torch: a recovery world record holds {value!r}, not what drun writes")
    fields = value.split("\t")
    if len(fields) not in (2, 4):
        raise bad
    try:
        kept = [int(r) for r in fields[0].split(",")], [int(n) for n in fields[1].split(",")]
        added = (int(fields[2]), int(fields[3])) if len(fields) == 4 else (0, 0)
    except ValueError:
        raise bad from None
    for listed in kept:
        if any(x < 0 for x in listed) or len(set(listed)) != len(listed):
            raise bad
    if len(fields) == 4 and min(added) < 1:
        raise bad
    return kept[0], kept[1], added[0], added[1]


def is_grow(store, generation):
    """Whether `generation` is a grow: a world record that adds ranks and no rank lost."""
    try:
        world = store.try_get(f"recovery/{generation}/world")
        if world is None or store.try_get(f"recovery/{generation}/lost_ranks") is not None:
            return False
        return parse_world(world.decode() if isinstance(world, bytes) else world)[2] > 0
    except ValueError:
        return False


def renumber_environment(store, from_generation, to_generation, environ=os.environ):
    """Applies the shrinks and grows in (from, to] to `environ`'s ranks and sizes. Returns (size
    before, size after) when the world changed, else None; RuntimeError when a shrink dropped this
    rank."""
    before = int(environ.get("WORLD_SIZE", "1"))
    changed = False
    for g in range(from_generation + 1, to_generation + 1):
        value = store.try_get(f"recovery/{g}/world")
        if value is None:
            continue
        ranks, nodes, added_ranks, added_nodes = parse_world(value.decode() if isinstance(value, bytes) else value)
        rank, node = int(environ.get("RANK", "0")), int(environ.get("GROUP_RANK", "0"))
        if rank not in ranks or node not in nodes:
            raise RuntimeError(f"drun.torch: generation {g} shrank the world without rank {rank}")
        environ["RANK"] = environ["ROLE_RANK"] = str(ranks.index(rank))
        environ["WORLD_SIZE"] = environ["ROLE_WORLD_SIZE"] = str(len(ranks) + added_ranks)
        environ["GROUP_RANK"] = str(nodes.index(node))
        environ["GROUP_WORLD_SIZE"] = str(len(nodes) + added_nodes)
        changed = True
    return (before, int(environ["WORLD_SIZE"])) if changed else None


def _parse_generation(value):
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0  # not a generation: nothing began


def _install_default_group(old, new):
    """Makes `new` torch's default group in place of `old` (a drun group resized in place: torch
    1.13's groups keep their rank and size, so the communicator moved to a new one). torch has
    no public call for it: its registry (distributed_c10d's maps) is updated as
    init_process_group fills it."""
    c10d = dist.distributed_c10d
    backend, store = c10d._pg_map.pop(old)
    name = c10d._pg_names.pop(old, "0")
    c10d._pg_group_ranks.pop(old, None)
    c10d._pg_map[new] = (backend, store)
    c10d._pg_names[new] = name
    c10d._pg_group_ranks[new] = {i: i for i in range(new.size())}
    c10d._update_default_pg(new)
    from . import _groups  # the exit hook stops its queue too
    _groups.add(new)


class Coordinator:
    """One per process: see the module's doc."""

    def __init__(self):
        self._generation = int(os.environ.get(worker_store.GENERATION, "0") or "0")
        self._numbered = self._generation  # the generation os.environ's ranks and sizes are of
        self._pg_timeout = dist.constants.default_pg_timeout
        self._lock = threading.Condition()
        self._newest = self._generation
        self._last_loss = 0  # the newest generation that is not a grow (a grow loses nobody)
        self._torch_stores = []  # (generation, WorkerStore) handed to torch's env://
        self._init_store = None  # the last of them, until a "drun" world group is formed over it
        self._formed = set()
        self._stopping = False
        self._root = worker_store.connect("")
        self._watch_store = worker_store.connect("")
        known = self._watch_store.try_get(GENERATION_KEY)
        self._newest = max(self._newest, _parse_generation(known))
        if self._newest > self._generation and not is_grow(self._watch_store, self._newest):
            self._last_loss = self._newest
        self._thread = threading.Thread(target=self._watch, args=(known,),
                                        name="drun-generation-watcher", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def generation(self):
        """The generation this process is in (its group was formed for it)."""
        return self._generation

    def joining(self):
        """The generation a group made now joins (torch's env:// asks): the newest known."""
        with self._lock:
            self._generation = max(self._generation, self._newest)
            return self._generation

    def world_formed(self, generation, size):
        """A "drun" default group was formed for `generation` (init_process_group, in _create):
        this process is in it, and torch's store-based barrier after it passes at once (the
        module's doc says why) on the store torch's env:// was handed for this init."""
        with self._lock:
            self._generation = generation
            store, self._init_store = self._init_store, None
        c10d = dist.distributed_c10d
        count = getattr(c10d, "_group_count", None)  # the default group's, counted already
        if store is not None and count is not None:
            store.settle(f"default_pg/{c10d.STORE_BASED_BARRIER_PREFIX}:{count}", size)

    def newest(self):
        with self._lock:
            return self._newest

    def grow_due(self):
        """Whether the world grew since this process's generation and nothing was lost: the
        resilient function moves to the larger world at its next commit (state.commit)."""
        with self._lock:
            return self._newest > self._generation and self._last_loss <= self._generation

    # torch's env:// handler hands out a store for this process's generation.
    def on_torch_store(self, store, generation, rank, timeout):
        self._pg_timeout = timeout
        with self._lock:
            self._torch_stores = [(g, s) for g, s in self._torch_stores if g >= generation]
            self._torch_stores.append((generation, store))
            self._init_store = store
            newest = self._newest  # a generation the watcher saw begin before this store was listed
        if newest > generation:
            store.abandon(f"generation {newest} began")
        if generation > 0:
            self._root.set(f"recovery/{generation}/joined/{rank}", worker_store.joined_value())

    def entered(self):
        """resilient calls this as the function is first entered: a replacement's gloo/nccl group
        is connected by now (the program made it), so its rank counts as formed."""
        if self._generation > 0 and dist.is_initialized() and dist.get_backend() != "drun":
            self._mark_formed(self._generation)

    def began(self, error):
        """The generation that began if `error` came from a recovery, else None (waits up to
        RECOVERY_GRACE for the generation to move: a collective may fail first)."""
        if not isinstance(error, RuntimeError):
            return None
        deadline = time.monotonic() + RECOVERY_GRACE.total_seconds()
        with self._lock:
            # A grow explains no error (it loses nobody): only a generation that lost ranks does.
            while self._last_loss <= self._generation and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
            return self._newest if self._last_loss > self._generation else None

    def _renumber(self, generation):
        """os.environ's ranks and sizes become those of `generation` (the shrinks up to it)."""
        if generation > self._numbered:
            renumber_environment(self._root, self._numbered, generation)
            self._numbered = generation

    def rejoin(self):
        """Moves the default process group to the newest generation (see the module's doc).
        Returns (world size before, after) when a shrink changed the world, else None."""
        before = int(os.environ.get("WORLD_SIZE", "1"))
        if not dist.is_initialized():
            self._generation = self.newest()
            self._renumber(self._generation)
        elif dist.get_backend() == "drun":
            group = dist.distributed_c10d._get_default_group()
            self._generation = _backend.reform(group, self._pg_timeout or _REFORM_TIMEOUT)
            self._renumber(self._generation)
            if dist.get_world_size() != int(os.environ["WORLD_SIZE"]):
                _install_default_group(group, _backend.hand_over(group))
        else:
            backend = dist.get_backend()
            dist.destroy_process_group()
            self.init_newest(_ORIGINAL_INIT, backend, init_method="env://", timeout=self._pg_timeout)
            self._mark_formed(self._generation)
        after = int(os.environ.get("WORLD_SIZE", "1"))
        return (before, after) if after != before else None

    def init_newest(self, init, *args, **kwargs):
        """Runs torch's init_process_group `init` until it forms the newest generation: an init
        that a newer generation superseded while it connected (its store abandoned, a peer gone)
        is made again for the newer one (env:// asks joining(): the newest)."""
        for _ in range(_MAX_SUPERSEDED):
            tried = self.joining()
            self._renumber(tried)  # env:// reads RANK and WORLD_SIZE
            try:
                return init(*args, **kwargs)
            except RuntimeError:
                if self.newest() <= tried:
                    raise
                if dist.is_initialized():
                    dist.destroy_process_group()
                # The failed init counted a group (its name, its barrier key: "0", ":1" for
                # the default group); the other ranks' init of the newer one counts from 0, as
                # after destroy_process_group.
                dist.distributed_c10d._group_count = 0
        raise RuntimeError(f"drun.torch: init_process_group was superseded {_MAX_SUPERSEDED} times "
                           "in a row by new generations")

    def _mark_formed(self, generation):
        if generation in self._formed:
            return
        self._formed.add(generation)
        count = self._root.add(f"recovery/{generation}/formed", 1)
        if count == dist.get_world_size():
            self._root.compare_set(f"recovery/{generation}/outcome", "", "formed")

    def _watch(self, known):
        while True:
            try:
                value = self._watch_store.watch(GENERATION_KEY, known, _WATCH_SLICE)
            except Exception as e:  # noqa: BLE001 (the connection ended: closed, or the store lost)
                with self._lock:
                    if not self._stopping:
                        print(f"drun.torch: the generation watcher stopped: {e}", flush=True)
                    self._stopping = True
                    self._lock.notify_all()
                return
            if value == known:
                continue
            known = value
            generation = _parse_generation(value)
            with self._lock:
                if generation <= self._newest:
                    continue
                since = self._newest
            grow = all(is_grow(self._watch_store, g) for g in range(since + 1, generation + 1))
            with self._lock:
                if generation <= self._newest:
                    continue
                self._newest = generation
                if not grow:
                    self._last_loss = generation
                superseded = [s for g, s in self._torch_stores if g < generation]
                self._lock.notify_all()
            for store in superseded:
                store.abandon(f"generation {generation} began")
            if not grow:  # a grow aborts nothing: the program moves at its next commit
                self._abort_group(generation)

    def _abort_group(self, generation):
        if not dist.is_initialized():
            return
        try:
            group = dist.distributed_c10d._get_default_group()
            backend = dist.get_backend()
        except RuntimeError:
            return  # destroyed meanwhile
        if backend == "gloo":
            _backend.abort_gloo(group)
        elif backend == "nccl" and hasattr(group, "abort"):
            group.abort()

    def close(self):
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._watch_store.interrupt()
        self._thread.join(timeout=_WATCH_SLICE.total_seconds() + 1)


_coordinator = None
_coordinator_lock = threading.Lock()


def coordinator():
    """This process's Coordinator (made on first use; needs DRUN_WORKER_STORE)."""
    global _coordinator
    with _coordinator_lock:
        if _coordinator is None:
            if not worker_store.configured():
                raise RuntimeError("drun.torch: DRUN_RECOVERY=in-process without DRUN_WORKER_STORE: "
                                   "start the program with drun --recovery in-process")
            _coordinator = Coordinator()
        return _coordinator
