"""The nbgrader export: every solution as an nbgrader source notebook (solution cells, locked autograded check cells,
manually graded written answers) and the course's nbgrader_config.py.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from .building import Report, _clear_run_state, _learner_metadata, default_root
from .cells import DEFAULT_TITLE, _NUMBERED, ExerciseError, _blocks, _is_check, _where, cell_title, stub_line
from .files import _as_notebook, _display, _read, dumps
from .validation import _defined_names, _free_names, _parse, list_exercises, validate

NBGRADER_SCHEMA = 3
# nbgrader replaces each solution block with one stub for every cell. This one is the course's own stub for an
# untitled block: checks.learner_code() recognises it inside a kernel, and check_kernel reports it as unfinished.
NBGRADER_STUB = stub_line(DEFAULT_TITLE)
NBGRADER_CONFIG = f"""\
# nbgrader's settings for the qwen_lab course, written by `python -m qwen_lab.exercises nbgrader`.
c = get_config()  # noqa: F821 (nbgrader defines it)

# The stub nbgrader writes in place of each solution block (its default is a bare NotImplementedError, which a
# Triton kernel compiled for a GPU reports as an unsupported `raise` instead).
c.ClearSolutions.code_stub = {{"python": {NBGRADER_STUB!r}}}
# Notebooks run their kernels through the Triton interpreter on a CPU, where a cell can take a minute or two.
c.Execute.timeout = 1200
"""


def _grade_id(kind: str, title: str | None, taken: set[str]) -> str:
    """A unique nbgrader grade id from the exercise title's number: `exercise-02-1`, then `exercise-02-1-b`..."""
    numbered = _NUMBERED.match(title or "")
    base = f"{kind}-{int(numbered.group(1)):02d}-{numbered.group(2)}" if numbered else kind
    gid, n = base, 0
    while gid in taken:
        n += 1
        gid = f"{base}-{chr(ord('a') + n)}" if n < 26 else f"{base}-{n}"
    taken.add(gid)
    return gid


def _nbgrader_meta(gid: str, *, grade: bool, solution: bool, locked: bool, points: int | None = None):
    meta = {"grade": grade, "grade_id": gid, "locked": locked, "schema_version": NBGRADER_SCHEMA,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return nbformat.from_dict(meta)


def nbgrader_notebook(notebook, name: str = "notebook"):
    """The nbgrader source version of a solution notebook (a new NotebookNode; the argument is not changed).

    The solution blocks stay (nbgrader strips them); cells get nbgrader's metadata (schema 3): an exercise's code
    cell is a solution cell, a check cell an autograded test cell worth 1 point and locked, a written answer
    (markdown) a manually graded answer worth 1 point. Grade ids follow the exercise numbers (`exercise-02-1`,
    `check-02-1`, `check-02-1-b`, `answer-13-2`); a check takes the number of the last exercise whose names it
    uses, or else of the last exercise before it.
    Outputs and run metadata are dropped, and the notebook metadata becomes the learner's (the default python3
    kernel, as in `strip_solutions`). Raises ExerciseError where `validate` finds a problem.
    """
    nb = copy.deepcopy(_as_notebook(notebook))
    problems = validate(nb, name)
    if problems:
        raise ExerciseError(problems)
    taken: set[str] = set()
    last_title = None
    defines = {}   # code exercise title -> the names its cell defines (a check is named after the last it uses)
    for i, cell in enumerate(nb.cells):
        _clear_run_state(cell)
        meta = cell.metadata
        meta.pop("nbgrader", None)
        blocks, _ = _blocks(cell, _where(name, i, cell))
        if blocks:
            last_title = cell_title(cell)
            tree = _parse(cell.get("source", "")) if cell.get("cell_type") == "code" else None
            defines[last_title] = _defined_names(tree) if tree is not None else set()
            if cell.get("cell_type") == "markdown":
                meta["nbgrader"] = _nbgrader_meta(_grade_id("answer", last_title, taken), grade=True,
                                                  solution=True, locked=False, points=1)
            else:
                meta["nbgrader"] = _nbgrader_meta(_grade_id("exercise", last_title, taken), grade=False,
                                                  solution=True, locked=False)
        elif _is_check(cell):
            tree = _parse(cell.get("source", ""))
            used = _free_names(tree) if tree is not None else set()
            graded = [t for t, names in defines.items() if names & used] or [last_title]
            meta["nbgrader"] = _nbgrader_meta(_grade_id("check", graded[-1], taken), grade=True, solution=False,
                                              locked=True, points=1)
    nb.metadata = _learner_metadata(nb.metadata)   # nbgrader copies it into the learners' version
    return nb


def export_nbgrader(out, solutions=None) -> Report:
    """Write the nbgrader course directory `out`: source/NN_name/NN_name.ipynb for every solution (see
    `nbgrader_notebook`) and nbgrader_config.py. Nothing is written when any solution has a problem."""
    solutions = Path(solutions) if solutions is not None else default_root() / "solutions"
    if not solutions.is_dir():
        raise ExerciseError(f"{_display(solutions)}/: no such directory (pass --solutions DIR)")
    out = Path(out)
    texts, report, problems = {}, Report(), []
    for path in sorted(solutions.glob("*.ipynb")):
        try:
            nb = _read(path)
            texts[path.stem] = dumps(nbgrader_notebook(nb, _display(path)))
            report.exercises += len(list_exercises(nb))
        except ExerciseError as e:
            problems.extend(e.problems)
    if problems:
        raise ExerciseError(problems)
    for stem, text in texts.items():
        target = out / "source" / stem / f"{stem}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text.encode("utf-8"))
        report.written.append(_display(target))
    config = out / "nbgrader_config.py"
    config.write_text(NBGRADER_CONFIG, encoding="utf-8")
    report.written.append(_display(config))
    report.notebooks = len(texts)
    return report
