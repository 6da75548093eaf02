"""Probe: the prefill conv's forms against a copy of the same bytes (the floor), on the model's shapes.

    python benchmarks/probe_conv.py [--tokens 2048]        (an NVIDIA GPU; prints one line per variant)

The library's `conv1d_prefill_kernel` first computed a [BLOCK_T, BLOCK_C] tile per program and loaded every row
W times (once per tap): ~25 us per layer against a ~14 us copy. The `rows` form below measured 18.6 us and became
the library's kernel (docs/perf-log.md, 2026-12-02). Variants timed here, each inside a CUDA Graph on the
model's shapes (x a [T, 6144] slice of the [T, 8224] in-projection):

- `library`: conv1d.causal_conv1d with each of its PREFILL_CONFIGS segments (the `rows` form, with the state),
  the weight passed as the model keeps it (the [C, W] view of [W, C] storage);
- `wt2d`: the weights stored [W, C] (channel-contiguous) and loaded as a broadcast 2-D tile, in the x tile's
  layout: vector loads, no shared-memory round trip;
- `span`: a program loops over SPAN rows in BLOCK_T steps, its weights loaded once (wt2d's loads, amortised);
- `copy`: the same tiles with one tap and no SiLU: the memory floor of this access pattern;
- `gather`: each x row of the tile loaded once; the taps' shifted rows taken from the tile in registers
  (`tl.gather` along the tokens), only the W-1 rows before the tile loaded again. The other forms load every row
  W times (once per tap), from L1 or L2 (docs/perf-log.md, 2026-12-01: 23.7 us against the copy's 14.0);
- `rows`: a program holds SEG + W-1 consecutive rows of BLOCK_C channels as separate vectors (each loaded once, all
  requested before any is used) and forms each output row from W of them: the taps' shifts are a choice of
  registers, with no shuffles and no shared memory; W-1 rows per SEG are read twice.

The state (the carried W-1 inputs) is zero here; the variants read rows before 0 as zeros, as the first prefill
of a sequence does. Each variant's output is checked against `reference.causal_conv1d`.

Last, the library's segments again with a carried state that is not zero, the weight once contiguous [C, W]
and once as the model keeps it ([W, C] storage: each tap's weights one contiguous vector).
"""

import sys

import torch
import triton
import triton.language as tl

from probe_ab import probe_args


@triton.jit
def conv_wt2d_kernel(x_ptr, wt_ptr, out_ptr, T, C, stride_xt, stride_ot,
                     W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, SPAN: tl.constexpr,
                     TAPS: tl.constexpr, SILU: tl.constexpr):
    # program (span of SPAN rows, block of channels); wt [W, C] contiguous
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_i = tl.arange(0, BLOCK_T)
    mask_c = offs_c < C
    zero_rows = offs_i[:, None] * 0
    wts = ()
    for j in tl.static_range(W):  # broadcast loads in the tile's own layout (rows repeat: L1 hits)
        wts = wts + (tl.load(wt_ptr + j * C + offs_c[None, :] + zero_rows, mask=mask_c[None, :] & (zero_rows == 0),
                             other=0.0).to(tl.float32),)
    for s in tl.static_range(SPAN // BLOCK_T):
        t0 = tl.program_id(0) * SPAN + s * BLOCK_T
        offs_t = t0 + offs_i
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(W - TAPS, W):
            src = offs_t - (W - 1) + j
            xv = tl.load(x_ptr + src[:, None].to(tl.int64) * stride_xt + offs_c[None, :],
                         mask=((src >= 0) & (src < T))[:, None] & mask_c[None, :], other=0.0)
            acc += wts[j] * xv.to(tl.float32)
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out_ptr + offs_t[:, None].to(tl.int64) * stride_ot + offs_c[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=(offs_t < T)[:, None] & mask_c[None, :])


@triton.jit
def conv_gather_kernel(x_ptr, wt_ptr, out_ptr, T, C, stride_xt, stride_ot,
                       W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    # program (tile of BLOCK_T rows, block of channels); wt [W, C] contiguous; rows before 0 read as zeros
    t0 = tl.program_id(0) * BLOCK_T
    offs_i = tl.arange(0, BLOCK_T)
    offs_t = t0 + offs_i
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    x = tl.load(x_ptr + offs_t[:, None].to(tl.int64) * stride_xt + offs_c[None, :],
                mask=(offs_t < T)[:, None] & mask_c[None, :], other=0.0)
    w_last = tl.load(wt_ptr + (W - 1) * C + offs_c, mask=mask_c, other=0.0).to(tl.float32)
    acc = w_last[None, :] * x.to(tl.float32)
    rows = offs_i[:, None] + offs_c[None, :] * 0                       # [BLOCK_T, BLOCK_C] row index
    for j in tl.static_range(W - 1):
        s = W - 1 - j                                                   # tap j reads row t - s
        inside = tl.gather(x, tl.maximum(rows - s, 0), axis=0)          # row i - s of the tile, for i >= s
        src = offs_t - s                                                # the first s rows: before the tile
        halo = tl.load(x_ptr + src[:, None].to(tl.int64) * stride_xt + offs_c[None, :],
                       mask=((offs_i < s) & (src >= 0))[:, None] & mask_c[None, :], other=0.0)
        wj = tl.load(wt_ptr + j * C + offs_c, mask=mask_c, other=0.0).to(tl.float32)
        acc += wj[None, :] * tl.where(rows >= s, inside, halo).to(tl.float32)
    acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + offs_t[:, None].to(tl.int64) * stride_ot + offs_c[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=(offs_t < T)[:, None] & mask_c[None, :])


@triton.jit
def conv_rows_kernel(x_ptr, wt_ptr, out_ptr, T, C, stride_xt, stride_ot,
                     W: tl.constexpr, SEG: tl.constexpr, BLOCK_C: tl.constexpr):
    # program (SEG rows, block of channels); wt [W, C] contiguous; rows before 0 read as zeros
    t0 = tl.program_id(0) * SEG
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    wts = ()
    for j in tl.static_range(W):
        wts = wts + (tl.load(wt_ptr + j * C + offs_c, mask=mask_c, other=0.0).to(tl.float32),)
    xs = ()
    for r in tl.static_range(SEG + W - 1):  # input rows t0 - (W-1) .. t0 + SEG - 1
        t = t0 + r - (W - 1)
        xs = xs + (tl.load(x_ptr + t.to(tl.int64) * stride_xt + offs_c, mask=mask_c & (t >= 0) & (t < T),
                           other=0.0),)  # kept in x's dtype (half the registers) until used
    for i in tl.static_range(SEG):
        acc = wts[0] * xs[i].to(tl.float32)
        for j in tl.static_range(1, W):
            acc += wts[j] * xs[i + j].to(tl.float32)
        y = acc * tl.sigmoid(acc)
        t = t0 + i
        tl.store(out_ptr + t.to(tl.int64) * stride_ot + offs_c, y.to(out_ptr.dtype.element_ty),
                 mask=mask_c & (t < T))


def main() -> int:
    args = probe_args(__doc__, model=False)
    if args is None:
        return 0
    from qwen_lab import reference
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import conv1d, graph_time_us

    T, C, W, N = args.tokens, cfg.linear_conv_dim, cfg.linear_conv_kernel_dim, cfg.linear_in_proj_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    proj = torch.randn(T, N, device="cuda", generator=gen).bfloat16()
    x = proj[:, :C]
    weight = (torch.randn(C, W, device="cuda", generator=gen) * 0.4).bfloat16()
    wt = weight.t().contiguous()
    out = torch.empty(T, C, device="cuda", dtype=torch.bfloat16)
    ref = reference.causal_conv1d(x, weight, torch.zeros(C, W - 1, device="cuda", dtype=torch.bfloat16))
    floor_us = (x.numel() + out.numel()) * 2 / 4.0e12 * 1e6
    print(f"T={T} C={C} W={W}: {2 * x.numel() * 2 / 1e6:.1f} MB moved, {floor_us:.1f} us at 4 TB/s")

    def report(name, call, check=True):
        call()
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item() if check else float("nan")
        us = graph_time_us([call], replays=20)
        print(f"{name:48s} {us:7.2f} us   max err {err:.3g}", flush=True)

    state = torch.zeros(C, W - 1, device="cuda", dtype=torch.bfloat16)
    for c in conv1d.PREFILL_CONFIGS:
        conv1d.FORCE_PREFILL_CONFIG = c

        def lib(c=c):
            state.zero_()
            conv1d.causal_conv1d(x, wt.t(), state, out=out)  # the weight as the model keeps it: [W, C] storage
        report(f"library {c.kwargs['BLOCK_T']}x{c.kwargs['BLOCK_C']} w{c.num_warps}", lib)
    conv1d.FORCE_PREFILL_CONFIG = None
    for bt, bc, span, warps in [(32, 128, 32, 4), (16, 256, 16, 4), (8, 256, 8, 4), (32, 256, 32, 8),
                                (32, 128, 64, 4), (32, 128, 128, 4), (16, 256, 64, 4), (16, 256, 128, 8),
                                (64, 128, 128, 8), (8, 512, 64, 8)]:
        for taps, silu, name in ((W, True, "wt2d" if span == bt else "span"), (1, False, "copy")):
            if name == "copy" and span != bt:
                continue
            grid = (triton.cdiv(T, span), triton.cdiv(C, bc))

            def run(grid=grid, bt=bt, bc=bc, span=span, warps=warps, taps=taps, silu=silu):
                conv_wt2d_kernel[grid](x, wt, out, T, C, x.stride(0), out.stride(0), W=W, BLOCK_T=bt, BLOCK_C=bc,
                                       SPAN=span, TAPS=taps, SILU=silu, num_warps=warps)
            report(f"{name} {bt}x{bc} span {span} w{warps}", run, check=name != "copy")
    for bt, bc, warps in [(16, 256, 4), (32, 128, 4), (32, 256, 8), (64, 128, 8), (64, 64, 4), (128, 64, 8),
                          (16, 512, 8)]:
        def gather(bt=bt, bc=bc, warps=warps):
            conv_gather_kernel[(triton.cdiv(T, bt), triton.cdiv(C, bc))](
                x, wt, out, T, C, x.stride(0), out.stride(0), W=W, BLOCK_T=bt, BLOCK_C=bc, num_warps=warps)
        try:
            report(f"gather {bt}x{bc} w{warps}", gather)
        except Exception as e:  # a tile the compiler refuses: say so, go on
            print(f"gather {bt}x{bc} w{warps}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    for seg, bc, warps in [(8, 1024, 4), (16, 1024, 4), (8, 2048, 8), (16, 2048, 8), (8, 512, 2), (16, 512, 2)]:
        def rows(seg=seg, bc=bc, warps=warps):
            conv_rows_kernel[(triton.cdiv(T, seg), triton.cdiv(C, bc))](
                x, wt, out, T, C, x.stride(0), out.stride(0), W=W, SEG=seg, BLOCK_C=bc, num_warps=warps)
        try:
            report(f"rows {seg}x{bc} w{warps}", rows)
        except Exception as e:
            print(f"rows {seg}x{bc} w{warps}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    carried = torch.randn(C, W - 1, device="cuda", generator=gen).bfloat16()
    ref = reference.causal_conv1d(x, weight, carried.clone())  # what report() checks from here on
    for c in conv1d.PREFILL_CONFIGS:
        conv1d.FORCE_PREFILL_CONFIG = c
        for name, w in (("[C, W]", weight), ("[W, C] storage", wt.t())):
            # the first call (the one checked) reads the carried state; the timed ones read what it left, which
            # changes the values, not the work (no reset kernel inside the timing)
            state.copy_(carried)
            report(f"state {c.kwargs['BLOCK_T']}x{c.kwargs['BLOCK_C']} w{c.num_warps} weight {name}",
                   lambda w=w: conv1d.causal_conv1d(x, w, state, out=out))
    conv1d.FORCE_PREFILL_CONFIG = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
