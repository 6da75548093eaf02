"""Probe: what the library's prefill conv (the rows form with the carried state) pays against the probe's rows form.

    python benchmarks/probe_conv_state.py [--tokens 2048]        (an NVIDIA GPU)

Two differences, switched one at a time: WT reads the weights as [W, C] (each tap a contiguous vector) instead of
the model's [C, W] (each tap strided by W), and BRANCH reads the carried state behind a branch taken by the
first segment only, instead of with masked loads that every program issues (masked off past the first).
"""

import argparse
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def conv_state_kernel(x_ptr, w_ptr, state_ptr, out_ptr, T, C, stride_xt, stride_wc, stride_wj, stride_sc, stride_ot,
                      W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BRANCH: tl.constexpr):
    t0 = tl.program_id(0) * BLOCK_T
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    wts = ()
    for j in tl.static_range(W):
        wts = wts + (tl.load(w_ptr + offs_c * stride_wc + j * stride_wj, mask=mask_c, other=0.0).to(tl.float32),)
    x_seg = x_ptr + t0.to(tl.int64) * stride_xt
    xs = ()
    for r in tl.static_range(BLOCK_T + W - 1):
        t = t0 + (r - (W - 1))
        xv = tl.load(x_seg + (r - (W - 1)) * stride_xt + offs_c, mask=mask_c & (t >= 0) & (t < T), other=0.0)
        if r < W - 1:
            xv = xv.to(tl.float32)
            if BRANCH:
                if t0 < W - 1:
                    sv = tl.load(state_ptr + offs_c * stride_sc + (t + W - 1), mask=mask_c & (t < 0), other=0.0)
                    xv += sv.to(tl.float32)
            else:
                sv = tl.load(state_ptr + offs_c * stride_sc + (t + W - 1), mask=mask_c & (t < 0), other=0.0)
                xv += sv.to(tl.float32)
        xs = xs + (xv,)
    out_seg = out_ptr + t0.to(tl.int64) * stride_ot
    for i in tl.static_range(BLOCK_T):
        acc = wts[0] * xs[i].to(tl.float32)
        for j in tl.static_range(1, W):
            acc += wts[j] * xs[i + j].to(tl.float32)
        y = acc * tl.sigmoid(acc)
        tl.store(out_seg + i * stride_ot + offs_c, y.to(out_ptr.dtype.element_ty), mask=mask_c & (t0 + i < T))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=2048)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: the probe times kernels on an NVIDIA GPU")
        return 0
    from qwen_lab import reference
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import graph_time_us

    T, C, W, N = args.tokens, cfg.linear_conv_dim, cfg.linear_conv_kernel_dim, cfg.linear_in_proj_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, N, device="cuda", generator=gen).bfloat16()[:, :C]
    weight = (torch.randn(C, W, device="cuda", generator=gen) * 0.4).bfloat16()
    wt = weight.t().contiguous()
    state = torch.randn(C, W - 1, device="cuda", generator=gen).bfloat16()
    out = torch.empty(T, C, device="cuda", dtype=torch.bfloat16)
    ref = reference.causal_conv1d(x, weight, state.clone())
    for bt, bc, warps in [(8, 1024, 4), (8, 512, 2), (8, 2048, 8), (8, 256, 2)]:
        for wt_form in (False, True):
            for branch in (True, False):
                w, swc, swj = (wt, 1, C) if wt_form else (weight, W, 1)

                def run(bt=bt, bc=bc, warps=warps, w=w, swc=swc, swj=swj, branch=branch):
                    conv_state_kernel[(triton.cdiv(T, bt), triton.cdiv(C, bc))](
                        x, w, state, out, T, C, x.stride(0), swc, swj, state.stride(0), out.stride(0), W=W,
                        BLOCK_T=bt, BLOCK_C=bc, BRANCH=branch, num_warps=warps)
                run()
                torch.cuda.synchronize()
                err = (out.float() - ref.float()).abs().max().item()
                us = graph_time_us([run], replays=20)
                print(f"{bt}x{bc} w{warps} weights {'[W, C]' if wt_form else '[C, W]'} state "
                      f"{'branch' if branch else 'masked'}: {us:7.2f} us   max err {err:.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
