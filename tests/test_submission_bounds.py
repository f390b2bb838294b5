"""A submission is bounded before it is parsed (``bounds.scan``, ``driver.bounded``): crafted bytes.

The scan sees the JSON's structure as the parser will (strings, escapes, nesting), counts its values,
refuses what is graded past a bound and leaves out what a notebook stores beside its code past one.
Fast: no sandbox, no subprocess (test_bounds.py has the class worker's backstop, a subprocess).
"""

from __future__ import annotations

import json
import time

import nbformat
import pytest
from mlbook_tools import bounds, driver
from mlbook_tools.config import layout
from mlbook_tools.limits import DEFAULT

pytestmark = pytest.mark.unit

ROOT = layout().root
SOLVED = ROOT / "solutions" / "notebooks" / "rlhf_ppo.ipynb"
SOURCE = ROOT / "autograde" / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb"


def _nb(cells, metadata=None, version=4) -> dict:
    return {"cells": cells, "metadata": metadata or {}, "nbformat": version, "nbformat_minor": 5}


def _code(source="x = 1\n", **parts) -> dict:
    return {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {},
        "outputs": [],
        "source": source,
        **parts,
    }


def _scan(nb, **limits):
    text = nb if isinstance(nb, bytes) else json.dumps(nb).encode()
    return bounds.scan(text, DEFAULT.replace(**limits))


def _bomb(mb: int = 18) -> bytes:
    """The solved notebook with a first cell the student added: ``mb`` MB of ``{}`` in its metadata."""
    n = mb * 1024**2 // 3
    nb = json.loads(SOLVED.read_text())
    nb["cells"].insert(0, _code("y = 1\n", metadata={"x": "PLACE"}))
    return json.dumps(nb).encode().replace(b'"PLACE"', b"[" + b"{}," * (n - 1) + b"{}]")


# ------------------------------------------------------------------------------ what the scan sees


def test_values_and_nesting_are_counted_outside_strings_only():
    text = b'{"cells": [], "metadata": {"a": [1, 2, {}], "b": "x{[,\\"{[", "c": "\\\\"}, "nbformat": 4}'
    got = bounds.scan(text)
    # outside strings: the containers { [ { [ {} (5) and the commas (6); those in "b" are in a string
    assert got.values == 11, got
    assert json.loads(got.text) == json.loads(text)  # nothing left out: unchanged
    # an escaped backslash before the closing quote ends the string: the {} after it count
    assert bounds.scan(b'{"cells": [], "metadata": {"k": ["\\\\", {}]}}').values == 7


def test_a_key_written_with_escapes_is_still_recognised():
    big = [{"output_type": "stream", "name": "stdout", "text": "x" * 1000}] * 20
    text = json.dumps(_nb([_code(outputs=big)])).replace('"outputs"', '"outp\\u0075ts"')
    got = bounds.scan(text.encode(), DEFAULT.replace(max_output_bytes=5000))
    assert json.loads(got.text)["cells"][0]["outputs"] == [] and got.notes


def test_the_empty_dict_bomb_is_left_out_in_seconds_and_the_code_kept():
    raw = _bomb()
    assert len(raw) < DEFAULT.max_notebook_bytes  # inside every size bound of the file
    t0 = time.monotonic()
    data, notes = driver.bounded(raw)
    took = time.monotonic() - t0
    assert took < 5, took  # was ~60 s to plan and ~140 s more to copy, 8 GB of memory
    assert data["cells"][0]["metadata"] == {} and data["cells"][0]["source"] == "y = 1\n"
    assert len(notes) == 1 and "cell 1's stored metadata (18.0 MB" in notes[0], notes
    solved = json.loads(SOLVED.read_text())
    assert [c["source"] for c in data["cells"][1:]] == [c["source"] for c in solved["cells"]]


def test_a_stripped_metadata_keeps_its_nbgrader_entry():
    nbgrader = {
        "grade": False,
        "grade_id": "gae",
        "locked": False,
        "schema_version": 3,
        "solution": True,
    }
    deep = json.loads("[" * 100 + "]" * 100)
    nb = _nb([_code(metadata={"junk": deep, "nbgrader": nbgrader, "tags": ["a"]})])
    got = _scan(nb)
    assert json.loads(got.text)["cells"][0]["metadata"] == {"nbgrader": nbgrader}
    assert "104 levels deep) left out" in got.notes[0], got.notes
    # after parsing, every cell keeps only its nbgrader metadata (small ones too)
    small = _nb([_code(metadata={"nbgrader": nbgrader, "tags": ["a"]}), _code(metadata={"x": 1})])
    data, notes = driver.bounded(json.dumps(small))
    assert [c["metadata"] for c in data["cells"]] == [{"nbgrader": nbgrader}, {}] and not notes


def test_stored_parts_are_kept_in_file_order_while_they_fit():
    out = [{"output_type": "stream", "name": "stdout", "text": "x" * 500}]
    nb = _nb(
        [
            _code("a = 1\n", outputs=out),
            _code("b = 2\n", outputs=out * 3),
            _code("c = 3\n", outputs=out),
        ]
    )
    got = _scan(nb, max_output_bytes=1200)
    kept = [len(c["outputs"]) for c in json.loads(got.text)["cells"]]
    assert kept == [1, 0, 1], kept  # the second did not fit, the third still did
    assert len(got.notes) == 1 and got.notes[0].startswith("cell 2's stored outputs")
    assert [c["source"] for c in json.loads(got.text)["cells"]] == ["a = 1\n", "b = 2\n", "c = 3\n"]


def test_the_notebooks_own_metadata_is_left_out_past_a_bound():
    nb = _nb([_code()], metadata={"deep": json.loads("[" * 80 + "]" * 80)})
    got = _scan(nb)
    assert json.loads(got.text)["metadata"] == {} and got.notes[0].startswith("the notebook's")


# ------------------------------------------------------------------------------ what is refused


@pytest.mark.parametrize(
    "what, text, error, line",
    [
        (
            "values in sources",
            json.dumps(_nb([_code([""] * 2000)])),
            bounds.TooLarge,
            "JSON values outside stored outputs and metadata (limit 1000)",
        ),
        (
            "nesting in sources",
            json.dumps(_nb([_code(json.loads("[" * 80 + "]" * 80))])),
            bounds.TooLarge,
            "nested more than 64",
        ),
        (
            "nesting outside the cells",
            '{"cells": [], "extra": ' + "[" * 200_000 + "]" * 200_000 + "}",
            bounds.TooLarge,
            "nested more than 64",
        ),
        ("unbalanced", '{"cells": [', driver.CannotGrade, "brackets do not balance"),
        (
            "not a list",
            '{"cells": 5, "metadata": [], "nbformat": 4}',
            driver.CannotGrade,
            "not a readable notebook",
        ),
        ("not an object", "[1, 2]", driver.CannotGrade, "not a readable notebook"),
        ("empty", "  ", driver.CannotGrade, "it is empty"),
        (
            "keys",
            '{"cells": [{' + ",".join(f'"k{i}": 0' for i in range(100)) + "}]}",
            driver.CannotGrade,
            "100 keys in 1 cells",
        ),
        (
            "nbformat 3",
            json.dumps(
                {
                    "worksheets": [{"cells": [{"cell_type": "code", "input": "x" * 100}]}],
                    "metadata": {},
                    "nbformat": 3,
                }
            ),
            bounds.OldFormat,
            "nbformat 3 notebook: open and save it in JupyterLab to convert it",
        ),
    ],
)
def test_what_is_graded_past_a_bound_is_refused_in_one_line(what, text, error, line):
    limits = DEFAULT.replace(max_json_values=1000)
    t0 = time.monotonic()
    with pytest.raises(error) as err:
        driver.parse_submission(text, limits)
    assert time.monotonic() - t0 < 2, what
    assert line in str(err.value) and "\n" not in str(err.value), (what, str(err.value))


def test_a_large_nbformat_3_notebook_is_refused_before_it_is_graded():
    """15 MB of v3 ``input`` slipped the 4 MB source bound (and was graded 10/10)."""
    v3 = {
        "worksheets": [{"cells": [{"cell_type": "code", "input": ["x = 1\n"] * 1_300_000}]}],
        "metadata": {},
        "nbformat": 3,
        "nbformat_minor": 0,
    }
    source_nb = nbformat.read(SOURCE, as_version=4)
    with pytest.raises(
        driver.CannotGrade, match=r"^nbformat 3 notebook: open and save it in JupyterLab"
    ):
        driver.make_plan(source_nb, json.dumps(v3))


def test_a_released_and_a_solved_notebook_pass_unchanged():
    for path in (SOURCE, SOLVED, ROOT / "chapters" / "rlhf_ppo.ipynb"):
        raw = path.read_bytes()
        got = bounds.scan(raw)
        assert got.text == raw and not got.notes and got.values < DEFAULT.max_json_values / 10


def test_ordinary_notebooks_are_within_every_bound():
    driver.check_bounds(SOLVED.read_text())
    driver.check_bounds(SOURCE.read_text())
