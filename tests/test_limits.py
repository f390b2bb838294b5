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


def test_every_way_of_building_limits_checks_them():
    """``__post_init__``: the constructor, ``replace`` and ``dataclasses.replace`` alike refuse a value
    that is not a positive number of the field's type, or limits whose order does not hold."""
    for build in (
        lambda **kw: GradingLimits(**kw),
        lambda **kw: DEFAULT.replace(**kw),
        lambda **kw: dataclasses.replace(DEFAULT, **kw),
    ):
        for name, bad in [
            ("cell_seconds", "not a number"),
            ("cell_seconds", 0),
            ("memory_bytes", -1),
            ("memory_bytes", 1.5),
            ("shown_chars", True),
            ("budget_seconds", float("nan")),
        ]:
            with pytest.raises(UnknownLimit, match=name):
                build(**{name: bad})
        with pytest.raises(UnknownLimit, match="'call_seconds'.*'check_seconds'"):
            build(call_seconds=100.0)
        with pytest.raises(UnknownLimit, match="'shown_cell_outputs'.*'shown_notebook_outputs'"):
            build(shown_notebook_outputs=10)
        with pytest.raises(UnknownLimit, match="wall_factor"):
            build(wall_factor=0.5)
    got = dataclasses.replace(DEFAULT, memory_bytes=2.0 * 1024**3, cell_seconds=8)
    assert (got.memory_bytes, got.cell_seconds) == (2 * 1024**3, 8.0)
    assert isinstance(got.memory_bytes, int) and isinstance(got.cell_seconds, float)


def test_every_field_has_a_docstring_and_the_help_lists_them(capsys):
    from mlbook_tools.limits import field_docs, help_text

    docs = field_docs()
    assert list(docs) == GradingLimits.names() and all(docs.values())
    assert help_text().splitlines()[0] == f"  cell_seconds = 20.0: {docs['cell_seconds']}"
    with pytest.raises(SystemExit):
        cli.main(["grade", "--help"])
    shown = capsys.readouterr().out
    assert all(f"  {name} = " in shown for name in GradingLimits.names())
    assert "--budget S, --timeout S" in shown  # one name, the old one kept as an alias


def test_the_budget_has_one_name_on_the_command_line(monkeypatch):
    from mlbook_tools import classgrade, classreport

    got = {}
    monkeypatch.setattr(classgrade, "grade_class", lambda *a, **kw: got.update(kw) or {})
    monkeypatch.setattr(classreport, "class_summary", lambda results: 0)
    course = str(pathlib.Path(__file__).resolve().parents[1] / "autograde")
    args = ["grade-class", "--course", course, "--no-sandbox"]
    assert cli.main([*args, "--budget", "42", "--limit", "budget_seconds=7"]) == 0
    assert got["limits"] == DEFAULT.replace(budget_seconds=42.0) and "budget" not in got

    from mlbook_tools import grading
    from mlbook_tools.result import GradingResult

    for flag in ("--budget", "--timeout"):  # --timeout: mlbook grade's old name, an alias
        got.clear()
        monkeypatch.setattr(
            grading, "grade_notebook", lambda *a, **kw: got.update(kw) or GradingResult()
        )
        cli.main(["grade", "x.ipynb", "--no-sandbox", flag, "9"])
        assert got["limits"].budget_seconds == 9.0 and "budget" not in got


def test_the_readme_limits_table_is_generated_from_the_fields():
    from mlbook_tools.limits import markdown_table

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    begin = "<!-- limits table: generated by `mlbook limits --markdown`, do not edit by hand -->\n"
    end = "<!-- end of limits table -->"
    assert begin in readme and end in readme, "README.md lost its limits table's markers"
    table = readme.split(begin, 1)[1].split(end, 1)[0]
    assert table == markdown_table(), (
        "README.md's limits table differs from GradingLimits: paste `mlbook limits --markdown` "
        "between its markers"
    )
