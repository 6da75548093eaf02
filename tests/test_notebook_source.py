"""The drift check between a notebook's exercise solutions and the library's teaching file fails where they part."""

import pytest

from notebook_source import ROOT, assert_teaches, solution_cells


def test_a_teaching_file_that_drifted_from_its_notebook_fails_naming_the_cell(tmp_path):
    teach = (ROOT / "qwen_lab/kernels/norms/teach.py").read_text()
    assert_teaches("02_rmsnorm.ipynb", str(ROOT / "qwen_lab/kernels/norms/teach.py"))
    drifted = tmp_path / "teach.py"
    drifted.write_text(teach.replace("tl.math.rsqrt", "1.0 / tl.sqrt", 1))
    with pytest.raises(AssertionError, match=r"solutions/02_rmsnorm.ipynb cell \d+ .* drifted apart"):
        assert_teaches("02_rmsnorm.ipynb", str(drifted))


def test_exercises_are_found_by_their_titles():
    cells = solution_cells("08_gated_deltanet_recurrent.ipynb")
    assert all(source.startswith("# Exercise 08.") for source in cells.values())
    assert all("### BEGIN SOLUTION" not in source for source in cells.values())
    with pytest.raises(AssertionError, match=r"expected the exercises \['08.9'\]"):
        assert_teaches("08_gated_deltanet_recurrent.ipynb", "qwen_lab/kernels/conv1d/teach.py", exercises=["08.9"])


def test_notebook_14_teaches_the_persistent_teaching_kernel():
    assert_teaches("14_one_kernel_per_token.ipynb", "qwen_lab/kernels/persistent/teach.py", exercises=["14.1"])
