"""benchmarks/live_report.py, the GPU session's pytest plugin: what it writes while a run is still going, so that a
run stopped by the session's time limit still says which tests finished, how, and why the failures failed."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = os.path.join(os.path.dirname(HERE), "benchmarks")

SAMPLE = '''
import pytest

def test_fine():
    assert 1 + 1 == 2

def test_broken():
    assert 2 + 2 == 5, "arithmetic moved"

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
'''


@pytest.mark.parametrize("workers", [None, 2], ids=["one-process", "xdist"])
def test_each_finished_test_and_each_failure_is_written_as_it_happens(tmp_path, workers):
    sample = tmp_path / "test_sample.py"
    sample.write_text(SAMPLE)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": BENCHMARKS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    spread = [] if workers is None else ["-n", str(workers)]   # as the GPU session runs it: workers + controller
    done = subprocess.run([sys.executable, "-m", "pytest", str(sample), "-q", "-p", "live_report", "-p",
                           "no:cacheprovider", "-p", "no:randomly", *spread], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr   # one test fails
    finished = (out / "finished.txt").read_text().splitlines()
    assert len(finished) == 3, f"expected one line per test, got {finished}"
    outcomes = {line.split(" ", 2)[2].split("::")[-1]: line.split(" ", 1)[0] for line in finished}
    assert outcomes == {"test_fine": "passed", "test_broken": "failed", "test_skipped": "skipped"}, finished
    failures = (out / "failures.txt").read_text()
    assert "=== test_sample.py::test_broken (call)" in failures and "arithmetic moved" in failures, failures
    assert "test_fine" not in failures
    assert failures.count("=== ") == 1, failures
