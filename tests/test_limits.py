"""GradingLimits: one frozen dataclass, its defaults in one place, every way of setting a limit
refusing a name it does not know (a typo never passes silently)."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
from mlbook_tools import cli
from mlbook_tools.grading import course_limits
from mlbook_tools.limits import DEFAULT, GradingLimits, UnknownLimit
from mlbook_tools.plugins import SandboxedExecute

pytestmark = pytest.mark.unit


def test_limits_are_frozen_and_replace_refuses_unknown_names():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.memory_bytes = 1  # type: ignore[misc]
    assert DEFAULT.replace(cell_seconds=8.0).cell_seconds == 8.0 and DEFAULT.cell_seconds == 20.0
    with pytest.raises(UnknownLimit, match="'cell_secs'.*cell_seconds"):
        DEFAULT.replace(cell_secs=8.0)


def test_a_dict_round_trips_and_is_checked():
    changed = DEFAULT.replace(memory_bytes=2 * 1024**3, cpus=0.5)
    assert GradingLimits.from_dict(changed.to_dict()) == changed
    with pytest.raises(UnknownLimit, match="'memroy_bytes'"):
        GradingLimits.from_dict({"memroy_bytes": 1})
    for bad in ("not a number", -1, 0, True, 1.5):  # 1.5: memory is a whole number of bytes
        with pytest.raises(UnknownLimit, match="memory_bytes"):
            GradingLimits.from_dict({"memory_bytes": bad})


def test_command_line_options_parse_by_the_fields_type():
    got = DEFAULT.with_options(["memory_bytes=2147483648", "cell_seconds = 7.5", "max_cells=1e3"])
    assert (got.memory_bytes, got.cell_seconds, got.max_cells) == (2 * 1024**3, 7.5, 1000)
    assert isinstance(got.max_cells, int)
    with pytest.raises(UnknownLimit, match="name=value"):
        DEFAULT.with_options(["memory_bytes"])


def test_mlbook_grade_refuses_an_unknown_limit(capsys):
    assert cli.main(["grade", "x.ipynb", "--limit", "cel_seconds=3"]) == 1
    err = capsys.readouterr().err
    assert "unknown grading limit 'cel_seconds'" in err and "cell_seconds" in err


def test_the_course_config_sets_limits_and_refuses_unknown_ones(tmp_path: pathlib.Path):
    assert course_limits(tmp_path) == DEFAULT  # no config: the defaults
    (tmp_path / "nbgrader_config.py").write_text(
        "c = get_config()\nc.SandboxedExecute.limits = {'memory_bytes': 2 * 1024**3}\n"
        "c.SandboxedExecute.budget = 60\n"
    )
    assert course_limits(tmp_path) == DEFAULT.replace(memory_bytes=2 * 1024**3, budget_seconds=60.0)
    (tmp_path / "nbgrader_config.py").write_text(
        "c = get_config()\nc.SandboxedExecute.limits = {'memory': 1}\n"
    )
    with pytest.raises(UnknownLimit, match="'memory'"):
        course_limits(tmp_path)
    with pytest.raises(UnknownLimit, match="'memory'"):
        SandboxedExecute(limits={"memory": 1})


def test_the_repo_course_config_loads_with_the_defaults():
    from mlbook_tools.config import layout

    assert course_limits(layout().course) == DEFAULT


def test_the_json_value_count_is_a_whole_positive_limit_the_scan_obeys():
    from mlbook_tools import bounds

    got = DEFAULT.with_options(["max_json_values=2e5"])
    assert got.max_json_values == 200_000 and isinstance(got.max_json_values, int)
    for bad in ("1.5", "0", "-3"):
        with pytest.raises(UnknownLimit, match="max_json_values"):
            DEFAULT.with_options([f"max_json_values={bad}"])
    text = b'{"cells": [{"cell_type": "code", "source": ["a", "b", "c"]}], "nbformat": 4}'
    bounds.scan(text, DEFAULT.replace(max_json_values=8))  # { [ { [ and four commas
    with pytest.raises(bounds.TooLarge, match=r"8 JSON values .*\(limit 7\)"):
        bounds.scan(text, DEFAULT.replace(max_json_values=7))
