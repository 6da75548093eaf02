"""Recorded GPU results: what a measuring cell shows on a machine without a GPU.

A cell that times kernels measures on the GPU and then keeps what it found; on a CPU it shows what a real GPU
measured instead of nothing:

    if on_gpu:
        ...                                           # measure, print, plot, as always
        recorded.keep("03.tflops", table=rows, figure=fig)
    else:
        recorded.show("03.tflops")

`keep` writes only when a recording run asks for it: the environment variable QWEN_LAB_RECORD names a folder, and
`benchmarks/record_notebooks.py` sets it. A learner's own run writes nothing. The records that ship with the course
live in qwen_lab/course/records/: one NAME.json (the label and the table) and, when there is a figure, NAME.png.

A record's JSON: {"name", "gpu", "date", "torch", "triton", "commit", "command", "table": {"columns", "rows"},
"notes": [lines], "figure": "NAME.png" or null, "source": where the numbers come from (optional)}.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
from pathlib import Path

ENV = "QWEN_LAB_RECORD"
RECORDS = Path(__file__).resolve().parent / "records"      # the records shipped with the course (package data)
LABEL_KEYS = ("gpu", "date", "command")                     # what every record must say about where it came from
_NAME = re.compile(r"^\d\d\.[a-z0-9_-]+$")


def command_for(name: str) -> str:
    """The command that records `name` again on a GPU: its notebook, run by the recording script."""
    return f"python benchmarks/record_notebooks.py --only {name.split('.')[0]}"


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"recorded: a record's name is 'NN.word' (its notebook's number, a dot, lower-case words), "
                         f"got {name!r}")


def _cell(value):
    """A table cell as JSON keeps it: floats to 4 significant digits (a record is a picture of a run, not data to
    compute with), everything else as text unless it is a number or None."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return float(f"{value:.4g}")
    try:                                              # a 0-d tensor or a numpy scalar
        return _cell(value.item())
    except (AttributeError, ValueError):
        return str(value)


def as_table(table) -> dict:
    """{"columns": [...], "rows": [[...]]} from a list of dicts (one per row, the columns from their keys in order),
    a dict of dicts ({row label: {column: value}}, the label becomes the first column) or a (columns, rows) pair."""
    if table is None:
        return {"columns": [], "rows": []}
    if isinstance(table, dict) and set(table) == {"columns", "rows"}:
        columns, rows = list(table["columns"]), [list(r) for r in table["rows"]]
    elif isinstance(table, tuple) and len(table) == 2:
        columns, rows = list(table[0]), [list(r) for r in table[1]]
    elif isinstance(table, dict):
        inner = [c for v in table.values() for c in v]
        columns = [""] + list(dict.fromkeys(inner))
        rows = [[label] + [vals.get(c) for c in columns[1:]] for label, vals in table.items()]
    elif isinstance(table, list) and all(isinstance(r, dict) for r in table):
        columns = list(dict.fromkeys(k for r in table for k in r))
        rows = [[r.get(c) for c in columns] for r in table]
    else:
        raise TypeError(f"recorded: table must be a list of dicts, a dict of dicts or (columns, rows), "
                        f"got {type(table).__name__}")
    for r in rows:
        if len(r) != len(columns):
            raise ValueError(f"recorded: a table row has {len(r)} cells for {len(columns)} columns: {r!r}")
    return {"columns": [str(c) for c in columns], "rows": [[_cell(v) for v in r] for r in rows]}


def run_label() -> dict:
    """Where this process runs: the GPU, today's date (UTC), the versions of torch and Triton, the git commit."""
    import torch
    import triton

    from ..bench import git_commit

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu, "date": time.strftime("%Y-%m-%d", time.gmtime()), "torch": torch.__version__,
            "triton": triton.__version__, "commit": git_commit()}


def keep(name: str, table=None, figure=None, notes=(), command: str | None = None, folder=None,
         measured: dict | None = None) -> Path | None:
    """Write record `name` (its table, its figure as a PNG, a few lines of notes, and the label of this run) into
    `folder`, or into the folder QWEN_LAB_RECORD names. Without either it writes nothing and returns None: a
    learner's run measures and prints, and keeps nothing. Returns the JSON's path.

    `measured` labels a record made from an earlier result instead of this run: its "gpu" and "date" (required),
    "torch", "triton", "commit" and "source" (where the numbers are kept)."""
    _check_name(name)
    folder = folder or os.environ.get(ENV)
    if not folder:
        return None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if measured is not None:
        missing = [k for k in ("gpu", "date") if not measured.get(k)]
        if missing:
            raise ValueError(f"recorded.keep({name!r}): measured= must say {missing}")
        where = {k: measured.get(k) for k in ("gpu", "date", "torch", "triton", "commit", "source")}
    else:
        where = run_label()
    record = {"name": name, **where, "command": command or command_for(name), "table": as_table(table),
              "notes": [str(n) for n in notes], "figure": None}
    if figure is not None:
        record["figure"] = f"{name}.png"
        # small: a record ships inside the package
        figure.savefig(folder / record["figure"], dpi=72, bbox_inches="tight")
    path = folder / f"{name}.json"
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"recorded {name} -> {path}")
    return path


def load(name: str, folder=None) -> dict | None:
    """Record `name` from `folder` (the course's records by default), or None when there is none."""
    _check_name(name)
    path = Path(folder or RECORDS) / f"{name}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def names(folder=None) -> list[str]:
    """The names of the records in `folder` (the course's records by default)."""
    return sorted(p.stem for p in Path(folder or RECORDS).glob("*.json"))


def label(record: dict) -> str:
    """One line saying where a record was measured and how to measure it again."""
    versions = ", ".join(f"{k} {record[k]}" for k in ("torch", "triton") if record.get(k))
    where = f"{record['gpu']}, {record['date']}" + (f" ({versions})" if versions else "")
    return f"Recorded on {where}. Again on a GPU: {record['command']}"


def _text(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class Table:
    """A recorded table: text where there is no notebook, markdown in one."""

    def __init__(self, table: dict):
        self.columns, self.rows = table["columns"], table["rows"]

    def __repr__(self) -> str:
        cells = [self.columns] + [[_text(v) for v in r] for r in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths)))
                 for r in cells]
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        esc = lambda s: html.escape(s).replace("|", "\\|")
        head = "| " + " | ".join(esc(c) for c in self.columns) + " |"
        rule = "| " + " | ".join("---" for _ in self.columns) + " |"
        body = ["| " + " | ".join(esc(_text(v)) for v in r) + " |" for r in self.rows]
        return "\n".join([head, rule] + body)


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def show(name: str, folder=None) -> dict | None:
    """On a machine without a GPU: print the label of record `name`, then its table, its notes and its figure. A
    record not made yet prints one line saying so and the command that makes it. Returns the record (or None)."""
    record = load(name, folder)
    if record is None:
        print(f"No GPU here, and no recorded result {name!r} yet: {command_for(name)} on a GPU records it.")
        return None
    print(f"No GPU here: what a GPU measured. {label(record)}")
    if record.get("source"):
        print(f"({record['source']})")
    notebook = _in_notebook()
    if record["table"]["columns"]:
        if notebook:
            from IPython.display import display
            display(Table(record["table"]))
        else:
            print(repr(Table(record["table"])))
    for line in record.get("notes", ()):
        print(line)
    if record.get("figure"):
        png = Path(folder or RECORDS) / record["figure"]
        if notebook:
            from IPython.display import Image, display
            display(Image(filename=str(png)))
        else:
            print(f"(figure: {png})")
    return record
