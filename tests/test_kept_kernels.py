"""The learner's kernels, kept (qwen_lab.course.kept): a passing exercise check writes the kernel's source to the
learner's folder, never into the package or solutions/ and never failing the check; `exercises build` leaves that
folder alone; the finale loads every kept kernel into the model and generates as the library's kernels do.
"""

from __future__ import annotations

import ast
import json
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from qwen_lab import reference, runtime
from qwen_lab.course import checks, kept
from qwen_lab.course.exercises import building

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"


@pytest.fixture
def kept_folder(tmp_path, monkeypatch):
    folder = tmp_path / "my_kernels"
    monkeypatch.setenv(kept.ENV, str(folder))
    return folder


# A learner's kernel, as a notebook cell would define it (a test file is the learner's code, as a cell is)
@triton.jit
def _norm_kernel(x_ptr, w_ptr, out_ptr, D, eps, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.math.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + cols, (x * inv_rms * (1.0 + w)).to(out_ptr.dtype.element_ty), mask=mask)


LANES = 16   # a constant of the notebook, carried into the kept file


def learners_rms_norm(x, weight, eps):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty_like(x2)
    _norm_kernel[(x2.shape[0],)](x2, weight, out, x2.shape[1], eps,
                                 BLOCK_D=max(LANES, triton.next_power_of_2(x2.shape[1])))
    return out.reshape(x.shape)


def _norm_cases():
    dev = runtime.choose().device   # the kernels launch there: on a GPU, cases on the CPU would not reach them
    return [lambda g: dict(x=checks.randn(6, 40, g=g, device=dev), weight=checks.randn(40, g=g, scale=0.1, device=dev),
                           eps=1e-6)]


def test_a_passing_check_keeps_the_kernel_as_a_loadable_file(kept_folder, capsys):
    checks.check_kernel("rms_norm", learners_rms_norm, reference.rms_norm, _norm_cases())
    path = kept_folder / "ex02_1_rms_norm.py"
    assert path.is_file(), sorted(p.name for p in kept_folder.glob("*"))
    text = path.read_text()
    assert text.startswith('"""Your kernel of Exercise 02.1 (zero-centred RMSNorm).')
    assert re.search(r"Kept on \d{4}-\d\d-\d\d \d\d:\d\d UTC", text)
    assert 'model.ops["rms_norm"] = learners_rms_norm' in text
    assert "@triton.jit\ndef _norm_kernel" in text and "LANES = 16" in text
    # the kernel comes before the launcher that calls it
    assert text.index("def _norm_kernel") < text.index("def learners_rms_norm")
    assert f"kept: {path}" in capsys.readouterr().out

    mine = kept.load(kept_folder)
    assert list(mine) == ["rms_norm"] and mine["rms_norm"].exercise == "02.1"
    dev = runtime.choose().device
    x, w = torch.randn(3, 5, 40, device=dev), torch.randn(40, device=dev) * 0.1
    torch.testing.assert_close(mine["rms_norm"].fn(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))


BIG = torch.ones(3)   # a tensor of the notebook: a kept file cannot carry it


def learners_rms_norm_reading_a_tensor(x, weight, eps):
    return learners_rms_norm(x, weight + 0 * BIG.sum(), eps)


def test_keeping_never_fails_a_check(kept_folder):
    with pytest.warns(UserWarning, match=r"Exercise 02\.1 passed, but its kernel was not kept: .*'BIG', a Tensor"):
        results = checks.check_kernel("rms_norm", learners_rms_norm_reading_a_tensor, reference.rms_norm,
                                      _norm_cases())
    assert results and not kept_folder.exists()


def test_only_the_learners_own_kernel_of_an_exercise_is_kept(kept_folder):
    from qwen_lab.kernels import norms

    checks.check_kernel("rms_norm", norms.rms_norm, reference.rms_norm, _norm_cases())   # the library's kernel
    checks.check_kernel("my own norm", learners_rms_norm, reference.rms_norm, _norm_cases())   # no exercise's
    assert not kept_folder.exists()


def test_nothing_is_kept_outside_a_learners_notebooks_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(kept.ENV, raising=False)
    monkeypatch.chdir(tmp_path)                             # a folder that is no learner's notebooks folder
    assert kept.kept_dir() is None
    for forbidden in (REPO / "qwen_lab" / "my_kernels", SOLUTIONS / "my_kernels"):
        monkeypatch.setenv(kept.ENV, str(forbidden))
        assert kept.kept_dir() is None
        checks.check_kernel("rms_norm", learners_rms_norm, reference.rms_norm, _norm_cases(), quiet=True)
        assert not forbidden.exists()
    monkeypatch.setenv(kept.ENV, "")                        # empty: keep nothing
    assert kept.kept_dir() is None
    monkeypatch.delenv(kept.ENV)
    learner = tmp_path / "notebooks"
    learner.mkdir()
    monkeypatch.chdir(learner)
    assert kept.kept_dir() == learner / kept.FOLDER


def test_every_kept_exercise_is_a_check_of_its_chapter_and_an_operator():
    from qwen_lab.model import OPERATORS

    for name, exercise in kept.EXERCISES.items():
        assert exercise.operator in OPERATORS, exercise
        (notebook,) = SOLUTIONS.glob(f"{exercise.number[:2]}_*.ipynb")
        sources = "".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])
        assert f'check_kernel("{name}"' in sources, f"{notebook.name} has no check named {name!r}"


def test_build_never_overwrites_or_removes_kept_kernels(tmp_path):
    notebooks = tmp_path / "notebooks"
    mine = notebooks / kept.FOLDER
    mine.mkdir(parents=True)
    files = {"ex02_1_rms_norm.py": "# the learner's rms_norm\n", "ex03_1_linear.py": "# the learner's GEMM\n",
             "01_notes.ipynb": "{}\n"}
    for name, text in files.items():
        (mine / name).write_text(text)
    building.build(SOLUTIONS, notebooks)
    edited = notebooks / "02_rmsnorm.ipynb"            # a hand edit, then build --force over it
    edited.write_text(edited.read_text().replace("RMSNorm", "RMS norm", 1))
    building.build(SOLUTIONS, notebooks, force=True)
    assert sorted(p.name for p in mine.iterdir()) == sorted(files)
    for name, text in files.items():
        assert (mine / name).read_text() == text
    assert building.check(SOLUTIONS, notebooks).ok


# ------------------------------------------------------------------------------------------------
# The solution notebooks' checks keep every kernel; the finale loads them and generates as the library does
# ------------------------------------------------------------------------------------------------

def _names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell defines, names it reads), generously: a cell kept too many costs time, one too few breaks."""
    tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
    defined, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (defined if isinstance(node.ctx, (ast.Store, ast.Del)) else used).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    return defined, used


def _cells_for(notebook, targets: list[int]) -> list:
    """The setup cell, the target code cells and every earlier code cell that defines a name they read."""
    code = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code"]
    chosen, wanted = {code[0], *targets}, set()
    for i in reversed([i for i in code if i <= max(targets)]):
        defined, used = _names(notebook.cells[i].source)
        if i in chosen or defined & wanted:
            chosen.add(i)
            wanted = (wanted - defined) | used
    return [notebook.cells[i] for i in sorted(chosen)]


def _run(cells, tmp_path, env, metadata):
    from nbclient import NotebookClient
    from nbformat.v4 import new_notebook

    nb = new_notebook(cells=cells, metadata=metadata)
    for cell in nb.cells:
        cell.outputs, cell.execution_count = [], None
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    return nb


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


@pytest.mark.slow
def test_the_solutions_keep_their_kernels_and_the_finale_generates_with_them(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat

    strict = runtime.interpreter_active()   # the notebooks run float32 here; bf16 on a GPU
    folder = tmp_path / "my_kernels"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               **{kept.ENV: str(folder)})
    by_chapter: dict[str, list[str]] = {}
    for name, exercise in kept.EXERCISES.items():
        by_chapter.setdefault(exercise.number[:2], []).append(name)
    for chapter, names in sorted(by_chapter.items()):
        (path,) = SOLUTIONS.glob(f"{chapter}_*.ipynb")
        nb = nbformat.read(str(path), as_version=4)
        targets = [i for i, c in enumerate(nb.cells) for n in names if f'check_kernel("{n}"' in c.source]
        assert len(targets) == len(names), (path.name, names)
        _run(_cells_for(nb, targets), tmp_path, env, nb.metadata)
    assert sorted(p.name for p in folder.glob("*.py")) == sorted(e.file_name for e in kept.EXERCISES.values())

    # the finale: notebook 13's section that loads them, after the cells it needs
    nb = nbformat.read(str(SOLUTIONS / "13_generation_and_benchmark.ipynb"), as_version=4)
    (finale,) = [i for i, c in enumerate(nb.cells) if "kept.load()" in c.source]
    out = _text(_run(_cells_for(nb, [finale]), tmp_path, env, nb.metadata).cells[-1])
    mine = kept.load(folder)
    assert set(mine) == {e.operator for e in kept.EXERCISES.values()}
    for operator, k in mine.items():                                # (03.1 serves linear, not 04.1 or 04.2)
        row = re.search(rf"^{operator} +yours: {re.escape(k.exercise)} {k.fn.__name__} +(.+)$", out, re.M)
        assert row, out
        if operator == "sample":                                    # the same draws as reference.sample
            assert re.fullmatch(r"same token in (\d+) of \1 draws", row.group(1)), row.group(0)
        elif strict:                                                # float32: the reference's values, nearly
            assert float(row.group(1)) < 1e-4, row.group(0)
        else:                                                       # bf16 on a GPU: finite, and not far off
            assert float(row.group(1)) < 1.0, row.group(0)
    for name in ("kv_cache_write", "sigmoid_gate"):                # no exercise writes these two
        assert re.search(rf"^{name} +the library's$", out, re.M), out
    # greedy generation with every kept kernel: the library's tokens, and the prompt's logits close to its logits
    # (in float32; in bf16 a near tie between two tokens may go either way, as the notebook's line says)
    assert re.search(r"^(the same|different) tokens.*; the prompt's logits differ by \S+ \(relative\)$", out, re.M)
    assert not strict or "\nthe same tokens; " in out, out
    assert float(re.search(r"differ by (\S+) \(relative\)", out).group(1)) < (1e-4 if strict else 0.1), out


def test_the_finale_says_so_when_nothing_is_kept(kept_folder):
    import qwen_lab

    model = qwen_lab.load_model("tiny", backend="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mine = kept.load()
    assert mine == {}
    assert kept.table(kept.into_model(model, mine), model).startswith("No kernel of yours is kept yet")
