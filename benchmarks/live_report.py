"""A pytest plugin for the GPU session: each failure is written to $OUT/failures.txt the moment it is reported, and
each finished test to $OUT/finished.txt (its outcome, seconds and id, one line).

pytest prints its failures only at the end of the run; a run stopped by the session's time limit would then say
that tests failed but not which or why, nor which tests it never reached. With xdist the reports reach the
controller, where this hook runs.

    PYTHONPATH=benchmarks:$PYTHONPATH python3 -m pytest tests -p live_report ...
"""

import os

LIMIT = 4000  # characters of each failure's report kept


_worker = False


def pytest_configure(config):
    # Under xdist this plugin runs in each worker too, and each report again where it reaches the controller: only
    # the controller writes (a worker that dies has its reports, up to its death, there already). A worker is known
    # by its config, not by PYTEST_XDIST_WORKER, which a pytest started from inside a worker's test inherits.
    global _worker
    _worker = hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    if _worker:
        return
    out = os.environ.get("OUT", "gpu_out")
    # a test ends with its call, or earlier when its setup fails or skips it
    if report.when == "call" or (report.when == "setup" and not report.passed):
        with open(os.path.join(out, "finished.txt"), "a") as f:
            f.write(f"{report.outcome} {report.duration:.1f} {report.nodeid}\n")
    if not report.failed:
        return
    path = os.path.join(out, "failures.txt")
    text = report.longreprtext
    if len(text) > LIMIT:
        text = text[:LIMIT // 4] + "\n...\n" + text[-3 * LIMIT // 4:]
    with open(path, "a") as f:
        f.write(f"=== {report.nodeid} ({report.when})\n{text}\n\n")
