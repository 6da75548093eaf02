"""Why a prompt prefilled in pieces (as the bucketed prefill graphs split it) can part from one prefill.

Runs in one process on the eager model, so no CUDA Graph is involved:
  1. the pieces against one prefill of the whole prompt, under each setting of the kernel switches;
  2. every split-K GEMV of a few rows checked where it runs: its output against a deterministic relaunch of the
     same call on the same inputs after a synchronisation, and an atomic relaunch likewise. A wrong output whose
     relaunches agree points at the kernels around it (their ordering); wrong relaunches point at the GEMV.
    python benchmarks/probe_prefill_graphs.py [T] [model]
"""

import os
import sys

import torch

import qwen_lab
from qwen_lab import checks
from qwen_lab.graph import PREFILL_BUCKETS, prefill_pieces
from qwen_lab.kernels import gemm

SETTINGS = [("default", {}), ("PDL=0", {"QWEN_LAB_PDL": "0"}), ("DETERMINISTIC=1", {"QWEN_LAB_DETERMINISTIC": "1"}),
            ("PERSIST=0", {"QWEN_LAB_GEMV_PERSIST": "0"}), ("default again", {})]


def in_pieces(model, ids):
    cache = model.new_cache(2048)
    offset = 0
    for s in prefill_pieces(ids.numel(), PREFILL_BUCKETS):
        logits = model.step(ids[offset:offset + s], torch.arange(offset, offset + s, device=model.device), cache)
        offset += s
    return logits.float()


def main(T: int, source: str):
    model = qwen_lab.load_model(source, dtype=torch.bfloat16 if torch.cuda.is_available() else None)
    dev = model.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    ids = torch.randint(0, model.config.vocab_size, (T,), generator=torch.Generator().manual_seed(T)).to(dev)
    print(f"T={T}, pieces {prefill_pieces(T, PREFILL_BUCKETS)}", flush=True)
    with torch.inference_mode():
        whole = model.step(ids, torch.arange(T, device=dev), model.new_cache(2048)).float()
        for name, env in SETTINGS:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            errs = [checks.relative_error(in_pieces(model, ids), whole) for _ in range(3)]
            print(f"  {name:16s} pieces vs whole: {' '.join(f'{e:.3g}' for e in errs)}", flush=True)
            for k, v in saved.items():  # back to the setting before this one
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v

        launch = gemm._launch_gemv
        found = []

        def checked(name, x, weight, out, M, N, K, split_k, deterministic, prologue, args, dv=1):
            launch(name, x, weight, out, M, N, K, split_k, deterministic, prologue, args, dv)
            if M > 1:
                plan = gemm.last_plan
                sync()
                ref = torch.empty_like(out)
                launch(name, x, weight, ref, M, N, K, split_k, True, prologue, dict(args), dv)
                again = torch.empty_like(out)
                launch(name, x, weight, again, M, N, K, split_k, deterministic, prologue, dict(args), dv)
                sync()
                found.append((model.layer_index, gemm.PROLOGUE_NAMES.get(prologue, prologue), M, N, K, plan[0],
                              checks.relative_error(out.float(), ref.float()),
                              checks.relative_error(again.float(), ref.float())))
            return out

        gemm._launch_gemv = checked
        try:
            err = checks.relative_error(in_pieces(model, ids), whole)
        finally:
            gemm._launch_gemv = launch
    print(f"  checked run pieces vs whole: {err:.3g}")
    bad = [f for f in found if max(f[6], f[7]) > 2e-2]
    print(f"  {len(found)} GEMV calls of a few rows checked, {len(bad)} off by more than 2e-2; the first 12:")
    for layer, pro, M, N, K, split, e_out, e_again in bad[:12]:
        print(f"    layer {layer:2d} {pro:8s} M={M:2d} N={N:5d} K={K:5d} split {split}: in place {e_out:.3g}, "
              f"relaunched {e_again:.3g}")
    ok = [f for f in found if max(f[6], f[7]) <= 2e-2]
    print(f"  fine, by kind: {sorted({(f[1], f[2], f[5]) for f in ok})}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 77, sys.argv[2] if len(sys.argv) > 2 else "qwen3.5-0.8b")
