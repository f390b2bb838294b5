"""The wire protocol (``mlbook_tools/inside/protocol.py``, its values ``codec.py``): every tag round-trips, every malformed frame is refused.

Frames go through a real pipe. The driver's codec encodes (data and student-library types), the
runner's codec decodes (rebuilding those types); replies go the other way and may hold only data and
handles. Anything that breaks the schema is a ``ProtocolError``, which the driver treats as "the
runner died" (see test_sandbox_bounds.py for the same frames written by code inside a sandbox).
"""

import json
import math
import os
import struct

import pytest
import torch
from mlbook_tools.inside import protocol
from mlbook_tools.inside.codec import Codec

from mlbook.posttrain.toy_lm import DemoBatch, TinyCausalLM, ToyLMConfig

pytestmark = pytest.mark.unit


def _through_pipe(header, blobs=()):
    import threading

    r, w = os.pipe()
    writer = threading.Thread(target=protocol.write_frame, args=(w, header, blobs))
    writer.start()
    try:
        return protocol.read_frame(r, deadline=None)
    finally:
        writer.join()
        os.close(r)
        os.close(w)


class _Slots:
    __slots__ = ("beta",)

    def __init__(self):
        self.beta = 0.1


def test_every_tag_round_trips_driver_to_runner():
    kept = {}
    runner = Codec(
        keep=lambda o: kept.setdefault(len(kept), o) and len(kept) - 1,
        make_handle=lambda h, t: ("H", h),
        rebuild=True,
    )
    driver = Codec(make_handle=lambda h, t: ("remote", h, t))
    model = TinyCausalLM(ToyLMConfig(init_std=0.3))
    batch = DemoBatch(torch.arange(6).reshape(2, 3), torch.full((2, 3), -100))
    value = [
        None,
        True,
        "s",
        3,
        2.5,
        float("nan"),
        float("-inf"),
        (1, (2.0,)),
        {"k": torch.ones(2, dtype=torch.float64)},
        torch.zeros(0, 3),
        torch.tensor([1, 2], dtype=torch.int32),
        torch.tensor([True]),
        torch.ones(2, dtype=torch.bfloat16),
        ToyLMConfig(d_model=16),
        batch,
        model,
    ]
    blobs, leaves = [], []
    enc = driver.encode(value, blobs, leaves)
    header, raw = _through_pipe(
        {"op": "call", "target": "f", "method": None, "args": [enc], "kwargs": {}}, blobs
    )
    for meta in header[protocol.TENSORS]:
        protocol.check_tensor_meta(meta)
    protocol.check_value(header["args"], len(raw), request=True)
    out = runner.decode(header["args"][0], raw, header[protocol.TENSORS], [], [])
    assert (
        out[:5] == value[:5]
        and math.isnan(out[5])
        and out[6] == -math.inf
        and out[7] == (1, (2.0,))
    )
    assert torch.equal(out[8]["k"], value[8]["k"]) and out[8]["k"].dtype == torch.float64
    for got, want in zip(out[9:13], value[9:13], strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert out[13] == ToyLMConfig(d_model=16)
    assert type(out[14]) is DemoBatch and torch.equal(out[14].input_ids, batch.input_ids)
    assert type(out[15]) is TinyCausalLM and out[15].cfg == model.cfg
    for (k, a), b in zip(out[15].state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_every_reply_tag_round_trips_runner_to_driver_and_objects_come_back_as_handles():
    kept = []

    def keep(obj):
        kept.append(obj)
        return len(kept) - 1

    runner = Codec(keep=keep, make_handle=lambda h, t: kept[h], rebuild=True)
    driver = Codec(make_handle=lambda h, t: ("remote", h, t))
    value = (
        torch.arange(4.0).reshape(2, 2),
        [1, "x", None],
        {"a": 1.5},
        float("inf"),
        _Slots(),
        len,
        lambda: 0,
    )
    blobs = []
    enc = runner.encode(value, blobs)
    reply = {"ok": True, "result": enc, "graph": False, "grads": [], "mutated": [], "attrs": {}}
    header, raw = _through_pipe(reply, blobs)
    protocol.check_reply(header, "call", len(raw))
    out = driver.decode(header["result"], raw, header.get(protocol.TENSORS, []))
    assert torch.equal(out[0], value[0]) and out[1] == [1, "x", None] and out[2] == {"a": 1.5}
    assert out[3] == math.inf
    assert (
        out[4] == ("remote", 0, "_Slots") and kept[0] is value[4]
    )  # __slots__, no __dict__: still a handle
    assert out[5][0] == "remote" and out[6][0] == "remote"


def _frame(head: bytes, tail: bytes = b"") -> bytes:
    body = struct.pack("<Q", len(head)) + head + tail
    return struct.pack("<Q", len(body)) + body


MALFORMED = {
    "infinity_literal": _frame(b'{"ok": true, "result": Infinity}'),
    "nan_literal": _frame(b'{"ok": true, "result": NaN}'),
    "float_overflow": _frame(b'{"ok": true, "result": 1e999}'),
    "deep_nesting": _frame(b'{"ok": true, "result": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
    "huge_int": _frame(b'{"ok": true, "result": ' + b"9" * 5000 + b"}"),
    "not_an_object": _frame(b"[1, 2]"),
    "bad_utf8": _frame(b'{"ok": "\xff"}'),
    "ok_not_bool": _frame(b'{"ok": 1}'),
    "error_not_text": _frame(b'{"ok": false, "error": {"tensor": 0}}'),
    "unknown_key": _frame(b'{"ok": true, "after": []}'),
    "unknown_tag": _frame(b'{"ok": true, "result": {"pickle": "gASV"}}'),
    "rebuild_in_reply": _frame(b'{"ok": true, "result": {"module": {"type": "mlbook.x.Y"}}}'),
    "tensor_index_out_of_range": _frame(b'{"ok": true, "result": {"tensor": 3}}'),
    "negative_handle": _frame(b'{"ok": true, "result": {"handle": -1}}'),
    "mutated_not_names": _frame(b'{"ok": true, "result": 1, "mutated": [1]}'),
    "tensor_bytes_short": _frame(
        b'{"ok": true, "result": {"tensor": 0}, "tensors": [{"dtype": "float32", "shape": [4], "nbytes": 16}]}',
        b"\0" * 8,
    ),
    "tensor_bad_dtype": _frame(
        b'{"ok": true, "result": {"tensor": 0}, "tensors": [{"dtype": "object", "shape": [1], "nbytes": 8}]}',
        b"\0" * 8,
    ),
    "tensor_too_big": _frame(
        b'{"ok": true, "result": {"tensor": 0}, "tensors": [{"dtype": "uint8", "shape": [100000, 100000], "nbytes": 10000000000}]}'
    ),
    "header_length_past_body": struct.pack("<Q", 16) + struct.pack("<Q", 1 << 40) + b"{}      ",
    "oversize": struct.pack("<Q", protocol.MAX_REPLY + 1),
    "tiny_length": struct.pack("<Q", 3) + b"abc",
    # bounded before parsing (a 64 MB header of empty lists cost the grader ~3.5 GB and ~50 s)
    "header_too_large": _frame(b'{"ok": true, "result": "' + b"x" * protocol.MAX_HEADER + b'"}'),
    "too_many_containers": _frame(b'{"ok": true, "result": [' + b"[]," * 200_000 + b"[]]}"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_frames_are_protocol_errors(name):
    r, w = os.pipe()
    try:
        os.write(w, MALFORMED[name][:60000])
        if len(MALFORMED[name]) > 60000:  # a big frame: through a thread
            import threading

            threading.Thread(
                target=os.write, args=(w, MALFORMED[name][60000:]), daemon=True
            ).start()
        with pytest.raises(protocol.ProtocolError):
            header, blobs = protocol.read_frame(r, deadline=None, max_size=protocol.MAX_REPLY)
            protocol.check_reply(header, "call", len(blobs))
    finally:
        os.close(r)
        os.close(w)


def test_header_keys_are_named_tags_and_the_schema_lists_them():
    doc = protocol.__doc__
    for tag in protocol.VALUE_TAGS:
        assert f'"{tag}"' in doc, tag
        assert len(tag) > 2
    assert json.loads(json.dumps({protocol.TENSOR: 0})) == {"tensor": 0}
