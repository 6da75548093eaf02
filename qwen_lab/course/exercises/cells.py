"""The course's notebook conventions, and what they make of one cell: the solution markers, the check tag, exercise
titles, and the stub that replaces a solution block in the learner's version.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ...errors import QwenLabError

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
# In a markdown cell the markers are HTML comments, which Jupyter renders as nothing: `### BEGIN SOLUTION` there would
# show as a heading in the solution notebook. nbgrader finds them all the same (it looks for "BEGIN SOLUTION" in a line).
MD_BEGIN = "<!-- BEGIN SOLUTION -->"
MD_END = "<!-- END SOLUTION -->"
CHECK_TAG = "check"
RAISES_TAG = "raises-exception"
DEFAULT_TITLE = "Exercise: fill in this block"
MARKDOWN_STUB = "*Your answer here.*"
REBUILD = "run python -m qwen_lab.exercises build"

# Something that was meant as a marker but is not exactly one (`# BEGIN SOLUTION`, `### End solution`,
# `### BEGIN SOLUTON`, `### END SOLUTIONS`, `x = 0  ### BEGIN SOLUTION`): left alone it would leak the solution
# into the learner's notebook. A line is one when, in any case, a run of '#' is followed by BEGIN or END and then a
# word starting with SOLUT (spaces, '_' or '-' between them, or none), anywhere in a line of code or as the whole
# of a line of markdown, and it is not exactly BEGIN or END. Prose that mentions the end and a solution ("in the end,
# compare your solution"), or quotes the markers in a sentence, is not one.
_LOOKALIKE = re.compile(r"#+[ \t]*(?:begin|end)[\s_-]*solut", re.IGNORECASE)
# (in markdown only a line that holds nothing else, as a heading or an HTML comment: prose may quote the markers,
# "between `### BEGIN SOLUTION` and ...", and a heading may read "## End solutions overview")
_LOOKALIKE_MD = re.compile(r"^\s*(?:#+|<!--[ \t#]*)[ \t]*(?:begin|end)[\s_-]*solut\w*[ \t]*(?:-->)?\s*$",
                           re.IGNORECASE)
# A code cell whose first line reads as an exercise title (`# Exercise 02.1: ...`, `## exercise 2`): it must hold a
# solution block, or the whole cell, solution included, would reach the learner.
_CODE_TITLE_LIKE = re.compile(r"^\s*#+\s*exercise\b", re.IGNORECASE)
_MARKDOWN_TITLE = re.compile(r"^\s*(?:#{1,6}\s*|\*\*)?(Exercise\b.*?)(?:\*\*)?\s*$")
_NUMBERED = re.compile(r"^Exercise\s+(\d+)\.(\d+)\b")
# Cell metadata a run writes (timings, scroll state): never part of the learner's notebook.
_RUN_METADATA = ("execution", "ExecuteTime", "scrolled", "collapsed")
# Cell metadata of the instructor's editor or grader (read-only or hidden cells, nbgrader ids, Colab and VS Code
# state): dropped from the learner's notebook, where it would lock or hide cells.
_EDITOR_CELL_METADATA = ("editable", "deletable", "jupyter", "nbgrader", "trusted", "vscode", "colab", "id",
                         "outputId")
# The learner's notebook metadata, whatever the solution carries: a kernel every Jupyter, Colab and VS Code has.
LEARNER_KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
LEARNER_LANGUAGE_INFO = {"name": "python"}
# Notebook metadata kept from the solution besides those two (nbformat's own keys); any other key (vscode, colab,
# widgets, toc, jupytext...) belongs to the instructor's editor and is dropped.
_NOTEBOOK_METADATA_KEPT = ("title", "authors")
# The names `build` gives learner notebooks (those of the solutions: NN_name.ipynb).
_NOTEBOOK_NAME = re.compile(r"^\d+_[A-Za-z0-9_]+\.ipynb$")


class ExerciseError(QwenLabError, ValueError):
    """Solutions that cannot be built into exercise notebooks; `problems` lists each one."""

    def __init__(self, problems):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


# --------------------------------------------------------------------------------------------------
# One cell: titles, marker blocks, stubs
# --------------------------------------------------------------------------------------------------

@dataclass
class _Block:
    begin: int      # 0-based line index of the BEGIN marker in the cell
    end: int        # 0-based line index of the END marker
    indent: str     # leading whitespace of the BEGIN marker


def _lines(source: str) -> list[str]:
    return source.splitlines(keepends=True)


def _tags(cell) -> list:
    return list(cell.get("metadata", {}).get("tags", []) or [])


def _is_check(cell) -> bool:
    return cell.get("cell_type") == "code" and CHECK_TAG in _tags(cell)


def cell_title(cell) -> str | None:
    """The exercise title on a cell's first line, or None.

    Code: `# Exercise 02.1: zero-centred RMSNorm` gives "Exercise 02.1: zero-centred RMSNorm".
    Markdown: a heading or bold line starting with "Exercise" (`### Exercise 02.4: why fp32?`).
    """
    lines = _lines(cell.get("source", ""))
    first = lines[0].rstrip("\r\n") if lines else ""
    if cell.get("cell_type") == "code":
        return first[2:].strip() if re.match(r"# Exercise\b", first) else None
    if cell.get("cell_type") == "markdown":
        m = _MARKDOWN_TITLE.match(first)
        return m.group(1).strip() if m else None
    return None


def _where(name: str, index: int, cell) -> str:
    lines = _lines(cell.get("source", ""))
    first = lines[0].strip() if lines else ""
    if len(first) > 60:
        first = first[:57] + "..."
    return f"{name}, cell {index} ({cell.get('cell_type')}, {json.dumps(first, ensure_ascii=False)})"


def markers(cell) -> tuple[str, str]:
    """The (begin, end) solution markers of a cell's kind: HTML comments in markdown, `###` comments elsewhere."""
    return (MD_BEGIN, MD_END) if cell.get("cell_type") == "markdown" else (BEGIN, END)


def _near_markers(cell, where: str) -> list[str]:
    """A problem for every line of the cell that looks like a solution marker but is not exactly one."""
    problems = []
    markdown = cell.get("cell_type") == "markdown"
    begin, end = markers(cell)
    for i, line in enumerate(_lines(cell.get("source", ""))):
        text = line.strip()
        rule = _LOOKALIKE_MD if markdown else _LOOKALIKE
        if markdown and text in (BEGIN, END):
            exact = MD_BEGIN if text == BEGIN else MD_END
            problems.append(f"{where}: line {i + 1} is the code cells' marker {text!r}, which a markdown cell "
                            f"renders as a heading; in markdown write {exact!r} (an HTML comment, shown as nothing)")
        elif text not in (begin, end) and rule.search(line):
            problems.append(f"{where}: line {i + 1} looks like a solution marker but is not exactly {begin!r} "
                            f"or {end!r}: {text!r}; as written, the solution would reach the learner. Write the "
                            f"marker exactly, alone on its line, or reword the line")
    return problems


def _blocks(cell, where: str) -> tuple[list[_Block], list[str]]:
    """The marker blocks of one cell, and the problems with its markers.

    A line that looks like a marker but is not one makes the cell's only problems (and no blocks): pairing the
    exact markers around it would only report its partner as unmatched.
    """
    near = _near_markers(cell, where)
    if near:
        return [], near
    blocks, problems = [], []
    open_at: int | None = None
    indent = ""
    begin, end = markers(cell)
    for i, line in enumerate(_lines(cell.get("source", ""))):
        text = line.strip()
        if text == begin:
            if open_at is not None:
                problems.append(f"{where}: nested markers: {begin!r} on line {i + 1} inside the block opened "
                                f"on line {open_at + 1}; close each block with {end!r} before opening another")
                continue
            open_at, indent = i, line[: len(line) - len(line.lstrip())]
        elif text == end:
            if open_at is None:
                problems.append(f"{where}: unmatched marker: {end!r} on line {i + 1} has no {begin!r} before it")
                continue
            blocks.append(_Block(open_at, i, indent))
            open_at = None
    if open_at is not None:
        problems.append(f"{where}: unmatched marker: {begin!r} on line {open_at + 1} is never closed by {end!r}")
    return blocks, problems


def stub_line(title: str) -> str:
    """The statement that replaces a solution block in a code cell (without indentation)."""
    return f"raise NotImplementedError({json.dumps(title, ensure_ascii=False)})"


def _strip_source(source: str, blocks: list[_Block], replacement: str) -> str:
    lines = _lines(source)
    out, last = [], 0
    for b in blocks:
        out.extend(lines[last:b.begin])
        newline = lines[b.end][len(lines[b.end].rstrip("\r\n")):]
        out.append(f"{b.indent}{replacement}{newline}")
        last = b.end + 1
    out.extend(lines[last:])
    return "".join(out)


def _stripped_cell_source(cell, blocks: list[_Block]) -> str:
    if cell.get("cell_type") == "markdown":
        return _strip_source(cell["source"], blocks, MARKDOWN_STUB)
    return _strip_source(cell["source"], blocks, stub_line(cell_title(cell) or DEFAULT_TITLE))
