"""tests/xdist_quiet.py: under pytest-xdist a test marked `quiet` runs while no other worker runs a test."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("xdist")
TESTS = Path(__file__).resolve().parent


def _intervals(tmp_path: Path, marked: bool) -> tuple[list, list]:
    """Run a two-worker session: one file with a 1.5 s test (marked quiet or not), one with ten 0.3 s tests; the
    (start, end) times of the long test and of the short ones."""
    log = tmp_path / "log.jsonl"
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from xdist_quiet import pytest_runtest_protocol  # noqa: F401

        def pytest_configure(config):
            config.addinivalue_line("markers", "quiet: runs alone")
        """))
    record = textwrap.dedent(f"""
        import json, time
        import pytest

        def timed(name, seconds):
            start = time.time()
            time.sleep(seconds)
            with open({str(log)!r}, "a") as f:
                f.write(json.dumps([name, start, time.time()]) + "\\n")
        """)
    mark = "@pytest.mark.quiet\n" if marked else ""
    (tmp_path / "test_long.py").write_text(record + f"\n{mark}def test_long():\n    timed('long', 1.5)\n")
    (tmp_path / "test_short.py").write_text(record + "\n@pytest.mark.parametrize('i', range(10))\n"
                                            "def test_short(i):\n    timed('short', 0.3)\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider",
                        str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [r[1:] for r in rows if r[0] == "long"], [r[1:] for r in rows if r[0] == "short"]


def _overlaps(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.parametrize("marked", [True, False], ids=["quiet", "unmarked"])
def test_a_quiet_test_runs_alone(tmp_path, marked):
    (long,), short = _intervals(tmp_path, marked)
    assert len(short) == 10
    overlapping = [s for s in short if _overlaps(long, s)]
    if marked:
        assert not overlapping, f"the quiet test {long} ran beside {overlapping}"
    else:
        assert overlapping, "unmarked, the long test should have run beside the short ones (two workers)"
