"""What a student and an instructor read: verdicts as cell outputs, the autograded notebook, the
feedback page's preprocessors (nbgrader ``GenerateFeedback``). Hidden tests are stripped and a
verdict becomes a cell's output in one place each (``strip_hidden_tests``, ``verdict_outputs``);
every cell of the student's passes ``inert.sanitize_cell`` and every text from a student's code
``inert.capped`` (printable and capped): the rules about student text are inert.py's. Nothing here
imports the grading engine."""

from __future__ import annotations

import copy

from nbconvert.preprocessors import Preprocessor
from nbgrader.preprocessors import GetGrades

from mlbook_tools.cells import grade_id, is_graded, is_solution, is_test, nbgrader
from mlbook_tools.cells import points as cell_points
from mlbook_tools.inert import capped, fold_outputs, printable, sanitized
from mlbook_tools.limits import DEFAULT, GradingLimits, limits_from_config
from mlbook_tools.notebook_order import merged
from mlbook_tools.result import CellGrade, GradingResult, is_extra

HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def strip_hidden_tests(source: str) -> str:
    """A test cell's source without its hidden-test regions (the marker lines included)."""
    kept, hidden = [], False
    for line in source.split("\n"):
        if HIDDEN_BEGIN in line:
            hidden = True
        elif HIDDEN_END in line:
            hidden = False
        elif not hidden:
            kept.append(line)
    return "\n".join(kept)


def grading_notes(notes: list) -> str:
    """The grader's notes as markdown whose every note shows as the text it is: an error's message or
    a file's name may be the student's (``<img src=/logout>`` is shown, not fetched)."""
    import html

    items = "".join(
        f"<li><code>{html.escape(printable(str(n)).replace(chr(10), ' '))}</code></li>"
        for n in notes
    )
    return f"**Grading notes**\n\n<ul>{items}</ul>\n"


def verdict_outputs(grade: CellGrade | None, limits: GradingLimits = DEFAULT) -> list:
    """A test cell's outputs for a verdict: ``passed (2 / 2)`` on stdout, else the message as an
    AssertionError (capped, printable); no verdict at all is "not graded"."""
    import nbformat

    if grade is not None and grade.passed:
        return [
            nbformat.v4.new_output(
                "stream", name="stdout", text=f"passed ({grade.score:g} / {grade.max_score:g})\n"
            )
        ]
    message = capped((grade.message or "") if grade is not None else "not graded", limits)
    return [
        nbformat.v4.new_output(
            "error",
            ename="AssertionError",
            evalue=message,
            traceback=[f"AssertionError: {message}"],
        )
    ]


def _shown_added(cell) -> bool:
    """Whether an added cell appears in the autograded notebook: code and markdown the student wrote;
    never a cell carrying a grade id the course does not have (nbgrader would look that grade up)."""
    if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown"):
        return False
    return nbgrader(cell).get("grade_id") is None


def _part_of_written_answer(mine, parts, cells, limits: GradingLimits) -> bool:
    """A split half of a written (markdown) answer is appended to the graded cell above it (the last
    one of ``cells``), so the grader reads the whole answer in the cell the grade belongs to."""
    if not any(mine is p for p in parts) or not cells or cells[-1].cell_type != "markdown":
        return False
    if not isinstance(mine, dict) or mine.get("cell_type") != "markdown":
        return False
    text = mine.get("source", "")
    text = "".join(text) if isinstance(text, list) else str(text)
    graded = cells[-1]
    graded.source = graded.source.rstrip("\n") + "\n\n" + text if graded.source.strip() else text
    if images := sanitized(mine, True, limits).get("attachments"):  # the student's images only
        graded.attachments = {**graded.get("attachments", {}), **images}
    return True


def autograded_notebook(source_nb, plan, result: GradingResult, limits: GradingLimits = DEFAULT):
    """The notebook nbgrader's feedback and formgrader read: source order, locked cells restored,
    verdicts as outputs. Every student cell passes ``sanitize_cell`` (inert.py): an added one is
    shown sanitised; of a course cell's copy, the sanitised outputs and attachments are kept."""
    import nbformat

    student = plan.notebook if plan is not None else None
    order, placement = merged(source_nb.cells, student.cells if student is not None else [])
    cells = []
    if result.error or result.problems:
        notes = ([result.error] if result.error else []) + (result.problems or [])
        cells.append(nbformat.v4.new_markdown_cell(grading_notes(notes)))
    for kind, where, mine in order:
        if kind == "added":  # shown where the student put it (the plan ran it there), inert
            if _part_of_written_answer(mine, placement.parts.get(where, ()), cells, limits):
                continue  # merged into the written answer above
            if (
                grade_id(mine) in placement.copies
            ):  # a further copy of an answer: the student's cell
                mine = copy.deepcopy(mine)
                mine["metadata"] = {}
            if _shown_added(mine):
                cells.append(sanitized(mine, True, limits))
            continue
        src = where
        gid, graded, answer = grade_id(src), is_graded(src), is_solution(src)
        cell = copy.deepcopy(src)
        # the student's copy, as the course cell's type, sanitised: its outputs and images are kept
        clean = (
            sanitized({**mine, "cell_type": cell.cell_type}, False, limits)
            if mine is not None
            else None
        )
        if answer and mine is not None:
            text = mine.get("source", "")
            cell.source = "".join(text) if isinstance(text, list) else str(text)
            if cell.cell_type == "markdown":  # the student's images only
                cell.pop("attachments", None)
                if images := clean.get("attachments"):
                    cell.attachments = images
        elif answer:
            cell.source = ""
        if cell.cell_type == "code":
            cell.source = strip_hidden_tests(cell.source).rstrip() if graded else cell.source
            cell.outputs = clean["outputs"] if mine is not None and not graded else []
            cell.execution_count = None
            if graded and gid in result.grades:
                cell.outputs = verdict_outputs(result.grades[gid], limits)
        cells.append(cell)
    fold_outputs(cells, limits)  # a page shows the notebook's first outputs only (inert.py)
    nb = nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(source_nb.metadata))
    if result.error:  # refused or unreadable: formgrader's page and the feedback say so (flags.py)
        from mlbook_tools.flags import from_error

        nb.metadata.setdefault("mlbook", {})["flag"] = from_error(result.error).to_dict()
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
        if cell.cell_type != "code":
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
    return nb


# ------------------------------------------------------------------ the feedback page


class RedactHiddenTests(Preprocessor):
    """For feedback: drop hidden-test regions and cut test-cell tracebacks down to ``Error: message``.

    nbgrader's ClearHiddenTests removes the hidden source, but an error's traceback quotes the
    hidden lines that raised it; students keep the message (written for them) and nothing else.
    """

    enabled = True

    def preprocess_cell(self, cell, resources, index):
        if not is_test(cell):
            return cell, resources
        cell.source = strip_hidden_tests(cell.source)
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                out.traceback = [f"{out.ename}: {out.evalue}"]
        return cell, resources


class GetGradesWithStatus(GetGrades):
    """nbgrader's GetGrades, plus what its 0.0 placeholder hides: whether the cell awaits manual grading."""

    def _get_score(self, cell, resources):
        super()._get_score(cell, resources)
        grade = self.gradebook.find_grade(
            grade_id(cell),
            self.notebook_id,
            self.assignment_id,
            self.student_id,
        )
        cell.metadata.nbgrader["needs_manual_grade"] = bool(grade.needs_manual_grade)


class CoreExtraSummary(Preprocessor):
    """For feedback: the header shows the core points and the extra credit apart (the numbers ``mlbook
    grade`` prints), each extra-credit cell its possible points, and ungraded written answers as awaiting."""

    enabled = True

    def preprocess(self, nb, resources):
        import nbformat

        mine = nb.metadata.get("mlbook")
        flag = mine.get("flag") if isinstance(mine, dict) else None
        grades = {}
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if not meta.get("grade"):
                continue
            gid = meta.get("grade_id", "")
            if flag:  # nothing of the file was read: no written answer awaits a person
                meta["needs_manual_grade"] = False
            grades[gid] = CellGrade(
                gid,
                float(meta.get("score") or 0.0),
                cell_points(cell),
                awaiting_manual=bool(meta.get("needs_manual_grade")),
            )
            meta["points"] = cell_points(cell)  # what the cell may earn, shown next to its score
            meta["mlbook_extra_credit"] = is_extra(gid)  # the page's label (result.py decides)
        result = GradingResult(grades)
        core, extra = result.core, result.extra
        waiting = [g.grade_id for g in result.grades.values() if g.awaiting_manual]
        info = resources.setdefault("nbgrader", {})
        info["score"], info["max_score"] = core.score, core.max_score
        info["extra_credit"], info["extra_credit_max"] = extra.score, extra.max_score
        lines = [
            f"**Core: {core.score:g} / {core.max_score:g} points.** Extra credit: {extra.score:g} / {extra.max_score:g} (optional, counted apart)."
        ]
        if isinstance(flag, dict) and flag.get("kind"):
            lines.insert(
                0,
                f"**Not graded ({printable(flag['kind'])}):** {printable(flag.get('reason', ''))}. "
                + printable(flag.get("for_student", "")),
            )
        elif waiting:
            lines.append("Awaiting manual grading: " + ", ".join(waiting) + ".")
        nb.cells.insert(0, nbformat.v4.new_markdown_cell("\n\n".join(lines)))
        return nb, resources


class CapOutputs(Preprocessor):
    """For feedback: every printed output cut to a readable length (a 50 MB line stays out); the
    length is the course config's ``shown_chars`` (``c.SandboxedExecute.limits``)."""

    enabled = True

    def preprocess(self, nb, resources):
        self.limit = limits_from_config(self.config).shown_chars
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and len(out.get("text", "")) > self.limit:
                out["text"] = (
                    out["text"][: self.limit]
                    + f"\n... [{len(out['text']) - self.limit} more characters]"
                )
            for key, value in list(out.get("data", {}).items()):
                if key.startswith("text/") and isinstance(value, str) and len(value) > self.limit:
                    out["data"][key] = value[: self.limit] + "\n... [cut]"
        return cell, resources
