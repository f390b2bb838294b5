"""The one wire protocol between the trusted driver and the sandboxed runner (both import this file).

Nothing is pickled in either direction. A frame is

    8 bytes  little-endian length of the body (at most MAX_FRAME)
    8 bytes  little-endian length of the JSON header
    header   UTF-8 JSON object (strict: no NaN/Infinity literals, at most MAX_DEPTH levels deep)
    blobs    the raw bytes of every tensor listed in header["tensors"], in order

Schema of a header (every key below is a tag of this module; no other keys are read):

    request  {"op": "exec",    "cell": str, "source": str}
             {"op": "defined", "names": [str]}
             {"op": "bind",    "names": [str]}  (the callables the names are bound to now)
             {"op": "call",    "target": str | int, "method": str | null,
                               "args": [value], "kwargs": {str: value}, "attrs": [str]}
             {"op": "getattr", "target": int, "name": str}
    reply    {"ok": false, "error": str}
             {"ok": true}                                   (exec)
             {"ok": true, "names": [str]}                   (defined)
             {"ok": true, "result": value}                  (getattr; bind: a dict of handles)
             {"ok": true, "result": value, "graph": bool, "grads": [value | null],
                               "mutated": [str], "attrs": {str: value}}     (call)
    every frame with tensors: "tensors": [{"dtype": str, "shape": [int], "nbytes": int,
                                          "requires_grad": bool}]

A ``value`` is JSON null, bool, str, int (|x| < 2**53), finite float, a JSON list of values, or one
object with exactly one tag:

    {"tensor": i}                 tensor i of the frame's "tensors" list (raw bytes, dtype + shape)
    {"tuple": [value]}            a tuple
    {"float": "nan"|"inf"|"-inf"} a float JSON cannot write
    {"dict": [[str, value]]}      a dict with string keys
    {"handle": int, "type": str}  an object that stays on the side that sent it (a function, a
                                  controller, anything that is not plain data, ``__slots__`` or not);
                                  the driver calls it and reads its attributes through requests
    request only (driver -> runner), rebuilt only for types of the student library (``mlbook.*``),
    which both sides import:
    {"module": {"type": "pkg.mod.Class", "config": value, "state": {str: value}, "grad": bool}}
                                  an nn.Module rebuilt as ``Class(config)`` + ``load_state_dict``
    {"dataclass": {"type": "pkg.mod.Class", "fields": {str: value}}}
    {"namedtuple": {"type": "pkg.mod.Class", "items": [value]}}

``read_frame`` and ``check_reply`` (the trusted side) raise ``ProtocolError`` on any frame that
does not follow this schema; the driver treats that as "the runner died".
"""

import json
import math
import os
import select
import struct
import time

MAX_FRAME = 256 * 1024 * 1024  # requests (the driver sends whole models)
MAX_REPLY = 64 * 1024 * 1024  # replies (what the student's code may send back)
MAX_DEPTH = 24  # JSON nesting of a header
MAX_HEADER = 4 * 1024 * 1024  # bytes of one JSON header (tensors travel as raw bytes, not in it)
MAX_CONTAINERS = 100_000  # lists and objects in one header, counted before it is parsed
MAX_VALUE_DEPTH = 8  # nesting of one value (tuples in lists in ...)
MAX_ELEMENTS = 4_000_000  # one tensor
MAX_DIMS = 8
REBUILDABLE = "mlbook."  # module prefix of the types a request may ask the runner to rebuild

# tags
OP, OK, ERROR, RESULT, TENSORS = "op", "ok", "error", "result", "tensors"
TENSOR, TUPLE, FLOAT, DICT, HANDLE, TYPE = "tensor", "tuple", "float", "dict", "handle", "type"
MODULE, DATACLASS, NAMEDTUPLE = "module", "dataclass", "namedtuple"
VALUE_TAGS = (TENSOR, TUPLE, FLOAT, DICT, HANDLE, MODULE, DATACLASS, NAMEDTUPLE)
DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)


class ProtocolError(Exception):
    """A frame that does not follow the schema above (or a closed or silent pipe)."""


# ------------------------------------------------------------------------------ framing


def _read_exact(fd, n, deadline, tick=None):
    """``n`` bytes; TimeoutError past ``deadline`` (wall clock) or when ``tick()``, called every 0.1 s
    while nothing arrives, raises it (the driver's meter of the sandbox's own time)."""
    chunks = []
    while n:
        while deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timeout")
            if select.select([fd], [], [], min(left, 0.1) if tick else left)[0]:
                break
            if tick is not None:
                tick()
            elif time.monotonic() >= deadline:
                raise TimeoutError("timeout")
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("died")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _reject_constant(name):
    raise ValueError(f"JSON constant {name} is not allowed")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a float literal out of range")
    return value


def _depth_ok(obj, limit):
    stack = [(obj, 0)]
    while stack:
        x, d = stack.pop()
        if d > limit:
            return False
        if isinstance(x, dict):
            stack += [(v, d + 1) for v in x.values()]
        elif isinstance(x, list):
            stack += [(v, d + 1) for v in x]
    return True


def parse_header(raw: bytes) -> dict:
    """Strict JSON -> dict; anything else (NaN, 1e999, deep nesting, huge ints, bad UTF-8) is a ProtocolError.

    The size and the number of containers are bounded before parsing: a 64 MB header of empty lists
    would otherwise cost the trusted side gigabytes and tens of seconds to parse."""
    if len(raw) > MAX_HEADER:
        raise ProtocolError("malformed frame: the header is too large")
    if raw.count(b"[") + raw.count(b"{") > MAX_CONTAINERS:
        raise ProtocolError("malformed frame: the header holds too many lists or objects")
    try:
        header = json.loads(
            raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float
        )
    except (ValueError, RecursionError, OverflowError, TypeError, MemoryError) as err:
        raise ProtocolError(
            f"malformed frame: {type(err).__name__}"
        ) from None  # RecursionError: nested too deeply
    if not isinstance(header, dict) or not _depth_ok(header, MAX_DEPTH):
        raise ProtocolError("malformed frame: the header is not a JSON object")
    return header


def read_frame(fd, deadline=None, max_size=MAX_FRAME, tick=None):
    """One frame from ``fd`` -> (header, blobs). TimeoutError past ``deadline`` (or from ``tick``),
    EOFError on a closed pipe."""
    (size,) = struct.unpack("<Q", _read_exact(fd, 8, deadline, tick))
    if size > max_size or size < 8:
        raise ProtocolError("malformed frame: bad length")
    body = _read_exact(fd, size, deadline, tick)
    (hlen,) = struct.unpack("<Q", body[:8])
    if hlen > size - 8:
        raise ProtocolError("malformed frame: bad header length")
    header = parse_header(body[8 : 8 + hlen])
    metas = header.get(TENSORS, [])
    if not isinstance(metas, list):
        raise ProtocolError("malformed frame: tensors is not a list")
    blobs, offset = [], 8 + hlen
    for meta in metas:
        check_tensor_meta(meta)
        blobs.append(body[offset : offset + meta["nbytes"]])
        offset += meta["nbytes"]
    if offset != size:
        raise ProtocolError("malformed frame: the tensor bytes do not add up")
    return header, blobs


def write_frame(fd, header, blobs=()):
    """``blobs``: [(meta, raw bytes)]; their metas go into header["tensors"]."""
    blobs = list(blobs)
    if blobs:
        header = dict(header, **{TENSORS: [b[0] for b in blobs]})
    head = json.dumps(header, allow_nan=False).encode()
    body = struct.pack("<Q", len(head)) + head + b"".join(b[1] for b in blobs)
    view = memoryview(struct.pack("<Q", len(body)) + body)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def check_tensor_meta(meta):
    try:
        ok = (
            isinstance(meta, dict)
            and meta.get("dtype") in DTYPES
            and isinstance(meta.get("shape"), list)
            and len(meta["shape"]) <= MAX_DIMS
            and all(type(s) is int and 0 <= s <= MAX_ELEMENTS for s in meta["shape"])
            and math.prod(meta["shape"]) <= MAX_ELEMENTS
            and type(meta.get("nbytes")) is int
            and meta["nbytes"] == math.prod(meta["shape"]) * _itemsize(meta["dtype"])
            and type(meta.get("requires_grad", False)) is bool
        )
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ProtocolError("malformed frame: a tensor header is wrong")


def _itemsize(dtype):
    return {
        "float64": 8,
        "int64": 8,
        "float32": 4,
        "int32": 4,
        "float16": 2,
        "bfloat16": 2,
        "int16": 2,
    }.get(dtype, 1)


# ------------------------------------------------------------------------------ replies (trusted side)


def check_reply(header, op, n_tensors):
    """The shape of a reply to ``op``; values inside are checked again as they are decoded."""

    def need(cond, what):
        if not cond:
            raise ProtocolError(f"malformed reply: {what}")

    need(
        set(header) <= {OK, ERROR, RESULT, TENSORS, "names", "graph", "grads", "mutated", "attrs"},
        "unknown keys",
    )
    need(type(header.get(OK)) is bool, "no ok flag")
    if not header[OK]:
        need(isinstance(header.get(ERROR), str), "an error without text")
        return header
    if op == "defined":
        need(
            isinstance(header.get("names"), list)
            and all(isinstance(n, str) for n in header["names"]),
            "names",
        )
    if op == "call":
        need(type(header.get("graph", False)) is bool, "graph")
        need(isinstance(header.get("grads", []), list), "grads")
        need(
            isinstance(header.get("mutated", []), list)
            and all(isinstance(n, str) for n in header.get("mutated", [])),
            "mutated",
        )
        need(isinstance(header.get("attrs", {}), dict), "attrs")
    for value in [header.get(RESULT), *header.get("grads", []), *header.get("attrs", {}).values()]:
        check_value(value, n_tensors)
    return header


def check_value(x, n_tensors, depth=0, request=False):
    """A value as the schema allows it (replies: no rebuildable types)."""
    if depth > MAX_VALUE_DEPTH:
        raise ProtocolError("malformed value: nested too deeply")
    if x is None or type(x) in (bool, str):
        return
    if type(x) is int:
        if abs(x) >= 2**53:
            raise ProtocolError("malformed value: an integer out of range")
        return
    if type(x) is float:
        if not math.isfinite(x):
            raise ProtocolError("malformed value: a non-finite float literal")
        return
    if isinstance(x, list):
        for v in x:
            check_value(v, n_tensors, depth + 1, request)
        return
    if not isinstance(x, dict) or len(x) not in (1, 2):
        raise ProtocolError("malformed value: not a tagged object")
    tag = next((t for t in VALUE_TAGS if t in x), None)
    allowed = {tag} | ({TYPE} if tag == HANDLE else set())
    if tag is None or set(x) - allowed or (len(x) == 2 and tag != HANDLE):
        raise ProtocolError("malformed value: unknown tag")
    v = x[tag]
    if tag == TENSOR:
        ok = type(v) is int and 0 <= v < n_tensors
    elif tag == TUPLE:
        ok = isinstance(v, list)
        if ok:
            for item in v:
                check_value(item, n_tensors, depth + 1, request)
    elif tag == FLOAT:
        ok = v in ("nan", "inf", "-inf")
    elif tag == DICT:
        ok = isinstance(v, list) and all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in v
        )
        if ok:
            for _, item in v:
                check_value(item, n_tensors, depth + 1, request)
    elif tag == HANDLE:
        ok = type(v) is int and v >= 0 and isinstance(x.get(TYPE, ""), str)
    else:
        ok = request  # rebuildable types travel only from the driver to the runner
    if not ok:
        raise ProtocolError(f"malformed value: a bad {tag!r}")


# ------------------------------------------------------------------------------ values (both sides)


class Codec:
    """Encode/decode values of the schema. ``keep`` stores an object that is not data and returns its handle
    (runner side); ``make_handle`` turns a received handle into a local proxy (driver side)."""

    def __init__(self, keep=None, make_handle=None, rebuild=False):
        import torch

        self.torch = torch
        self.dtypes = {name: getattr(torch, name) for name in DTYPES}
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
        return {TENSOR: len(blobs) - 1}

    def encode(self, x, blobs, leaves=None, depth=0):
        """Any Python value -> a schema value. ``leaves`` (driver side) collects tensors that require grad."""
        torch = self.torch
        if depth > MAX_VALUE_DEPTH:
            raise ValueError("a value nested too deeply")
        if isinstance(x, torch.Tensor):
            return self.tensor_out(x, blobs, leaves)
        if type(x) is bool or x is None or type(x) is str:
            return x
        if type(x) is int:
            return x if abs(x) < 2**53 else float(x)
        if type(x) is float:
            return x if math.isfinite(x) else {FLOAT: str(x)}
        if type(x) is list:
            return [self.encode(v, blobs, leaves, depth + 1) for v in x[:100000]]
        if type(x) is tuple:
            return {TUPLE: [self.encode(v, blobs, leaves, depth + 1) for v in x[:100000]]}
        if type(x) is dict and all(type(k) is str for k in x):
            return {
                DICT: [
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
            return {TUPLE: [self.encode(v, blobs, leaves, depth + 1) for v in items]}
        if isinstance(x, list):  # a list subclass: a plain list of its stored items
            return [
                self.encode(v, blobs, leaves, depth + 1)
                for v in list.__getitem__(x, slice(0, 100000))
            ]
        if isinstance(x, dict) and all(
            type(k) is str for k in dict.keys(x)
        ):  # OrderedDict, defaultdict
            pairs = list(dict.items(x))[:10000]
            return {DICT: [[k, self.encode(v, blobs, leaves, depth + 1)] for k, v in pairs]}
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
        return {HANDLE: self.keep(x), TYPE: type(x).__name__[:100]}

    def _encode_rebuildable(self, x, blobs, leaves, depth):
        import dataclasses

        name = f"{type(x).__module__}.{type(x).__qualname__}"
        if isinstance(x, self.torch.nn.Module) and name.startswith(REBUILDABLE):
            grad = any(p.requires_grad for p in x.parameters())
            state = {k: self.tensor_out(v.detach(), blobs) for k, v in x.state_dict().items()}
            if grad and leaves is not None:
                leaves.extend(p for _, p in x.named_parameters())
            config = self.encode(getattr(x, "cfg", None), blobs, None, depth + 1)
            return {MODULE: {"type": name, "config": config, "state": state, "grad": grad}}
        if dataclasses.is_dataclass(x) and not isinstance(x, type) and name.startswith(REBUILDABLE):
            fields = {
                f.name: self.encode(getattr(x, f.name), blobs, leaves, depth + 1)
                for f in dataclasses.fields(x)
            }
            return {DATACLASS: {"type": name, "fields": fields}}
        if isinstance(x, tuple) and hasattr(type(x), "_fields") and name.startswith(REBUILDABLE):
            return {
                NAMEDTUPLE: {
                    "type": name,
                    "items": [self.encode(v, blobs, leaves, depth + 1) for v in x],
                }
            }
        handle = getattr(
            x, "_protocol_handle", None
        )  # a proxy of an object that lives in the runner
        if handle is not None:
            return {HANDLE: handle}
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
        if depth > MAX_VALUE_DEPTH + 4:
            raise ProtocolError("malformed value: nested too deeply")
        if isinstance(x, list):
            return [self.decode(v, blobs, metas, leaves, tensors, depth + 1) for v in x]
        if not isinstance(x, dict):
            return x
        if TENSOR in x:
            t = self.tensor_in(x[TENSOR], blobs, metas)
            if metas[x[TENSOR]].get("requires_grad") and leaves is not None:
                t.requires_grad_(True)
                leaves.append(t)
            if tensors is not None:
                tensors.append((t, x[TENSOR]))
            return t
        if TUPLE in x:
            return tuple(self.decode(v, blobs, metas, leaves, tensors, depth + 1) for v in x[TUPLE])
        if FLOAT in x:
            return float(x[FLOAT])
        if DICT in x:
            return {k: self.decode(v, blobs, metas, leaves, tensors, depth + 1) for k, v in x[DICT]}
        if HANDLE in x:
            return self.make_handle(x[HANDLE], str(x.get(TYPE, "object"))[:100])
        if not self.rebuild:
            raise ProtocolError("malformed value: a rebuildable type in a reply")
        if MODULE in x:
            spec = x[MODULE]
            config = self.decode(spec["config"], blobs, metas, None, None, depth + 1)
            model = _library_type(spec["type"])(config)
            model.load_state_dict(
                {k: self.tensor_in(v[TENSOR], blobs, metas) for k, v in spec["state"].items()}
            )
            for p in model.parameters():
                if spec.get("grad") and leaves is not None:
                    leaves.append(p)
                else:
                    p.requires_grad_(False)
            return model
        if DATACLASS in x:
            spec = x[DATACLASS]
            return _library_type(spec["type"])(
                **{
                    k: self.decode(v, blobs, metas, leaves, tensors, depth + 1)
                    for k, v in spec["fields"].items()
                }
            )
        if NAMEDTUPLE in x:
            spec = x[NAMEDTUPLE]
            return _library_type(spec["type"])(
                *[self.decode(v, blobs, metas, leaves, tensors, depth + 1) for v in spec["items"]]
            )
        raise ProtocolError("malformed value: unknown tag")


def _library_type(name):
    import importlib

    module, _, qualname = name.rpartition(".")
    if not name.startswith(REBUILDABLE):
        raise ProtocolError(f"{name} is not a type of the student library")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
