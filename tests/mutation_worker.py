"""The mutation suite's worker (tests/test_mutations.py starts it): pays for torch, triton and pytest once, then forks
one child per mutant, which runs that mutant's tests on its copy of the package.

Protocol, one JSON object per line: stdin gives {"dir": the folder holding the mutated qwen_lab/, "args": pytest's
arguments, "log": a file for the child's output, "timeout": seconds}; stdout answers {"rc": the child's exit status}. The child's working
directory and the front of its sys.path are "dir", so `import qwen_lab` finds the mutated copy there; nothing in this
process imports qwen_lab. The parent sets TRITON_INTERPRET=1 and hides any GPU before this starts, so every mutant's
tests run through the interpreter in float32, as on a CPU-only machine.
"""

import json
import os
import signal
import sys

import pytest
import torch  # noqa: F401  (imported once here, inherited by every child)
import triton  # noqa: F401


def _child(job) -> int:
    signal.alarm(job["timeout"])   # a hung run ends by SIGALRM: the parent reads its status as a time-out
    os.chdir(job["dir"])
    sys.path.insert(0, job["dir"])
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        return int(pytest.main(job["args"]))
    except BaseException:  # noqa: BLE001  (a crash of pytest itself is reported as status 3)
        import traceback

        traceback.print_exc()
        return 3
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def main() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os._exit(_child(job))
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
