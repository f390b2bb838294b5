"""The process that runs a student's code, inside the sandbox. It decides nothing.

It imports only the standard library, torch, IPython, the student library ``mlbook``, ``protocol.py`` and
``codec.py`` (bound next to it: it runs where nothing else is visible). Its one argument is a JSON object:
{"fds": [requests, replies], "paths": [import roots], "limits": {rlimit name: value}}; it lowers its
own rlimits before any request is read. It reads requests and writes replies, one frame each, in
the format and schema of ``protocol.py`` (nothing is pickled). An ``exec`` request runs one cell
through IPython, as Jupyter does (magics, ``__future__``, ``display``, linecache for ``inspect``). A call also returns the gradient of
its first output (summed) with respect to every input tensor that requires grad, and the names of
the arguments the call changed in place (the driver never copies anything back: it fails the test).

As in a Jupyter kernel, the working folder (the sandbox's /tmp) is on ``sys.path`` and is where ``!``
lines and ``%%bash`` cells run (``!mkdir pkg``, ``%%writefile pkg/__init__.py``, then ``import pkg``),
and ``torch.compile`` runs eagerly (its C++ compiler would spend the budget): a correct compiled
function keeps its points. ``"processes": false`` in the config says the sandbox refuses new
processes (no cgroup bounds them): an error that comes of it says so.
"""

import functools
import json
import os
import resource
import signal
import sys
import traceback

if __package__:
    from . import protocol
    from .codec import Codec
else:
    import protocol
    from codec import Codec


def _lower_limits(limits):
    for name, value in limits.items():
        key = getattr(resource, name)
        soft, hard = resource.getrlimit(key)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(key, (value, value))


_SHELL = []  # the IPython shell, made at start-up (import costs ~0.2 s)
_NO_PROCESSES = (
    " (the grader's sandbox refuses new processes on this machine: shell commands,"
    " subprocess and multiprocessing cannot run while grading)"
)
_CONFIG = {"processes": True}


def _shell(namespace):
    """An IPython ``InteractiveShell`` over ``namespace``: the cells run as Jupyter runs them.

    Magics, ``!`` lines, ``display``, ``__future__`` imports, and every cell's source in ``linecache``
    (``inspect.getsource`` and ``torch.jit.script`` work). No history database, no colours. A shell
    escape runs here, in the sandbox's working folder; where starting a process fails, it prints why
    and returns 127, so the rest of the cell still runs (as on a machine without that program).
    ``NBGRADER_EXECUTION=autograde`` is set as nbgrader sets it, so code that asks whether it is
    being graded gets nbgrader's answer.
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


def main(req_fd, rep_fd):
    import inspect

    # torch.compile: inductor's C++ compiler is a new process (refused without a cgroup) and seconds of
    # compiling per graph (a correct answer's budget). Dynamo still traces (a graph break under
    # fullgraph=True fails as in a kernel), the graph then runs eagerly;
    # any other compiler failure falls back to eager execution (suppress_errors), never to an error.
    os.environ["TORCHDYNAMO_SUPPRESS_ERRORS"] = "1"
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    import torch

    real_compile = torch.compile

    def compile_here(model=None, *, backend="inductor", mode=None, options=None, **kw):
        if backend == "inductor":  # mode and options are inductor's own settings
            backend, mode, options = "eager", None, None
        return real_compile(model, backend=backend, mode=mode, options=options, **kw)

    torch.compile = functools.wraps(real_compile)(compile_here)

    torch.set_num_threads(1)
    namespace = {"__name__": "__main__"}
    handles = {}

    def keep(obj):
        handles[len(handles)] = obj
        return len(handles) - 1

    def owner(target):
        return handles[target] if isinstance(target, int) else namespace[target]

    codec = Codec(keep=keep, make_handle=lambda h, _type: handles[h], rebuild=True)
    _shell(namespace)  # before the first request: the start-up overlaps the driver's own imports
    try:  # what nearly every notebook imports (its font list is built here): before the first request too
        import matplotlib.pyplot  # noqa: F401
    except ImportError:
        pass

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
        if isinstance(err, BlockingIOError) and not _CONFIG["processes"]:
            text += _NO_PROCESSES
        return text + (f" ({where})" if where else "")

    def arg_names(fn, args, kwargs):
        """The parameter name of every positional argument (``argument i`` where the signature says nothing)."""
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            params = []
        return [
            params[i] if i < len(params) else f"argument {i + 1}" for i in range(len(args))
        ] + list(kwargs)

    def call(req, blobs, out):
        leaves, received = [], []
        metas = req.get("tensors", [])
        args, kwargs = [], {}
        for i, a in enumerate(req["args"]):
            seen = []
            args.append(codec.decode(a, blobs, metas, leaves, seen))
            received += [(t, k, ("pos", i)) for t, k in seen]
        for key, a in req["kwargs"].items():
            seen = []
            kwargs[key] = codec.decode(a, blobs, metas, leaves, seen)
            received += [(t, k, ("kw", key)) for t, k in seen]
        fn = owner(req["target"])
        if req.get("method"):
            fn = getattr(fn, req["method"])
        result = fn(*args, **kwargs)
        first = result[0] if isinstance(result, tuple | list) and result else result
        grads, graph = [], False
        if leaves and isinstance(first, torch.Tensor) and first.requires_grad:
            graph = True
            try:
                got = torch.autograd.grad(first.sum(), leaves, allow_unused=True)
                grads = [None if g is None else codec.tensor_out(g, out) for g in got]
            except RuntimeError:
                graph = False
        names = arg_names(fn, args, kwargs)
        mutated = []
        for t, k, (kind, where) in received:  # compared with the bytes that came in
            meta = metas[k]
            now = torch.Tensor.detach(t)
            changed = list(now.shape) != meta["shape"] or now.dtype != codec.dtypes[meta["dtype"]]
            if not changed and now.numel():
                changed = (
                    now.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() != blobs[k]
                )
            name = names[where] if kind == "pos" else where
            if changed and name not in mutated:
                mutated.append(name)
        attrs = {}
        for name in req.get("attrs", []):
            obj = fn.__self__ if req.get("method") else result
            attrs[name] = codec.encode(getattr(obj, name, None), out)
        return {
            "ok": True,
            "result": codec.encode(result, out),
            "graph": graph,
            "grads": grads,
            "mutated": mutated,
            "attrs": attrs,
        }

    me = os.getpid()
    # The driver interrupts a request cut at its limit as Jupyter interrupts a kernel (SIGINT: a
    # KeyboardInterrupt in the student's code, which answers as an error). Between requests SIGINT is
    # ignored (a late one is dropped, the pipe stays in step); during one, the handler is the default
    # or whatever the student's code set last (kept across requests, as in a kernel).
    handler = signal.default_int_handler
    while True:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            req, blobs = protocol.read_frame(req_fd)
        except EOFError:
            return
        except protocol.ProtocolError as err:
            protocol.write_frame(rep_fd, {"ok": False, "error": str(err)})
            continue
        out = []
        try:
            signal.signal(signal.SIGINT, handler)
            if req["op"] == "exec":
                reply = run_cell(namespace, req["cell"], req["source"], error_text)
            elif req["op"] == "defined":
                reply = {"ok": True, "names": sorted(k for k in req["names"] if k in namespace)}
            elif req["op"] == "bind":  # handles of the callables the names are bound to now
                now = [(k, namespace[k]) for k in req["names"] if callable(namespace.get(k))]
                held = [
                    [k, {protocol.HANDLE: keep(v), protocol.TYPE: type(v).__name__[:100]}]
                    for k, v in now
                ]
                reply = {"ok": True, "result": {protocol.DICT: held}}
            elif req["op"] == "call":
                reply = call(req, blobs, out)
            elif req["op"] == "getattr":
                reply = {
                    "ok": True,
                    "result": codec.encode(getattr(owner(req["target"]), req["name"]), out),
                }
            else:
                reply = {"ok": False, "error": f"unknown op {req['op']!r}"}
            handler = signal.signal(signal.SIGINT, signal.SIG_IGN) or signal.default_int_handler
        except BaseException as err:  # noqa: BLE001 - every failure of student code is a reply
            handler = signal.signal(signal.SIGINT, signal.SIG_IGN) or signal.default_int_handler
            out = []
            reply = {"ok": False, "error": error_text(err)}
        if os.getpid() != me:  # a child the student's code forked (and did not end) came back here:
            os._exit(0)  # only the runner itself answers, or two processes would share one pipe
        try:
            protocol.write_frame(rep_fd, reply, out)
        except Exception as err:  # noqa: BLE001 - an unencodable result is the student's problem
            protocol.write_frame(
                rep_fd,
                {"ok": False, "error": f"result could not be sent back: {type(err).__name__}"},
            )


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    _lower_limits(config.get("limits", {}))
    _CONFIG["processes"] = bool(config.get("processes", True))
    sys.path[:0] = [
        "",
        *config.get("paths", []),
    ]  # "": the working folder, first, as ipykernel puts it
    main(*config["fds"])
