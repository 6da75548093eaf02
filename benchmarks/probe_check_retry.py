"""Probe: chapter 12's decode-step check on a GPU, and its retry in the deterministic mode.

    python benchmarks/probe_check_retry.py        (an NVIDIA GPU; from the repository's root)

Runs the solution notebook's code cells up to the check of Exercise 12.1, as a Jupyter kernel would (the check
compares the graph-replayed step with eager generation under the default atomic split-K). Then it runs the check's
last part again with eager generation's last token changed whenever the deterministic mode is off: the check must
report the differing token, compare again in the deterministic mode, and pass. On a CPU the interpreter's atomics
always add in one order and the check never retries, so there is nothing to probe.
"""

import json
import os
import sys
import time

import torch

from qwen_lab import exercises
from run_notebooks import run_cell

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "solutions",
                        "12_cuda_graph.ipynb")


def main(require_gpu: bool = True) -> int:
    """(require_gpu=False: the CPU test of the probe's own plumbing, where the check must fail instead of retrying.)"""
    if require_gpu and not torch.cuda.is_available():
        print("skipped: the check retries only on a GPU")
        return 0
    nb = json.load(open(NOTEBOOK))
    _, check = exercises.exercise_and_check(NOTEBOOK, "Exercise 12.1")
    os.chdir(os.path.dirname(NOTEBOOK))
    namespace = {"__name__": "__main__"}
    for i, cell in enumerate(nb["cells"][:check + 1]):
        if cell["cell_type"] == "code":
            start = time.perf_counter()
            run_cell("".join(cell["source"]), f"<12_cuda_graph.ipynb cell {i}>", namespace)
            print(f"cell {i}: {time.perf_counter() - start:.1f} s", flush=True)

    source = "".join(nb["cells"][check]["source"])
    retry = source[source.index("try:\n    check_decode_step()"):]
    eager = namespace["tokens_from_generate"]

    def one_token_off(**case):
        tokens = eager(**case)
        if os.environ.get("QWEN_LAB_DETERMINISTIC") != "1":   # as if the atomics had swapped a near-tie
            tokens = tokens.clone()
            tokens[-1] += 1
        return tokens

    namespace["tokens_from_generate"] = one_token_off
    start = time.perf_counter()
    run_cell(retry, "<12_cuda_graph.ipynb check, one token off in the atomic round>", namespace)
    print(f"the retry path: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
