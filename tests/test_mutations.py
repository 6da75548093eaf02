"""The mutation suite: each plausible bug of tests/mutations.py, planted in a copy of the package, must fail its tests.

For each mutant the package `qwen_lab/` is copied to a temporary folder, the mutant's snippet is replaced there
(it must occur exactly once in its file), and the mutant's own tests run in a process of their own whose working
directory and sys.path start at that folder, so the copy is what `import qwen_lab` finds. (The processes are forked
from a worker, tests/mutation_worker.py, that imported torch and triton once: a fresh interpreter per mutant would
pay seconds of imports each time.) A pytest plugin written beside the copy records which qwen_lab the run imported;
a run that imported another one is an error, not a catch. A mutant is caught when its tests fail (pytest's exit
status 1); it survives when they pass. Anything else (a snippet missing, a test id that does not exist, a crash of
pytest itself, a run past TIMEOUT_S) fails the suite as an error. The tests always run through the Triton
interpreter in float32, as on a CPU-only machine (a GPU is hidden from them).

QWEN_LAB_MUTANTS=name,name runs only those mutants (to try a new one); QWEN_LAB_MUTATION_JOBS sets how many run
at once (2 by default: the mutants' tests are single-threaded under the interpreter).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mutations import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "qwen_lab"
TIMEOUT_S = 600  # one mutant's tests; a hang counts as an error, not a catch

# Loaded into each mutant's pytest (-p), from beside the mutated copy: writes into imported.txt beside itself the
# CPU seconds the run took (the suite's cost, whatever else the machine is doing) and the qwen_lab it imported.
_PROBE = '''import os
import resource


def pytest_sessionfinish(session, exitstatus):
    import qwen_lab

    use = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imported.txt"), "w") as f:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # (the CLI tests run the command line in a child)
        f.write(f"{use.ru_utime + use.ru_stime + kids.ru_utime + kids.ru_stime:.1f}\\n{os.path.realpath(qwen_lab.__file__)}")
'''


def apply(mutant: Mutant, package: Path) -> None:
    """Replace the mutant's snippet in `package` (a copy of qwen_lab/); the snippet must occur exactly once."""
    path = package / mutant.file
    if not path.is_file():
        raise AssertionError(f"mutant {mutant.name}: no file qwen_lab/{mutant.file}")
    source = path.read_text()
    count = source.count(mutant.find)
    if count != 1:
        raise AssertionError(f"mutant {mutant.name}: its snippet occurs {count} times in qwen_lab/{mutant.file}, "
                             f"expected exactly once (the source moved: update tests/mutations.py)")
    path.write_text(source.replace(mutant.find, mutant.replace))


class Worker:
    """tests/mutation_worker.py in a subprocess: torch and triton imported once, one forked child per mutant."""

    def __init__(self, home: Path):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
        # every mutant's tests run through the interpreter in float32, as on a CPU-only machine, whatever this
        # machine has; nothing of the repository's own qwen_lab on the path
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("mutation_worker.py"))],
                                     cwd=home, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, folder: Path, args: list, log: Path) -> int:
        job = dict(dir=str(folder), args=args, log=str(log), timeout=TIMEOUT_S)
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the mutation worker ended (exit status {self.proc.wait()})")
        return json.loads(answer)["rc"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run_mutant(mutant: Mutant, worker: Worker) -> tuple[str, str, float]:
    """-> ("caught" | "survived" | "error", detail, CPU seconds of its tests)."""
    with tempfile.TemporaryDirectory(prefix="qwen_lab_mutant_") as tmp:
        tmp = Path(os.path.realpath(tmp))
        shutil.copytree(PACKAGE, tmp / "qwen_lab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        try:
            apply(mutant, tmp / "qwen_lab")
        except AssertionError as e:
            return "error", str(e), 0.0
        (tmp / "_mutation_probe.py").write_text(_PROBE)
        probe, log = tmp / "imported.txt", tmp / "pytest.log"
        args = ["-x", "-q", "-p", "no:cacheprovider", "-p", "_mutation_probe", "-o", "addopts=",
                *[str(ROOT / node) for node in mutant.tests]]
        start = time.monotonic()
        rc = worker.run(tmp, args, log)
        tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-15:]) if log.exists() else ""
        cpu, _, imported = (probe.read_text() if probe.exists() else "0\n(nothing recorded)").partition("\n")
        cpu = float(cpu)
        took = f"{time.monotonic() - start:.0f} s, {cpu:.1f} s of CPU"
        if rc == -signal.SIGALRM:
            return "error", f"mutant {mutant.name}: its tests ran past {TIMEOUT_S} s\n{tail}", cpu
        if not imported.startswith(str(tmp / "qwen_lab") + os.sep):
            return "error", (f"mutant {mutant.name}: the tests imported {imported}, not the mutated copy in {tmp}"
                             f"\n{tail}"), cpu
        if rc == 1:
            return "caught", took, cpu
        if rc == 0:
            return "survived", f"mutant {mutant.name} survived ({mutant.bug}); its tests passed:\n{tail}", cpu
        return "error", f"mutant {mutant.name}: pytest exited with {rc}\n{tail}", cpu


def _selected() -> list[Mutant]:
    names = [n for n in os.environ.get("QWEN_LAB_MUTANTS", "").split(",") if n]
    unknown = sorted(set(names) - {m.name for m in MUTANTS})
    if unknown:
        raise AssertionError(f"QWEN_LAB_MUTANTS names no mutant {unknown}")
    return [m for m in MUTANTS if not names or m.name in names]


def test_the_mutant_list_is_well_formed():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)), "two mutants share a name"
    for m in MUTANTS:
        assert m.find != m.replace, f"mutant {m.name} changes nothing"
        assert m.bug and m.tests, f"mutant {m.name}: a description and at least one test are needed"
        for node in m.tests:
            file, _, test = node.partition("::")
            assert (ROOT / file).is_file(), f"mutant {m.name}: no test file {file}"
            assert f"def {test.split('[')[0]}(" in (ROOT / file).read_text(), f"mutant {m.name}: no test {node}"
    # every kernel family has mutants
    families = {p.name for p in (PACKAGE / "kernels").iterdir() if p.is_dir() and p.name != "__pycache__"}
    covered = {m.file.split("/")[1] for m in MUTANTS if m.file.startswith("kernels/")}
    assert families <= covered, f"kernel families without a mutant: {sorted(families - covered)}"


def _run_all(mutants: list[Mutant], jobs: int) -> list[tuple[str, str, float]]:
    """Each mutant's result, in order; `jobs` workers, each taking the next mutant when it is free."""
    results: list = [None] * len(mutants)
    todo = queue.Queue()
    for item in enumerate(mutants):
        todo.put(item)

    def drain(home):
        worker = Worker(Path(home))
        try:
            while True:
                try:
                    i, mutant = todo.get_nowait()
                except queue.Empty:
                    return
                results[i] = run_mutant(mutant, worker)
        finally:
            worker.close()

    with tempfile.TemporaryDirectory(prefix="qwen_lab_mutation_workers_") as home:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for done in [pool.submit(drain, home) for _ in range(min(jobs, len(mutants)))]:
                done.result()
    return results


def test_every_mutant_is_caught(record_property):
    mutants = _selected()
    results = _run_all(mutants, max(1, int(os.environ.get("QWEN_LAB_MUTATION_JOBS", "2"))))
    caught = sum(status == "caught" for status, _, _ in results)
    survivors = [m.name for m, (status, _, _) in zip(mutants, results) if status == "survived"]
    errors = [m.name for m, (status, _, _) in zip(mutants, results) if status == "error"]
    cpu = sum(seconds for _, _, seconds in results)
    summary = f"mutation suite: {len(mutants)} mutants, {caught} caught ({cpu:.0f} s of CPU in their tests)"
    if survivors:
        summary += f"; survived: {', '.join(survivors)}"
    if errors:
        summary += f"; errors: {', '.join(errors)}"
    record_property("mutation_summary", summary)  # tests/conftest.py prints it at the end of the run
    problems = [detail for status, detail, _ in results if status != "caught"]
    assert not problems, summary + "\n\n" + "\n\n".join(problems)
