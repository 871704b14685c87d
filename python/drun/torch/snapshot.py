"""A committed step in memory: what drun.torch.State goes back to after a recovery and sends to a
replacement process.

Each tracked object's state_dict() is split into its tensors and the rest (its skeleton: the
dicts, lists and plain values, with a _Slot where a tensor was). The tensors are copied into
buffers allocated once and reused while their shapes, dtypes and devices stay the same (a commit
of a model and its optimizer allocates nothing); the skeleton and the program's plain values are
deep-copied. Loading rebuilds each state_dict with copies of the buffers, so an object that keeps
what it is given never aliases the snapshot.

encode()/decode() turn a snapshot into bytes and back (torch.save / torch.load over memory, no
file) for the broadcast to a replacement. Not thread-safe: the training thread owns its snapshot.
"""
import collections
import copy
import io

import torch


class _Slot:
    """Where the tensor with this index stood in a state_dict."""
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __reduce__(self):
        return (_Slot, (self.index,))


def _split(value, tensors):
    """The skeleton of `value`; its tensors appended to `tensors` in traversal order."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, dict):
        out = type(value)() if type(value) in (dict, collections.OrderedDict) else {}
        for k, v in value.items():
            out[k] = _split(v, tensors)
        metadata = getattr(value, "_metadata", None)  # nn.Module's versions of its submodules
        if metadata is not None:
            out._metadata = copy.deepcopy(metadata)
        return out
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        items = [_split(v, tensors) for v in value]
        return items if type(value) is list else tuple(items)
    return copy.deepcopy(value)


def _join(skeleton, tensors):
    """The state_dict `skeleton` stands for, with copies of `tensors` in its slots."""
    if isinstance(skeleton, _Slot):
        return tensors[skeleton.index].clone()
    if isinstance(skeleton, dict):
        out = type(skeleton)() if type(skeleton) in (dict, collections.OrderedDict) else {}
        for k, v in skeleton.items():
            out[k] = _join(v, tensors)
        metadata = getattr(skeleton, "_metadata", None)
        if metadata is not None:
            out._metadata = copy.deepcopy(metadata)
        return out
    if type(skeleton) in (list, tuple):
        items = [_join(v, tensors) for v in skeleton]
        return items if type(skeleton) is list else tuple(items)
    return copy.deepcopy(skeleton)


def _same_layout(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


class _Entry:
    """One tracked object's committed state: its skeleton and its tensors' buffers."""
    __slots__ = ("skeleton", "buffers")

    def __init__(self):
        self.skeleton = None
        self.buffers = []

    def capture(self, state_dict):
        tensors = []
        skeleton = _split(state_dict, tensors)
        reuse = len(tensors) == len(self.buffers) and all(
            _same_layout(t, b) for t, b in zip(tensors, self.buffers))
        with torch.no_grad():
            if reuse:
                for buffer, t in zip(self.buffers, tensors):
                    buffer.copy_(t)
            else:
                self.buffers = [t.detach().clone() for t in tensors]
        self.skeleton = skeleton

    def state_dict(self):
        return _join(self.skeleton, self.buffers)


class Snapshot:
    """The committed step: its number, each tracked object's state, the program's plain values."""

    def __init__(self, step=0):
        self.step = step
        self.entries = {}  # name -> _Entry
        self.values = {}   # name -> deep copy of the value the program set on its State

    def capture(self, name, obj):
        self.entries.setdefault(name, _Entry()).capture(obj.state_dict())

    def has(self, name):
        return name in self.entries

    def load_into(self, name, obj):
        obj.load_state_dict(self.entries[name].state_dict())

    def capture_values(self, values):
        self.values = copy.deepcopy(values)

    def encode(self):
        """The snapshot as bytes (torch.save over memory)."""
        payload = {
            "step": self.step,
            "values": self.values,
            "entries": {n: (e.skeleton, e.buffers) for n, e in self.entries.items()},
        }
        out = io.BytesIO()
        torch.save(payload, out)
        return out.getvalue()

    @staticmethod
    def decode(data):
        """The snapshot encode() made; raises ValueError when the bytes are not one."""
        try:
            payload = torch.load(io.BytesIO(data), map_location="cpu")
            snapshot = Snapshot(int(payload["step"]))
            snapshot.values = payload["values"]
            for name, (skeleton, buffers) in payload["entries"].items():
                entry = _Entry()
                entry.skeleton, entry.buffers = skeleton, list(buffers)
                snapshot.entries[name] = entry
        except Exception as e:  # a truncated or foreign payload: say what it was
            raise ValueError(f"drun.torch: a received snapshot of {len(data)} bytes is unreadable "
                             f"({type(e).__name__}: {e})") from e
        return snapshot
