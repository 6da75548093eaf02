"""The attention layer's decode sequence, before and after the launch fusion (bf16, Qwen3.5-0.8B's shapes, one GPU).

    python benchmarks/bench_decode_attention.py [--out DIR]

A decode step of Qwen3.5-0.8B runs 6 gated attention layers. Per layer, from the fused projection's q, gate, k, v:
- old, 4 launches: qk_norm_rope, kv_cache_write, flash_decode_split, flash_decode_combine;
- new, 2 launches: qk_norm_rope_cache (the cache write fused into the norm + RoPE kernel), then the one-launch
  decode attention (the last split of each KV head merges the partials).
Each sequence is timed the way the model runs it: the 6 layers (each with its own KV cache, capacity CAPACITY)
captured back to back in one CUDA Graph, replayed (kernels.graph_time_us), divided by 6; PDL as the model uses
it (on for Hopper unless QWEN_LAB_PDL=0). The two halves are also timed alone (q/k preparation + cache write; the
attention itself). Cache lengths 2048 and 8192 (the query at position length - 1).

Prints one table and writes DIR/bench_decode_attention.json. Needs a CUDA GPU; says it skipped otherwise.
Finishes in well under a minute on an H200 (compiling and autotuning included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import qwen_lab  # noqa: E402,F401  (sets up the runtime before any kernel module is imported)
from qwen_lab import runtime  # noqa: E402
from qwen_lab.config import QWEN35_0_8B as C  # noqa: E402

DEVICE = "cuda"
LAYERS = C.num_full_layers  # 6 gated attention layers
CAPACITY = 8192
LENGTHS = (2048, 8192)
REPLAYS = 50


class Layer:
    """One attention layer's decode inputs (views of one fused projection row, as the model's) and its KV cache."""

    def __init__(self, gen):
        Hq, Hkv, D = C.num_attention_heads, C.num_key_value_heads, C.head_dim
        proj = torch.randn(1, 2 * Hq * D + 2 * Hkv * D, generator=gen, device=DEVICE).to(torch.bfloat16)
        qg = proj[:, :2 * Hq * D].view(1, Hq, 2 * D)
        self.q, self.gate = qg[..., :D], qg[..., D:]
        self.k = proj[:, 2 * Hq * D:2 * Hq * D + Hkv * D].view(1, Hkv, D)
        self.v = proj[:, 2 * Hq * D + Hkv * D:].view(1, Hkv, D)
        self.wq = (0.2 * torch.randn(D, generator=gen, device=DEVICE)).to(torch.bfloat16)
        self.wk = (0.2 * torch.randn(D, generator=gen, device=DEVICE)).to(torch.bfloat16)
        self.k_cache = torch.randn(CAPACITY, Hkv, D, generator=gen, device=DEVICE).to(torch.bfloat16)
        self.v_cache = torch.randn(CAPACITY, Hkv, D, generator=gen, device=DEVICE).to(torch.bfloat16)
        self.q_out = torch.empty(1, Hq, D, dtype=torch.bfloat16, device=DEVICE)
        self.k_out = torch.empty(1, Hkv, D, dtype=torch.bfloat16, device=DEVICE)
        self.out = torch.empty(1, Hq, D, dtype=torch.bfloat16, device=DEVICE)


def old_prep(x, pos):
    from qwen_lab.kernels import attention as A
    from qwen_lab.kernels import rope as R

    R.qk_norm_rope(x.q, x.k, x.wq, x.wk, C.rms_norm_eps, pos, C.rotary_dim, C.rope_theta, q_out=x.q_out,
                   k_out=x.k_out)
    A.kv_cache_write(x.k_cache, x.v_cache, x.k_out, x.v, pos)


def old_attention(x, pos):
    from qwen_lab.kernels import attention as A

    saved, A.DECODE_ONE_LAUNCH = A.DECODE_ONE_LAUNCH, False  # read at the call: split + combine
    try:
        A.attention(x.q_out, x.k_cache, x.v_cache, pos, gate=x.gate, out=x.out)
    finally:
        A.DECODE_ONE_LAUNCH = saved


def new_prep(x, pos):
    from qwen_lab.kernels import rope as R

    R.qk_norm_rope_cache(x.q, x.k, x.v, x.wq, x.wk, C.rms_norm_eps, pos, C.rotary_dim, C.rope_theta,
                         x.k_cache, x.v_cache, out=x.q_out)


def new_attention(x, pos):
    from qwen_lab.kernels import attention as A

    saved, A.DECODE_ONE_LAUNCH = A.DECODE_ONE_LAUNCH, True
    try:
        A.attention(x.q_out, x.k_cache, x.v_cache, pos, gate=x.gate, out=x.out)
    finally:
        A.DECODE_ONE_LAUNCH = saved


def time_layers(layers, pos, *steps) -> float:
    """Microseconds per layer: `steps` of every layer captured back to back in one CUDA Graph, replayed."""
    from qwen_lab.kernels import graph_time_us

    calls = [lambda x=x: [step(x, pos) for step in steps] for x in layers]
    return graph_time_us(calls, warmup=True, replays=REPLAYS)


def launches_of(x, pos, *steps) -> int:
    from qwen_lab.kernels import count_launches

    with count_launches() as c:
        for step in steps:
            step(x, pos)
    torch.cuda.synchronize()
    return sum(c.values())


def rows(gen):
    from qwen_lab.kernels import pdl_enabled

    layers = [Layer(gen) for _ in range(LAYERS)]
    pos = torch.zeros(1, dtype=torch.long, device=DEVICE)
    out = []
    for length in LENGTHS:
        pos.fill_(length - 1)
        # the two sequences agree (the old one's output, then the new one's, on the same inputs)
        x = layers[0]
        old_prep(x, pos)
        old_attention(x, pos)
        ref = x.out.float().clone()
        new_prep(x, pos)
        new_attention(x, pos)
        err = (x.out.float() - ref).abs().max().item()
        row = dict(cache_len=length, capacity=CAPACITY, layers=LAYERS, pdl=pdl_enabled(DEVICE), max_abs_diff=err,
                   launches_old=launches_of(x, pos, old_prep, old_attention),
                   launches_new=launches_of(x, pos, new_prep, new_attention))
        row["old_us"] = time_layers(layers, pos, old_prep, old_attention)
        row["new_us"] = time_layers(layers, pos, new_prep, new_attention)
        row["old_prep_us"] = time_layers(layers, pos, old_prep)
        row["new_prep_us"] = time_layers(layers, pos, new_prep)
        row["old_attention_us"] = time_layers(layers, pos, old_attention)
        row["new_attention_us"] = time_layers(layers, pos, new_attention)
        out.append(row)
    return out


def print_table(result):
    print(f"\nattention-layer decode on {result['gpu']}: us per layer, {LAYERS} layers in one CUDA Graph, cache "
          f"capacity {CAPACITY}, PDL {'on' if result['rows'][0]['pdl'] else 'off'}")
    head = (f"{'cache len':>9}  {'launches':>8}  {'old us':>7}  {'new us':>7}  {'saved':>6}  {'prep old':>8}  "
            f"{'prep new':>8}  {'attn old':>8}  {'attn new':>8}  {'max |diff|':>10}")
    print(head)
    print("-" * len(head))
    for r in result["rows"]:
        launches = f"{r['launches_old']} -> {r['launches_new']}"
        print(f"{r['cache_len']:>9}  {launches:>8}  {r['old_us']:>7.2f}  {r['new_us']:>7.2f}  "
              f"{1 - r['new_us'] / r['old_us']:>6.1%}  {r['old_prep_us']:>8.2f}  {r['new_prep_us']:>8.2f}  "
              f"{r['old_attention_us']:>8.2f}  {r['new_attention_us']:>8.2f}  {r['max_abs_diff']:>10.3g}")
    print("old: qk_norm_rope + kv_cache_write + flash_decode_split + flash_decode_combine; "
          "new: qk_norm_rope_cache + flash_decode_kernel (one launch)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=".", help="directory for bench_decode_attention.json (default: here)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_decode_attention.json")

    if not torch.cuda.is_available() or runtime.interpreter_active():
        msg = "skipped: bench_decode_attention needs a CUDA GPU (this machine runs kernels in the Triton interpreter)"
        print(msg)
        with open(path, "w") as fh:
            json.dump({"skipped": msg}, fh, indent=1)
        return 0

    import triton

    started = time.time()
    props = torch.cuda.get_device_properties(0)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    result = dict(gpu=props.name, torch=torch.__version__, triton=triton.__version__)
    with torch.inference_mode():
        result["rows"] = rows(gen)
    result["elapsed_s"] = time.time() - started
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print_table(result)
    print(f"\n{result['elapsed_s']:.1f} s; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
