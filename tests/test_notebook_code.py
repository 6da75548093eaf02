"""Every notebook's code, read as one program: no name used that nothing defines, no syntax error.

nbval runs the notebooks here on a CPU, where every `if on_gpu:` branch (the timings, the plots of GPU
measurements) is skipped. A typo in such a branch would first show on a learner's GPU. pyflakes reads all the
code cells of a notebook in order, as the kernel would run them, and finds names used before anything defines
them, in the branches that were not run as well.
"""

import glob
import json
import os

import pytest

# in requirements.txt; a GPU image without it leaves this static check to the CPU run
pyflakes = pytest.importorskip("pyflakes", reason="pyflakes reads the notebooks' code (pip install pyflakes)")
from pyflakes import api, messages  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "solutions", "*.ipynb"))) + \
    sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
IPYTHON_NAMES = {"display", "get_ipython", "In", "Out"}   # what IPython defines in every notebook
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect:
    """A pyflakes reporter that keeps what it is told."""

    def __init__(self):
        self.flakes, self.errors = [], []

    def flake(self, message):
        self.flakes.append(message)

    def syntaxError(self, filename, msg, lineno, offset, text):  # noqa: N802 (pyflakes' name)
        self.errors.append(f"line {lineno}: {msg}: {text!r}")

    def unexpectedError(self, filename, msg):  # noqa: N802
        self.errors.append(msg)


def notebook_program(path: str) -> tuple[str, list[int]]:
    """The code cells of a notebook joined in order (IPython magics and shell lines blanked), and for each line
    the index of the cell it comes from."""
    nb = json.load(open(path))
    lines, cells = [], []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        for line in "".join(cell["source"]).splitlines() + [""]:
            lines.append("" if line.lstrip().startswith(("%", "!")) else line)
            cells.append(i)
    return "\n".join(lines) + "\n", cells


def undefined_names(path: str) -> list[str]:
    source, cells = notebook_program(path)
    report = _Collect()
    api.check(source, os.path.basename(path), report)
    found = [f"cell {cells[m.lineno - 1]}: {m.message % m.message_args}" for m in report.flakes
             if isinstance(m, UNDEFINED) and m.message_args[0] not in IPYTHON_NAMES]
    return report.errors + found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: os.path.relpath(p, ROOT))
def test_notebook_uses_no_undefined_name(path):
    problems = undefined_names(path)
    assert not problems, f"{os.path.relpath(path, ROOT)}:\n" + "\n".join(problems)


def test_the_check_sees_a_name_only_a_gpu_branch_would_use(tmp_path):
    """A misspelt name inside a branch that never runs on a CPU is reported, with its cell."""
    nb = {"cells": [{"cell_type": "markdown", "source": ["# t"]},
                    {"cell_type": "code", "source": ["on_gpu = False\n", "%matplotlib inline\n"]},
                    {"cell_type": "code", "source": ["if on_gpu:\n", "    print(timings_ms)\n"]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "t.ipynb"
    path.write_text(json.dumps(nb))
    assert undefined_names(str(path)) == ["cell 2: undefined name 'timings_ms'"]
    assert len(NOTEBOOKS) >= 28  # both versions of the 14 notebooks were found
