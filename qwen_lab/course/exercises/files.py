"""Reading and writing notebook files: a path or a notebook read alike, cell ids that stay put from one build to
the next, the fixed text form a build writes, and paths shown relative to the current directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import nbformat

from .cells import ExerciseError

def _display(path: Path) -> str:
    path = Path(path)
    try:
        rel = os.path.relpath(path.resolve(), Path.cwd().resolve())
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if rel.startswith("..") else rel


def _as_notebook(notebook):
    if isinstance(notebook, (str, os.PathLike)):
        return _read(Path(notebook))
    return notebook


def _read(path: Path):
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        _stable_ids(raw)
        return nbformat.reads(json.dumps(raw), as_version=4)
    except Exception as e:
        raise ExerciseError(f"{_display(path)}: not a readable notebook: {type(e).__name__}: {e}") from e


def _stable_ids(raw) -> None:
    """Give the cells of a raw nbformat 4.5+ notebook that lack an id, or repeat one, the ids a build derives from
    their position. nbformat repairs such ids with random ones as it reads, and two builds would then differ."""
    if not (isinstance(raw, dict) and raw.get("nbformat") == 4 and isinstance(raw.get("nbformat_minor"), int)
            and raw["nbformat_minor"] >= 5 and isinstance(raw.get("cells"), list)):
        return
    cells = [c for c in raw["cells"] if isinstance(c, dict)]
    taken = {c.get("id") for c in cells if isinstance(c.get("id"), str) and c.get("id")}
    seen: set[str] = set()
    for i, cell in enumerate(cells):
        if not isinstance(cell.get("id"), str) or not cell["id"] or cell["id"] in seen:
            cell["id"] = _cell_id(i, taken | seen)
        seen.add(cell["id"])


def _cell_id(index: int, taken: set[str]) -> str:
    base = hashlib.sha1(f"qwen_lab-cell-{index}".encode()).hexdigest()[:8]
    cid, n = base, 0
    while cid in taken:
        n += 1
        cid = f"{base}-{n}"
    return cid


def dumps(notebook) -> str:
    """The fixed text form of a notebook: nbformat's JSON (sorted keys, indent 1) and a final newline."""
    text = nbformat.writes(notebook, version=4)
    return text if text.endswith("\n") else text + "\n"
