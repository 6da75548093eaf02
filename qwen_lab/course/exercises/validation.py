"""The rules a solution notebook must follow before it becomes a learner's notebook (`validate`), with the Python
reading of code cells they need, and the exercises of a notebook (`list_exercises`, `exercise_and_check`).
"""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

from .cells import (_CODE_TITLE_LIKE, _NUMBERED, BEGIN, CHECK_TAG, DEFAULT_TITLE, END, MARKDOWN_STUB, ExerciseError,
                    _Block, _blocks, _is_check, _lines, _near_markers, _stripped_cell_source, _where, cell_title,
                    markers, stub_line)
from .files import _as_notebook

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
# Whole notebooks: the exercises, and the rules
# --------------------------------------------------------------------------------------------------


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
                line.strip() in markers(cell) for line in _lines(source)):
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
