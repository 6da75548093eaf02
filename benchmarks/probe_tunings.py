"""Probe: what the tunings kept on disk (qwen_lab.tunings) save a new process.

    python benchmarks/probe_tunings.py [--model qwen3.5-0.8b]      (an NVIDIA GPU; from the repository's root)

Runs the same first calls, as a notebook makes them, in three fresh processes one after another: the model's
prefill at a few prompt lengths (each a new tuning key for the GEMMs, the attention and the DeltaNet kernels), then
generation through the decode graph (the decode GEMV plans, the fused decode step, the split attention):

1. the store on, its folder empty: every shape is timed and recorded;
2. the store on again: every pick is read from the first run's records;
3. the store off (QWEN_LAB_TUNING_CACHE=0): every shape is timed again, as every process did before the store.

Compiled kernels come from Triton's own disk cache in all three (the first run compiles what is missing), so run 2
against run 3 is the time the records save. Each run also prints its last logits' checksum: the three must agree up
to the atomic split-K's last bits, and exactly when the same picks serve them.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PROMPTS = (16, 77, 300)
NEW_TOKENS = 16


def child(model_name: str, folder: str) -> None:
    from pathlib import Path

    import torch

    import qwen_lab
    from qwen_lab import tunings

    tunings.cache_dir = lambda: Path(folder)  # the probe's own folder, Triton's compiled kernels left where they are
    times = {}
    start = time.perf_counter()
    model = qwen_lab.load_model(model_name)
    torch.cuda.synchronize()
    times["load"] = time.perf_counter() - start
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    logits = None
    for T in PROMPTS:
        ids = torch.randint(0, vocab, (T,), generator=gen).to(model.device)
        start = time.perf_counter()
        logits = model.forward(ids)
        torch.cuda.synchronize()
        times[f"prefill {T}"] = time.perf_counter() - start
    ids = torch.randint(0, vocab, (32,), generator=gen).to(model.device)
    start = time.perf_counter()
    tokens = qwen_lab.generate(model, ids, max_new_tokens=NEW_TOKENS, cuda_graph=True)
    torch.cuda.synchronize()
    times[f"generate {NEW_TOKENS} (graph)"] = time.perf_counter() - start
    records = sum(len(json.loads(p.read_text())["entries"]) for p in Path(folder).glob("*.json"))
    print(json.dumps({"times": times, "records": records, "logits_sum": float(logits[-1].double().sum()),
                      "tokens": tokens.tolist()}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3.5-0.8b")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model, args.child)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("skipped: nothing is timed on a CPU, so there is nothing to keep")
        return 0
    folder = tempfile.mkdtemp(prefix="qwen_lab-tunings-probe-")
    runs = [("1. store on, empty", "1"), ("2. store on, read", "1"), ("3. store off", "0")]
    results = []
    for name, on in runs:
        env = dict(os.environ, QWEN_LAB_TUNING_CACHE=on)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", folder], env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            print(f"{name}: failed\n{done.stderr[-3000:]}")
            return 1
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append((name, wall, result))
        print(f"{name}: {wall:.1f} s in all, {result['records']} records; "
              + ", ".join(f"{k} {v:.1f} s" for k, v in result["times"].items())
              + f"; last logits sum {result['logits_sum']:.4f}", flush=True)
    same = results[0][2]["tokens"] == results[1][2]["tokens"]
    print(f"generated tokens of runs 1 and 2 (same picks): {'equal' if same else 'DIFFERENT'}; "
          f"run 3: {'equal' if results[2][2]['tokens'] == results[0][2]['tokens'] else 'different'} to run 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
