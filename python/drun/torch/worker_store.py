"""The workers' store (docs/recovery.md) from Python: drun's store, served by the agent or the
rendezvous store, that outlives every rank. DRUN_WORKER_STORE is its host:port,
DRUN_WORKER_STORE_PREFIX the round's key prefix P, DRUN_RDZV_TOKEN_FILE its secret.

connect(prefix) gives a torch Store (drun.torch._backend.WorkerStore) whose keys live under
P + prefix. install_env_rendezvous() makes torch's env:// use it, as torchrun's
TORCHELASTIC_USE_AGENT_STORE does: init_process_group(..., init_method="env://") then gets the
workers' store under P + "torch/g<g>/", g being the generation this process is in, so the group
of each generation has keys of its own and rank 0's death does not take the store along.
"""
import datetime
import importlib
import os
import socket
from urllib.parse import parse_qsl, urlparse

from torch.distributed.constants import default_pg_timeout

from . import _backend

ENDPOINT = "DRUN_WORKER_STORE"
PREFIX = "DRUN_WORKER_STORE_PREFIX"
GENERATION = "DRUN_GENERATION"
TOKEN_FILE = "DRUN_RDZV_TOKEN_FILE"


def configured():
    return bool(os.environ.get(ENDPOINT))


def endpoint():
    """(host, port) of DRUN_WORKER_STORE: host:port or [v6]:port; ValueError naming it."""
    text = os.environ.get(ENDPOINT, "")
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"drun.torch: {ENDPOINT}={text!r} is not host:port")
    return host, int(port)


def _token():
    path = os.environ.get(TOKEN_FILE)
    if not path:
        return ""
    with open(path, "rb") as f:
        token = f.read().decode()
    return token[:-1] if token.endswith("\n") else token


def connect(prefix="", timeout=datetime.timedelta(seconds=300)):
    """A new connection to the workers' store, its keys under P + prefix."""
    host, port = endpoint()
    return _backend.WorkerStore(host, port, os.environ.get(PREFIX, "") + prefix, _token(), timeout)


def joined_value():
    """What a rank entering a generation writes under recovery/<g>/joined/<rank>."""
    return f"{socket.gethostname()} pid {os.getpid()}"


class EnvRendezvous:
    """torch's "env" rendezvous handler over the workers' store. `generation` gives the
    generation this process is in; `on_store(store, generation, rank, timeout)` hears of each
    store handed out (recovery.py abandons a superseded generation's store, marks joined)."""

    def __init__(self, generation, on_store):
        self._generation = generation
        self._on_store = on_store

    def __call__(self, url, timeout=default_pg_timeout, **kwargs):
        query = dict(parse_qsl(urlparse(url).query))
        rank = int(query.get("rank", os.environ.get("RANK", "-1")))
        size = int(query.get("world_size", os.environ.get("WORLD_SIZE", "-1")))
        if rank < 0 or size < 1:
            raise ValueError("drun.torch: env:// rendezvous: RANK and WORLD_SIZE must be set")
        generation = self._generation()
        store = connect(f"torch/g{generation}/", timeout)
        self._on_store(store, generation, rank, timeout)
        yield (store, rank, size)
        raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def install_env_rendezvous(handler):
    """Replaces torch's "env" handler (register_rendezvous_handler refuses a second one)."""
    # The module, not torch.distributed's function of the same name.
    module = importlib.import_module("torch.distributed.rendezvous")
    module._rendezvous_handlers["env"] = handler
