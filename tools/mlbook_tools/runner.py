"""The process that runs a student's code, inside the sandbox. It decides nothing.

It imports only the standard library, torch and the student library ``mlbook`` (it runs where
nothing else is visible). It reads requests from fd 3 and writes replies to fd 4, one frame each:
an 8-byte length, a JSON header, then the raw bytes of every tensor the header lists. Nothing is
pickled in either direction. Requests:

    {"op": "exec", "cell": id, "source": text}    run one cell through IPython, as Jupyter does
    {"op": "call", "target": name | handle, "method": name | null, "args": [...], "kwargs": {...}}

Values are JSON with tags: {"T": i} tensor number i of the frame, {"M": {...}} a toy model rebuilt
from its config and weights, {"H": n} an object kept here (a controller, a returned function),
{"tuple": [...]}, {"float": "nan"}. A call also returns the gradient of its first output (summed)
with respect to every input tensor that requires grad, and the inputs' values after the call (so
the driver can see in-place changes). What comes back is only data: the driver checks it.
"""

import json
import math
import os
import struct
import sys
import traceback

MAX_FRAME = 256 * 1024 * 1024


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    (size,) = struct.unpack("<Q", _read_exact(fd, 8))
    if size > MAX_FRAME:
        raise ValueError("frame too large")
    body = _read_exact(fd, size)
    (hlen,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8 : 8 + hlen])
    blobs, offset = [], 8 + hlen
    for meta in header.get("blobs", []):
        blobs.append(body[offset : offset + meta["nbytes"]])
        offset += meta["nbytes"]
    return header, blobs


def write_frame(fd, header, blobs=()):
    blobs = list(blobs)
    header = dict(header, blobs=[b[0] for b in blobs]) if blobs else header
    head = json.dumps(header).encode()
    body = struct.pack("<Q", len(head)) + head + b"".join(b[1] for b in blobs)
    data = struct.pack("<Q", len(body)) + body
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


_SHELL = []  # the IPython shell, started by the first cell (import costs ~0.2 s)


def _shell(namespace):
    """An IPython ``InteractiveShell`` over ``namespace``: the cells run as Jupyter runs them.

    Magics, ``!`` lines, ``display``, ``__future__`` imports, and every cell's source in ``linecache``
    (``inspect.getsource`` and ``torch.jit.script`` work). No history database, no colours. A shell
    escape runs here, in the sandbox, where starting a process fails: it prints why and returns 127,
    so the rest of the cell still runs (as on a machine without that program), never a SyntaxError.
    ``NBGRADER_EXECUTION=autograde`` is set as nbgrader sets it, so the notebook's own
    ``AUTOGRADING`` flag holds.
    """
    if _SHELL:
        return _SHELL[0]
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    os.environ.setdefault("MPLBACKEND", "Agg")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.text import SList
    from traitlets.config import Config

    cfg = Config()
    cfg.HistoryManager.enabled = False
    cfg.InteractiveShell.colors = "nocolor"
    cfg.InteractiveShell.xmode = "Plain"
    shell = InteractiveShell.instance(config=cfg, user_ns=namespace)
    current = {"cell": "?"}
    shell.compile.get_code_name = lambda raw, transformed, number: f"<cell {current['cell']}>"

    def system(cmd):
        try:
            return shell.system_raw(cmd)
        except OSError as err:
            print(f"!{cmd}: not run while grading ({err.strerror or err})", file=sys.stderr)
            shell.user_ns["_exit_code"] = 127

    def getoutput(cmd, split=True, depth=0):
        try:
            return orig_getoutput(cmd, split=split, depth=depth + 1)
        except OSError as err:
            print(f"!{cmd}: not run while grading ({err.strerror or err})", file=sys.stderr)
            return SList() if split else ""

    def enable_matplotlib(
        gui=None,
    ):  # `%matplotlib inline`: the inline backend's entry point (package
        try:  # metadata) is not in the sandbox; figures are not graded, so they go to Agg
            return orig_enable_matplotlib(gui)
        except (RuntimeError, ValueError, KeyError):
            if gui != "inline":
                raise
            import matplotlib

            matplotlib.use("agg")
            return "inline", "agg"

    orig_getoutput, orig_enable_matplotlib = shell.getoutput, shell.enable_matplotlib
    shell.system, shell.getoutput, shell.enable_matplotlib = system, getoutput, enable_matplotlib
    _SHELL.extend([shell, current])
    return shell


def run_cell(namespace, cell, source, error_text):
    """One notebook cell through IPython; the reply says whether it raised, and what."""
    shell = _shell(namespace)
    _SHELL[1]["cell"] = cell
    result = shell.run_cell(source, store_history=True)
    err = result.error_before_exec or result.error_in_exec
    if err is None:
        return {"ok": True}
    return {"ok": False, "error": error_text(err)}


def main():
    import torch

    torch.set_num_threads(1)
    DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "bool": torch.bool,
              "int32": torch.int32, "float16": torch.float16, "bfloat16": torch.bfloat16}  # fmt: skip
    names = {v: k for k, v in DTYPES.items()}
    namespace = {"__name__": "__main__"}
    handles = {}
    req_fd, rep_fd = 3, 4

    def tensor_out(t, out):
        t = torch.Tensor.detach(t).cpu()
        t = torch.Tensor.contiguous(torch.Tensor.as_subclass(t, torch.Tensor))
        if t.dtype not in names:
            t = t.to(torch.float64)
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        out.append(({"dtype": names[t.dtype], "shape": list(t.shape), "nbytes": len(raw)}, raw))
        return {"T": len(out) - 1}

    def encode(x, out, depth=0):
        if depth > 6:
            return {"type": "too deep"}
        if isinstance(x, torch.Tensor):
            return tensor_out(x, out)
        if type(x) is bool or x is None or type(x) is str:
            return x
        if type(x) is int:
            return x if abs(x) < 2**53 else float(x)
        if type(x) is float:
            return x if math.isfinite(x) else {"float": str(x)}
        if type(x) in (tuple, list):
            items = [encode(v, out, depth + 1) for v in x[:10000]]
            return {"tuple": items} if type(x) is tuple else items
        try:  # numpy scalars and arrays, python numbers of odd types: through a tensor
            return tensor_out(torch.as_tensor(x), out)
        except Exception:
            pass
        if not isinstance(
            x, dict | set | frozenset | bytes
        ):  # any object (with __slots__ too): a handle
            handles[len(handles)] = x
            return {"H": len(handles) - 1, "type": type(x).__name__}
        return {"type": type(x).__name__}

    def decode(x, blobs, metas, leaves):
        if isinstance(x, list):
            return [decode(v, blobs, metas, leaves) for v in x]
        if not isinstance(x, dict):
            return x
        if "T" in x:
            meta = metas[x["T"]]
            dtype = DTYPES[meta["dtype"]]
            if meta["nbytes"]:
                t = (
                    torch.frombuffer(bytearray(blobs[x["T"]]), dtype=torch.uint8)
                    .view(dtype)
                    .reshape(meta["shape"])
                )
            else:
                t = torch.empty(meta["shape"], dtype=dtype)
            if meta.get("requires_grad"):
                t.requires_grad_(True)
                leaves.append(t)
            return t
        if "tuple" in x:
            return tuple(decode(v, blobs, metas, leaves) for v in x["tuple"])
        if "float" in x:
            return float(x["float"])
        if "H" in x:
            return handles[x["H"]]
        if "M" in x:
            from mlbook.posttrain import toy_lm

            spec = x["M"]
            model = getattr(toy_lm, spec["kind"])(toy_lm.ToyLMConfig(**spec["config"]))
            state = {k: decode(v, blobs, metas, []) for k, v in spec["params"].items()}
            model.load_state_dict(state)
            for p in model.parameters():
                if spec.get("grad"):
                    leaves.append(p)
                else:
                    p.requires_grad_(False)
            return model
        if "demo" in x:
            from mlbook.posttrain.toy_lm import DemoBatch

            return DemoBatch(*[decode(v, blobs, metas, leaves) for v in x["demo"]])
        return {k: decode(v, blobs, metas, leaves) for k, v in x.items()}

    def error_text(err):
        frames = traceback.extract_tb(err.__traceback__)
        where = next(
            (
                f"line {f.lineno} of cell {f.filename[6:-1]}"
                for f in reversed(frames)
                if f.filename.startswith("<cell ")
            ),
            "",
        )
        text = f"{type(err).__name__}: {err}"[:2000]
        return text + (f" ({where})" if where else "")

    while True:
        try:
            req, blobs = read_frame(req_fd)
        except EOFError:
            return
        out = []
        try:
            if req["op"] == "exec":
                reply = run_cell(namespace, req["cell"], req["source"], error_text)
            elif req["op"] == "defined":
                reply = {"ok": True, "names": sorted(k for k in req["names"] if k in namespace)}
            elif req["op"] == "call":
                leaves = []
                metas = req.get("blobs", [])
                args = decode(req["args"], blobs, metas, leaves)
                kwargs = decode(req["kwargs"], blobs, metas, leaves)
                target = req["target"]
                fn = handles[target] if isinstance(target, int) else namespace[target]
                if req.get("method"):
                    fn = getattr(fn, req["method"])
                tensor_args = [
                    a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)
                ]
                result = fn(*args, **kwargs)
                first = result[0] if isinstance(result, tuple | list) and result else result
                grads, graph = [], False
                if leaves and isinstance(first, torch.Tensor) and first.requires_grad:
                    graph = True
                    try:
                        got = torch.autograd.grad(first.sum(), leaves, allow_unused=True)
                        grads = [None if g is None else encode(g, out) for g in got]
                    except RuntimeError:
                        graph = False
                after = [encode(a.detach(), out) for a in tensor_args]
                attrs = {}
                for name in req.get("attrs", []):
                    obj = fn.__self__ if req.get("method") else result
                    attrs[name] = encode(getattr(obj, name, None), out)
                reply = {"ok": True, "result": encode(result, out), "graph": graph, "grads": grads,
                         "after": after, "attrs": attrs}  # fmt: skip
            elif req["op"] == "getattr":
                reply = {
                    "ok": True,
                    "result": encode(getattr(handles[req["target"]], req["name"]), out),
                }
            else:
                reply = {"ok": False, "error": f"unknown op {req['op']!r}"}
        except BaseException as err:  # noqa: BLE001 - every failure of student code is a reply
            if isinstance(err, KeyboardInterrupt | SystemExit) and req.get("op") != "exec":
                pass
            out = []
            reply = {"ok": False, "error": error_text(err)}
        try:
            write_frame(rep_fd, reply, out)
        except Exception as err:  # noqa: BLE001 - an unencodable result is the student's problem
            write_frame(
                rep_fd,
                {"ok": False, "error": f"result could not be sent back: {type(err).__name__}"},
            )


if __name__ == "__main__":
    sys.path[:0] = sys.argv[1:]
    main()
