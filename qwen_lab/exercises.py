"""Build the learner's notebooks/ from the instructor's solutions/, and check that they are in sync.

    python -m qwen_lab.exercises build [--solutions DIR] [--notebooks DIR]
    python -m qwen_lab.exercises check [--solutions DIR] [--notebooks DIR]
    python -m qwen_lab.exercises list  [--solutions DIR]
    python -m qwen_lab.exercises nbgrader --out COURSE_DIR [--solutions DIR]

`solutions/NN_name.ipynb` is the complete notebook and the only one anybody edits. `build` writes
`notebooks/NN_name.ipynb` from it:

- In a code cell, every block between a line `### BEGIN SOLUTION` and a line `### END SOLUTION`
  (the nbgrader convention) becomes one line `raise NotImplementedError("<title>")` at the
  indentation of the BEGIN marker. The title is the cell's first line without its `# `, e.g.
  `# Exercise 02.1: zero-centred RMSNorm` gives "Exercise 02.1: zero-centred RMSNorm".
- In a markdown cell (a written answer) the block becomes `*Your answer here.*`.
- A cell tagged `check` (it grades an exercise, or needs one finished) also gets the tag
  `raises-exception`, so nbval and nbclient expect it to fail in the learner's version.
- Outputs, execution counts and run metadata are dropped; cell ids are kept (cells without one get
  an id derived from their position), so building twice gives byte-identical files.
- The instructor's editor state is dropped: cell metadata `editable`, `deletable`, `jupyter` (hidden
  source or outputs), `nbgrader`, `vscode`, `colab`; the notebook metadata becomes the default kernel
  `{"name": "python3", "display_name": "Python 3", "language": "python"}` with language_info
  `{"name": "python"}` (only `title` and `authors` are kept besides), so a learner's notebook opens on
  Colab or a fresh machine whatever kernel the solution was last run with. Cell tags are kept.
- Notebooks without exercises are copied with outputs cleared. A `notebooks/*.ipynb` file without a
  solution is removed only when build wrote it: named like a solution (`NN_name.ipynb`) and in the
  form build writes (the learner's notebook metadata above and nothing else, no outputs, execution
  counts or editor metadata, check cells tagged `raises-exception`; see `is_generated_notebook`). Any
  other file there (`my_analysis.ipynb`, a notebook somebody ran) is left alone, with a note.
- With only `--solutions DIR`, the notebooks go to `notebooks/` beside DIR. With neither option, both
  folders are those of the current directory when it holds `solutions/`, else of the checkout the
  package is imported from (the output line says which). `build` refuses a `--notebooks` folder that
  is the solutions folder or inside it, before writing anything.

Before writing anything, `build` validates every solution and stops on any problem, naming the
notebook and the cell (cells counted from 0, as in `nb.cells[i]`): unmatched or nested markers, a
line that looks like a marker but is not exactly one (in any case, '#' then BEGIN or END then a word
starting with SOLUT, anywhere in a line of code or as the whole of a line of markdown: `### BEGIN
SOLUTON`, `### END SOLUTIONS`, `x = 0  ### BEGIN SOLUTION`; named by its line), a code cell titled
`# Exercise ...` without a solution block (it would reach the learner whole), markers in a cell whose first line is no
`# Exercise` title, a stub that would run as soon as its cell runs (not inside a function body), an
exercise notebook without a `check` cell, a check cell before the exercise it grades, and a cell without the
`check` tag that would stop the learner's notebook: it runs an exercise's function (directly, or through a
function a later cell builds on it, outside a `try` that catches NotImplementedError) or reads a name that only
a check cell binds.

`check` builds in memory and compares byte for byte with what is in notebooks/: it exits 1 listing
every missing, differing or stale file, and 0 when they are in sync.

`nbgrader` writes an nbgrader course directory for instructors who grade with nbgrader: every solution as
`COURSE_DIR/source/NN_name/NN_name.ipynb` (one assignment per chapter, the markers left for nbgrader to strip)
with nbgrader's cell metadata added, and a `nbgrader_config.py` beside it. An exercise's code cell becomes a
solution cell; each check cell an autograded test cell worth one point (it passes when it runs without an
error, which is how every check reports), locked so a learner cannot edit it; a written answer (markdown) a
manually graded answer worth one point. Then `nbgrader generate_assignment NN_name` in COURSE_DIR makes the
learners' version, and `nbgrader autograde` grades what they hand in.

In Python: `strip_solutions(nb)` returns the learner's version of a notebook, `list_exercises(path)`
the (title, cell index) of its exercises, `exercise_and_check(path, title)` the cells that grade one of them,
`validate(nb, name)` the list of problems,
`nbgrader_notebook(nb)` the nbgrader source version, `build()`, `check()` and `export_nbgrader()` what the
commands do, `resolve_dirs()` their default folders, `is_generated_notebook(path)` whether build may remove a file.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .errors import QwenLabError

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
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
# (in markdown only a line that holds nothing else: prose may quote the markers, "between `### BEGIN SOLUTION`
# and ...", and a heading may read "## End solutions overview")
_LOOKALIKE_MD = re.compile(r"^\s*#+[ \t]*(?:begin|end)[\s_-]*solut\w*\s*$", re.IGNORECASE)
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


def _near_markers(cell, where: str) -> list[str]:
    """A problem for every line of the cell that looks like a solution marker but is not exactly one."""
    problems = []
    for i, line in enumerate(_lines(cell.get("source", ""))):
        text = line.strip()
        rule = _LOOKALIKE_MD if cell.get("cell_type") == "markdown" else _LOOKALIKE
        if text not in (BEGIN, END) and rule.search(line):
            problems.append(f"{where}: line {i + 1} looks like a solution marker but is not exactly {BEGIN!r} "
                            f"or {END!r}: {text!r}; as written, the solution would reach the learner. Write the "
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
    for i, line in enumerate(_lines(cell.get("source", ""))):
        text = line.strip()
        if text == BEGIN:
            if open_at is not None:
                problems.append(f"{where}: nested markers: {BEGIN!r} on line {i + 1} inside the block opened "
                                f"on line {open_at + 1}; close each block with {END!r} before opening another")
                continue
            open_at, indent = i, line[: len(line) - len(line.lstrip())]
        elif text == END:
            if open_at is None:
                problems.append(f"{where}: unmatched marker: {END!r} on line {i + 1} has no {BEGIN!r} before it")
                continue
            blocks.append(_Block(open_at, i, indent))
            open_at = None
    if open_at is not None:
        problems.append(f"{where}: unmatched marker: {BEGIN!r} on line {open_at + 1} is never closed by {END!r}")
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


# --------------------------------------------------------------------------------------------------
# Python analysis of code cells (best effort: a cell that does not parse is left to nbval)
# --------------------------------------------------------------------------------------------------

def _parse(source: str):
    try:
        return ast.parse(source)
    except SyntaxError:
        pass
    try:  # IPython syntax (%magics, !shell): translate it the way the kernel does, then parse
        from IPython.core.inputtransformer2 import TransformerManager
        return ast.parse(TransformerManager().transform_cell(source))
    except Exception:
        return None


def _solution_line(blocks: list[_Block], line: int) -> int:
    """A line (1-based) of the learner's version of a cell as the line of the solution cell the instructor edits:
    each block, markers included, became one stub line, which stands for its BEGIN marker's line."""
    shift = 0
    for b in blocks:
        stub = b.begin - shift + 1
        if line < stub:
            break
        if line == stub:
            return b.begin + 1
        shift += b.end - b.begin
    return line + shift


def _syntax_error(source: str, blocks: list[_Block] = ()) -> str | None:
    """None when the cell parses as Python (IPython syntax allowed), else the parser's complaint, located in the
    solution cell (`blocks`: how the learner's version `source` was made from it)."""
    try:
        ast.parse(source)
        return None
    except SyntaxError as e:
        error = e
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        ast.parse(TransformerManager().transform_cell(source))
        return None
    except SyntaxError as e:
        error = e
    except Exception:
        pass
    where = f"line {_solution_line(list(blocks), error.lineno)} of the solution cell" if blocks else \
        f"line {error.lineno}"
    return f"{error.msg} ({where}; the message's own line numbers count the learner's version)" if blocks and \
        re.search(r"\bline \d", error.msg) else f"{error.msg} ({where})"


def _eager_stubs(tree, title: str) -> list[int]:
    """Lines of the stubs that execute when the cell runs (not inside a def or lambda)."""
    hits = []

    def visit(node, in_function: bool):
        if isinstance(node, ast.Raise) and not in_function:
            exc = node.exc
            if (isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name)
                    and exc.func.id == "NotImplementedError" and exc.args
                    and isinstance(exc.args[0], ast.Constant) and exc.args[0].value == title):
                hits.append(node.lineno)
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return hits


def _defined_names(tree) -> set[str]:
    """Names a cell binds at its top level (defs, classes, assignments, imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [i.optional_vars for i in node.items if i.optional_vars] if isinstance(node, ast.With)
                else [node.target])
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _free_names(tree) -> set[str]:
    """Names a cell reads but binds nowhere in itself (a rough free-variable set)."""
    loads, bound = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (loads if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in n.names)
    return loads - bound


# --------------------------------------------------------------------------------------------------
# Whole notebooks
# --------------------------------------------------------------------------------------------------

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


def list_exercises(notebook) -> list[tuple[str, int]]:
    """(title, cell index) of every exercise in a notebook (a path or a NotebookNode).

    In a solution, an exercise is a cell holding solution markers; in a built learner's notebook
    (no markers left), a titled cell holding its stub. Untitled cells get DEFAULT_TITLE.
    """
    nb = _as_notebook(notebook)
    found = []
    for i, cell in enumerate(nb.cells):
        source = cell.get("source", "")
        if cell.get("cell_type") in ("code", "markdown") and any(
                line.strip() in (BEGIN, END) for line in _lines(source)):
            found.append((cell_title(cell) or DEFAULT_TITLE, i))
    if found:
        return found
    for i, cell in enumerate(nb.cells):
        title = cell_title(cell)
        if title is None:
            continue
        stub = stub_line(title) if cell.get("cell_type") == "code" else MARKDOWN_STUB
        if any(line.strip() == stub for line in _lines(cell.get("source", ""))):
            found.append((title, i))
    return found


def exercise_and_check(notebook, title: str) -> tuple[int, int]:
    """(cell index of the one exercise whose title starts with `title`, cell index of the first check cell after
    it): what a runner executes to grade that exercise alone (cells 0 .. the check)."""
    nb = _as_notebook(notebook)
    matches = [i for t, i in list_exercises(nb) if t.startswith(title)]
    if len(matches) != 1:
        raise ExerciseError(f"{title!r}: {len(matches)} exercises with that title in the notebook; expected one")
    index = matches[0]
    check = next((i for i in range(index + 1, len(nb.cells)) if _is_check(nb.cells[i])), None)
    if check is None:
        raise ExerciseError(f"{title!r} (cell {index}): no cell tagged {CHECK_TAG!r} after it")
    return index, check


def validate(notebook, name: str = "notebook") -> list[str]:
    """Every reason this solution notebook cannot become an exercise notebook (empty when it can)."""
    nb = _as_notebook(notebook)
    problems: list[str] = []
    code_exercises: list[tuple[str, int]] = []     # (title, index) of code cells with markers
    titles: dict[str, int] = {}
    stem_number = re.match(r"^(\d+)", Path(name).name)
    for i, cell in enumerate(nb.cells):
        where = _where(name, i, cell)
        kind = cell.get("cell_type")
        near = _near_markers(cell, where)
        if near:      # the cell's only problems: whatever else it has follows from them
            problems.extend(near)
            if kind == "code" and cell_title(cell):
                code_exercises.append((cell_title(cell), i))
            continue
        blocks, marker_problems = _blocks(cell, where)
        problems.extend(marker_problems)
        if not blocks and not marker_problems:
            lines = _lines(cell.get("source", ""))
            if kind == "code" and lines and _CODE_TITLE_LIKE.match(lines[0]):
                problems.append(f"{where}: line 1 titles the cell as an exercise but the cell holds no solution "
                                f"block, so the whole cell, solution included, would reach the learner; enclose "
                                f"the solution between lines {BEGIN!r} and {END!r}, or, if the cell is no "
                                f"exercise, do not start it with '# Exercise'")
                code_exercises.append((cell_title(cell) or DEFAULT_TITLE, i))
            continue
        if kind not in ("code", "markdown"):
            problems.append(f"{where}: solution markers in a {kind} cell; only code and markdown cells can "
                            f"hold an exercise")
            continue
        title = cell_title(cell)
        if title is None:
            expected = ("'# Exercise NN.K: short title'" if kind == "code"
                        else "a heading such as '### Exercise NN.K: short question'")
            problems.append(f"{where}: holds solution markers but its first line is not an exercise title; "
                            f"start the cell with {expected}")
            if kind == "code":
                code_exercises.append((DEFAULT_TITLE, i))
            continue
        if title in titles:
            problems.append(f"{where}: the title {title!r} is already used by cell {titles[title]}; "
                            f"give every exercise its own number")
        titles.setdefault(title, i)
        numbered = _NUMBERED.match(title)
        if numbered and stem_number and int(numbered.group(1)) != int(stem_number.group(1)):
            problems.append(f"{where}: {title!r} is numbered for notebook {numbered.group(1)}, but this is "
                            f"notebook {stem_number.group(1)}")
        if kind != "code":
            continue
        code_exercises.append((title, i))
        if marker_problems:
            continue
        stripped = _stripped_cell_source(cell, blocks)
        if _parse(cell["source"]) is None:
            continue  # the solution itself does not parse: nbval over solutions/ reports it
        error = _syntax_error(stripped, blocks)
        if error:
            problems.append(f"{where}: with its blocks replaced by the stub the cell is no longer valid Python: "
                            f"{error}; put each marker at the indentation of the code it encloses")
            continue
        tree = _parse(stripped)
        eager = _eager_stubs(tree, title) if tree is not None else []
        if eager and not _is_check(cell):
            problems.append(f"{where}: the stub of the block on line {_solution_line(blocks, eager[0])} would run "
                            f"as soon as the cell runs (it is not "
                            f"inside a function body), so the learner's notebook would stop here; put the block "
                            f"inside the kernel or launcher body, or tag the cell {CHECK_TAG!r}")

    checks = [i for i, cell in enumerate(nb.cells) if _is_check(cell)]
    if not code_exercises:
        for i in checks:
            problems.append(f"{_where(name, i, nb.cells[i])}: tagged {CHECK_TAG!r} but the notebook has no code "
                            f"exercise for it to grade; remove the tag")
        return problems
    if not checks:
        listed = ", ".join(f"{t!r} in cell {i}" for t, i in code_exercises)
        problems.append(f"{name}: has exercises ({listed}) but no cell tagged {CHECK_TAG!r}; tag the cell that "
                        f"grades each exercise (metadata {{\"tags\": [\"{CHECK_TAG}\"]}})")
        return problems
    first_title, first = code_exercises[0]
    for i in checks:
        if i < first:
            problems.append(f"{_where(name, i, nb.cells[i])}: a check cell before the exercise it grades: the first "
                            f"exercise, {first_title!r}, is cell {first}; move the check after it")
    last_title, last = code_exercises[-1]
    if checks[-1] < last:
        problems.append(f"{_where(name, last, nb.cells[last])}: {last_title!r} has no check cell after it; the cell "
                        f"that grades it must come after it and carry the tag {CHECK_TAG!r}")
    # every code cell parsed once, for the two rules that read the cells' Python
    trees = {i: _parse(c.get("source", "")) for i, c in enumerate(nb.cells) if c.get("cell_type") == "code"}
    problems.extend(_checks_using_later_exercises(nb, name, code_exercises, checks, trees))
    problems.extend(_untagged_cells_running_stubs(nb, name, code_exercises, checks, trees))
    return problems


def _stubbed_functions(tree, title: str) -> set[str]:
    """The functions an exercise cell defines at its top level whose body holds its stub: in the learner's
    notebook each raises NotImplementedError when called."""
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and _eager_stubs(ast.Module(body=node.body, type_ignores=[]), title)}


_CATCHES_STUB = {"NotImplementedError", "Exception", "BaseException"}


def _without_guarded_tries(tree):
    """A copy of `tree` without the bodies of the `try` statements that catch NotImplementedError (by name, or as
    Exception, or bare): a cell may run an exercise's function there on purpose and say it is not done yet."""
    def catches(handler) -> bool:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        return any(k is None or (isinstance(k, ast.Name) and k.id in _CATCHES_STUB) for k in kinds)

    tree = copy.deepcopy(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(catches(h) for h in node.handlers):
            node.body = [ast.Pass()]
    return tree


def _runs(tree, unfinished: set[str]) -> tuple[set[str], dict[str, set[str]]]:
    """(the names in `unfinished` this cell reads when it runs, {each def it makes unfinished: what it reads})

    A def at the cell's top level whose body reads an unfinished name (not one of its own arguments or locals) is
    unfinished itself; a read outside any def or lambda body runs with the cell (a lambda is left out: whether it
    runs depends on what the cell does with it, and a check hands the function itself, not a lambda, to
    check_kernel). A name the cell binds itself is the cell's own, not the unfinished one."""
    unfinished = set(unfinished)
    tree = _without_guarded_tries(tree)
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    new: dict[str, set[str]] = {}
    changed = True
    while changed:
        changed = False
        for node in defs:
            reads = _free_names(ast.Module(body=[node], type_ignores=[])) & unfinished
            if node.name not in unfinished and reads:
                unfinished.add(node.name)
                new[node.name] = reads
                changed = True
    loads: set[str] = set()
    bound = _defined_names(tree)

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in getattr(node, "decorator_list", []) + node.args.defaults + node.args.kw_defaults:
                if d is not None:
                    visit(d)
            return
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return (loads - (bound - set(new))) & unfinished, new


def _untagged_cells_running_stubs(nb, name, code_exercises, checks, trees) -> list[str]:
    """A cell without the check tag that runs an exercise's stub (or a function built on it, or a value only a
    check cell computes) stops the learner's notebook with an error nbval does not expect."""
    problems = []
    starts = dict((i, t) for t, i in code_exercises)
    unfinished: dict[str, str] = {}      # name -> where it comes from, for the message
    bound_before: set[str] = set()       # names bound by the cells that run through in the learner's notebook
    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        if i in starts:
            tree = trees[i]
            bound_before |= _defined_names(tree) if tree is not None else set()
            blocks, _ = _blocks(cell, "")
            tree = _parse(_stripped_cell_source(cell, blocks)) if blocks else None
            if tree is not None:
                stubbed = _stubbed_functions(tree, starts[i])
                for fn in stubbed:
                    unfinished[fn] = (f"{fn} is the stub of {starts[i]!r} (cell {i}) in the learner's notebook and "
                                      f"raises NotImplementedError")
                for fn, reads in _runs(tree, stubbed)[1].items():   # a launcher beside its kernel, say
                    unfinished[fn] = (f"{fn} calls {', '.join(sorted(reads))}, the stub of {starts[i]!r} (cell {i}) "
                                      f"in the learner's notebook")
            continue
        tree = trees[i]
        if tree is None:
            continue
        ran, new = _runs(tree, set(unfinished))
        for fn, reads in new.items():
            unfinished[fn] = f"{fn} uses {', '.join(sorted(reads))}, unfinished in the learner's notebook"
        bound = _defined_names(tree) - set(new)
        if i in checks and ran:
            # In the learner's notebook the cell stops at its first statement that runs a stub: what the statements
            # before it bind exists, what that one and the later ones bind (and nothing before bound) does not.
            stop = next((k for k, stmt in enumerate(tree.body)
                         if _runs(ast.Module(body=[stmt], type_ignores=[]), set(unfinished))[0]), len(tree.body))
            before = _defined_names(ast.Module(body=tree.body[:stop], type_ignores=[]))
            for b in before:
                unfinished.pop(b, None)
            bound_before |= before
            for b in bound - before - bound_before:
                unfinished[b] = (f"{b} is bound only by check cell {i}, after the call that stops that cell in the "
                                 f"learner's notebook (a NameError here)")
            continue
        for b in bound:        # bound again by a cell that runs: the learner's notebook has it
            unfinished.pop(b, None)
        bound_before |= bound
        if i in checks:
            continue
        if ran:
            first = sorted(ran)[0]
            problems.append(f"{_where(name, i, cell)}: uses {first}, and {unfinished[first]}, so the learner's "
                            f"notebook stops here; tag this cell {CHECK_TAG!r} (build then marks it as expected to "
                            f"fail), or move the call into the exercise's check cell")
    return problems


def _checks_using_later_exercises(nb, name, code_exercises, checks, trees) -> list[str]:
    """A check cell that uses a name only a later exercise defines grades an exercise before it exists."""
    problems = []
    defined_by = {i: (_defined_names(t) if t is not None else set()) for i, t in trees.items()}
    for c in checks:
        if trees.get(c) is None:
            continue
        known = set().union(*(names for i, names in defined_by.items() if i <= c))
        used = _free_names(trees[c]) - known
        for title, e in code_exercises:
            late = sorted(used & defined_by.get(e, set())) if e > c else []
            if late:
                problems.append(f"{_where(name, c, nb.cells[c])}: a check cell before the exercise it grades: it "
                                f"uses {', '.join(late)}, which {title!r} defines later, in cell {e}")
    return problems


def _cell_id(index: int, taken: set[str]) -> str:
    base = hashlib.sha1(f"qwen_lab-cell-{index}".encode()).hexdigest()[:8]
    cid, n = base, 0
    while cid in taken:
        n += 1
        cid = f"{base}-{n}"
    return cid


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


def dumps(notebook) -> str:
    """The fixed text form of a notebook: nbformat's JSON (sorted keys, indent 1) and a final newline."""
    text = nbformat.writes(notebook, version=4)
    return text if text.endswith("\n") else text + "\n"


def build_notebook(notebook, name: str = "notebook") -> str:
    """Validate one solution notebook and return the text of its learner's version."""
    problems = validate(notebook, name)
    if problems:
        raise ExerciseError(problems)
    return dumps(strip_solutions(notebook))


# --------------------------------------------------------------------------------------------------
# Directories
# --------------------------------------------------------------------------------------------------

def _display(path: Path) -> str:
    path = Path(path)
    try:
        rel = os.path.relpath(path.resolve(), Path.cwd().resolve())
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if rel.startswith("..") else rel


def default_root() -> Path:
    """Where solutions/ and notebooks/ are when no option names them: the current directory when it holds
    solutions/ (the checkout you are working in), else the checkout this package was imported from when that has
    solutions/, else the current directory."""
    cwd = Path.cwd()
    if (cwd / "solutions").is_dir():
        return cwd
    here = Path(__file__).resolve().parent.parent
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


def build(solutions=None, notebooks=None) -> Report:
    """Write notebooks/ from solutions/ (only files whose text changes) and remove stale notebooks.

    Defaults as in `resolve_dirs`. A notebook in notebooks/ without a solution is removed only when
    `is_generated_notebook` says build wrote it (a chapter whose solution was deleted or renamed); any other file
    is left alone and listed in `kept`. Nothing is written when any solution has a problem (ExerciseError lists them
    all), nor when notebooks/ is the solutions folder or inside it.
    """
    solutions, notebooks = resolve_dirs(solutions, notebooks)
    _refuse_overlap(solutions, notebooks)
    built, report = _build_all(solutions)
    notebooks.mkdir(parents=True, exist_ok=True)
    for fname, text in built.items():
        target = notebooks / fname
        if not target.exists() or target.read_bytes() != text.encode("utf-8"):
            target.write_bytes(text.encode("utf-8"))
            report.written.append(_display(target))
    stale, other = _without_solution(notebooks, built)
    for path in stale:
        path.unlink()
        report.removed.append(_display(path))
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
                                   f"(it rewrites {_display(target)}: a change made there by hand is lost; make "
                                   f"it in {_display(source)})")
    stale, other = _without_solution(notebooks, built)
    for path in stale:
        report.problems.append(f"{_display(path)} has no counterpart in {_display(solutions)}/ "
                               f"(build removes it): {REBUILD}")
    report.kept = [_display(path) for path in other]
    return report


# --------------------------------------------------------------------------------------------------
# nbgrader
# --------------------------------------------------------------------------------------------------

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


def _print_problems(e: ExerciseError, solutions: Path) -> int:
    print(f"nothing written: {len(e.problems)} problem(s) in {_display(solutions)}/", file=sys.stderr)
    for p in e.problems:
        print(f"  {p}", file=sys.stderr)
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen_lab.exercises",
                                     description="Build the learner's notebooks/ from solutions/, or check they "
                                                 "are in sync.")
    dirs = argparse.ArgumentParser(add_help=False)
    dirs.add_argument("--solutions", type=Path, default=None, metavar="DIR",
                      help="the solution notebooks (default: solutions/ of the current directory when it has one, "
                           "else of the checkout qwen_lab is imported from)")
    dirs.add_argument("--notebooks", type=Path, default=None, metavar="DIR",
                      help="where the learner's notebooks go (default: notebooks/ beside --solutions DIR when that "
                           "is given, else notebooks/ of the same checkout as the default solutions/)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", parents=[dirs], help="write notebooks/ from solutions/")
    sub.add_parser("check", parents=[dirs], help="exit 1 unless notebooks/ is what solutions/ builds")
    sub.add_parser("list", parents=[dirs], help="list every exercise of every solution notebook")
    grader = sub.add_parser("nbgrader", help="write an nbgrader course directory (source/ and nbgrader_config.py)")
    grader.add_argument("--solutions", type=Path, default=None, metavar="DIR",
                        help="the solution notebooks (default: solutions/ of the current directory when it has "
                             "one, else of the checkout qwen_lab is imported from)")
    grader.add_argument("--out", type=Path, required=True, metavar="COURSE_DIR",
                        help="the nbgrader course directory to write (created if missing; its source/ notebooks "
                             "and nbgrader_config.py are overwritten)")
    args = parser.parse_args(argv)

    root = default_root()
    solutions = args.solutions if args.solutions is not None else root / "solutions"
    # which checkout the default folders come from, named on the output line
    defaults = "" if args.solutions is not None else f"; default folders from {_default_root_note(root)}"
    if args.command == "nbgrader":
        try:
            report = export_nbgrader(args.out, solutions)
        except ExerciseError as e:
            return _print_problems(e, solutions)
        print(f"wrote {len(report.written)} files: {report.notebooks} assignments under {_display(args.out)}/source/ "
              f"({report.exercises} exercises) and {_display(args.out / 'nbgrader_config.py')}")
        print(f"then, in {_display(args.out)}: nbgrader generate_assignment NN_name (one per chapter)")
        return 0
    solutions, notebooks = resolve_dirs(args.solutions, args.notebooks)
    where = f"{_display(notebooks)}/ in sync with {_display(solutions)}/"

    if args.command == "list":
        if not solutions.is_dir():
            print(f"{_display(solutions)}/: no such directory (pass --solutions DIR)", file=sys.stderr)
            return 1
        for path in sorted(solutions.glob("*.ipynb")):
            try:
                exercises = list_exercises(path)
            except ExerciseError as e:
                print(e, file=sys.stderr)
                return 1
            print(f"{_display(path)}: {len(exercises)} exercise(s)")
            for title, index in exercises:
                print(f"  cell {index:3d}  {title}")
        return 0

    if args.command == "build":
        try:
            report = build(solutions, notebooks)
        except ExerciseError as e:
            return _print_problems(e, solutions)
        for path in report.written:
            print(f"wrote {path}")
        for path in report.removed:
            print(f"removed {path} (no solution)")
        _print_kept(report)
        print(f"{_display(notebooks)}/ built from {_display(solutions)}/ ({report.notebooks} notebooks, "
              f"{report.exercises} exercises; {len(report.written)} written, {len(report.removed)} removed)"
              f"{defaults}")
        return 0

    report = check(solutions, notebooks)
    if not report.ok:
        for p in report.problems:
            print(p, file=sys.stderr)
        return 1
    _print_kept(report)
    print(f"{where} ({report.notebooks} notebooks, {report.exercises} exercises){defaults}")
    return 0


def _print_kept(report: Report) -> None:
    for path in report.kept:
        print(f"left {path} alone: it has no solution, and build did not write it")


if __name__ == "__main__":
    sys.exit(main())
