"""Values of the wire protocol, both ways (``protocol.py`` holds the schema, the framing and the checks).

``Codec`` turns Python values into the schema's values and back: tensors as raw bytes beside the
JSON header, an object that is not data as a handle that stays on the side that sent it, and (driver
to runner only) the types of the student library rebuilt from their fields. The runner and the
driver each make one: the runner keeps what it sends as handles (``keep``), the driver turns a
received handle into a proxy (``make_handle``). Like ``protocol.py`` it enters the sandbox, bound as
``/sandbox/codec.py``, and imports nothing of the tooling.
"""

import math

if __package__:  # the trusted side: mlbook_tools.inside.codec
    from . import protocol
else:  # the sandbox: a plain script beside /sandbox/protocol.py
    import protocol


class Codec:
    """Encode/decode values of the schema. ``keep`` stores an object that is not data and returns its handle
    (runner side); ``make_handle`` turns a received handle into a local proxy (driver side)."""

    def __init__(self, keep=None, make_handle=None, rebuild=False):
        import torch

        self.torch = torch
        self.dtypes = {name: getattr(torch, name) for name in protocol.DTYPES}
        self.names = {v: k for k, v in self.dtypes.items()}
        self.keep, self.make_handle, self.rebuild = keep, make_handle, rebuild

    # -------------------------------------------------------------- out
    def tensor_out(self, t, blobs, leaves=None):
        torch = self.torch
        src = t
        t = torch.Tensor.detach(t).cpu()
        t = torch.Tensor.contiguous(torch.Tensor.as_subclass(t, torch.Tensor))
        if t.dtype not in self.names:
            t = t.to(torch.float64)
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        meta = {"dtype": self.names[t.dtype], "shape": list(t.shape), "nbytes": len(raw)}
        if leaves is not None and src.requires_grad:
            meta["requires_grad"] = True
            leaves.append(src)
        blobs.append((meta, raw))
        return {protocol.TENSOR: len(blobs) - 1}

    def encode(self, x, blobs, leaves=None, depth=0):
        """Any Python value -> a schema value. ``leaves`` (driver side) collects tensors that require grad."""
        torch = self.torch
        if depth > protocol.MAX_VALUE_DEPTH:
            raise ValueError("a value nested too deeply")
        if isinstance(x, torch.Tensor):
            return self.tensor_out(x, blobs, leaves)
        if type(x) is bool or x is None or type(x) is str:
            return x
        if type(x) is int:
            return x if abs(x) < 2**53 else float(x)
        if type(x) is float:
            return x if math.isfinite(x) else {protocol.FLOAT: str(x)}
        if type(x) is list:
            return [self.encode(v, blobs, leaves, depth + 1) for v in x[:100000]]
        if type(x) is tuple:
            return {protocol.TUPLE: [self.encode(v, blobs, leaves, depth + 1) for v in x[:100000]]}
        if type(x) is dict and all(type(k) is str for k in x):
            return {
                protocol.DICT: [
                    [k, self.encode(v, blobs, leaves, depth + 1)]
                    for k, v in list(x.items())[:10000]
                ]
            }
        if self.keep is None:  # the driver: only data and rebuildable library types go out
            return self._encode_rebuildable(x, blobs, leaves, depth)
        if isinstance(
            x, tuple
        ):  # NamedTuple, namedtuple, torch.Size, torch.return_types: a plain tuple
            items = tuple.__getitem__(
                x, slice(0, 100000)
            )  # the stored items, whatever the class overrides
            return {protocol.TUPLE: [self.encode(v, blobs, leaves, depth + 1) for v in items]}
        if isinstance(x, list):  # a list subclass: a plain list of its stored items
            return [
                self.encode(v, blobs, leaves, depth + 1)
                for v in list.__getitem__(x, slice(0, 100000))
            ]
        if isinstance(x, dict) and all(
            type(k) is str for k in dict.keys(x)
        ):  # OrderedDict, defaultdict
            pairs = list(dict.items(x))[:10000]
            return {
                protocol.DICT: [[k, self.encode(v, blobs, leaves, depth + 1)] for k, v in pairs]
            }
        if isinstance(
            x, bool | int | float
        ):  # a subclass of a number (runs its own __float__/__int__ here)
            return self.encode(
                float(x) if isinstance(x, float) else int(x), blobs, leaves, depth + 1
            )
        if type(x).__module__ == "numpy":
            try:  # numpy scalars and arrays: through a tensor
                return self.tensor_out(torch.as_tensor(x), blobs)
            except Exception:  # noqa: BLE001
                pass
        return {protocol.HANDLE: self.keep(x), protocol.TYPE: type(x).__name__[:100]}

    def _encode_rebuildable(self, x, blobs, leaves, depth):
        import dataclasses

        name = f"{type(x).__module__}.{type(x).__qualname__}"
        if isinstance(x, self.torch.nn.Module) and name.startswith(protocol.REBUILDABLE):
            grad = any(p.requires_grad for p in x.parameters())
            state = {k: self.tensor_out(v.detach(), blobs) for k, v in x.state_dict().items()}
            if grad and leaves is not None:
                leaves.extend(p for _, p in x.named_parameters())
            config = self.encode(getattr(x, "cfg", None), blobs, None, depth + 1)
            return {protocol.MODULE: {"type": name, "config": config, "state": state, "grad": grad}}
        if (
            dataclasses.is_dataclass(x)
            and not isinstance(x, type)
            and name.startswith(protocol.REBUILDABLE)
        ):
            fields = {
                f.name: self.encode(getattr(x, f.name), blobs, leaves, depth + 1)
                for f in dataclasses.fields(x)
            }
            return {protocol.DATACLASS: {"type": name, "fields": fields}}
        if (
            isinstance(x, tuple)
            and hasattr(type(x), "_fields")
            and name.startswith(protocol.REBUILDABLE)
        ):
            return {
                protocol.NAMEDTUPLE: {
                    "type": name,
                    "items": [self.encode(v, blobs, leaves, depth + 1) for v in x],
                }
            }
        handle = getattr(
            x, "_protocol_handle", None
        )  # a proxy of an object that lives in the runner
        if handle is not None:
            return {protocol.HANDLE: handle}
        raise TypeError(f"cannot send a {type(x).__name__} to the sandbox")

    # -------------------------------------------------------------- in
    def tensor_in(self, i, blobs, metas):
        torch = self.torch
        meta = metas[i]
        dtype = self.dtypes[meta["dtype"]]
        if not meta["nbytes"]:
            return torch.empty(meta["shape"], dtype=dtype)
        return (
            torch.frombuffer(bytearray(blobs[i]), dtype=torch.uint8)
            .view(dtype)
            .reshape(meta["shape"])
            .clone()
        )

    def decode(self, x, blobs, metas, leaves=None, tensors=None, depth=0):
        """A schema value -> Python. ``leaves`` (runner side) collects received tensors that require grad;
        ``tensors`` collects (decoded tensor, index) of every tensor argument."""
        if depth > protocol.MAX_VALUE_DEPTH + 4:
            raise protocol.ProtocolError("malformed value: nested too deeply")
        if isinstance(x, list):
            return [self.decode(v, blobs, metas, leaves, tensors, depth + 1) for v in x]
        if not isinstance(x, dict):
            return x
        if protocol.TENSOR in x:
            t = self.tensor_in(x[protocol.TENSOR], blobs, metas)
            if metas[x[protocol.TENSOR]].get("requires_grad") and leaves is not None:
                t.requires_grad_(True)
                leaves.append(t)
            if tensors is not None:
                tensors.append((t, x[protocol.TENSOR]))
            return t
        if protocol.TUPLE in x:
            return tuple(
                self.decode(v, blobs, metas, leaves, tensors, depth + 1) for v in x[protocol.TUPLE]
            )
        if protocol.FLOAT in x:
            return float(x[protocol.FLOAT])
        if protocol.DICT in x:
            return {
                k: self.decode(v, blobs, metas, leaves, tensors, depth + 1)
                for k, v in x[protocol.DICT]
            }
        if protocol.HANDLE in x:
            return self.make_handle(x[protocol.HANDLE], str(x.get(protocol.TYPE, "object"))[:100])
        if not self.rebuild:
            raise protocol.ProtocolError("malformed value: a rebuildable type in a reply")
        if protocol.MODULE in x:
            spec = x[protocol.MODULE]
            config = self.decode(spec["config"], blobs, metas, None, None, depth + 1)
            model = _library_type(spec["type"])(config)
            model.load_state_dict(
                {
                    k: self.tensor_in(v[protocol.TENSOR], blobs, metas)
                    for k, v in spec["state"].items()
                }
            )
            for p in model.parameters():
                if spec.get("grad") and leaves is not None:
                    leaves.append(p)
                else:
                    p.requires_grad_(False)
            return model
        if protocol.DATACLASS in x:
            spec = x[protocol.DATACLASS]
            return _library_type(spec["type"])(
                **{
                    k: self.decode(v, blobs, metas, leaves, tensors, depth + 1)
                    for k, v in spec["fields"].items()
                }
            )
        if protocol.NAMEDTUPLE in x:
            spec = x[protocol.NAMEDTUPLE]
            return _library_type(spec["type"])(
                *[self.decode(v, blobs, metas, leaves, tensors, depth + 1) for v in spec["items"]]
            )
        raise protocol.ProtocolError("malformed value: unknown tag")


def _library_type(name):
    import importlib

    module, _, qualname = name.rpartition(".")
    if not name.startswith(protocol.REBUILDABLE):
        raise protocol.ProtocolError(f"{name} is not a type of the student library")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
