"""Grading with the real nbgrader: the course's export (`python -m qwen_lab.exercises nbgrader`), then
`nbgrader generate_assignment` and `nbgrader autograde` on chapter 02, as an instructor would run them.

Two learners hand in chapter 02: one filled every solution cell with the course's solution, one handed in the
released notebook untouched. The autograder runs both notebooks in a Jupyter kernel (the kernels through the Triton
interpreter on a CPU, about a minute) and must give 4 of 4 points and 0 of 4.
"""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the exercise tooling needs nbformat (requirements.txt)")
pytest.importorskip("nbgrader", reason="grading needs nbgrader (requirements.txt: pip install -r requirements.txt "
                                       "-c constraints.txt)")
from nbgrader.api import Gradebook  # noqa: E402

from qwen_lab.course import exercises as ex  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHAPTER = "02_rmsnorm"
MARKERS = (ex.BEGIN, ex.END, ex.MD_BEGIN, ex.MD_END)


def _run(args, course: Path):
    """One nbgrader command in the course directory. nbgrader calls the `alembic` script beside its Python, and the
    notebooks' kernel imports this checkout's qwen_lab (not a copy from the network: the setup cell installs one
    only when qwen_lab cannot be imported)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([sysconfig.get_path("scripts"), os.path.dirname(sys.executable), env["PATH"]])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={course}"], cwd=course,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _submit(course: Path, student: str, nb) -> None:
    target = course / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb"
    target.parent.mkdir(parents=True)
    nbformat.write(nb, str(target))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The course exported, chapter 02 released, two submissions autograded: (course dir, released notebook)."""
    course = tmp_path_factory.mktemp("nbgrader") / "course"
    report = ex.export_nbgrader(course, REPO / "solutions")
    assert report.notebooks == len(list((REPO / "solutions").glob("*.ipynb")))
    _run(["generate_assignment", CHAPTER], course)
    released = nbformat.read(str(course / "release" / CHAPTER / f"{CHAPTER}.ipynb"), as_version=4)
    source = nbformat.read(str(course / "source" / CHAPTER / f"{CHAPTER}.ipynb"), as_version=4)
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    # the filled submission: the released notebook, each solution cell's stub replaced by the solution (what a
    # learner who solved every exercise hands in)
    filled = nbformat.from_dict(released)
    for cell in filled.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = "\n".join(line for line in solutions[meta["grade_id"]].splitlines()
                                    if line.strip() not in MARKERS)
    _submit(course, "filled", filled)
    _submit(course, "blank", released)
    _run(["autograde", CHAPTER], course)
    return course, released


def test_generate_assignment_releases_the_learners_notebook(graded):
    """nbgrader strips every solution of chapter 02 and writes the course's stub in its place."""
    _, released = graded
    solution_cells = [c for c in released.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert len(solution_cells) == len(ex.list_exercises(REPO / "solutions" / f"{CHAPTER}.ipynb"))
    text = "\n".join(c.source for c in released.cells)
    assert not any(marker.replace("#", "").strip() in text for marker in MARKERS), "a solution marker survived"
    for cell in solution_cells:
        if cell.cell_type == "code":
            assert ex.NBGRADER_STUB in cell.source, cell.source
    checks = [c for c in released.cells if ex.CHECK_TAG in c.metadata.get("tags", [])]
    assert checks and all(c.metadata["nbgrader"]["locked"] and c.metadata["nbgrader"]["points"] == 1 for c in checks)


def test_autograde_gives_full_marks_to_the_solution_and_none_to_a_blank(graded):
    course, _ = graded
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        scores = {who: (gb.find_submission(CHAPTER, who).code_score, gb.find_submission(CHAPTER, who).max_code_score)
                  for who in ("filled", "blank")}
    assert scores == {"filled": (4, 4), "blank": (0, 4)}, scores
    # the blank notebook's four checks failed on the stubs, saying an exercise is unfinished (not on a broken notebook)
    blank = nbformat.read(str(course / "autograded" / "blank" / CHAPTER / f"{CHAPTER}.ipynb"), as_version=4)
    errors = [o for c in blank.cells if ex.CHECK_TAG in c.metadata.get("tags", []) for o in c.outputs
              if o.output_type == "error"]
    assert len(errors) == 4, [(o.ename, o.evalue) for o in errors]
    assert all("Exercise" in o.evalue for o in errors), [(o.ename, o.evalue) for o in errors]
