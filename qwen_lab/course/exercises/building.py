"""Building the learner's notebooks: `strip_solutions` makes one notebook's learner's version, `build` writes
notebooks/ from solutions/, `check` compares them, and the default folders are found here.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .cells import (_EDITOR_CELL_METADATA, _NOTEBOOK_METADATA_KEPT, _NOTEBOOK_NAME, _RUN_METADATA, CHECK_TAG,
                    LEARNER_KERNELSPEC, LEARNER_LANGUAGE_INFO, RAISES_TAG, REBUILD, ExerciseError, _blocks, _tags,
                    _stripped_cell_source, _where)
from .files import _as_notebook, _cell_id, _display, _read, dumps
from .validation import list_exercises, validate

# --------------------------------------------------------------------------------------------------
# One notebook: the learner's version
# --------------------------------------------------------------------------------------------------

def _clear_run_state(cell) -> None:
    """Drop what a run leaves in a cell: outputs, execution count, timings and scroll state."""
    meta = cell.setdefault("metadata", nbformat.NotebookNode())
    for key in _RUN_METADATA:
        meta.pop(key, None)
    if cell.get("cell_type") == "code":
        cell["outputs"] = []
        cell["execution_count"] = None


def strip_solutions(notebook):
    """The learner's version of a solution notebook (a new NotebookNode; the argument is not changed).

    Solution blocks become stubs, check cells get the tag `raises-exception`, outputs and run metadata
    go, cell ids are kept (missing ones derived from the cell's position). The editor's cell metadata
    (`editable`, `deletable`, `jupyter` (hidden source or outputs), `nbgrader`, `vscode`, `colab`...) goes;
    the notebook's metadata becomes LEARNER_KERNELSPEC and LEARNER_LANGUAGE_INFO (plus `title` and
    `authors` if the solution has them), so the notebook opens with the default kernel anywhere.
    Raises ExerciseError on markers that cannot be paired and on lines that look like a marker but are not
    one (either would leak a solution); it does not enforce the course's other rules (see `validate`).
    Cells without a title line get the stub `raise NotImplementedError("Exercise: fill in this block")`.
    """
    nb = copy.deepcopy(_as_notebook(notebook))
    problems = []
    for i, cell in enumerate(nb.cells):
        blocks, cell_problems = _blocks(cell, _where("notebook", i, cell))
        problems.extend(cell_problems)
        if blocks and not cell_problems and cell.get("cell_type") in ("code", "markdown"):
            cell["source"] = _stripped_cell_source(cell, blocks)
    if problems:
        raise ExerciseError(problems)

    taken = {c.get("id") for c in nb.cells if c.get("id")}
    seen: set[str] = set()
    for i, cell in enumerate(nb.cells):
        if not cell.get("id") or cell["id"] in seen:
            cell["id"] = _cell_id(i, taken | seen)
        seen.add(cell["id"])
        _clear_run_state(cell)
        for key in _EDITOR_CELL_METADATA:
            cell.metadata.pop(key, None)
        tags = _tags(cell)
        if CHECK_TAG in tags and RAISES_TAG not in tags:
            cell.metadata["tags"] = tags + [RAISES_TAG]
    nb.metadata = _learner_metadata(nb.metadata)
    nb.nbformat, nb.nbformat_minor = 4, max(5, int(nb.get("nbformat_minor", 5)))
    return nb


def _learner_metadata(meta) -> nbformat.NotebookNode:
    """The notebook metadata of a learner's (or nbgrader source) notebook: the fixed kernelspec and language_info,
    and of the solution's own metadata only `title` and `authors`."""
    kept = {k: copy.deepcopy(meta[k]) for k in _NOTEBOOK_METADATA_KEPT if k in meta}
    return nbformat.from_dict({"kernelspec": dict(LEARNER_KERNELSPEC), "language_info": dict(LEARNER_LANGUAGE_INFO),
                               **kept})


def build_notebook(notebook, name: str = "notebook") -> str:
    """Validate one solution notebook and return the text of its learner's version."""
    problems = validate(notebook, name)
    if problems:
        raise ExerciseError(problems)
    return dumps(strip_solutions(notebook))


# --------------------------------------------------------------------------------------------------
# Directories
# --------------------------------------------------------------------------------------------------


def default_root() -> Path:
    """Where solutions/ and notebooks/ are when no option names them: the current directory when it holds
    solutions/ (the checkout you are working in), else the checkout this package was imported from when that has
    solutions/, else the current directory."""
    cwd = Path.cwd()
    if (cwd / "solutions").is_dir():
        return cwd
    here = Path(__file__).resolve().parents[3]   # the checkout above qwen_lab/course/exercises/
    return here if (here / "solutions").is_dir() else cwd


def _default_root_note(root: Path) -> str:
    """Which checkout the default folders came from, for the output line."""
    if root.resolve() == Path.cwd().resolve():
        return "the current directory"
    return f"the checkout of the imported qwen_lab package, {root}"


def resolve_dirs(solutions=None, notebooks=None) -> tuple[Path, Path]:
    """(solutions, notebooks) with their defaults: with only `solutions` given, notebooks/ beside it; with neither,
    solutions/ and notebooks/ of `default_root()`; with only `notebooks`, solutions/ of `default_root()`."""
    if solutions is None:
        root = default_root()
        return root / "solutions", Path(notebooks) if notebooks is not None else root / "notebooks"
    solutions = Path(solutions)
    if notebooks is None:
        notebooks = Path(os.path.abspath(solutions)).parent / "notebooks"
    return solutions, Path(notebooks)


def _refuse_overlap(solutions: Path, notebooks: Path) -> None:
    """ExerciseError when the learner's notebooks would be written over or among the solutions."""
    sol, out = solutions.resolve(), notebooks.resolve()
    if out == sol or sol in out.parents:
        where = "is the solutions folder" if out == sol else "is inside the solutions folder"
        raise ExerciseError(f"--notebooks {_display(notebooks)}/ {where} {_display(solutions)}/: the build would "
                            f"write the learner's stubs over or among the solutions; pass a separate folder for "
                            f"--notebooks (by default, notebooks/ beside the solutions folder)")


def is_generated_notebook(path) -> bool:
    """Whether a file in notebooks/ is one `build` could have written, so that `build` may remove it when its
    solution is gone. It must be named like a solution (`NN_name.ipynb`) and be in the form `build` writes: a
    readable notebook whose metadata is exactly the learner's (LEARNER_KERNELSPEC, LEARNER_LANGUAGE_INFO, at most
    `title` and `authors` besides), no code cell with outputs or an execution count, no run or editor cell
    metadata, and every cell tagged 'check' also tagged 'raises-exception'. A notebook anybody ran, saved from an
    editor, or named otherwise (`my_analysis.ipynb`) is not one."""
    path = Path(path)
    if not _NOTEBOOK_NAME.match(path.name):
        return False
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception:
        return False
    meta = nb.get("metadata", {})
    if (meta.get("kernelspec") != LEARNER_KERNELSPEC or meta.get("language_info") != LEARNER_LANGUAGE_INFO
            or set(meta) - {"kernelspec", "language_info", *_NOTEBOOK_METADATA_KEPT}):
        return False
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code" and (cell.get("outputs") or cell.get("execution_count") is not None):
            return False
        if any(key in cell.get("metadata", {}) for key in _RUN_METADATA + _EDITOR_CELL_METADATA):
            return False
        tags = _tags(cell)
        if CHECK_TAG in tags and RAISES_TAG not in tags:
            return False
    return True


@dataclass
class Report:
    """What build or check found; `problems` is empty when all is well."""
    notebooks: int = 0
    exercises: int = 0
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)      # notebooks without a solution that build leaves alone
    backed_up: list[str] = field(default_factory=list)  # copies of edited notebooks build --force overwrote
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _build_all(solutions: Path) -> tuple[dict[str, str], Report]:
    """{file name: learner's text} for every solution; raises ExerciseError listing every problem."""
    if not solutions.is_dir():
        raise ExerciseError(f"{_display(solutions)}/: no such directory (pass --solutions DIR)")
    built, report, problems = {}, Report(), []
    for path in sorted(solutions.glob("*.ipynb")):
        name = _display(path)
        try:
            nb = _read(path)
            found = validate(nb, name)
            if found:
                problems.extend(found)
                continue
            built[path.name] = dumps(strip_solutions(nb))
            report.exercises += len(list_exercises(nb))
        except ExerciseError as e:
            problems.extend(e.problems)
    if problems:
        raise ExerciseError(problems)
    report.notebooks = len(built)
    return built, report


def _without_solution(notebooks: Path, built: dict[str, str]) -> tuple[list[Path], list[Path]]:
    """(stale notebooks build removes, other notebooks it leaves alone) among notebooks/*.ipynb without a solution."""
    stale, other = [], []
    if notebooks.is_dir():
        for path in sorted(notebooks.glob("*.ipynb")):
            if path.name not in built:
                (stale if is_generated_notebook(path) else other).append(path)
    return stale, other


# What build last wrote in a notebooks/ folder: file name -> sha256 of its text. A notebook whose text is no longer
# that is someone's edit (a learner's solution, an instructor's tweak), which build does not overwrite unprompted.
RECORD = ".built.json"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_record(notebooks: Path) -> dict:
    try:
        record = json.loads((notebooks / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


class EditedNotebooks(ExerciseError):
    """Notebooks of notebooks/ edited since build last wrote them, which build does not overwrite."""


def edited_since_built(notebooks: Path, built: dict[str, str]) -> list[Path]:
    """The notebooks of `notebooks` that build would change and that differ from what it last wrote there (or that
    it has no record of writing)."""
    record, edited = _read_record(notebooks), []
    for fname, text in built.items():
        target = notebooks / fname
        if not target.exists():
            continue
        data = target.read_bytes()
        if data != text.encode("utf-8") and record.get(fname) != _digest(data):
            edited.append(target)
    return edited


def build(solutions=None, notebooks=None, force: bool = False) -> Report:
    """Write notebooks/ from solutions/ (only files whose text changes) and remove stale notebooks.

    Defaults as in `resolve_dirs`. A notebook someone edited since build last wrote it is not overwritten: build
    writes nothing and raises ExerciseError naming each one, unless `force`, which first copies each to
    `<name>.ipynb.bak` beside it. A notebook in notebooks/ without a solution is removed only when
    `is_generated_notebook` says build wrote it (a chapter whose solution was deleted or renamed); any other file
    is left alone and listed in `kept`. Nothing is written when any solution has a problem (ExerciseError lists them
    all), nor when notebooks/ is the solutions folder or inside it. Only notebooks/*.ipynb and the record are ever
    written or removed: the learner's kept kernels (notebooks/my_kernels/, qwen_lab.course.kept) stay as they are.
    """
    solutions, notebooks = resolve_dirs(solutions, notebooks)
    _refuse_overlap(solutions, notebooks)
    built, report = _build_all(solutions)
    notebooks.mkdir(parents=True, exist_ok=True)
    edited = edited_since_built(notebooks, built)
    if edited and not force:
        raise EditedNotebooks([f"{_display(path)}: edited since build last wrote it; build leaves it alone. Move the "
                             f"change into {_display(solutions / path.name)} (the source of the course text), or "
                             f"run build --force to overwrite it (keeping a copy as {_display(path)}.bak)"
                             for path in edited])
    for path in edited:
        shutil.copyfile(path, path.with_name(path.name + ".bak"))
        report.backed_up.append(_display(path.with_name(path.name + ".bak")))
    record = _read_record(notebooks)
    for fname, text in built.items():
        target = notebooks / fname
        data = text.encode("utf-8")
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
            report.written.append(_display(target))
        record[fname] = _digest(data)
    stale, other = _without_solution(notebooks, built)
    for path in list(stale):   # (a stale notebook edited since build wrote it stays, as an edited one does)
        if record.get(path.name) not in (None, _digest(path.read_bytes())):
            stale.remove(path)
            other.append(path)
    for path in stale:
        path.unlink()
        record.pop(path.name, None)
        report.removed.append(_display(path))
    record = {name: record[name] for name in sorted(record) if (notebooks / name).exists()}
    text = json.dumps(record, indent=1) + "\n"
    if not (notebooks / RECORD).exists() or (notebooks / RECORD).read_text() != text:
        (notebooks / RECORD).write_text(text)
    report.kept = [_display(path) for path in other]
    return report


def check(solutions=None, notebooks=None) -> Report:
    """Compare notebooks/ with what solutions/ builds; `problems` lists each missing, differing, stale file (stale:
    one `build` would remove; others are listed in `kept`). Defaults as in `resolve_dirs`."""
    solutions, notebooks = resolve_dirs(solutions, notebooks)
    try:
        _refuse_overlap(solutions, notebooks)
        built, report = _build_all(solutions)
    except ExerciseError as e:
        return Report(problems=e.problems)
    for fname, text in built.items():
        target, source = notebooks / fname, solutions / fname
        if not target.exists():
            report.problems.append(f"{_display(target)} is missing; {_display(source)} builds it: {REBUILD}")
        elif target.read_bytes() != text.encode("utf-8"):
            report.problems.append(f"{_display(target)} differs from what {_display(source)} builds: {REBUILD} "
                                   f"(a change made by hand in {_display(target)} belongs in {_display(source)}: "
                                   f"build refuses to overwrite it, and build --force keeps a copy of it)")
    stale, other = _without_solution(notebooks, built)
    for path in stale:
        report.problems.append(f"{_display(path)} has no counterpart in {_display(solutions)}/ "
                               f"(build removes it): {REBUILD}")
    report.kept = [_display(path) for path in other]
    return report
