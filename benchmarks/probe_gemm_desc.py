"""Probe: the prefill GEMM's TMA descriptors made on the host (the library) against made in every program.

    python benchmarks/probe_gemm_desc.py [--tokens 2048]        (an NVIDIA GPU of compute capability 9.0+)

`gemm.matmul_kernel`'s TMA configurations take host tensor descriptors: the launcher makes them, and they travel in
the launch's parameters (in a CUDA Graph: made once, at capture). Made in the kernel instead
(`tl.make_tensor_descriptor`, the form below), each program writes its two 128-byte descriptors into global scratch
and fences them after its PDL wait, before its first TMA load. For each prefill projection of the 0.8B model and
each TMA configuration, this times (inside a CUDA Graph, 20 calls back to back, PDL as in the model) the
device-descriptor form, the library's, and cuBLAS; and checks that both kernels write the same bits
(docs/perf-log.md, 2026-12-01).

Then, for each persistent configuration, the library's kernel with TAIL = 1 and TAIL = 2: a last round of tiles
that would keep only some SMs busy (448 SwiGLU tiles on 132 SMs: 3.4 rounds) run as half-height slices instead,
checked bitwise against TAIL = 1 (the same sums, in the same order, per output).
"""


import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qwen_lab.kernels.gemm import _tma_program

from probe_ab import probe_args


@triton.jit
def matmul_device_desc_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                              DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SWIGLU: tl.constexpr = False,
                              TMA: tl.constexpr = True, PERSIST: tl.constexpr = False, JOIN: tl.constexpr = False,
                              TAIL: tl.constexpr = 1, USE_PDL: tl.constexpr = False):
    if USE_PDL:
        gdc_wait()  # before the descriptors: their scratch may be memory the previous kernel used
        gdc_launch_dependents()
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
    if SWIGLU and JOIN:
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[2, N, K], strides=[N * stride_wn, stride_wn, 1],
                                           block_shape=[2, BLOCK_N, BLOCK_K])
    else:
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[2 * N if SWIGLU else N, K], strides=[stride_wn, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    xt_desc = None
    if TAIL > 1:   # the SwiGLU configurations' last round in row slices: x described in slices of BLOCK_M / TAIL
        xt_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1],
                                            block_shape=[BLOCK_M // TAIL, BLOCK_K])
    _tma_program(x_desc, w_desc, out_ptr, M, N, K, stride_om, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                 SWIGLU, PERSIST, JOIN, xt_desc, TAIL)


def device_desc_call(x, w, out, config, swiglu):
    from qwen_lab.kernels import pdl_options
    from qwen_lab.kernels.gemm import matmul_grid
    M, K = x.shape
    N = out.shape[1]
    grid = matmul_grid(M, N, config.kwargs, x.device)

    def call():
        matmul_device_desc_kernel[grid](x, w, out, M, N, K, x.stride(0), w.stride(0), out.stride(0),
                                        DOT_PRECISION="tf32", SWIGLU=swiglu, num_warps=config.num_warps,
                                        num_stages=config.num_stages, **config.kwargs, **pdl_options(x.device))
    return call


def main() -> int:
    args = probe_args(__doc__, ("--calls", dict(type=int, default=20)), model=False)
    if args is None:
        return 0
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import graph_time_us
    from qwen_lab.kernels import gemm

    T, H, dev, bf = args.tokens, cfg.hidden_size, "cuda", torch.bfloat16
    shapes = [("in (deltanet)", H, cfg.linear_in_proj_dim, False),
              ("q/k/v (attention)", H, cfg.attn_q_dim + 2 * cfg.attn_kv_dim, False),
              ("gate+up (swiglu)", H, cfg.intermediate_size, True),
              ("down", cfg.intermediate_size, H, False),
              ("out (deltanet)", cfg.linear_value_dim, H, False),
              ("o (attention)", cfg.num_attention_heads * cfg.head_dim, H, False)]
    gen = torch.Generator(device=dev).manual_seed(0)
    # the device-made descriptors' global scratch, asked for at every launch
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=dev))
    print(f"{'projection':<20} {'config':<44} {'device desc':>11} {'host desc':>10} {'cuBLAS':>8}  same bits")
    for name, K, N, swiglu in shapes:
        x = (torch.randn(T, K, device=dev, generator=gen) * 0.5).to(bf)
        w = (torch.randn(2 * N if swiglu else N, K, device=dev, generator=gen) * K ** -0.5).to(bf)
        cublas = [lambda: torch.nn.functional.linear(x, w)]  # with SwiGLU: its gate+up product alone
        us_cublas = graph_time_us(cublas * args.calls, warmup=True)
        assert gemm._tma_ok(x, w)
        for config in gemm._matmul_configs(swiglu):
            if not config.kwargs.get("TMA") or config.kwargs.get("TAIL", 1) > 1:  # TAIL: the second table
                continue
            out_d = torch.empty(T, N, device=dev, dtype=bf)
            out_h = torch.empty(T, N, device=dev, dtype=bf)
            device = device_desc_call(x, w, out_d, config, swiglu)
            host = [lambda c=config, o=out_h: gemm.matmul_with_config(x, w, o, c, swiglu=swiglu)]
            try:
                us_d = graph_time_us([device] * args.calls, warmup=True)
                us_h = graph_time_us(host * args.calls, warmup=True)
            except Exception as e:  # a configuration that does not compile or fit: say so, go on
                print(f"{name:<20} {str(config.kwargs):<44} failed: {type(e).__name__}: {str(e)[:100]}")
                continue
            same = torch.equal(out_d, out_h)
            tag = f"{config.kwargs['BLOCK_M']}x{config.kwargs['BLOCK_N']}x{config.kwargs['BLOCK_K']} " \
                  f"s{config.num_stages} w{config.num_warps}{' P' if config.kwargs.get('PERSIST') else ''}" \
                  f"{' J' if config.kwargs.get('JOIN') else ''}"
            print(f"{name:<20} {tag:<44} {us_d:11.2f} {us_h:10.2f} {us_cublas:8.2f}  {same}")
    print(f"\n{'projection':<20} {'persistent config':<36} {'tiles':>6} {'TAIL=1':>8} {'TAIL=2':>8}  same bits")
    for name, K, N, swiglu in shapes:
        x = (torch.randn(T, K, device=dev, generator=gen) * 0.5).to(bf)
        w = (torch.randn(2 * N if swiglu else N, K, device=dev, generator=gen) * K ** -0.5).to(bf)
        for config in gemm._matmul_configs(swiglu):
            if not config.kwargs.get("PERSIST") or config.kwargs.get("TAIL", 1) > 1:  # each one once, at both TAILs
                continue
            outs, times = [], []
            for tail in (1, 2):
                c = triton.Config(dict(config.kwargs, TAIL=tail), num_warps=config.num_warps,
                                  num_stages=config.num_stages)
                out = torch.empty(T, N, device=dev, dtype=bf)
                times.append(graph_time_us([lambda c=c, o=out: gemm.matmul_with_config(x, w, o, c, swiglu=swiglu)]
                                           * args.calls, warmup=True))
                outs.append(out)
            kw = config.kwargs
            tiles = triton.cdiv(T, kw["BLOCK_M"]) * triton.cdiv(N, kw["BLOCK_N"])
            tag = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} s{config.num_stages} w{config.num_warps}" \
                  f"{' J' if kw.get('JOIN') else ''}"
            print(f"{name:<20} {tag:<36} {tiles:6d} {times[0]:8.2f} {times[1]:8.2f}  {torch.equal(*outs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
