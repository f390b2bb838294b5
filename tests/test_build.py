"""What `mlbook build` stores for nbval, read without running a notebook (unit; test_nbval_checks.py runs
nbval and a kernel): only cells tagged nbval-check-output hold outputs, nbgrader keeps the tags in the
release, every sanitizer rule masked a stored output, and `build --check` reports a checked cell
without one. And what it writes for students: `make chapter` writes notebooks only through `mlbook
build`, and the release carries no jupytext pairing. And `make html`'s executor (tests/test_progress.py
runs it): the section headings it shows, the Makefile's call, outputs recorded whatever the flushes.
"""

import json
import re
import subprocess

import nbformat
import pytest
from mlbook_tools.build import COURSE, RAISES
from mlbook_tools.config import layout
from mlbook_tools.execute import heading
from mlbook_tools.recorded import CHECK_OUTPUT, NOT_RECORDED, reuse_outputs
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from nbval_support import RELEASE, ROOT, SANITIZE, SOLVED
from nbval_support import checked as _checked
from nbval_support import code_cells as _code

pytestmark = pytest.mark.unit


def _stored_text(cell):
    return "".join(
        o.get("text", "") + "".join(o.get("data", {}).values())
        for o in cell.outputs
        if o.output_type != "error"
    )


def test_checked_cells_hold_their_outputs_and_nothing_else_does():
    for path in SOLVED:
        cells = _code(nbformat.read(path, as_version=4))
        checked = [c for c in cells if _checked(c)]
        assert checked, f"{path.name}: no output-checked cell"
        for c in cells:
            if _checked(c):
                assert c.execution_count is not None, (
                    f"{path.name}:{c.id} is checked but was never recorded"
                )
                assert NOT_RECORDED not in _stored_text(c), (
                    f"{path.name}:{c.id}: run `mlbook build`"
                )
            else:
                assert c.execution_count is None and not c.outputs, (
                    f"{path.name}:{c.id} stores an unchecked output"
                )


def test_nbgrader_keeps_the_tags_in_the_release():
    source = nbformat.read(
        ROOT / "autograde" / "source" / "rlhf_ppo" / "rlhf_ppo.ipynb", as_version=4
    )
    release = {c.id: c for c in nbformat.read(RELEASE, as_version=4).cells}
    tagged = [  # the course's own instruction cells are not in the self-paced release
        c for c in source.cells if c.metadata.get("tags") and COURSE not in c.metadata["tags"]
    ]
    assert any(RAISES in c.metadata["tags"] for c in tagged) and any(
        CHECK_OUTPUT in c.metadata["tags"] for c in tagged
    )
    for cell in tagged:
        assert release[cell.id].metadata.get("tags") == cell.metadata["tags"], (
            f"{cell.id}: tags lost in the release"
        )


def _rules():
    return re.findall(r"^regex: (.*)$\n^replace: (.*)$", SANITIZE.read_text(), flags=re.MULTILINE)


def test_every_sanitizer_rule_masked_a_stored_output():
    """No dead rule: each one has masked part of a recorded line (the build stores outputs sanitized)
    and would match that line again with a number in place of each mask; the rest of the line stays."""
    stored = [
        _stored_text(c)
        for path in SOLVED
        for c in _code(nbformat.read(path, as_version=4))
        if _checked(c)
    ]
    lines = [line for text in stored for line in text.splitlines()]
    assert _rules()
    for regex, _ in _rules():
        assert not any(re.search(regex, line) for line in lines), (
            f"{regex!r}: a stored output was not sanitized"
        )
        masked = [line for line in lines if re.search(regex, re.sub(r"<[a-z]+>", "1", line))]
        assert masked, f"sanitizer rule {regex!r} masked no stored output"
        assert all(len(re.sub(r"<[a-z]+>", "", line)) > 20 for line in masked), masked


def test_check_mode_reports_a_checked_cell_without_stored_output(tmp_path):
    """`mlbook build --check` does not execute: a checked cell with no recorded output must differ."""
    cell = nbformat.v4.new_code_cell("print(6 * 7)", metadata={"tags": [CHECK_OUTPUT]}, id="c1")
    nb = nbformat.v4.new_notebook(cells=[cell])
    stored = tmp_path / "nb.ipynb"
    nbformat.write(nb, stored)  # never executed: no outputs, no execution count
    assert reuse_outputs(nb, stored).cells[0].outputs[0].text == NOT_RECORDED
    cell.outputs, cell.execution_count = (
        [nbformat.v4.new_output("stream", name="stdout", text="42\n")],
        7,
    )
    nbformat.write(nb, stored)
    fresh = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("print(6 * 7)", metadata=cell.metadata, id="c1")]
    )
    reused = reuse_outputs(fresh, stored).cells[0]
    assert reused.outputs[0].text == "42\n" and reused.execution_count == 1
    fresh.cells[
        0
    ].source = "print(6 * 8)"  # edited source: the stored output no longer belongs to it
    assert reuse_outputs(fresh, stored).cells[0].outputs[0].text == NOT_RECORDED


def _run(cmd, cwd=ROOT):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)


def test_make_chapter_writes_notebooks_only_through_mlbook_build():
    """`make chapter` is slow; its dry run shows that the generated notebooks are written only by
    `mlbook build` (the guarded writer) and that the execution and nbconvert write only under build/."""
    dry = _run(["make", "-n", "chapter"]).stdout.replace("\\\n", " ")
    lines = [ln for ln in dry.splitlines() if ln.strip()]
    assert any(ln.strip().endswith("/mlbook build") for ln in lines), dry
    for ln in lines:
        if "nbconvert" in ln or "mlbook_tools.execute" in ln:
            assert re.search(r"--output-dir build[/ ]", ln), ln
        assert "chapters/" not in ln and ">" not in ln.replace("->", ""), ln


def test_released_notebook_carries_no_jupytext_pairing():
    """JupyterLab with jupytext would write a paired .py beside every student copy."""
    for path in layout().release.glob("*.ipynb"):
        assert "jupytext" not in json.loads(path.read_text())["metadata"], path
    for path in layout().release.glob("*.py"):
        assert "formats:" not in path.read_text().split("# ---", 2)[1], path


def test_headings():
    assert heading(new_markdown_cell("Intro\n## 3.2 GAE\nmore")) == "3.2 GAE"
    assert heading(new_markdown_cell("#### too deep")) is None
    assert heading(new_markdown_cell("#hashtag, not a heading")) is None
    assert heading(new_code_cell("# a comment")) is None


def test_make_html_executes_through_it():
    """The Makefile's html target runs this module with what nbconvert had: TQDM_DISABLE, the
    600 s cell timeout, build/executed, every solved notebook."""
    text = (layout().root / "Makefile").read_text()
    target = text[text.index("\nhtml:") : text.index("\nchapter:")].replace("\\\n", " ")
    assert re.search(
        r"TQDM_DISABLE=1 \$\(BIN\)/python -m mlbook_tools\.execute --timeout 600\s+"
        r"--output-dir \$\(OUT\)/executed solutions/notebooks/\*\.ipynb",
        target,
    ), target
    assert "nbconvert --to notebook" not in target


def test_recorded_outputs_do_not_depend_on_how_the_kernel_flushed():
    """Found by following the README: a second `mlbook build` rewrote the solved notebook because one
    cell's printing arrived as two stream messages instead of one (a flush timing, not a change)."""
    from mlbook_tools.recorded import CHECK_OUTPUT, _keep_checked_outputs
    from nbformat.v4 import new_output

    def recorded(outputs):
        cell = new_code_cell("print('a'); print('b')", metadata={"tags": [CHECK_OUTPUT]})
        cell.outputs = outputs
        nb = new_notebook(cells=[cell])
        _keep_checked_outputs(nb)
        return [(o.output_type, o.get("name"), o.get("text")) for o in nb.cells[0].outputs]

    def out(name, text):
        return new_output("stream", name=name, text=text)

    whole = recorded([out("stdout", "a\nb\n"), out("stderr", "w\n"), out("stdout", "c\n")])
    split = recorded(
        [out("stdout", "a\n"), out("stdout", "b\n"), out("stderr", "w\n"), out("stdout", "c\n")]
    )
    assert (
        split
        == whole
        == [
            ("stream", "stdout", "a\nb\n"),
            ("stream", "stderr", "w\n"),
            ("stream", "stdout", "c\n"),
        ]
    )
