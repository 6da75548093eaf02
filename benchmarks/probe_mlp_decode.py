"""Probe: the decode MLP (gate/up, SwiGLU, down) in one launch instead of two GEMVs.

    python benchmarks/probe_mlp_decode.py        (an NVIDIA GPU; prints us per layer for each form)

Each decode GEMV costs its bytes plus a launch's ramp (docs/perf-log.md, 2026-11-30: a one-launch floor), and the
MLP pays it twice: the gate/up GEMV (14.7 MB at 0.8B's sizes), then the down GEMV (7.3 MB) with SwiGLU as its
prologue. The down projection's K is the intermediate dimension, so it splits along K with no exchange between
programs when each program produces its own slice of the input:

    program p (intermediate rows i in [p B, p B + B)):   a_i = silu(W_gate[i] . h) * (W_up[i] . h)
                                                          y  += W_down[:, i] a_i        (fp32 atomics)

and the last program to finish (a ticket) rounds y to bf16 and clears the sums. W_down is read as its transpose
[I, H] (a layout the loader could store), so a program's share is B whole rows, not B-wide column slices of 1024
rows. Every weight load is issued before the PDL wait: a program has its whole 3 x B x H share in flight while
the kernel before it finishes.

Timed inside a CUDA Graph over 24 layers' weights (more than L2 holds, as in the model), in us per layer:
- `library`: gemm.linear (gate/up GEMV) then activations.swiglu_down (the down GEMV, SwiGLU prologue);
- `fused B=...`: the kernel below, for a few slice heights.
Both are checked against an fp32 reference of the MLP.
"""

import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from probe_ab import probe_args


@triton.jit
def mlp_decode_kernel(h_ptr, wgu_ptr, wdt_ptr, ws_ptr, count_ptr, out_ptr, H, I,
                      B: tl.constexpr, BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * B + tl.arange(0, B)                                         # intermediate rows of this program
    offs_h = tl.arange(0, BLOCK_H)
    m2 = (rows < I)[:, None] & (offs_h < H)[None, :]
    w_rows = rows.to(tl.int64)[:, None] * H + offs_h[None, :]
    # the weights first: they do not depend on the kernel before this one
    wg = tl.load(wgu_ptr + w_rows, mask=m2, other=0.0)                       # [B, BLOCK_H] gate rows
    wu = tl.load(wgu_ptr + I * H + w_rows, mask=m2, other=0.0)               # up rows, I rows further down
    wd = tl.load(wdt_ptr + w_rows, mask=m2, other=0.0)                       # rows of W_down^T
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    h = tl.load(h_ptr + offs_h, mask=offs_h < H, other=0.0).to(tl.float32)
    g = tl.sum(wg.to(tl.float32) * h[None, :], 1)
    u = tl.sum(wu.to(tl.float32) * h[None, :], 1)
    # rounded like the library's stored gate_up and its SwiGLU prologue
    g = g.to(out_ptr.dtype.element_ty).to(tl.float32)
    u = u.to(out_ptr.dtype.element_ty).to(tl.float32)
    a = (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty).to(tl.float32)  # [B]
    part = tl.sum(wd.to(tl.float32) * a[:, None], 0)                         # [BLOCK_H]
    tl.atomic_add(ws_ptr + offs_h, part, mask=offs_h < H, sem="relaxed")
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:
        total = tl.load(ws_ptr + offs_h, mask=offs_h < H, other=0.0, cache_modifier=".cg")
        tl.debug_barrier()
        tl.store(ws_ptr + offs_h, tl.zeros([BLOCK_H], dtype=tl.float32), mask=offs_h < H)
        tl.store(out_ptr + offs_h, total.to(out_ptr.dtype.element_ty), mask=offs_h < H)
        tl.store(count_ptr, 0)


def mlp_decode(h, w_gate_up, w_down_t, ws, count, out, B, warps=8):
    """y [1, H] = down(silu(gate) * up) of h [1, H]; w_gate_up [2I, H], w_down_t [I, H]; ws fp32 [H] and count
    int32 [1] zeroed once (the kernel leaves them zeroed)."""
    from qwen_lab.kernels import pdl_options
    I, H = w_down_t.shape
    mlp_decode_kernel[(triton.cdiv(I, B),)](h, w_gate_up, w_down_t, ws, count, out, H, I, B=B,
                                            BLOCK_H=triton.next_power_of_2(H), num_warps=warps,
                                            **{"USE_PDL": False, **pdl_options(h.device)})
    return out


def main() -> int:
    args = probe_args(__doc__, ("--layers", dict(type=int, default=24)), tokens=False, model=False)
    if args is None:
        return 0
    from qwen_lab import reference
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import activations, gemm, graph_time_us

    H, I, L, dev, bf = cfg.hidden_size, cfg.intermediate_size, args.layers, "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    w_gu = [(torch.randn(2 * I, H, device=dev, generator=gen) * H ** -0.5).to(bf) for _ in range(L)]
    w_dn = [(torch.randn(H, I, device=dev, generator=gen) * I ** -0.5).to(bf) for _ in range(L)]
    w_dt = [w.t().contiguous() for w in w_dn]
    h = torch.randn(1, H, device=dev, generator=gen).to(bf)
    ref = reference.linear(reference.silu_mul(reference.linear(h.float(), w_gu[0].float())), w_dn[0].float())
    gu = torch.empty(1, 2 * I, device=dev, dtype=bf)
    out = torch.empty(1, H, device=dev, dtype=bf)
    mb = (w_gu[0].numel() + w_dn[0].numel()) * 2 / 1e6
    print(f"H={H} I={I}: {mb:.1f} MB per layer, {mb / 4.0e6 * 1e6:.2f} us at 4 TB/s; {L} layers' weights")

    def report(name, layer_call):
        layer_call(0)  # the first layer's weights, against the reference
        torch.cuda.synchronize()
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        us = graph_time_us([lambda i=i: layer_call(i) for i in range(L)], warmup=True, replays=20)
        print(f"{name:24s} {us:7.2f} us per layer   max error (relative to max |y|) {err:.2e}", flush=True)

    # the library's two GEMVs (tuned on first use, outside the graph)
    gemm.linear(h, w_gu[0], out=gu)
    activations.swiglu_down(gu, w_dn[0], out=out)
    report("library (two GEMVs)", lambda i: activations.swiglu_down(gemm.linear(h, w_gu[i], out=gu), w_dn[i], out=out))
    ws = torch.zeros(H, device=dev, dtype=torch.float32)
    count = torch.zeros(1, device=dev, dtype=torch.int32)
    for B, warps in ((4, 4), (8, 4), (8, 8), (16, 8)):
        try:
            report(f"fused B={B} w{warps}",
                   lambda i, B=B, w=warps: mlp_decode(h, w_gu[i], w_dt[i], ws, count, out, B, w))
        except Exception as e:  # a slice height the compiler refuses: say so, go on
            print(f"fused B={B} w{warps}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
