"""The exercise solutions of a solution notebook, as source text: the kernel a notebook teaches is the teaching kernel
of its family's folder (`qwen_lab/kernels/<family>/teach*.py`), character for character. `assert_teaches` fails,
naming the cell, when the two drift apart."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def solution_cells(notebook: str) -> dict[int, str]:
    """Cell index -> source of every code cell of solutions/`notebook` holding a solution block, with the two
    marker lines removed (they tell the exercise builder what to strip; the library's copy does without them)."""
    nb = json.loads((ROOT / "solutions" / notebook).read_text())
    cells = {}
    for i, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and MARKERS[0] in source:
            lines = [line for line in source.splitlines() if line.strip() not in MARKERS]
            cells[i] = "\n".join(lines).strip("\n")
    if not cells:
        raise AssertionError(f"solutions/{notebook}: no code cell holds '{MARKERS[0]}'")
    return cells


def assert_teaches(notebook: str, module_file: str, exercises: list[str] | None = None) -> None:
    """Every solution cell of `notebook` (or those of `exercises`, e.g. ["08.2", "08.3"], found by their titles
    "# Exercise 08.2: ...") appears whole, line for line, in `module_file` (a path relative to the repository's
    root)."""
    text = (ROOT / module_file).read_text()
    found = solution_cells(notebook)
    if exercises is None:
        wanted = found
    else:
        wanted = {i: source for i, source in found.items()
                  if any(source.startswith(f"# Exercise {e}:") for e in exercises)}
        if len(wanted) != len(exercises):
            raise AssertionError(f"solutions/{notebook}: expected the exercises {exercises}, found the cells "
                                 f"{sorted(wanted)} for them")
    for i, source in wanted.items():
        if source not in text:
            first = source.splitlines()[0]
            raise AssertionError(f"solutions/{notebook} cell {i} (starting {first!r}) is not in {module_file} "
                                 f"as written there: the notebook's kernel and the library's teaching kernel drifted "
                                 f"apart; make them the same text")
