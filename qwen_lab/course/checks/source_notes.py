"""Notes from reading the learner's kernels' source (their AST): a store without a mask or with a mask that holds one
value for the whole block, program ids taken from the wrong grid axis, masked loads without `other=` that reach a
reduction, and in-place updates without a barrier. A failing (or passing) check adds them to what it says.
"""

from __future__ import annotations

from .learner import _learner_code

def _kernel_tree(fn):
    """(the kernel's FunctionDef, the line of its file where its source starts), or None without source."""
    import ast
    import inspect
    import textwrap

    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    tree = ast.parse(textwrap.dedent("".join(lines)))
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef)), None)
    return None if node is None else (node, first)


def _learner_kernels(functions: dict):
    """(name, the kernel's FunctionDef, the line of its file where its source starts, its `_bindings`) for each of
    the learner's kernels among functions (name -> Python function) whose source can be read; qwen_lab's own kernels,
    launched beside the learner's, are left out (not the learner's to fix)."""
    for name, fn in functions.items():
        code = getattr(fn, "__code__", None)
        if code is not None and not _learner_code(code.co_filename):
            continue
        parsed = _kernel_tree(fn)
        if parsed is not None:
            yield name, parsed[0], parsed[1], _bindings(parsed[0])


def _is_tl(node, *names) -> bool:
    """node is a call tl.<name>(...) for one of names."""
    import ast

    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "tl")


def _bindings(func) -> dict:
    """name -> the expressions assigned to it anywhere in the kernel (x = ..., x += ..., a, b = c, d)."""
    import ast

    found: dict = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node.value)
                elif isinstance(target, ast.Tuple):
                    values = node.value.elts if isinstance(node.value, ast.Tuple) and \
                        len(node.value.elts) == len(target.elts) else [node.value] * len(target.elts)
                    for t, v in zip(target.elts, values):
                        if isinstance(t, ast.Name):
                            found.setdefault(t.id, []).append(v)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) and node.value:
            found.setdefault(node.target.id, []).append(node.value)
    return found


def _per_lane(expr, bindings: dict, seen: frozenset = frozenset()):
    """Whether expr varies across a block's lanes: True when it reaches a tl.arange (through the names it uses),
    False when it is built from program ids, scalars and constants only, None when a call to another function hides
    it."""
    import ast

    unknown = False
    for node in ast.walk(expr):
        if _is_tl(node, "arange"):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in ("min", "max"):
            unknown = True   # a helper function: what it returns is not read here
        if isinstance(node, ast.Name) and node.id in bindings and node.id not in seen:
            for value in bindings[node.id]:
                lane = _per_lane(value, bindings, seen | {node.id})
                if lane:
                    return True
                unknown |= lane is None
    return None if unknown else False


def store_notes(functions: dict, grids: dict | None = None, past_rows: bool = False) -> list[str]:
    """Sentences on the learner's kernels (name -> Python function) for a store that went outside a tensor: each
    tl.store of a block without a mask, or with a mask that holds one value for the whole block (no tl.arange in
    it: built from program ids and scalars, it lets every lane through or none); and, when the strays lie past a
    tensor's last row (`past_rows`), which program axis each index comes from, beside the grid of the launch."""
    import ast

    notes = []
    for name, func, first, bindings in _learner_kernels(functions):
        for node in ast.walk(func):
            if not _is_tl(node, "store", "atomic_add") or not node.args:
                continue
            line = f"{name} (line {first + node.lineno - 1} of its file)"
            mask = next((k.value for k in node.keywords if k.arg == "mask"), node.args[2] if len(node.args) > 2
                        else None)
            if any(k.arg == "boundary_check" for k in node.keywords) or not _per_lane(node.args[0], bindings):
                continue   # a block pointer's store, or one element per program: no lanes to mask
            lanes = sorted({n.id for n in ast.walk(node.args[0]) if isinstance(n, ast.Name) and n.id in bindings
                            and _per_lane(n, bindings)})
            offsets = f" (`{'`, `'.join(lanes)}`)" if lanes else ""
            if mask is None:
                notes.append(f"{line} stores `{ast.unparse(node)}` with no mask: every lane of the block writes, "
                             f"also those past the tensor's end; mask it with a comparison of the lanes' offsets"
                             f"{offsets} and the length")
                continue
            if _per_lane(mask, bindings) is False:
                shown = ast.unparse(mask)
                if isinstance(mask, ast.Name) and len(bindings.get(mask.id, ())) == 1:
                    shown += f"` (= `{ast.unparse(bindings[mask.id][0])}`)"
                else:
                    shown += "`"
                notes.append(f"{line}: the mask `{shown} of its tl.{node.func.attr} holds one value for the whole "
                             f"block: it uses no tl.arange (only program ids and scalars), so it lets every lane "
                             f"through or none. Build it from the lanes' offsets in the store's address{offsets}, e.g. "
                             f"`offsets < n`")
        if past_rows and not any(note.startswith(f"{name} (line") and "one value for the whole block" in note
                                 for note in notes):   # (a mask with no lanes explains the strays already)
            axes = []
            for var, values in bindings.items():
                for v in values:
                    if _is_tl(v, "program_id"):
                        arg = v.args[0] if v.args else next((k.value for k in v.keywords if k.arg == "axis"), None)
                        axes.append(f"`{var} = tl.program_id({ast.unparse(arg) if arg is not None else ''})`")
            if len(axes) > 1:
                grid = (grids or {}).get(name)
                along = ", ".join(f"{n} along axis {a}" for a, n in enumerate(grid or ()))
                ran = f"ran on the grid {grid} ({along.replace(' along', ' program(s) along', 1)}) and " if grid else ""
                notes.append(f"{name} {ran}takes {', '.join(axes)}: does each index come from the axis the launcher "
                             f"sized for it? tl.program_id(0) counts along the grid's first entry, tl.program_id(1) "
                             f"along its second")
    return notes


# the calls through which a masked-off lane can reach a result that is stored (tl.sum(x) or x.sum(), and so on)
_REDUCTIONS = frozenset({"sum", "max", "min", "argmax", "argmin", "dot", "reduce", "cumsum", "cumprod",
                         "associative_scan", "xor_sum", "dot_scaled"})


def unfilled_masked_loads(functions: dict) -> list[str]:
    """For each kernel (name -> its Python function) that reduces (a sum, max, dot, scan...), the `tl.load` calls
    with a `mask` and no `other`: what lanes it masks off hold is not defined (whatever the GPU returns; zeros under
    the interpreter), harmless when those lanes are never used, wrong once they reach a max, a sum or a dot. A
    kernel without a reduction is left out: its masked lanes reach no stored value (a masked store drops them),
    and pointing at them would send a learner after a mistake that is not there. -> one sentence per such load."""
    import ast

    found = []
    for name, tree, first, _ in _learner_kernels(functions):
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        if not any(c.func.attr in _REDUCTIONS for c in calls):
            continue
        for node in calls:
            if not (node.func.attr == "load"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "tl"):
                continue
            keywords = {k.arg for k in node.keywords}
            if "mask" in keywords and "other" not in keywords and len(node.args) < 3:
                found.append(f"{name} (line {first + node.lineno - 1} of its file) loads `{ast.unparse(node)}` with a "
                             f"mask and no `other=`: the lanes it masks off hold undefined values (zeros under the "
                             f"interpreter). If they reach a max, a sum or a dot, give them the value that leaves "
                             f"them out: other=float('-inf') for a max, other=0.0 for a sum.")
    return found


def _base_pointer(expr, bindings: dict, seen: frozenset = frozenset()):
    """The name of the pointer an address expression starts from (`state_ptr` in `state_ptr + rows * stride + c`,
    through names bound to such sums), or None where it cannot be told."""
    import ast

    while isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
        expr = expr.left
    if isinstance(expr, ast.Name):
        values = bindings.get(expr.id, [])
        if len(values) == 1 and expr.id not in seen:
            return _base_pointer(values[0], bindings, seen | {expr.id}) or expr.id
        return expr.id
    return None


def unordered_inplace_updates(functions: dict) -> list[str]:
    """For each learner's kernel (name -> its Python function), a `tl.store` through a pointer that a `tl.load` of
    the same kernel read earlier (by line) at other addresses, with no `tl.debug_barrier()` between the two: an
    update in place, such as a state shifted by some columns. The threads of one program run at their own pace, so
    one may overwrite an element that another has not read yet. The interpreter runs each program as one thread,
    in order, so the results are right there; on a GPU they may be wrong now and then. -> one sentence per store."""
    import ast

    found = []
    for name, func, first, bindings in _learner_kernels(functions):
        loads, stores, barriers = [], [], []
        for node in ast.walk(func):
            if _is_tl(node, "debug_barrier"):
                barriers.append(node.lineno)
            elif _is_tl(node, "load", "store") and node.args:
                base = _base_pointer(node.args[0], bindings)
                if base is not None:
                    (loads if node.func.attr == "load" else stores).append((node.lineno, base, node))
        for line, base, store in sorted(stores, key=lambda x: x[0]):
            earlier = [(ln, ld) for ln, b, ld in loads if b == base and ln < line
                       and ast.dump(ld.args[0]) != ast.dump(store.args[0])]   # (the same address: each lane its own)
            if not earlier:
                continue
            last = max(ln for ln, _ in earlier)
            if any(last < b < line for b in barriers):
                continue
            found.append(f"{name} (line {first + line - 1} of its file) stores through `{base}` at other addresses "
                         f"than its tl.load on line {first + last - 1} read, with no tl.debug_barrier() between them: "
                         f"the threads of one program run at their own pace, so one may overwrite an element another "
                         f"has not read yet (the interpreter runs a program as one thread, so it cannot show here; a "
                         f"GPU may, now and then). Call tl.debug_barrier() after the last load and before the store.")
    return found
