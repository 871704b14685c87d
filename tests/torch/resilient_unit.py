#!/usr/bin/python3
"""drun.torch.State and @drun.torch.resilient outside drun, in one process (no process group):

- a resilient function runs once, as an ordinary function, with exactly one warning;
- state.track(x=<no state_dict>) raises TypeError naming x and its type;
- commit()/track() of a model, an optimizer with state (momentum) and plain values: after more
  steps, going back (what a recovery does) restores the committed parameters, optimizer state,
  step and values into new objects; a commit reuses its buffers (no allocation);
- a snapshot survives encode()/decode() (the bytes a replacement receives);
- a shrink's world records renumber RANK, WORLD_SIZE, GROUP_RANK, ... in the environment, a
  grow's make the sizes larger and keep the ranks, a record that is not drun's is refused naming
  it, a rank a shrink dropped is told so, state.on_resize callbacks run with the old and new
  sizes, and commit() raises GrowAtCommit after committing once the world grew.

Prints `RESILIENT_UNIT ok checks=N` or exits non-zero naming what failed.
"""
import copy
import os
import sys
import warnings

import torch
import torch.nn as nn

import drun.torch
from drun.torch.snapshot import Snapshot
from resilient_train import ToyModel  # pytorch/examples' DDP tutorial model

checks = 0


def check(condition, what):
    global checks
    if not condition:
        sys.exit(f"RESILIENT_UNIT failed: {what}")
    checks += 1


def make():
    torch.manual_seed(0)
    model = ToyModel()
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def step(model, opt, n):
    g = torch.Generator().manual_seed(n)
    opt.zero_grad()
    loss = ((model(torch.randn(20, 10, generator=g)) - torch.randn(20, 5, generator=g)) ** 2).mean()
    loss.backward()
    opt.step()


def params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def runs_once_with_one_warning():
    for name in ("DRUN_RECOVERY", "TORCHELASTIC_RUN_ID"):
        os.environ.pop(name, None)
    calls = []

    @drun.torch.resilient
    def train(state, x, y=0):
        calls.append((x, y))
        check(isinstance(state, drun.torch.State), "the function gets a State")
        check(state.step == 0 and state.rank == 0 and state.world_size == 1, f"a fresh state: {state}")
        return x + y

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(2, y=3)
    check(result == 5 and calls == [(2, 3)], f"ran once with its arguments: {calls} -> {result}")
    mine = [w for w in caught if "drun.torch.resilient" in str(w.message)]
    check(len(mine) == 1, f"one warning outside drun, got {[str(w.message) for w in caught]}")
    check("runs once" in str(mine[0].message), f"the warning says what happens: {mine[0].message}")
    # Started by drun under --recovery restart: no warning.
    os.environ["TORCHELASTIC_RUN_ID"] = "unit"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(1)
    check(not [w for w in caught if "drun.torch.resilient" in str(w.message)],
          "no warning under drun --recovery restart")
    del os.environ["TORCHELASTIC_RUN_ID"]


def track_refuses_what_has_no_state_dict():
    state = drun.torch.State()

    class Plain:
        pass

    try:
        state.track(model=nn.Linear(2, 2), counter=Plain())
    except TypeError as e:
        check("counter" in str(e) and "Plain" in str(e), f"the TypeError names the object and its type: {e}")
    else:
        check(False, "track() of an object without state_dict() raised nothing")
    check(state._tracked == {}, "nothing was tracked from a refused call")


def commit_and_go_back():
    model, opt = make()
    state = drun.torch.State()
    state.best = 1.0
    state.history = []
    state.track(model=model, optimizer=opt)
    for n in range(3):
        step(model, opt, n)
        state.history.append(n)
        state.best = float(n)
        state.commit()
    check(state.step == 3, f"three commits: step {state.step}")
    committed = params(model).clone()
    committed_momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    buffers = [b.data_ptr() for e in state._snapshot.entries.values() for b in e.buffers]
    for n in range(3, 5):  # steps after the commit, then a failure
        step(model, opt, n)
        state.history.append(n)
        state.best = -1.0
    state.extra = "set after the commit"
    state._rewind()
    check(state.step == 3, f"back to the committed step: {state.step}")
    check(state.history == [0, 1, 2] and state.best == 2.0, f"plain values back: {state}")
    check(not hasattr(state, "extra"), "a value set after the commit is gone")
    model2, opt2 = make()
    state.track(model=model2, optimizer=opt2)
    check(torch.equal(params(model2), committed), "the new model holds the committed parameters")
    check(all(torch.equal(opt2.state[p]["momentum_buffer"], m)
              for p, m in zip(model2.parameters(), committed_momentum)),
          "the new optimizer holds the committed momentum")
    # Going on from the restored state gives what the uninterrupted run gives.
    reference, ref_opt = make()
    for n in range(5):
        step(reference, ref_opt, n)
    for n in range(3, 5):
        step(model2, opt2, n)
        state.commit()
    check(torch.equal(params(model2), params(reference)), "steps redone from the commit match")
    again = [b.data_ptr() for e in state._snapshot.entries.values() for b in e.buffers]
    check(again == buffers, "commits reuse their buffers")
    # What was restored is a copy: training on does not change the snapshot.
    snap = params(model2).clone()
    step(model2, opt2, 9)
    state._rewind()
    model3, opt3 = make()
    state.track(model=model3, optimizer=opt3)
    check(torch.equal(params(model3), snap), "the snapshot did not follow the model after a restore")
    return state


def encode_decode(state):
    data = state._snapshot.encode()
    back = Snapshot.decode(data)
    check(back.step == state.step and back.values == state._snapshot.values, "step and values decode")
    model, opt = make()
    back.load_into("model", model)
    back.load_into("optimizer", opt)
    mine, _ = make()
    state._snapshot.load_into("model", mine)
    check(torch.equal(params(model), params(mine)), "decoded parameters equal the snapshot's")
    try:
        Snapshot.decode(data[: len(data) // 2])
    except ValueError as e:
        check("unreadable" in str(e), f"a truncated snapshot is named: {e}")
    else:
        check(False, "a truncated snapshot decoded")


class Records:
    """The workers' store's recovery/<g>/world keys (the store's try_get)."""

    def __init__(self, worlds):
        self.worlds = worlds

    def try_get(self, key):
        for g, value in self.worlds.items():
            if key == f"recovery/{g}/world":
                return value.encode()
        return None


def shrink_renumbers_the_environment():
    from drun.torch import recovery
    env = {"RANK": "5", "WORLD_SIZE": "6", "ROLE_RANK": "5", "ROLE_WORLD_SIZE": "6", "GROUP_RANK": "2",
           "GROUP_WORLD_SIZE": "3"}
    # Generation 2 drops node 1 (ranks 2, 3); 3 is a replacement (no record); 4 drops node 0.
    store = Records({2: "0,1,4,5\t0,2", 4: "2,3\t1"})
    check(recovery.renumber_environment(store, 0, 1, env) is None, "no shrink: nothing changes")
    check(recovery.renumber_environment(store, 0, 3, env) == (6, 4), "generation 2 shrinks 6 to 4")
    check(env["RANK"] == "3" and env["ROLE_RANK"] == "3" and env["WORLD_SIZE"] == "4" and
          env["GROUP_RANK"] == "1" and env["GROUP_WORLD_SIZE"] == "2", f"renumbered densely: {env}")
    check(recovery.renumber_environment(store, 3, 4, env) == (4, 2), "generation 4 shrinks 4 to 2")
    check(env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "0", f"again: {env}")
    dropped = {"RANK": "0", "WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2"}
    try:
        recovery.renumber_environment(Records({1: "1\t1"}), 0, 1, dropped)
        check(False, "a dropped rank was renumbered")
    except RuntimeError as e:
        check("without rank 0" in str(e), f"a dropped rank is told: {e}")
    # A grow keeps every rank and adds two ranks on one node after them.
    grown = {"RANK": "3", "WORLD_SIZE": "4", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4", "GROUP_RANK": "1",
             "GROUP_WORLD_SIZE": "2"}
    check(recovery.renumber_environment(Records({5: "0,1,2,3\t0,1\t2\t1"}), 4, 5, grown) == (4, 6),
          "generation 5 grows 4 to 6")
    check(grown["RANK"] == "3" and grown["WORLD_SIZE"] == "6" and grown["ROLE_WORLD_SIZE"] == "6" and
          grown["GROUP_RANK"] == "1" and grown["GROUP_WORLD_SIZE"] == "3", f"grown, ranks kept: {grown}")
    check(recovery.is_grow(Records({5: "0,1,2,3\t0,1\t2\t1"}), 5), "a grow's record is a grow")
    check(not recovery.is_grow(Records({2: "0,1,4,5\t0,2"}), 2), "a shrink's is not")
    for bad in ("0,1", "0,0\t0", "a\t0", "0,-1\t0", "0\t0\t1", "0\t0\t0\t1", "0\t0\t1\t0", "0\t0\tx\t1"):
        try:
            recovery.parse_world(bad)
            check(False, f"{bad!r} parsed")
        except ValueError as e:
            check("not what drun writes" in str(e), f"{bad!r} refused: {e}")
    state = drun.torch.State()
    heard = []
    state.on_resize(lambda s, old, new: heard.append((old, new)))
    state._resized(6, 4)
    check(heard == [(6, 4)], f"on_resize ran with the sizes: {heard}")
    try:
        state.on_resize(3)
        check(False, "on_resize took a non-callable")
    except TypeError:
        check(True, "")
    # A grow is noticed at commit(), after the step is committed.
    from drun.torch.state import GrowAtCommit
    due = [False]
    growing = drun.torch.State(grow_due=lambda: due[0])
    growing.commit()
    due[0] = True
    try:
        growing.commit()
        check(False, "commit() did not notice the grow")
    except GrowAtCommit:
        check(growing.step == 2 and growing._snapshot.step == 2, f"the step is committed first: {growing}")


runs_once_with_one_warning()
track_refuses_what_has_no_state_dict()
shrink_renumbers_the_environment()
encode_decode(commit_and_go_back())
print(f"RESILIENT_UNIT ok checks={checks}", flush=True)
