"""@drun.torch.resilient: a training function that a peer's failure does not end.

    @drun.torch.resilient
    def train(state):          # drun.torch.State
        ...
    model = train()

Under `drun --recovery in-process` (DRUN_RECOVERY=in-process) the function is entered again after
each recovery: when an exception leaves it and the workers' store says a new generation began
(recovery.py: the watcher), the process group moves to that generation (re-formed in place for
"drun", re-created for "gloo" and "nccl"), the state goes back to its last commit and the function
runs again; the first track() brings every rank to the newest committed state. After a shrink
(a lost node that no spare replaced) the ranks are renumbered first: state.rank and
state.world_size are the new ones, and the callbacks given to state.on_resize(fn) run (fn(state,
old_world_size, new_world_size)) before the function is entered again. A grow (a node taken in)
is no failure: the step in progress ends, and after its state.commit() the function is entered
again in the larger world (the same hooks run; the newcomer receives the committed state). Any other exception
propagates. Under `--recovery restart`, or outside drun (one warning), the function runs once as
an ordinary function.
"""
import functools
import gc
import os
import sys
import warnings

from .state import GrowAtCommit, State


def _mode():
    return os.environ.get("DRUN_RECOVERY", "")


def _say(message):
    print(f"drun.torch: rank {os.environ.get('RANK', '?')}: {message}", file=sys.stderr, flush=True)


def resilient(fn):
    """Decorates fn(state, *args, **kwargs); the wrapper takes (*args, **kwargs)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if _mode() != "in-process":
            if "TORCHELASTIC_RUN_ID" not in os.environ:
                warnings.warn("drun.torch.resilient: not started by drun: "
                              f"{getattr(fn, '__qualname__', fn)} runs once, without recovery",
                              RuntimeWarning, stacklevel=2)
            return fn(State(), *args, **kwargs)
        from . import recovery
        coordinator = recovery.coordinator()
        state = State(generation=coordinator.generation, grow_due=coordinator.grow_due)
        coordinator.entered()
        while True:
            try:
                return fn(state, *args, **kwargs)
            except GrowAtCommit as e:
                _say(f"{e}; entering again in the larger world")
            except Exception as e:  # noqa: BLE001 (a recovery is told apart below)
                began = coordinator.began(e)
                if began is None:
                    raise
                _say(f"generation {began} began ({type(e).__name__}: {e}); "
                     f"going back to step {state._snapshot.step if state._snapshot else 0}")
            # Out of the except block: the exception, its traceback and the frames of the failed
            # entry (holding the old model, DDP's reducer, the old process group) are gone.
            gc.collect()
            resized = coordinator.rejoin()
            state._rewind()
            if resized is not None:
                _say(f"the world {'grew' if resized[1] > resized[0] else 'shrank'} in place from {resized[0]} to "
                     f"{resized[1]} ranks; this process is rank {os.environ.get('RANK')} now")
                state._resized(*resized)

    return run
