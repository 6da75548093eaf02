"""Each solution notebook has a core and, after its recap, an optional "## Going further" part (COURSE.md,
"Every notebook", items 7-8): the core carries no dated log citations and stays near 2,000 words of prose."""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((Path(__file__).resolve().parents[1] / "solutions").glob("*.ipynb"))
GOING_FURTHER = "## Going further"
MAX_CORE_WORDS = 2300
# a date such as 2026-12-02, or a citation of the experiments log that names one
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _text(cell):
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _going_further(cells):
    """Index of the markdown cell that opens the Going further part, or None."""
    hits = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
            and any(line.strip() == GOING_FURTHER for line in _text(c).splitlines())]
    assert len(hits) <= 1, f"more than one {GOING_FURTHER!r} heading, in cells {hits}"
    return hits[0] if hits else None


def _core(cells):
    end = _going_further(cells)
    return [c for c in cells[:end if end is not None else len(cells)] if c["cell_type"] == "markdown"]


def test_there_are_solution_notebooks():
    assert len(SOLUTIONS) == 15, [p.name for p in SOLUTIONS]


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_core_has_no_dated_citation(path):
    cells = _cells(path)
    end = _going_further(cells)
    for i, cell in enumerate(cells[:end if end is not None else len(cells)]):
        if cell["cell_type"] != "markdown":
            continue
        text = _text(cell)
        found = DATE.search(text)
        assert not found, (f"solutions/{path.name} cell {i}: the core cites a date ({found.group()}); "
                           f"move it under {GOING_FURTHER!r}")
        for line in text.splitlines():
            assert "experiments.md" not in line or not DATE.search(line), \
                f"solutions/{path.name} cell {i}: a dated experiments.md citation in the core"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_going_further_follows_the_recap(path):
    cells = _cells(path)
    end = _going_further(cells)
    if end is None:
        return
    assert _text(cells[end]).startswith(GOING_FURTHER + "\n") or _text(cells[end]) == GOING_FURTHER, \
        f"solutions/{path.name} cell {end}: the Going further cell must start with its heading"
    recaps = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
              and _text(c).lstrip().lower().startswith(("## recap", "## summary"))]
    assert recaps, f"solutions/{path.name}: no recap cell ('## Recap')"
    assert recaps[-1] < end, (f"solutions/{path.name}: {GOING_FURTHER!r} (cell {end}) comes before the recap "
                              f"(cell {recaps[-1]})")


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_core_prose_is_short(path):
    words = sum(len(_text(c).split()) for c in _core(_cells(path)))
    assert words <= MAX_CORE_WORDS, (f"solutions/{path.name}: {words} words of markdown before "
                                     f"{GOING_FURTHER!r}, at most {MAX_CORE_WORDS}")


def test_readme_is_a_short_front_door():
    # the README is the front door (issue 48): what the course is, install, the syllabus, the current numbers, links;
    # the details a maintainer or an instructor needs live in docs/
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text) < 10_000, f"README.md: {len(text)} characters, expected under 10,000 (move details to docs/)"
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).exists(), f"README.md links to {link}, which does not exist"
