"""The remote calls: the student's functions, classes and objects live in the sandbox; here they are
``Remote`` proxies whose calls and attribute reads are requests (plain tensors out, validated data
and handles back, under the session's deadlines). A scalar computed remotely from local inputs is
attached to them with the remote gradient, so the reference loop can backpropagate through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mlbook_tools.errors import RemoteError, RunnerDied
from mlbook_tools.inside import protocol
from mlbook_tools.inside.codec import Codec

if TYPE_CHECKING:
    from mlbook_tools.session import Session


def codec(session) -> Codec:
    """The driver's codec: data and library types out, data and handles (as ``Remote``) in."""
    return Codec(make_handle=lambda h, type_name: Remote(session, h, type_name))


class _Attach(torch.autograd.Function):
    """Connect a remotely computed scalar to the local inputs it was computed from, with the remote gradient."""

    @staticmethod
    def forward(ctx, value, grads, *inputs):
        ctx.grads = grads
        return value.clone()

    @staticmethod
    def backward(ctx, upstream):
        return (
            None,
            None,
            *[None if g is None else upstream * g.to(upstream.dtype) for g in ctx.grads],
        )


def _attach(result, grads, leaves):
    first = result[0] if isinstance(result, tuple | list) and result else result
    if not isinstance(first, torch.Tensor) or first.numel() != 1 or not first.is_floating_point():
        return result
    attached = _Attach.apply(first, grads, *leaves)
    if isinstance(result, tuple):
        return (attached, *result[1:])
    if isinstance(result, list):
        return [attached, *result[1:]]
    return attached


class Remote:
    """A function, class or object that lives in the sandbox: calling it is a request, attributes are requests.

    An attribute that was a bound method when read is, from its second read on, not read again ahead of
    its call: the proxy it returns calls ``target.<attr>(...)`` in one request, the sandbox reading the
    attribute at the call, as ``obj.attr(...)`` does (a check calling ``controller.update`` 800 times
    makes 800 requests, not 1,600)."""

    def __init__(self, session: Session, handle, type_name="function", name=None, method=None):
        object.__setattr__(self, "session", session)
        object.__setattr__(self, "handle", handle)
        object.__setattr__(self, "method", method)  # a method of ``handle``, read when it is called
        object.__setattr__(self, "type_name", type_name)
        object.__setattr__(self, "name", name or type_name)
        object.__setattr__(self, "label", None)  # the graded name it is bound to, for messages
        object.__setattr__(self, "_methods", set())  # attributes that were bound methods when read
        object.__setattr__(
            self, "_resolved", None
        )  # a method proxy's own handle, once sent as data

    def __repr__(self):
        return f"<remote {self.type_name} {self.name}>"

    @property
    def _protocol_handle(self):
        """The handle this proxy is sent as (``codec.Codec``): a method proxy reads its method first."""
        if self.method is None:
            return self.handle if isinstance(self.handle, int) else None
        if self._resolved is None:
            bound = self._read(self.handle, self.method, self.name)
            object.__setattr__(self, "_resolved", getattr(bound, "_protocol_handle", None))
        return self._resolved

    def __call__(self, *args, **kwargs):
        try:
            return self.session.call(self.handle, self.method, args, kwargs, label=self.label)
        except RemoteError as err:
            raise AssertionError(err.student_message(self.name)) from None

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        name = f"{self.name}.{attr}"
        if attr in self._methods and self.method is None:
            return Remote(self.session, self.handle, "method", name=name, method=attr)
        target = self.handle if self.method is None else self._protocol_handle
        value = self._read(target, attr, name)
        if isinstance(value, Remote):
            object.__setattr__(value, "name", name)
            if value.type_name == "method":
                self._methods.add(attr)
        return value

    def _read(self, target, attr, name):
        """``target.attr`` (called ``name`` in messages) read in the sandbox: data, or a proxy."""
        try:
            reply, rblobs = self.session.request(
                {"op": "getattr", "target": target, "name": attr},
                self.session.limits.call_seconds,
            )
        except RunnerDied as err:  # each kind says what happened to the read
            raise AssertionError(err.student_message(f"reading {name}")) from None
        if not reply["ok"]:
            shown = self.session.limits.shown_error_chars
            raise AssertionError(f"{name} is not available: {reply['error'][:shown]}")
        try:
            return codec(self.session).decode(
                reply.get("result"), rblobs, reply.get(protocol.TENSORS, [])
            )
        except protocol.ProtocolError as err:
            raise AssertionError(f"{name} is not data ({err})") from None


def call(session, target, method, args, kwargs, attrs=(), label=None):
    """Call ``target`` (a name or handle; ``label``: its name for messages) in the sandbox. Nothing
    comes back into ``args``: the driver's tensors stay as they were; a call that changed an input in
    place fails the check."""
    blobs, leaves = [], []
    wire = codec(session)
    enc_args = [wire.encode(a, blobs, leaves) for a in args]
    enc_kwargs = {k: wire.encode(v, blobs, leaves) for k, v in kwargs.items()}
    header = {
        "op": "call",
        "target": target,
        "method": method,
        "args": enc_args,
        "kwargs": enc_kwargs,
        "attrs": list(attrs),
    }
    name = label or (target if isinstance(target, str) else "your code")
    try:
        reply, rblobs = session.request(header, session.limits.call_seconds, blobs, interrupt=True)
    except RunnerDied as err:  # each kind says what happened to the call
        raise AssertionError(err.student_message(f"calling {name}")) from None
    if not reply["ok"]:
        raise RemoteError(reply["error"][: session.limits.shown_error_chars])
    metas = reply.get(protocol.TENSORS, [])
    try:
        result = wire.decode(reply.get("result"), rblobs, metas)
        grads = [wire.decode(g, rblobs, metas) for g in reply.get("grads", [])]
        extras = {k: wire.decode(v, rblobs, metas) for k, v in reply.get("attrs", {}).items()}
    except protocol.ProtocolError as err:
        raise AssertionError(f"{name} returned something that is not data ({err})") from None
    mutated = [str(m)[:80] for m in reply.get("mutated", [])]
    if mutated:
        which = ", ".join(f"`{m}`" for m in mutated[:5])
        raise AssertionError(
            f"{name} changed its input {which} in place; it must leave its inputs as they are "
            "(work on a copy, e.g. x = x.clone(), or use out-of-place ops)"
        )
    if reply.get("graph") and leaves:
        ok = len(grads) == len(leaves) and all(
            g is None or (isinstance(g, torch.Tensor) and g.shape == leaf.shape)
            for g, leaf in zip(grads, leaves, strict=False)
        )
        if ok:
            result = _attach(result, grads, leaves)
    return (result, extras) if attrs else result
