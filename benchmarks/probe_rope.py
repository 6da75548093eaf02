"""Probe: the prefill's q/k norm, RoPE and cache write with several tokens per program.

    python benchmarks/probe_rope.py [--tokens 2048]        (an NVIDIA GPU; prints one line per variant)

`rope.qk_norm_rope_cache` runs one program per (token, block of heads): at 2048 tokens, 2048 programs of q (8
heads, 4 KB in and out) and 2048 of k and v (2 heads each). The model's profile gives it ~12 us per attention
layer for ~25 MB moved, about twice a copy of those bytes. Each program is short: it loads the position, computes
the angles, loads its rows, reduces them for the norm and stores, so most of its time is one dependent chain of
latencies.

`qk_norm_rope_cache_tokens_kernel` gives each program BLOCK_T tokens instead: a [BLOCK_T, heads, D] tile, the
angles computed once per token and shared by its heads, the norm a reduction over the last axis. Axis 1 of the
grid is 0 for the q programs and 1 for those of k and v (2 k heads and 2 v heads: as many rows as q's 8 heads
read and write). Both are timed inside a CUDA Graph on the model's views (q, k, v slices of the [T, 5120]
projection, the caches one layer of a [layers, L, 2, 256] buffer), and the outputs compared with the library's.
The library's launches use programmatic dependent launch and the probe's do not, which favours the library.
"""

import sys

import torch
import triton
import triton.language as tl

from qwen_lab.kernels.rope import _rotary_lanes, _rotation

from probe_ab import probe_args


@triton.jit
def _norm_rope_tokens(x_ptr, w_ptr, inv_freq_ptr, offs_t, pos, T, H, stride_xt, stride_xh, eps,
                      D: tl.constexpr, HALF: tl.constexpr, HP: tl.constexpr, BLOCK_D: tl.constexpr):
    """rope(rms_norm(x)) of tokens offs_t (every head), as rope._norm_rope_rows computes one token's:
    -> (y [BLOCK_T, HP, BLOCK_D] in fp32, head offsets, dim offsets, mask)."""
    offs_h = tl.arange(0, HP)
    offs_d, is_first, is_rot, partner, inv_freq = _rotary_lanes(inv_freq_ptr, HALF, BLOCK_D)
    # [BLOCK_T, BLOCK_D]: the angles once per token, shared by its heads
    cos, sin = _rotation(pos.to(tl.float32)[:, None] * inv_freq[None, :], is_first, is_rot)

    mask = (offs_t < T)[:, None, None] & (offs_h < H)[None, :, None] & (offs_d < D)[None, None, :]
    rows = x_ptr + offs_t[:, None, None] * stride_xt + offs_h[None, :, None] * stride_xh
    x = tl.load(rows + offs_d[None, None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(rows + partner[None, None, :], mask=mask & is_rot[None, None, :], other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=2) / D + eps)                   # [BLOCK_T, HP]
    w = tl.load(w_ptr + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=is_rot, other=0.0).to(tl.float32)
    x = (x * rstd[:, :, None] * (1.0 + w[None, None, :])).to(x_ptr.dtype.element_ty).to(tl.float32)
    xp = (xp * rstd[:, :, None] * (1.0 + wp[None, None, :])).to(x_ptr.dtype.element_ty).to(tl.float32)
    y = x * cos[:, None, :] + xp * sin[:, None, :]
    return y, offs_h, offs_d, mask


@triton.jit
def qk_norm_rope_cache_tokens_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
                                     pos_ptr, inv_freq_ptr, T, Hq, Hk, L, eps,
                                     stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                                     stride_qot, stride_qoh, stride_kct, stride_kch, stride_vct, stride_vch,
                                     D: tl.constexpr, HALF: tl.constexpr, HQ_P: tl.constexpr, HK_P: tl.constexpr,
                                     BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    pos = tl.load(pos_ptr + offs_t, mask=offs_t < T, other=0)
    # (the two branches' tiles have different head counts, so their names differ: a compiled `if` joins the
    # values of the names both branches assign)
    if tl.program_id(1) == 0:
        qy, qh, qd, q_mask = _norm_rope_tokens(q_ptr, qw_ptr, inv_freq_ptr, offs_t, pos, T, Hq, stride_qt,
                                               stride_qh, eps, D, HALF, HQ_P, BLOCK_D)
        tl.store(q_out_ptr + offs_t[:, None, None] * stride_qot + qh[None, :, None] * stride_qoh
                 + qd[None, None, :], qy.to(q_out_ptr.dtype.element_ty), mask=q_mask)
    else:
        ky, kh, kd, k_mask = _norm_rope_tokens(k_ptr, kw_ptr, inv_freq_ptr, offs_t, pos, T, Hk, stride_kt,
                                               stride_kh, eps, D, HALF, HK_P, BLOCK_D)
        k_mask = k_mask & ((pos >= 0) & (pos < L))[:, None, None]   # a position outside the cache writes nothing
        k_new = ky.to(k_ptr.dtype.element_ty).to(k_cache_ptr.dtype.element_ty)
        tl.store(k_cache_ptr + pos[:, None, None] * stride_kct + kh[None, :, None] * stride_kch
                 + kd[None, None, :], k_new, mask=k_mask)
        v = tl.load(v_ptr + offs_t[:, None, None] * stride_vt + kh[None, :, None] * stride_vh
                    + kd[None, None, :], mask=k_mask)
        tl.store(v_cache_ptr + pos[:, None, None] * stride_vct + kh[None, :, None] * stride_vch
                 + kd[None, None, :], v.to(v_cache_ptr.dtype.element_ty), mask=k_mask)


def tokens_call(q, k, v, q_weight, k_weight, eps, positions, rotary_dim, theta, k_cache, v_cache, out,
                block_t: int, num_warps: int = 4):
    """qk_norm_rope_cache in the tokens form (the library's arguments, `out` required) -> out."""
    from qwen_lab.kernels import rope

    T, Hq, D = q.shape
    Hk, L = k.shape[1], k_cache.shape[0]
    inv_freq = rope.inv_freq_table(rotary_dim, theta, q.device)
    qk_norm_rope_cache_tokens_kernel[(triton.cdiv(T, block_t), 2)](
        q, k, v, q_weight, k_weight, out, k_cache, v_cache, positions, inv_freq, T, Hq, Hk, L, float(eps),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), D=D, HALF=rotary_dim // 2,
        HQ_P=triton.next_power_of_2(Hq), HK_P=triton.next_power_of_2(Hk), BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_T=block_t, num_warps=num_warps)
    return out


def main() -> int:
    args = probe_args(__doc__, model=False)
    if args is None:
        return 0
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import graph_time_us, rope

    T, Hq, Hk, D = args.tokens, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qd, kvd = cfg.attn_q_dim, cfg.attn_kv_dim
    gen = torch.Generator(device="cuda").manual_seed(0)
    proj = torch.randn(T, qd + 2 * kvd, device="cuda", generator=gen).bfloat16()
    q = proj[:, :qd].unflatten(1, (Hq, 2 * D))[..., :D]
    k = proj[:, qd:qd + kvd].unflatten(1, (Hk, D))
    v = proj[:, qd + kvd:].unflatten(1, (Hk, D))
    qw, kw = (torch.randn(D, device="cuda", generator=gen) * 0.1).bfloat16(), \
        (torch.randn(D, device="cuda", generator=gen) * 0.1).bfloat16()
    L = T + 128
    caches = torch.zeros(2, 2, L, Hk, D, device="cuda", dtype=torch.bfloat16)  # [k|v, layers, L, Hk, D]
    pos = torch.arange(T, device="cuda")
    moved = (2 * q.numel() + 4 * k.numel()) * 2
    print(f"T={T} Hq={Hq} Hk={Hk} D={D} rotary {cfg.rotary_dim}: {moved / 1e6:.1f} MB moved, "
          f"{moved / 4.0e12 * 1e6:.1f} us at 4 TB/s; us per call, 20 calls in a graph")
    args_common = (q, k, v, qw, kw, cfg.rms_norm_eps, pos, cfg.rotary_dim, cfg.rope_theta)
    lib_out = torch.empty(T, Hq, D, device="cuda", dtype=torch.bfloat16)

    def library():
        rope.qk_norm_rope_cache(*args_common, caches[0, 1], caches[1, 1], out=lib_out)
    library()
    want_q, want_k, want_v = lib_out.clone(), caches[0, 1].clone(), caches[1, 1].clone()
    print(f"{'library (token, 8 heads) x 4 warps':44s} {graph_time_us([library] * 20):7.2f}")
    # (compiled offline for sm_90, these need 64-156 registers and spill nothing; 4 tokens with 8 warps, 8 with 8
    # and 16 with 8 spilled 16-36 bytes and were left out)
    for block_t, warps in [(1, 2), (1, 4), (2, 4), (4, 4), (2, 8), (8, 16)]:
        out = torch.empty_like(lib_out)
        caches.zero_()

        def tokens(block_t=block_t, warps=warps, out=out):
            tokens_call(*args_common, caches[0, 1], caches[1, 1], out, block_t, warps)
        try:
            tokens()
            torch.cuda.synchronize()
            err = max((out.float() - want_q.float()).abs().max().item(),
                      (caches[0, 1].float() - want_k.float()).abs().max().item(),
                      (caches[1, 1].float() - want_v.float()).abs().max().item())
            us = graph_time_us([tokens] * 20)
            print(f"{f'tokens {block_t} x {warps} warps':44s} {us:7.2f}   max diff from the library {err:.3g}",
                  flush=True)
        except Exception as e:  # a tile the compiler refuses: say so, go on
            print(f"tokens {block_t} x {warps} warps: {type(e).__name__}: {str(e)[:120]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
