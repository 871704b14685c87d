"""drun.torch.State: what a resilient training function goes back to after a recovery.

    state.step                  the number of committed steps
    state.track(model=m, ...)   objects with state_dict()/load_state_dict(); loads the last
                                committed state into them (a replacement: the survivors')
    state.commit()              this step is done: step += 1, a snapshot in memory
    state.best = 0.3            plain values set on the state are committed (deep-copied) too
    state.rank, state.world_size    this rank and the world's size now (a shrink renumbers them)
    state.on_resize(fn)         fn(state, old_world_size, new_world_size) runs after a shrink or
                                a grow, before the function is entered again: re-shard the data
                                there

A grow (a node taken in while the job runs) is noticed by commit(): once the step is committed it
raises GrowAtCommit, which @drun.torch.resilient catches to enter the function again in the larger
world (nothing is redone: the commit just made is what it goes back to).

The snapshot lives in this process's memory (snapshot.py). After a recovery the first track()
(or commit()) of every rank runs one exchange over the default process group (transfer.py): the
lowest rank holding the highest committed step sends its snapshot to the ranks behind it (the
replacement, or a survivor whose last collective of the step failed before it committed).
Used by one thread: the one that runs the training function.
"""
import copy
import os

import torch.distributed as dist

from .snapshot import Snapshot
from . import transfer

_OWN = ("step",)  # public names that are not the program's plain values


class GrowAtCommit(Exception):
    """Raised by State.commit() after the commit when the world grew: resilient re-enters."""


def _trackable(obj):
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


class State:
    """The committed progress of one resilient function (see the module's doc)."""

    def __init__(self, generation=None, grow_due=None):
        # generation: a callable giving the generation this process is in (0: nothing to
        # exchange); grow_due: a callable saying whether the world grew since (a lock and a
        # comparison: the watcher thread did the store's part). None outside an in-process recovery.
        self._generation = generation
        self._grow_due = grow_due
        self._synced = 0
        self._tracked = {}
        self._snapshot = None
        self._on_resize = []
        self.step = 0

    @property
    def rank(self):
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return int(os.environ.get("RANK", "0"))

    @property
    def world_size(self):
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return int(os.environ.get("WORLD_SIZE", "1"))

    def on_resize(self, fn):
        """Registers fn(state, old_world_size, new_world_size), called after the world shrank in
        place (ranks renumbered; os.environ's RANK and WORLD_SIZE are the new ones). Returns fn."""
        if not callable(fn):
            raise TypeError(f"state.on_resize: {fn!r} is not callable")
        if fn not in self._on_resize:
            self._on_resize.append(fn)
        return fn

    def _resized(self, old_size, new_size):
        for fn in list(self._on_resize):
            fn(self, old_size, new_size)

    def track(self, **objects):
        """Tracks each name=object and loads the last committed state into it.

        Raises TypeError naming an object without state_dict()/load_state_dict(). An object first
        tracked before any commit counts as committed in its present state.
        """
        for name, obj in objects.items():
            if not _trackable(obj):
                raise TypeError(f"state.track: {name}={obj!r} (type {type(obj).__qualname__}) has no "
                                "state_dict()/load_state_dict(); track a torch.nn.Module, an "
                                "optimizer, or an object with both methods")
        self._exchange_if_due()
        if self._snapshot is None:
            self._snapshot = Snapshot(self.step)
            self._snapshot.capture_values(self._values())
        for name, obj in objects.items():
            self._tracked[name] = obj
            if self._snapshot.has(name):
                self._snapshot.load_into(name, obj)
            else:
                self._snapshot.capture(name, obj)

    def commit(self):
        """Ends a step: step += 1, and the tracked objects' state and the plain values become
        what a failure goes back to. Tensors are copied into buffers kept from the last commit."""
        self._exchange_if_due()
        snapshot = self._snapshot if self._snapshot is not None else Snapshot()
        for name, obj in self._tracked.items():
            snapshot.capture(name, obj)
        snapshot.capture_values(self._values())
        self.step += 1
        snapshot.step = self.step
        self._snapshot = snapshot
        if self._grow_due is not None and self._grow_due():
            raise GrowAtCommit(f"the world grew: step {self.step} committed")

    # What resilient does between a recovery and the function's next entry: back to the last
    # commit. The objects of the failed entry are dropped; the next entry tracks its own.
    def _rewind(self):
        self._tracked = {}
        self._restore_values()

    def _restore_values(self):
        for name in list(self._values()):
            del self.__dict__[name]
        if self._snapshot is None:
            self.step = 0
            return
        self.step = self._snapshot.step
        self.__dict__.update(copy.deepcopy(self._snapshot.values))

    def _values(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_") and k not in _OWN}

    def _exchange_if_due(self):
        generation = self._generation() if self._generation is not None else 0
        if generation == 0 or self._synced == generation:
            return
        self._synced = generation
        received = transfer.exchange(self._snapshot)
        if received is not None:
            self._snapshot = received
            self._restore_values()
            for name, obj in self._tracked.items():
                if received.has(name):
                    received.load_into(name, obj)

    def __repr__(self):
        return f"State(step={self.step}, tracked={sorted(self._tracked)}, values={sorted(self._values())})"
