"""The one wire protocol between the trusted driver and the sandboxed runner (both import this file;
both encode and decode its values with ``codec.py``).

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
