"""Your kernels, kept: when an exercise's check passes, the kernel you wrote is saved as a Python file in your
notebooks folder, and the finale (notebooks 10 and 13) puts every kept kernel into the model's operator table.

    keep(check_name, fn)     called by check_kernel when a check passes; never raises (a warning at most)
    kept_dir()               where kept kernels go: $QWEN_LAB_KEPT_DIR, else my_kernels/ in your notebooks folder
    load(folder=None)        {operator: Kept} for every kept file, one kernel per operator
    into_model(model, mine)  a twin of the model (the same weights) with your kernels in its table
    table(yours, model)      operator, yours or the library's, max error against the reference on the model's inputs
    generation(yours, model, ids)   the same prompt, greedy, with your kernels and with the library's

A kept file holds the @triton.jit kernel(s) and the launcher the check was given, read from the notebook's cells
with inspect.getsource, plus every function of the notebook they call, the imports they need, and a header naming
the exercise, the date and the operator table entry. Only exercises whose function can stand in for an operator of
qwen_lab.model.OPERATORS are kept (EXERCISES); NOT_KEPT says why the others cannot. Nothing is ever written into
the package or solutions/: outside a learner's notebooks folder (a checkout's root, solutions/, the tests) nothing
is kept unless QWEN_LAB_KEPT_DIR names a folder. `python -m qwen_lab.exercises build` writes notebooks/*.ipynb
and notebooks/.built.json only, so it never touches notebooks/my_kernels/.
"""

from __future__ import annotations

import builtins
import datetime
import dis
import importlib
import importlib.util
import inspect
import os
import sys
import textwrap
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .. import reference
from ..model import OPERATORS, Qwen35Model
from .checks.learner import _QWEN_LAB_DIR, _learner_code

ENV = "QWEN_LAB_KEPT_DIR"   # a folder to keep kernels in (empty: keep nothing); set by the tests
FOLDER = "my_kernels"       # the default: this folder inside the learner's notebooks folder


@dataclass(frozen=True)
class Exercise:
    """An exercise whose function can stand in for an operator table entry. `entry`: the notebook function to keep
    when the check is given a wrapper around it (11.1 checks `on_the_device`, which calls `sample_on_device`)."""
    number: str
    title: str
    operator: str
    entry: str | None = None

    @property
    def file_name(self) -> str:
        return f"ex{self.number.replace('.', '_')}_{self.operator}.py"


# check name (the first argument of check_kernel in the notebook) -> the exercise it grades. Where two exercises
# provide one operator, the first listed is loaded (03.1's GEMM serves every size; 04's split-K is made for decode).
EXERCISES = {
    "embedding": Exercise("01.2", "the embedding gather", "embedding"),
    "rms_norm": Exercise("02.1", "zero-centred RMSNorm", "rms_norm"),
    "add_rms_norm": Exercise("02.2", "fused residual add + RMSNorm", "add_rms_norm"),
    "gated_rms_norm": Exercise("02.3", "gated RMSNorm", "gated_rms_norm"),
    "matmul": Exercise("03.1", "the tiled GEMM", "linear"),
    "deterministic split-K linear": Exercise("04.2", "deterministic split-K", "linear"),
    "split-K linear": Exercise("04.1", "split-K with atomic_add", "linear"),
    "silu_mul": Exercise("05.1", "the silu(gate) * up kernel", "silu_mul"),
    "rope": Exercise("06.1", "the RoPE kernel", "rope"),
    "three-kernel attention": Exercise("07.3", "scores, masked softmax and weighted sum chained", "attention"),
    "causal_conv1d": Exercise("08.1", "causal conv1d with its state", "causal_conv1d"),
    "deltanet_gates": Exercise("08.2", "the gates", "deltanet_gates"),
    "delta_rule_recurrent": Exercise("08.3", "the recurrent delta rule", "delta_rule_recurrent"),
    "delta_rule_chunked (PyTorch prep + your scan)": Exercise("09.2", "the chunk scan", "delta_rule_chunked"),
    "sample_on_device": Exercise("11.1", "sampling on the device", "sample", entry="sample_on_device"),
}

# The exercises that are not kept, and why their function cannot stand in for an operator.
NOT_KEPT = {
    "01.1": "a vector add: no operator of the model adds two vectors on their own",
    "07.1, 07.2": "the scores and the masked softmax are parts of attention: their chain (07.3) is kept as attention",
    "09.1": "the triangular solve is one step of the chunked prep, which runs in PyTorch inside 09.2",
    "09.3": "a segment's map is a way to read the chunk scan, not an operator",
    "10.1": "the attention block is a whole mixer (a method of the model), built from the table's entries",
    "12.1": "the decode step is the loop around the model, not an entry of its table",
    "13.1, 13.2": "the floors are numbers about the model, not kernels",
    "14.1": "two dependent GEMVs ordered by a counter teach the persistent step's protocol; no operator of the "
            "model is two chained GEMVs (the persistent step is the whole decode step, not an entry of the table)",
}

# Names of the notebooks' setup that a kept file recomputes where it runs, rather than freezing the notebook's value
_SETUP_NAMES = {
    "on_gpu": "on_gpu = torch.cuda.is_available() and not _runtime.interpreter_active()",
    "rt": "rt = _runtime.choose()",
}
_CONSTANTS = (bool, int, float, str, type(None))


# ------------------------------------------------------------------------------------------------ where

def _forbidden(folder: Path) -> bool:
    """Inside the package, or inside the solutions/ folder of the checkout that holds it."""
    folder = folder.resolve()
    package = Path(_QWEN_LAB_DIR).resolve()
    solutions = package.parent / "solutions"
    return any(p == package or p == solutions for p in (folder, *folder.parents))


def kept_dir() -> Path | None:
    """The folder kept kernels go to and are loaded from, or None where nothing is kept: $QWEN_LAB_KEPT_DIR when
    set (empty: none), else my_kernels/ inside the current folder when it is a learner's notebooks folder (it holds
    the build's .built.json, or is named notebooks/) or a Colab session's; never inside the package or solutions/."""
    value = os.environ.get(ENV)
    if value is not None:
        folder = Path(value).expanduser() if value.strip() else None
    else:
        cwd = Path.cwd()
        learner = (cwd / ".built.json").is_file() or cwd.name == "notebooks" or "google.colab" in sys.modules
        folder = cwd / FOLDER if learner else None
    return None if folder is None or _forbidden(folder) else folder


# ------------------------------------------------------------------------------------------------ keeping

def _unwrap(obj):
    """The Python function under a @triton.jit kernel (or an autotuned one), else obj itself."""
    seen = 0
    while not isinstance(obj, types.FunctionType) and hasattr(obj, "fn") and seen < 4:
        obj, seen = obj.fn, seen + 1
    return obj


def _global_names(code: types.CodeType) -> list[str]:
    """The global names a function's code reads, nested functions and lambdas included, in order."""
    names = []
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval not in names:
            names.append(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += [n for n in _global_names(const) if n not in names]
    return names


def _import_line(name: str, obj) -> str | None:
    """`import ...` for a module, `from ... import ...` for a library's function or class, None otherwise."""
    if isinstance(obj, types.ModuleType):
        return f"import {obj.__name__}" if name == obj.__name__ else f"import {obj.__name__} as {name}"
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and qualname and "." not in qualname and module not in ("__main__", "builtins"):
        try:
            if getattr(importlib.import_module(module), qualname) is obj:
                return (f"from {module} import {qualname}" if name == qualname
                        else f"from {module} import {qualname} as {name}")
        except Exception:
            return None
    return None


def _collect(entry: Callable) -> tuple[list[str], list[str], list[str]]:
    """(sources, import lines, other lines) for `entry` and every notebook function it calls, dependencies first.
    Raises ValueError naming a value of the notebook the file could not carry (a tensor, a config)."""
    sources, imports, lines, seen = [], [], [], set()

    def visit(obj):
        fn = _unwrap(obj)
        if id(fn) in seen:
            return
        seen.add(id(fn))
        scope = fn.__globals__
        for name in _global_names(fn.__code__):
            if name not in scope:
                if hasattr(builtins, name):
                    continue
                raise ValueError(f"{fn.__name__} reads the name '{name}', which the notebook has not defined")
            value = scope[name]
            inner = _unwrap(value)
            if isinstance(inner, types.FunctionType) and _learner_code(inner.__code__.co_filename):
                visit(value)
            elif name in _SETUP_NAMES:
                line = _SETUP_NAMES[name]
                if line not in lines:
                    lines.append(line)
            elif (line := _import_line(name, value)) is not None:
                if line not in imports:
                    imports.append(line)
            elif isinstance(value, _CONSTANTS) or (isinstance(value, tuple) and all(isinstance(v, _CONSTANTS)
                                                                                     for v in value)):
                line = f"{name} = {value!r}"
                if line not in lines:
                    lines.append(line)
            else:
                raise ValueError(f"{fn.__name__} reads '{name}', a {type(value).__name__} of the notebook, which a "
                                 f"file cannot carry: pass it as an argument, or compute it inside the function")
        sources.append(textwrap.dedent(inspect.getsource(fn)).strip("\n"))   # after what it calls

    visit(entry)
    return sources, imports, lines


def kernel_file(exercise: Exercise, entry: Callable, when: datetime.datetime | None = None) -> str:
    """The text of the kept file for `entry`, the function that stands in for exercise.operator."""
    sources, imports, lines = _collect(entry)
    when = when or datetime.datetime.now(datetime.timezone.utc)
    name = _unwrap(entry).__name__
    header = (f'"""Your kernel of Exercise {exercise.number} ({exercise.title}).\n\n'
              f'Kept on {when:%Y-%m-%d %H:%M} UTC, when its check passed. It provides the operator table entry '
              f'`{exercise.operator}`:\nmodel.ops["{exercise.operator}"] = {name}. Copied from your notebook by '
              f'qwen_lab.course.kept; the next passing\ncheck of the exercise writes it again, and nothing else '
              f'of the course writes here.\n"""\n')
    imports = ["import torch", "import triton", "import triton.language as tl"] + [
        line for line in imports if line not in ("import torch", "import triton", "import triton.language as tl")]
    if any("_runtime." in line for line in lines):
        imports.append("from qwen_lab import runtime as _runtime")
    parts = [header, "\n".join(imports) + "\n",
             f'EXERCISE = "{exercise.number}"\nOPERATOR = "{exercise.operator}"\nENTRY = "{name}"\n']
    if lines:
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts) + "\n\n" + "\n\n\n".join(sources) + "\n"


def keep(check_name: str, fn: Callable, quiet: bool = False) -> Path | None:
    """Keep the learner's function of a passing check as a file in kept_dir(), when the check grades an exercise
    of EXERCISES and the function is the notebook's own. Returns the file's path, or None. Never raises: a kernel
    that cannot be kept is told in a warning, and the check still passes."""
    exercise = EXERCISES.get(check_name)
    if exercise is None:
        return None
    try:
        entry = fn.__globals__.get(exercise.entry) if exercise.entry else fn
        code = getattr(_unwrap(entry), "__code__", None)
        if code is None or not _learner_code(code.co_filename):
            return None                      # the library's own kernel, checked in a notebook: nothing to keep
        folder = kept_dir()
        if folder is None:
            return None
        text = kernel_file(exercise, entry)
        compile(text, exercise.file_name, "exec")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / exercise.file_name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        if not quiet:
            shown = os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd().resolve()) else path
            print(f"  kept: {shown} (your {exercise.operator}; notebooks 10 and 13 put it into the model)")
        return path
    except Exception as e:   # keeping is a gift, never a reason for a check to fail
        warnings.warn(f"qwen_lab.course.kept: Exercise {exercise.number} passed, but its kernel was not kept: "
                      f"{type(e).__name__}: {e}", stacklevel=3)
        return None


# ------------------------------------------------------------------------------------------------ loading

@dataclass(frozen=True)
class Kept:
    """A kept kernel, loaded: its exercise, the operator it provides, its file and its function."""
    exercise: str
    operator: str
    path: Path
    fn: Callable


def _load_file(path: Path) -> Kept:
    spec = importlib.util.spec_from_file_location(f"qwen_lab_kept_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    operator, entry = getattr(module, "OPERATOR", None), getattr(module, "ENTRY", None)
    if operator not in OPERATORS or not callable(getattr(module, entry or "", None)):
        raise ValueError(f"expected OPERATOR (one of the model's operators) and ENTRY (its function's name); found "
                         f"OPERATOR={operator!r}, ENTRY={entry!r}")
    return Kept(getattr(module, "EXERCISE", path.stem), operator, path, getattr(module, entry))


def load(folder=None) -> dict[str, Kept]:
    """{operator: Kept} of the kept files in `folder` (default: kept_dir()), one per operator, in the model's
    order. A file that does not load is skipped with a warning naming it."""
    folder = Path(folder) if folder is not None else kept_dir()
    if folder is None or not folder.is_dir():
        return {}
    rank = {e.file_name: i for i, e in enumerate(EXERCISES.values())}
    found: dict[str, Kept] = {}
    for path in sorted(folder.glob("ex*.py"), key=lambda p: rank.get(p.name, len(rank))):
        try:
            k = _load_file(path)
        except Exception as e:
            warnings.warn(f"{path}: not loaded: {type(e).__name__}: {e}", stacklevel=2)
            continue
        found.setdefault(k.operator, k)
    return {name: found[name] for name in OPERATORS if name in found}


def into_model(model: Qwen35Model, mine: dict[str, Kept]) -> Qwen35Model:
    """A twin of `model` (the same weights, device and dtype) with each kept kernel in its operator table."""
    yours = Qwen35Model(model.config, model.weights, backend=model.backend, rt=model.runtime)
    for name, k in mine.items():
        yours.ops[name] = k.fn
    yours.kept = dict(mine)
    return yours


# ------------------------------------------------------------------------------------------------ comparing

def _copy(v):
    """A copy of v with v's strides (a kernel meets the model's strided views here too)."""
    if not isinstance(v, torch.Tensor):
        return v
    if v.numel() == 0 or v.is_contiguous() or 0 in v.stride():
        return v.clone()
    return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device).copy_(v)


def operator_inputs(model: Qwen35Model, num_tokens: int = 8) -> dict[str, tuple]:
    """The arguments of each operator's first call in a prefill of num_tokens tokens and one decode step after it
    (the library's reference operators on the model's weights), plus one call of `sample` on the last logits."""
    oracle = Qwen35Model(model.config, model.weights, backend="torch", rt=model.runtime)
    seen: dict[str, tuple] = {}

    def recorded(name, fn):
        def run(*args):
            seen.setdefault(name, tuple(_copy(a) for a in args))
            return fn(*args)
        return run

    for name, fn in list(oracle.ops.items()):
        oracle.ops[name] = recorded(name, fn)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (num_tokens,), generator=g).to(model.device)
    cache = oracle.new_cache(num_tokens + 1)
    with torch.no_grad():
        logits = oracle.step(ids, torch.arange(num_tokens, device=model.device), cache)
        oracle.step(ids[-1:], torch.tensor([num_tokens], device=model.device), cache)
    seen["sample"] = (logits[-1].clone(),)
    return seen


def _max_error(fn: Callable, ref: Callable, args: tuple) -> float:
    """The largest |difference| over the outputs and over every tensor argument after the call (a cache or a state
    written in place), yours against the reference, on copies of the same arguments."""
    a, b = tuple(_copy(x) for x in args), tuple(_copy(x) for x in args)
    with torch.no_grad():
        got, want = fn(*a), ref(*b)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    pairs = list(zip(got, want)) + [(x, y) for x, y in zip(a, b) if isinstance(x, torch.Tensor)]
    worst = 0.0
    for x, y in pairs:
        d = (x.float() - y.float()).abs().max().item() if x.numel() else 0.0
        worst = max(worst, d if d == d else float("inf"))   # NaN counts as the worst
    return worst


def _sample_agreement(fn: Callable, logits: torch.Tensor) -> str:
    """Draws of your sampler against reference.sample on the same logits, settings and uniform numbers."""
    settings = [(0.0, 0, 1.0, 0.5)] + [(0.8, 20, 0.9, u / 8) for u in range(8)]
    same = 0
    for t, k, p, u in settings:
        uniform = torch.tensor(u, device=logits.device)
        same += int(fn(logits, t, k, p, uniform)) == int(reference.sample(logits, t, k, p, uniform))
    return f"same token in {same} of {len(settings)} draws"


def table(yours: Qwen35Model, model: Qwen35Model, num_tokens: int = 8) -> str:
    """A table of every operator: yours (the exercise) or the library's, and for yours the max error against
    the reference operator on the model's own inputs of a short prompt. A sentence where nothing is kept."""
    mine = getattr(yours, "kept", {})
    if not mine:
        return ("No kernel of yours is kept yet: each exercise check that passes in your notebooks keeps its kernel "
                f"in {FOLDER}/ beside them, and this table then shows it in the model.")
    inputs = operator_inputs(model, num_tokens)
    lines = [f"{'operator':22s} {'kernel':40s} max error vs reference ({num_tokens}-token prompt, then a decode step)"]
    for name in OPERATORS:
        if name not in mine:
            lines.append(f"{name:22s} the library's")
            continue
        k = mine[name]
        if name == "sample":
            error = _sample_agreement(k.fn, inputs["sample"][0])
        else:
            try:
                error = f"{_max_error(k.fn, getattr(reference, name), inputs[name]):.2e}"
            except Exception as e:
                error = f"failed here: {type(e).__name__}: {e}"
        lines.append(f"{name:22s} {'yours: ' + k.exercise + ' ' + k.fn.__name__:40s} {error}")
    folder = next(iter(mine.values())).path.parent
    lines.append(f"{len(mine)} of {len(OPERATORS)} operators are yours, loaded from {folder}")
    return "\n".join(lines)


def generate_both(yours: Qwen35Model, model: Qwen35Model, ids, max_new_tokens: int = 8):
    """(your tokens, the library's tokens, relative error of the prompt's logits), greedy, both launched from Python
    (no CUDA Graph: a kernel of yours need not be capturable here). The fast route runs the plain operators around
    each of your kernels; its one warning per entry is left out here."""
    from ..generation import generate

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="qwen_lab.plan")
        mine = generate(yours, ids, max_new_tokens=max_new_tokens, cuda_graph=False)
        theirs = generate(model, ids, max_new_tokens=max_new_tokens, cuda_graph=False)
        ids = torch.as_tensor(ids, device=model.device)
        a, b = yours.forward(ids), model.forward(ids)
    return mine, theirs, float((a - b).norm() / b.norm().clamp_min(1e-30))


def generation(yours: Qwen35Model, model: Qwen35Model, ids, tok=None, max_new_tokens: int = 8) -> str:
    """Greedy generation with your kernels and with the library's, side by side, and whether they agree."""
    mine, theirs, err = generate_both(yours, model, ids, max_new_tokens)
    show = (lambda t: repr(tok.decode(t.tolist()))) if tok is not None else (lambda t: str(t.tolist()))
    verdict = "the same tokens" if torch.equal(mine, theirs) else "different tokens"
    if verdict == "different tokens" and model.dtype != torch.float32:   # (a bug shows in the table's errors)
        verdict += (f" ({str(model.dtype).removeprefix('torch.')} rounds each kernel's output; on random weights "
                    f"two tokens are often nearly tied, and a last bit decides)")
    return (f"your kernels:      {show(mine)}\nthe library's:     {show(theirs)}\n{verdict}; the prompt's logits "
            f"differ by {err:.2e} (relative)")


__all__ = ["ENV", "EXERCISES", "FOLDER", "Exercise", "Kept", "NOT_KEPT", "generate_both", "generation",
           "into_model", "keep", "kept_dir", "kernel_file", "load", "operator_inputs", "table"]
