"""The exercise builder: notebooks/ in sync with solutions/, stubs that raise until filled in, validation.

The fixture tests/data/exercise_fixture.ipynb is a tiny solution notebook (with outputs from a CPU run):
cell 3 is Exercise 99.1 (its block in a @triton.jit body), cell 4 checks it, cell 6 is a written answer
(Exercise 99.2), cell 7 is Exercise 99.3 (its block nested 12 spaces deep), cell 8 checks it, cell 9
needs no exercise, cell 10 needs both and is tagged check.
"""

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the exercise tooling needs nbformat (requirements.txt)")
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell

from qwen_lab.course import exercises as ex
from qwen_lab.course.exercises import building, cells, validation

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).resolve().parent / "data" / "exercise_fixture.ipynb"
CHECK_CELLS = (4, 8, 10)
SOLUTION_LINES = ("tl.store(y_ptr + offs", "e = torch.exp(row - row.max())", "Because $n = 100$")


def _read(path):
    return nbformat.read(str(path), as_version=4)


def _built_fixture(tmp_path):
    """Build the fixture with the real command's code path into tmp_path/notebooks."""
    sol, out = tmp_path / "solutions", tmp_path / "notebooks"
    sol.mkdir()
    (sol / "99_fixture.ipynb").write_bytes(FIXTURE.read_bytes())
    report = ex.build(sol, out)
    return sol / "99_fixture.ipynb", out / "99_fixture.ipynb", report


# ------------------------------------------------------------------------------------------------
# The real repository
# ------------------------------------------------------------------------------------------------

def test_repo_notebooks_in_sync_with_solutions():
    """Fails whenever a solution changed and `python -m qwen_lab.exercises build` was not run."""
    proc = subprocess.run([sys.executable, "-m", "qwen_lab.exercises", "check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exercises check failed:\n{proc.stderr}{proc.stdout}"
    n = len(list((REPO / "solutions").glob("*.ipynb")))
    assert re.search(rf"in sync with .*solutions/ \({n} notebooks, \d+ exercises\)", proc.stdout), proc.stdout


def _repo_notebook_names():
    names = sorted({p.name for d in ("solutions", "notebooks") for p in (REPO / d).glob("*.ipynb")})
    return names or [pytest.param(None, marks=pytest.mark.skip(reason="no solution notebooks in the repo yet"))]


@pytest.mark.parametrize("name", _repo_notebook_names())
def test_repo_exercise_stubs_raise_and_are_checked(name):
    """Static: each exercise cell of notebooks/NAME holds its raise, and a check-tagged cell follows it."""
    sol_path, nb_path = REPO / "solutions" / name, REPO / "notebooks" / name
    assert sol_path.exists(), f"notebooks/{name} has no solution: python -m qwen_lab.exercises build removes it"
    assert nb_path.exists(), f"notebooks/{name} is missing: run python -m qwen_lab.exercises build"
    sol, nb = _read(sol_path), _read(nb_path)
    assert len(sol.cells) == len(nb.cells)
    expected = ex.list_exercises(sol)
    assert ex.list_exercises(nb) == expected
    for cell in nb.cells:
        assert not any(line.strip() in (ex.BEGIN, ex.END, ex.MD_BEGIN, ex.MD_END) for line in cell.source.splitlines()), \
            f"notebooks/{name}: a solution marker survived"
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
        if ex.CHECK_TAG in cell.metadata.get("tags", []):
            assert ex.RAISES_TAG in cell.metadata["tags"]
    checks = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and ex.CHECK_TAG in c.metadata.get("tags", [])]
    for title, index in expected:
        cell = nb.cells[index]
        if cell.cell_type == "markdown":
            assert ex.MARKDOWN_STUB in cell.source.splitlines()
            continue
        assert ex.stub_line(title) in [line.strip() for line in cell.source.splitlines()], \
            f"notebooks/{name}, cell {index}: no stub for {title!r}"
        assert any(c > index for c in checks), f"notebooks/{name}: no check cell after {title!r} (cell {index})"


# ------------------------------------------------------------------------------------------------
# Building the fixture
# ------------------------------------------------------------------------------------------------

def test_fixture_is_a_valid_solution_with_outputs():
    nb = _read(FIXTURE)
    assert ex.validate(nb, str(FIXTURE)) == []
    assert [t for t, _ in ex.list_exercises(FIXTURE)] == [
        "Exercise 99.1: scale and shift in Triton", "Exercise 99.2: why does the kernel need a mask?",
        "Exercise 99.3: softmax that survives fully masked rows"]
    assert [i for _, i in ex.list_exercises(FIXTURE)] == [3, 6, 7]
    # the point of clearing: the solution carries outputs and run metadata from a CPU run
    assert any(c.cell_type == "code" and c.outputs for c in nb.cells)
    assert any("execution" in c.metadata for c in nb.cells)


def test_blocks_become_raises_at_the_marker_indentation(tmp_path):
    sol_path, nb_path, _ = _built_fixture(tmp_path)
    sol, nb = _read(sol_path), _read(nb_path)
    kernel = nb.cells[3].source.splitlines()
    assert '    raise NotImplementedError("Exercise 99.1: scale and shift in Triton")' in kernel
    nested = nb.cells[7].source.splitlines()
    assert '            raise NotImplementedError("Exercise 99.3: softmax that survives fully masked rows")' in nested
    text = "".join(c.source for c in nb.cells)
    for line in SOLUTION_LINES + (ex.BEGIN, ex.END, ex.MD_BEGIN, ex.MD_END):
        assert line not in text
    # everything outside the blocks is unchanged, line for line
    for i in (3, 7):
        kept, inside = [], False
        for line in sol.cells[i].source.splitlines():
            if line.strip() in (ex.BEGIN, ex.END):
                inside = line.strip() == ex.BEGIN
                if inside:
                    kept.append(None)
                continue
            if not inside:
                kept.append(line)
        got = nb.cells[i].source.splitlines()
        assert len(got) == len(kept)
        assert all(k is None and "raise NotImplementedError" in g or k == g for k, g in zip(kept, got))
    # cells without markers are copied as they are
    for i, (a, b) in enumerate(zip(sol.cells, nb.cells)):
        if i not in (3, 6, 7):
            assert a.source == b.source and a.cell_type == b.cell_type


def test_markdown_answer_replaced(tmp_path):
    _, nb_path, _ = _built_fixture(tmp_path)
    answer = _read(nb_path).cells[6].source
    assert answer == "### Exercise 99.2: why does the kernel need a mask?\n\n*Your answer here.*"


def test_check_cells_tagged_outputs_cleared_ids_kept(tmp_path):
    sol_path, nb_path, report = _built_fixture(tmp_path)
    sol, nb = _read(sol_path), _read(nb_path)
    assert report.notebooks == 1 and report.exercises == 3 and len(report.written) == 1
    for i, (a, b) in enumerate(zip(sol.cells, nb.cells)):
        assert a.id == b.id
        tags = a.metadata.get("tags", [])
        if i in CHECK_CELLS:
            assert tags == ["check"] and b.metadata["tags"] == ["check", "raises-exception"]
        else:
            assert b.metadata.get("tags", []) == tags
        assert "execution" not in b.metadata
        if b.cell_type == "code":
            assert b.outputs == [] and b.execution_count is None
    assert "version" not in nb.metadata.language_info and nb.metadata.kernelspec.name == "python3"
    assert nb.nbformat == 4 and nb.nbformat_minor >= 5


def test_build_is_deterministic(tmp_path):
    sol_path, nb_path, _ = _built_fixture(tmp_path)
    first = nb_path.read_bytes()
    assert first.endswith(b"}\n")
    again = ex.build(sol_path.parent, nb_path.parent)
    assert again.written == [] and nb_path.read_bytes() == first
    nb_path.unlink()
    ex.build(sol_path.parent, nb_path.parent)
    assert nb_path.read_bytes() == first
    # the same text in memory; the solution is not modified by stripping
    sol = _read(sol_path)
    before = copy.deepcopy(sol)
    assert ex.dumps(ex.strip_solutions(sol)).encode() == first
    assert sol == before
    # re-running the solution (new outputs, timings, python version) does not change the learner's notebook
    for cell in sol.cells:
        if cell.cell_type == "code":
            cell.outputs = [new_output("stream", name="stdout", text="another run\n")]
            cell.execution_count = 42
            cell.metadata["execution"] = {"iopub.status.busy": "2031-01-01T00:00:00.000000Z"}
    sol.metadata.language_info["version"] = "3.99.0"
    assert ex.build_notebook(sol, "x").encode() == first


def test_cells_without_ids_get_stable_ones(tmp_path):
    data = json.loads(FIXTURE.read_text())
    data["nbformat_minor"] = 4
    for cell in data["cells"]:
        cell.pop("id")
    sol = tmp_path / "solutions"
    sol.mkdir()
    (sol / "99_old.ipynb").write_text(json.dumps(data))
    ex.build(sol, tmp_path / "a")
    ex.build(sol, tmp_path / "b")
    a, b = (tmp_path / "a" / "99_old.ipynb").read_bytes(), (tmp_path / "b" / "99_old.ipynb").read_bytes()
    assert a == b
    ids = [c.id for c in _read(tmp_path / "a" / "99_old.ipynb").cells]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", i) for i in ids)


@pytest.mark.parametrize("damage", ["duplicate", "missing"])
def test_cells_of_a_4_5_notebook_with_bad_ids_get_stable_ones(tmp_path, damage):
    """nbformat 4.5 requires ids; reading one with a repeated or missing id, nbformat repairs it with a random one,
    so two builds differed and `check` right after `build` reported the notebook stale."""
    data = json.loads(FIXTURE.read_text())
    data["nbformat_minor"] = 5
    if damage == "duplicate":
        data["cells"][1]["id"] = data["cells"][0]["id"]
    else:
        data["cells"][1].pop("id")
    sol = tmp_path / "solutions"
    sol.mkdir()
    (sol / "99_ids.ipynb").write_text(json.dumps(data))
    ex.build(sol, tmp_path / "a")
    ex.build(sol, tmp_path / "b")
    assert (tmp_path / "a" / "99_ids.ipynb").read_bytes() == (tmp_path / "b" / "99_ids.ipynb").read_bytes()
    ids = [c.id for c in _read(tmp_path / "a" / "99_ids.ipynb").cells]
    assert len(set(ids)) == len(ids)


def test_notebook_without_exercises_copied_and_stale_removed(tmp_path):
    sol, out = tmp_path / "solutions", tmp_path / "notebooks"
    sol.mkdir()
    out.mkdir()
    tour = new_notebook(cells=[new_markdown_cell("# Tour"), new_code_cell("print(1)")])
    tour.cells[1].outputs = [new_output("stream", name="stdout", text="1\n")]
    tour.cells[1].execution_count = 1
    nbformat.write(tour, str(sol / "00_tour.ipynb"))
    nbformat.write(new_notebook(cells=GOOD), str(sol / "02_gone.ipynb"))   # built once, then its solution goes
    ex.build(sol, out)
    (sol / "02_gone.ipynb").unlink()
    (out / "README.md").write_text("generated from solutions/\n")
    report = ex.build(sol, out)
    assert sorted(p.name for p in out.iterdir() if p.name != ex.RECORD) == ["00_tour.ipynb", "README.md"]
    assert report.removed and report.removed[0].endswith("02_gone.ipynb") and report.exercises == 0
    built = _read(out / "00_tour.ipynb")
    assert [c.source for c in built.cells] == ["# Tour", "print(1)"]
    assert built.cells[1].outputs == [] and built.cells[1].execution_count is None


def test_check_reports_differing_missing_and_stale(tmp_path, capsys):
    sol_path, nb_path, _ = _built_fixture(tmp_path)
    sol, out = sol_path.parent, nb_path.parent
    args = ["--solutions", str(sol), "--notebooks", str(out)]
    assert ex.main(["check", *args]) == 0
    assert re.search(r"notebooks/ in sync with .*solutions/ \(1 notebooks, 3 exercises\)", capsys.readouterr().out)

    nb = _read(sol_path)                                  # edit a solution without rebuilding
    nb.cells[2].source += "\nOne more sentence."
    nbformat.write(nb, str(sol_path))
    report = ex.check(sol, out)
    assert not report.ok and len(report.problems) == 1
    assert re.search(r"notebooks/99_fixture\.ipynb differs from what .*solutions/99_fixture\.ipynb builds: "
                     r"run python -m qwen_lab\.exercises build", report.problems[0])
    assert "build refuses to overwrite it" in report.problems[0]   # build is no way to keep a hand edit
    assert ex.main(["check", *args]) == 1
    assert "differs" in capsys.readouterr().err

    assert ex.main(["build", *args]) == 0                 # rebuilding brings it back in sync
    assert "1 written" in capsys.readouterr().out
    assert ex.check(sol, out).ok

    (out / "05_stale.ipynb").write_bytes(nb_path.read_bytes())   # what build wrote for a solution now gone
    nb_path.unlink()
    problems = ex.check(sol, out).problems
    assert len(problems) == 2
    assert any("99_fixture.ipynb is missing" in p for p in problems)
    assert any("05_stale.ipynb has no counterpart" in p for p in problems)


def test_build_refuses_to_overwrite_a_notebook_edited_since_it_wrote_it(tmp_path, capsys):
    """An instructor's tweak or a learner's solution in notebooks/ used to be overwritten without a word ("1
    written"). Build now refuses, naming the notebook and writing nothing; --force overwrites it and keeps a copy;
    a notebook build wrote, and nobody edited, is rebuilt as before."""
    sol_path, nb_path, _ = _built_fixture(tmp_path)
    sol, out = sol_path.parent, nb_path.parent
    args = ["--solutions", str(sol), "--notebooks", str(out)]
    nb = _read(sol_path)                                  # the course text changes: build rewrites its notebook
    nb.cells[2].source += "\nOne more sentence."
    nbformat.write(nb, str(sol_path))
    assert ex.main(["build", *args]) == 0 and "1 written" in capsys.readouterr().out
    edited = _read(nb_path)                               # a hand edit in the learner's notebook
    edited.cells[0].source += "\nMy own note."
    nbformat.write(edited, str(nb_path))
    mine = nb_path.read_bytes()
    nb.cells[2].source += "\nAnd another."              # the course text changes again
    nbformat.write(nb, str(sol_path))
    assert ex.main(["build", *args]) == 1
    err = capsys.readouterr().err
    assert "nothing written: 1 problem(s) in" in err and "notebooks/" in err.splitlines()[0]
    assert re.search(r"99_fixture\.ipynb: edited since build last wrote it; build leaves it alone\. Move the change "
                     r"into .*solutions/99_fixture\.ipynb .*build --force", err), err
    assert nb_path.read_bytes() == mine
    with pytest.raises(ex.EditedNotebooks):
        ex.build(sol, out)
    assert ex.main(["build", "--force", *args]) == 0
    stdout = capsys.readouterr().out
    assert "kept the edited notebook as" in stdout and "99_fixture.ipynb.bak" in stdout and "1 written" in stdout
    assert (out / "99_fixture.ipynb.bak").read_bytes() == mine
    assert "And another." in nb_path.read_text() and "My own note." not in nb_path.read_text()
    assert ex.build(sol, out).written == []              # rebuilt, recorded: nothing to refuse any more
    # a stale notebook (its solution gone) that somebody edited stays too
    edited = _read(nb_path)
    edited.cells[0].source += "\nMine again."
    nbformat.write(edited, str(nb_path))
    sol_path.unlink()
    report = ex.build(sol, out)
    assert nb_path.exists() and report.removed == [] and [Path(p).name for p in report.kept] == ["99_fixture.ipynb"]


def test_build_removes_only_notebooks_it_wrote(tmp_path, capsys):
    """`build --notebooks other` used to delete every other/*.ipynb without a solution, an analysis of one's own
    included. Now only a notebook build wrote goes; anything else stays, with a note."""
    sol, out = tmp_path / "solutions", tmp_path / "other"
    sol.mkdir()
    nbformat.write(new_notebook(cells=GOOD), str(sol / "02_a.ipynb"))
    nbformat.write(new_notebook(cells=GOOD), str(sol / "02_gone.ipynb"))
    ex.build(sol, out)
    (sol / "02_gone.ipynb").unlink()
    mine = new_notebook(cells=[new_code_cell("print(1)")])
    nbformat.write(mine, str(out / "my_analysis.ipynb"))              # not named like a chapter
    nbformat.write(mine, str(out / "03_mine.ipynb"))                  # named like one, but an editor's metadata
    ran = _read(out / "02_a.ipynb")                                   # a built chapter somebody ran
    ran.cells[2].outputs = [new_output("stream", name="stdout", text="1\n")]
    ran.cells[2].execution_count = 1
    nbformat.write(ran, str(out / "02_ran.ipynb"))
    (out / "04_broken.ipynb").write_text("{}")
    kept = ["02_ran.ipynb", "03_mine.ipynb", "04_broken.ipynb", "my_analysis.ipynb"]
    before = {name: (out / name).read_bytes() for name in kept}

    assert [n for n in kept if ex.is_generated_notebook(out / n)] == []
    assert ex.is_generated_notebook(out / "02_gone.ipynb") and ex.is_generated_notebook(out / "02_a.ipynb")
    check = ex.check(sol, out)
    assert len(check.problems) == 1 and "02_gone.ipynb has no counterpart" in check.problems[0]
    assert [Path(p).name for p in check.kept] == kept

    assert ex.main(["build", "--solutions", str(sol), "--notebooks", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir() if p.name != ex.RECORD) == sorted(kept + ["02_a.ipynb"])
    assert all((out / name).read_bytes() == data for name, data in before.items())
    assert re.search(r"removed .*02_gone\.ipynb \(no solution\)", stdout)
    for name in kept:
        assert re.search(rf"left .*{re.escape(name)} alone: it has no solution, and build did not write it", stdout)
    assert "1 removed" in stdout
    assert ex.check(sol, out).ok


@pytest.mark.parametrize("inside", [False, True])
def test_build_refuses_notebooks_in_the_solutions_folder(tmp_path, capsys, inside):
    """`build --solutions s --notebooks s` used to write the stubs over the solutions."""
    sol = tmp_path / "solutions"
    sol.mkdir()
    nbformat.write(new_notebook(cells=GOOD), str(sol / "02_a.ipynb"))
    before = (sol / "02_a.ipynb").read_bytes()
    out = sol / "notebooks" if inside else sol
    with pytest.raises(ex.ExerciseError, match="is (inside )?the solutions folder"):
        ex.build(sol, out)
    assert ex.main(["build", "--solutions", str(sol), "--notebooks", str(tmp_path / "solutions" / ".." / "solutions"
                                                                       / ("notebooks" if inside else ""))]) == 1
    err = capsys.readouterr().err
    assert "nothing written" in err and "pass a separate folder for --notebooks" in err
    assert sorted(p.name for p in sol.iterdir()) == ["02_a.ipynb"]
    assert (sol / "02_a.ipynb").read_bytes() == before
    assert not ex.check(sol, out).ok


def test_learner_notebook_drops_the_editors_kernel_and_cell_metadata(tmp_path):
    """A solution last saved with a custom kernel, VS Code, Colab, and read-only or hidden cells gave learners
    'kernel qwen-venv not found' and cells they could not edit or see."""
    nb = new_notebook(cells=copy.deepcopy(GOOD), metadata={
        "kernelspec": {"display_name": "Python (qwen-venv)", "language": "python", "name": "qwen-venv"},
        "language_info": {"name": "python", "version": "3.11.9", "codemirror_mode": {"name": "ipython", "version": 3},
                          "pygments_lexer": "ipython3", "file_extension": ".py", "mimetype": "text/x-python",
                          "nbconvert_exporter": "python"},
        "vscode": {"interpreter": {"hash": "deadbeef"}}, "colab": {"provenance": []}, "accelerator": "GPU",
        "widgets": {"application/vnd.jupyter.widget-state+json": {}}, "title": "RMSNorm"})
    editor = {"editable": False, "deletable": False, "jupyter": {"source_hidden": True, "outputs_hidden": True},
              "nbgrader": {"solution": True}, "vscode": {"languageId": "python"}, "colab": {"base_uri": "x"},
              "ExecuteTime": {"start": "x"}, "collapsed": True, "scrolled": True, "slideshow": {"slide_type": "-"}}
    for cell in nb.cells:
        cell.metadata.update(copy.deepcopy(editor))
    sol = tmp_path / "solutions"
    sol.mkdir()
    nbformat.write(nb, str(sol / "02_meta.ipynb"))
    ex.build(sol, tmp_path / "notebooks")
    built = json.loads((tmp_path / "notebooks" / "02_meta.ipynb").read_text())
    assert built["metadata"] == {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                 "language_info": {"name": "python"}, "title": "RMSNorm"}
    assert [c["metadata"] for c in built["cells"]] == [
        {"slideshow": {"slide_type": "-"}}, {"slideshow": {"slide_type": "-"}},
        {"slideshow": {"slide_type": "-"}, "tags": ["check", "raises-exception"]}]
    assert ex.is_generated_notebook(tmp_path / "notebooks" / "02_meta.ipynb")
    # nbgrader copies its source notebook's metadata into the learners' version: the same kernel there
    assert ex.nbgrader_notebook(nb, "02_meta.ipynb").metadata == built["metadata"]


def test_course_notebooks_carry_the_learners_metadata():
    """The metadata build writes is what notebooks/ holds today (no rebuild needed for it)."""
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        meta = json.loads(path.read_text())["metadata"]
        assert meta == {"kernelspec": ex.LEARNER_KERNELSPEC, "language_info": ex.LEARNER_LANGUAGE_INFO}, path.name


def test_default_folders(tmp_path, monkeypatch, capsys):
    """With only --solutions, notebooks/ goes beside it (it used to go to the imported package's checkout, so a second
    checkout's build wrote into the first one's notebooks/); with neither option, the current directory's checkout
    when it has solutions/, else the package's."""
    package, second, elsewhere = tmp_path / "package", tmp_path / "second", tmp_path / "elsewhere"
    for root in (package, second):
        (root / "solutions").mkdir(parents=True)
        nbformat.write(new_notebook(cells=GOOD), str(root / "solutions" / "02_a.ipynb"))
    elsewhere.mkdir()
    monkeypatch.setattr(building, "__file__",                                       # the imported checkout
                        str(package / "qwen_lab" / "course" / "exercises" / "building.py"))

    monkeypatch.chdir(elsewhere)
    assert ex.main(["build", "--solutions", str(second / "solutions")]) == 0
    assert (second / "notebooks" / "02_a.ipynb").exists() and not (package / "notebooks").exists()
    assert ex.resolve_dirs("solutions") == (Path("solutions"), elsewhere / "notebooks")
    capsys.readouterr()

    assert ex.main(["build"]) == 0                    # no solutions/ here: the package's checkout
    assert (package / "notebooks" / "02_a.ipynb").exists()
    assert f"default folders from the checkout of the imported qwen_lab package, {package}" in capsys.readouterr().out

    monkeypatch.chdir(second)                         # a checkout of its own: its folders, not the package's
    (second / "notebooks" / "02_a.ipynb").unlink()
    (package / "notebooks" / "02_a.ipynb").unlink()
    assert ex.main(["build"]) == 0
    assert "default folders from the current directory" in capsys.readouterr().out
    assert (second / "notebooks" / "02_a.ipynb").exists() and not (package / "notebooks" / "02_a.ipynb").exists()
    assert ex.check().ok and ex.main(["check"]) == 0

    monkeypatch.chdir(second / "solutions")           # `--solutions .` from inside the folder
    (second / "notebooks" / "02_a.ipynb").unlink()
    assert ex.main(["build", "--solutions", "."]) == 0
    assert (second / "notebooks" / "02_a.ipynb").exists() and not (second / "solutions" / "notebooks").exists()


def test_strip_solutions_fallback_title_and_list_exercises_on_learner_version():
    nb = new_notebook(cells=[new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n")])
    stripped = ex.strip_solutions(nb)
    assert stripped.cells[0].source == 'def f(x):\n    raise NotImplementedError("Exercise: fill in this block")\n'
    assert ex.list_exercises(nb) == [("Exercise: fill in this block", 0)]
    learner = ex.strip_solutions(_read(FIXTURE))
    assert ex.list_exercises(learner) == ex.list_exercises(FIXTURE)
    # a title with quotes still gives valid Python
    nb.cells[0].source = '# Exercise 01.1: the "gather"\n' + nb.cells[0].source
    compile(ex.strip_solutions(nb).cells[0].source, "cell", "exec")


# ------------------------------------------------------------------------------------------------
# Validation: every error names the notebook and the cell
# ------------------------------------------------------------------------------------------------

def _ex(title, body="    return x", tags=None, name="f"):
    src = f"# {title}\ndef {name}(x):\n    {ex.BEGIN}\n{body}\n    {ex.END}\n"
    return new_code_cell(src, metadata={"tags": tags} if tags else {})


def _check(src="print(f(1))"):
    return new_code_cell(src, metadata={"tags": ["check"]})


GOOD = [new_markdown_cell("# 02"), _ex("Exercise 02.1: f"), _check()]

INVALID = {
    "unmatched-end": ([new_code_cell(f"# Exercise 02.1: f\nx = 1\n{ex.END}\n"), _check()],
                      0, "has no '### BEGIN SOLUTION' before it"),
    "unmatched-begin": ([new_code_cell(f"# Exercise 02.1: f\ndef f(x):\n    {ex.BEGIN}\n    return x\n"), _check()],
                        0, "is never closed"),
    "nested": ([new_code_cell(f"# Exercise 02.1: f\ndef f(x):\n    {ex.BEGIN}\n    {ex.BEGIN}\n    return x\n"
                              f"    {ex.END}\n"), _check()], 0, "nested markers"),
    "near-miss": ([new_code_cell("# Exercise 02.1: f\ndef f(x):\n    # BEGIN SOLUTION\n    return x\n"
                                 "    # END SOLUTION\n"), _check()], 0, "looks like a solution marker"),
    "near-miss-misspelled": ([new_code_cell("# Exercise 02.1: f\ndef f(x):\n    ### BEGIN SOLUTON\n    return x\n"
                                            "    ### END SOLUTON\n"), _check()], 0, "looks like a solution marker"),
    "near-miss-plural": ([new_code_cell("# Exercise 02.1: f\ndef f(x):\n    ### BEGIN SOLUTIONS\n    return x\n"
                                        "    ### END SOLUTIONS\n"), _check()], 0, "looks like a solution marker"),
    "near-miss-after-code": ([new_code_cell(f"# Exercise 02.1: f\ndef f(x):\n    y = 0  {ex.BEGIN}\n    return x"
                                            f"  {ex.END}\n"), _check()], 0, "looks like a solution marker"),
    "near-miss-lone-begin": ([new_code_cell(f"# Exercise 02.1: f\ndef f(x):\n    ### BEGIN SOLUTON\n    return x\n"
                                            f"    {ex.END}\n"), _check()], 0, "line 3 looks like a solution marker"),
    "near-miss-markdown": (GOOD + [new_markdown_cell("### Exercise 02.2: why?\n\n### begin solution\nBecause.\n"
                                                     "### end solution")], 3, "looks like a solution marker"),
    "near-miss-markdown-comment": (GOOD + [new_markdown_cell("### Exercise 02.2: why?\n\n<!--BEGIN SOLUTION-->\n"
                                                             "Because.\n<!-- end solution -->")],
                                   3, "looks like a solution marker"),
    # the code cells' markers in markdown would render as headings in the solution notebook
    "markdown-heading-markers": (GOOD + [new_markdown_cell(f"### Exercise 02.2: why?\n\n{ex.BEGIN}\nBecause.\n"
                                                           f"{ex.END}")], 3, "renders as a heading"),
    "exercise-without-block": ([new_code_cell("# Exercise 02.1: f\ndef f(x):\n    return x\n"), _check()],
                               0, "line 1 titles the cell as an exercise but the cell holds no solution block"),
    "no-title": ([new_code_cell(f"def f(x):\n    {ex.BEGIN}\n    return x\n    {ex.END}\n"), _check()],
                 0, "first line is not an exercise title"),
    "markdown-no-title": (GOOD + [new_markdown_cell(f"Why?\n\n{ex.MD_BEGIN}\nBecause.\n{ex.MD_END}")],
                          3, "first line is not an exercise title"),
    "raw-cell": (GOOD + [new_raw_cell(f"{ex.BEGIN}\nx\n{ex.END}")], 3, "markers in a raw cell"),
    "no-check-cell": ([new_markdown_cell("# 02"), _ex("Exercise 02.1: f"), new_code_cell("print(f(1))")],
                      None, "no cell tagged 'check'"),
    "check-before-exercise": ([_check("print('too early')"), _ex("Exercise 02.1: f"), _check()],
                              0, "a check cell before the exercise it grades"),
    "check-uses-later-exercise": ([_ex("Exercise 02.1: f"), _check("print(g(1))"), _ex("Exercise 02.2: g", name="g"),
                                   _check("print(f(1), g(2))")], 1, "uses g, which 'Exercise 02.2: g' defines later"),
    "last-exercise-unchecked": (GOOD + [_ex("Exercise 02.2: g", name="g")], 3, "has no check cell after it"),
    "stub-runs-at-once": ([new_code_cell(f"# Exercise 02.1: y\n{ex.BEGIN}\ny = 2\n{ex.END}\n"), _check("print(y)")],
                          0, "would run as soon as the cell runs"),
    "stub-breaks-syntax": ([new_code_cell(f"# Exercise 02.1: f\ndef f(x):\n{ex.BEGIN}\n    return x\n{ex.END}\n"),
                            _check()], 0, "no longer valid Python"),
    "duplicate-title": (GOOD + [_ex("Exercise 02.1: f", name="g"), _check("g(1)")], 3, "already used by cell 1"),
    "wrong-number": ([_ex("Exercise 03.1: f"), _check()], 0, "numbered for notebook 03, but this is notebook 02"),
    "check-without-exercise": ([new_markdown_cell("# 02"), _check("print(1)")], 1, "no code exercise"),
    # a cell that calls the exercise but lacks the tag: nbval would stop at the learner's NotImplementedError
    "untagged-cell-runs-a-stub": (GOOD + [new_code_cell("assert f(2) == 2")], 3,
                                  "uses f, and f is the stub of 'Exercise 02.1: f' (cell 1)"),
    "untagged-cell-runs-a-function-on-a-stub": (GOOD + [new_code_cell("def twice(x):\n    return 2 * f(x)"),
                                                        new_code_cell("print(twice(1))")], 4, "uses twice, and twice uses f"),
    "untagged-cell-runs-the-launcher-of-a-stubbed-kernel": (
        [new_code_cell(f"# Exercise 02.1: f\ndef f_kernel(x):\n    {ex.BEGIN}\n    return x\n    {ex.END}\n\n"
                       f"def f(x):\n    return f_kernel(x)\n"), _check(), new_code_cell("print(f(3))")],
        2, "uses f, and f calls f_kernel, the stub of 'Exercise 02.1: f' (cell 0)"),
    "untagged-cell-reads-what-only-a-check-binds": (GOOD[:2] + [_check("y = f(1)"), new_code_cell("print(y + 1)")],
                                                    3, "y is bound only by check cell 2"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_validation_errors_name_notebook_and_cell(case):
    cells, index, words = INVALID[case]
    name = "solutions/02_case.ipynb"
    with pytest.raises(ex.ExerciseError) as err:
        ex.build_notebook(new_notebook(cells=cells), name)
    message = str(err.value)
    assert message.startswith(name), message
    assert all(words in p for p in err.value.problems), message   # the one problem, no follow-on noise
    if index is not None:
        assert f"{name}, cell {index} (" in message, message


def test_valid_variants_pass():
    """What validation must not reject: a stub in a check-tagged cell, magics, a markdown answer, two exercises
    graded by one check, a check cell that reuses a name it binds itself."""
    cells = [new_markdown_cell("# 02"),
             new_code_cell(f"# Exercise 02.1: y\n%time x = 1\n{ex.BEGIN}\ny = 2\n{ex.END}\n", metadata={"tags": ["check"]}),
             _ex("Exercise 02.2: f"), _ex("Exercise 02.3: g", name="g"),
             new_markdown_cell(f"**Exercise 02.4: why?**\n\n{ex.MD_BEGIN}\nBecause.\n{ex.MD_END}"),
             _check("for g in range(2):\n    print(f(g))\nprint(g(1), y)")]
    text = ex.build_notebook(new_notebook(cells=cells), "solutions/02_ok.ipynb")
    built = nbformat.reads(text, as_version=4)
    assert built.cells[1].source.splitlines()[2] == 'raise NotImplementedError("Exercise 02.1: y")'
    assert built.cells[4].source.endswith("*Your answer here.*")
    # prose that mentions the end and a solution is no marker lookalike: only '#' then BEGIN/END then SOLUT* is
    prose = new_markdown_cell("In the end, compare your solution with the reference; begin solving by hand.\n"
                              f"Solutions sit between `{ex.BEGIN}` and `{ex.END}`.\n## End solutions overview")
    ex.build_notebook(new_notebook(cells=cells[:1] + [prose] + cells[1:]), "solutions/02_ok.ipynb")
    assert [t for t, _ in ex.list_exercises(built)] == ["Exercise 02.1: y", "Exercise 02.2: f", "Exercise 02.3: g",
                                                        "Exercise 02.4: why?"]


def test_cells_that_use_an_exercise_safely_need_no_tag():
    """What the untagged-cell rule must not reject: the call inside a try that catches NotImplementedError, a def
    never called, a lambda handed on, a name a check cell binds again after an earlier cell bound it, a name a check
    cell binds before its call of the exercise, a name the cell binds itself, the exercise's function passed to a
    later check cell."""
    cells = GOOD + [
        new_code_cell("try:\n    print(f(1))\nexcept NotImplementedError:\n    print('not done yet')"),
        new_code_cell("def later(x):\n    return f(x)\nrows = [('yours', lambda: f(3))]"),
        new_code_cell("z = 0"), _check("z = f(0)"), new_code_cell("print(z)"),
        _check("cases = [1, 2]\nprint(f(cases[0]))"), new_code_cell("print(len(cases))"),
        new_code_cell("f = abs\nprint(f(-1))"),
        _check("print(later(2))")]
    ex.build_notebook(new_notebook(cells=cells), "solutions/02_ok.ipynb")
    # the same notebook with the last check untagged is refused, naming the cell and the chain of calls
    cells[-1] = new_code_cell("print(later(2))")
    cells[-2] = new_code_cell("print(1)")   # (f is no longer rebound before it)
    with pytest.raises(ex.ExerciseError, match="cell 11 .*uses later, and later uses f"):
        ex.build_notebook(new_notebook(cells=cells), "solutions/02_ok.ipynb")


LEAKS = {   # solution text that a marker the build does not recognise would leave in the learner's notebook
    "misspelled": ("    ### BEGIN SOLUTON\n    return 'SECRET'\n    ### END SOLUTON\n", [3, 5]),
    "plural": ("    ### BEGIN SOLUTIONS\n    return 'SECRET'\n    ### END SOLUTIONS\n", [3, 5]),
    "after-code": (f"    x = 0  {ex.BEGIN}\n    return 'SECRET'  {ex.END}\n", [3, 4]),
    "lone-misspelled-begin": (f"    ### BEGIN SOLUTON\n    return 'SECRET'\n    {ex.END}\n", [3]),
    "lone-misspelled-end": (f"    {ex.BEGIN}\n    return 'SECRET'\n    ### END SOLUTON\n", [5]),
    "glued": ("    ###BEGIN_SOLUTION\n    return 'SECRET'\n    ### ENDSOLUTION\n", [3, 5]),
    "lower-case": ("    ### begin solution\n    return 'SECRET'\n    ### end solution\n", [3, 5]),
    "no-block": ("    return 'SECRET'\n", [1]),
}


@pytest.mark.parametrize("case", sorted(LEAKS))
def test_a_marker_build_does_not_recognise_stops_it_naming_the_line(tmp_path, case):
    """Beside a valid exercise, a misspelled, plural, glued or inline marker (or none at all under an exercise title)
    used to pass through with the solution in it; now build stops, naming the notebook, the cell and each line."""
    body, lines = LEAKS[case]
    sol, out = tmp_path / "solutions", tmp_path / "notebooks"
    sol.mkdir()
    cells = GOOD + [new_code_cell(f"# Exercise 02.2: g\ndef g():\n{body}"), _check("g()")]
    nbformat.write(new_notebook(cells=cells), str(sol / "02_leak.ipynb"))
    with pytest.raises(ex.ExerciseError) as err:
        ex.build(sol, out)
    assert not out.exists()
    problems = err.value.problems
    assert len(problems) == len(lines), problems
    for problem, line in zip(problems, lines):
        assert re.search(rf"02_leak\.ipynb, cell 3 \(code, \"# Exercise 02\.2: g\"\): line {line} ", problem), problem
        assert "unmatched" not in problem and "reach the learner" in problem
    if case != "no-block":                  # nor does the library function strip around it quietly
        with pytest.raises(ex.ExerciseError, match="looks like a solution marker"):
            ex.strip_solutions(new_notebook(cells=cells))


def test_marker_lookalikes_in_the_course_are_only_exact_markers():
    """Every line of the course's solutions that mentions BEGIN/END and SOLUT* is an exact marker, and every code
    cell titled as an exercise holds a block (what validation now enforces)."""
    for path in sorted((REPO / "solutions").glob("*.ipynb")):
        nb = _read(path)
        for i, cell in enumerate(nb.cells):
            assert cells._near_markers(cell, f"{path.name}, cell {i}") == []
        assert [p for p in ex.validate(nb, path.name) if "no solution block" in p] == []


def test_no_course_markdown_renders_a_marker_as_a_heading():
    """Every markdown cell of solutions/, notebooks/ and the fixture rendered as Jupyter renders markdown (mistune,
    which nbconvert uses too): no heading and no visible text names a solution marker."""
    mistune = pytest.importorskip("mistune", reason="renders markdown as Jupyter does (nbconvert's dependency)")
    paths = sorted((REPO / "solutions").glob("*.ipynb")) + sorted((REPO / "notebooks").glob("*.ipynb")) + [FIXTURE]
    answers = 0
    for path in paths:
        for i, cell in enumerate(_read(path).cells):
            if cell.cell_type != "markdown":
                continue
            html = mistune.html(cell.source)
            shown = re.sub(r"<!--.*?-->", "", html, flags=re.S)   # HTML comments: rendered as nothing
            headings = re.findall(r"<h\d[^>]*>(.*?)</h\d>", shown, flags=re.S)
            assert not [h for h in headings if "SOLUTION" in h.upper()], f"{path.name}, cell {i}: {headings}"
            visible = re.sub(r"<code>.*?</code>", "", shown, flags=re.S)   # prose may quote the markers in code
            assert not re.search(r"(BEGIN|END) SOLUTION", visible), f"{path.name}, cell {i}: {visible[:300]}"
            answers += ex.MD_BEGIN in cell.source
    assert answers >= 2   # the fixture's answer and notebook 13's written answer are checked, not skipped


def test_build_reports_every_problem_and_writes_nothing(tmp_path, capsys):
    sol, out = tmp_path / "solutions", tmp_path / "notebooks"
    sol.mkdir()
    nbformat.write(new_notebook(cells=INVALID["nested"][0]), str(sol / "02_a.ipynb"))
    nbformat.write(new_notebook(cells=INVALID["no-check-cell"][0]), str(sol / "02_b.ipynb"))
    nbformat.write(new_notebook(cells=GOOD), str(sol / "02_c.ipynb"))
    (sol / "02_d.ipynb").write_text("{not json")
    with pytest.raises(ex.ExerciseError) as err:
        ex.build(sol, out)
    assert len(err.value.problems) == 3
    assert not out.exists()
    assert ex.main(["build", "--solutions", str(sol), "--notebooks", str(out)]) == 1
    stderr = capsys.readouterr().err
    assert "nothing written: 3 problem(s)" in stderr
    for fname in ("02_a.ipynb, cell 0", "02_b.ipynb: has exercises", "02_d.ipynb: not a readable notebook"):
        assert fname in stderr
    assert ex.main(["check", "--solutions", str(sol), "--notebooks", str(out)]) == 1


# ------------------------------------------------------------------------------------------------
# Every exercise stub raises until filled in (one Jupyter kernel runs both versions)
# ------------------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _errors(cell):
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def test_learner_notebook_raises_until_filled_in_and_solution_runs(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from nbclient import NotebookClient

    sol_path, nb_path, _ = _built_fixture(tmp_path)
    learner, solution = _read(nb_path), _read(sol_path)
    for cell in solution.cells:                       # run it fresh, not the stored outputs
        cell.id += "-solution"                        # ids stay unique in the combined run below
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    # one kernel: the learner's version, a reset, then the solution (an error outside a cell tagged
    # raises-exception stops the run with CellExecutionError)
    both = new_notebook(cells=[*learner.cells, new_code_cell("%reset -f", id="reset"), *solution.cells],
                        metadata=learner.metadata)
    NotebookClient(both, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    learner.cells, solution.cells = both.cells[:len(learner.cells)], both.cells[len(learner.cells) + 1:]
    titles = ex.list_exercises(solution)

    for i, cell in enumerate(learner.cells):
        if cell.cell_type != "code":
            continue
        errors = _errors(cell)
        if i not in CHECK_CELLS:
            assert not errors, f"learner's cell {i} should run before any exercise is done: {errors}"
            continue
        assert len(errors) == 1, f"learner's check cell {i} did not raise"
        error = errors[0]
        text = _ANSI.sub("", " ".join([error["ename"], error["evalue"], *error["traceback"]]))
        # a stub in a Python body raises NotImplementedError itself; one in a @triton.jit body reaches the
        # check wrapped by Triton (the interpreter, or the compiler on a GPU), its message still naming it
        assert error["ename"] == "NotImplementedError" or "NotImplementedError" in text, text
        earlier = [t for t, j in titles if j < i and solution.cells[j].cell_type == "code"]
        assert any(t in text for t in earlier), f"cell {i}: the error names no exercise: {text}"
    assert _errors(learner.cells[8])[0]["ename"] == "NotImplementedError"
    assert "Exercise 99.3" in _errors(learner.cells[8])[0]["evalue"]
    assert "Exercise 99.1" in _ANSI.sub("", " ".join(_errors(learner.cells[4])[0]["traceback"]))
    assert all(not _errors(c) for c in solution.cells)
    print("\n".join(f"learner's cell {i}: {_errors(learner.cells[i])[0]['ename']}: "
                    f"{_errors(learner.cells[i])[0]['evalue']}" for i in CHECK_CELLS))
    assert "PASS scale_shift" in "".join(o.get("text", "") for o in solution.cells[4].outputs)


# ------------------------------------------------------------------------------------------------
# nbgrader: the course directory for instructors who grade with it
# ------------------------------------------------------------------------------------------------

def _nbgrader_validate(nb, name: str) -> None:
    """nbgrader's own check of its cell metadata (schema 3: required keys and no others, grade ids from
    [a-zA-Z0-9_-] and unique, points on every graded cell, markdown graded exactly when it is a solution), as
    `generate_assignment` runs it. Called last in a test: without nbgrader the test's other checks have run."""
    fmt = pytest.importorskip("nbgrader.nbgraderformat", reason="nbgrader checks its metadata (requirements.txt)")
    try:
        fmt.MetadataValidator().validate_nb(nb)
    except fmt.ValidationError as e:
        pytest.fail(f"{name}: nbgrader rejects the export: {e}")


def test_nbgrader_export_marks_exercises_checks_and_answers(tmp_path):
    sol = tmp_path / "solutions"
    sol.mkdir()
    (sol / "99_fixture.ipynb").write_bytes(FIXTURE.read_bytes())
    report = ex.export_nbgrader(tmp_path / "course", sol)
    assert report.notebooks == 1 and report.exercises == 3
    path = tmp_path / "course" / "source" / "99_fixture" / "99_fixture.ipynb"
    nb, original = _read(path), _read(FIXTURE)
    meta = {i: c.metadata["nbgrader"] for i, c in enumerate(nb.cells) if "nbgrader" in c.metadata}
    assert {i: (m["grade_id"], m["solution"], m["grade"], m["locked"], m.get("points")) for i, m in meta.items()} == {
        3: ("exercise-99-1", True, False, False, None),
        4: ("check-99-1", False, True, True, 1),
        6: ("answer-99-2", True, True, False, 1),     # a written answer: graded by hand
        7: ("exercise-99-3", True, False, False, None),
        8: ("check-99-3", False, True, True, 1),
        10: ("check-99-3-b", False, True, True, 1),
    }
    # the text is the solution's, markers included (nbgrader strips them); outputs and run metadata go
    for a, b in zip(original.cells, nb.cells):
        assert a.source == b.source and a.id == b.id
        assert "execution" not in b.metadata
        if b.cell_type == "code":
            assert b.outputs == [] and b.execution_count is None
    assert ex.BEGIN in nb.cells[3].source and ex.END in nb.cells[7].source
    # nbgrader's stub for every block: the course's untitled stub, which the checks read as an unfinished exercise
    config = (tmp_path / "course" / "nbgrader_config.py").read_text()
    compile(config, "nbgrader_config.py", "exec")
    assert f'c.ClearSolutions.code_stub = {{"python": {ex.NBGRADER_STUB!r}}}' in config
    assert "c.Execute.timeout" in config
    assert ex.NBGRADER_STUB == ex.stub_line(ex.DEFAULT_TITLE)
    _nbgrader_validate(nb, path.name)


def test_nbgraders_stub_in_a_kernel_reads_as_not_done_yet():
    """What a GPU compile says of nbgrader's stub inside a @triton.jit body must still read as an unfinished exercise
    (checks.learner_code and check_kernel rely on it)."""
    from qwen_lab.course.checks.runner import _unfinished
    message = (f"at 2:4:\ndef my_kernel(x_ptr):\n    pid = tl.program_id(0)\n    {ex.NBGRADER_STUB}\n    ^\n"
               "unsupported AST node type: Raise")
    stub = _unfinished(RuntimeError(message))
    assert isinstance(stub, NotImplementedError) and str(stub) == ex.DEFAULT_TITLE


def test_nbgrader_export_of_every_course_notebook(tmp_path):
    out = tmp_path / "course"
    proc = subprocess.run([sys.executable, "-m", "qwen_lab.exercises", "nbgrader", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    solutions = sorted((REPO / "solutions").glob("*.ipynb"))
    assert re.search(rf"{len(solutions)} assignments under .*source/", proc.stdout), proc.stdout
    graded, exported = 0, []
    for path in solutions:
        nb = _read(out / "source" / path.stem / path.name)
        exported.append((nb, path.name))
        exercises = ex.list_exercises(path)
        solution_cells = [i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("solution")]
        assert solution_cells == [i for _, i in exercises], path.name
        checks = [i for i, c in enumerate(nb.cells) if ex.CHECK_TAG in c.metadata.get("tags", [])]
        tests = [i for i, c in enumerate(nb.cells)
                 if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"]
        assert tests == checks, path.name
        graded += len(tests)
    assert graded >= len([p for p in solutions if ex.list_exercises(p)])
    for nb, name in exported:
        _nbgrader_validate(nb, name)


def test_nbgrader_export_refuses_a_broken_solution_and_writes_nothing(tmp_path):
    sol = tmp_path / "solutions"
    sol.mkdir()
    nb = _read(FIXTURE)
    nb.cells[3].source = nb.cells[3].source.replace(ex.END, "# END SOLUTION")
    nbformat.write(nb, str(sol / "99_fixture.ipynb"))
    out = tmp_path / "course"
    proc = subprocess.run([sys.executable, "-m", "qwen_lab.exercises", "nbgrader", "--out", str(out),
                           "--solutions", str(sol)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "nothing written" in proc.stderr, proc.stderr
    assert "cell 3" in proc.stderr
    assert not out.exists()


def test_exercise_and_check_finds_the_cells_that_grade_one_exercise():
    nb = new_notebook(cells=[
        new_code_cell("import torch"),
        new_code_cell("# Exercise 1.1: add\ndef f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
        new_code_cell("f()", metadata={"tags": ["check"]}),
        new_code_cell("# Exercise 1.2: more\ndef g():\n    ### BEGIN SOLUTION\n    return 2\n    ### END SOLUTION"),
        new_code_cell("print('no check after it')"),
    ])
    assert ex.exercise_and_check(nb, "Exercise 1.1") == (1, 2)
    with pytest.raises(ex.ExerciseError, match="no cell tagged 'check' after it"):
        ex.exercise_and_check(nb, "Exercise 1.2")
    with pytest.raises(ex.ExerciseError, match="2 exercises with that title"):
        ex.exercise_and_check(nb, "Exercise 1")
    with pytest.raises(ex.ExerciseError, match="0 exercises"):
        ex.exercise_and_check(nb, "Exercise 9")


def test_a_stub_that_breaks_the_cell_is_located_in_the_solution_cell():
    """The parser sees the learner's version, where each block is one stub line: its line numbers are not the
    solution's, which is what the instructor edits. A 12-line block at lines 3-14, then a marker under-indented at
    line 17 (inside the `for` of line 16): the error names line 17 of the solution cell."""
    body = "".join(f"    a{i} = {i}\n" for i in range(10))
    source = (f"# Exercise 02.1: f\ndef f():\n    {ex.BEGIN}\n{body}    {ex.END}\n    s = 0\n    for i in range(3):\n"
              f"    {ex.BEGIN}\n        s += i\n    {ex.END}\n    return s\n")
    assert source.splitlines()[16] == f"    {ex.BEGIN}"
    with pytest.raises(ex.ExerciseError, match=r"no longer valid Python: .*\(line 17 of the solution cell"):
        ex.build_notebook(new_notebook(cells=[new_markdown_cell("# 02"), new_code_cell(source), _check("f()")]),
                          "solutions/02_lines.ipynb")
    blocks = [cells._Block(2, 13, "    "), cells._Block(16, 18, "    ")]
    assert [validation._solution_line(blocks, n) for n in (1, 3, 4, 6, 7)] == [1, 3, 15, 17, 20]
