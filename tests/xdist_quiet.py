"""The `quiet` marker: a test that times the machine runs alone under pytest-xdist.

tests/test_tiny_english.py holds the command line to 60 s on a quiet 2-core machine; beside a busy test worker the
command's CPU time grew too (a run of 34 s alone took 61 s of CPU in CI). So every item holds a shared lock on a file
of this run while it runs, and a quiet one holds it alone. A second lock, the gate, keeps new items from starting while
a quiet one waits for the running ones to end. tests/conftest.py imports the hook; one process (no xdist) takes no lock.
"""

import fcntl
import os
import tempfile

import pytest

_FILES: dict = {}


def _lock_file(config, name):
    uid = getattr(config, "workerinput", {}).get("testrunuid")
    if uid is None:
        return None
    if name not in _FILES:
        _FILES[name] = open(os.path.join(tempfile.gettempdir(), f"qwen_lab-{uid}-{name}.lock"), "a+")
    return _FILES[name]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # (called for every item, the notebooks' cells included, not only those under tests/)
    gate, run = _lock_file(item.config, "gate"), _lock_file(item.config, "run")
    if run is None:
        yield
        return
    quiet = item.get_closest_marker("quiet") is not None
    fcntl.flock(gate, fcntl.LOCK_EX)
    if quiet:
        fcntl.flock(run, fcntl.LOCK_EX)  # the gate stays held: no item starts until this one ends
    else:
        fcntl.flock(run, fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
    try:
        yield
    finally:
        fcntl.flock(run, fcntl.LOCK_UN)
        if quiet:
            fcntl.flock(gate, fcntl.LOCK_UN)
