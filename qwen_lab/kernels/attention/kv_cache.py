"""The KV-cache write of a prompt or a decode token: k_cache[positions[t]] = k[t], v_cache[positions[t]] = v[t].

caches [L, Hkv, D]; k, v [T, Hkv, D] (strided views of the fused projection allowed); positions [T] int on the
device, read inside the kernel (a captured graph replays at any position). One program per token; a position
outside [0, L) writes nothing. The model's prefill folds this write into rope.qk_norm_rope_cache and its decode
into the split kernel (norm_rope_decode.py); this kernel serves the unfused route.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...errors import KernelError
from .. import pdl_options
from .validate import _check_3d, _check_like, _check_positions


@triton.jit
def kv_cache_write_kernel(k_cache_ptr, v_cache_ptr, k_ptr, v_ptr, pos_ptr, L, H,
                          stride_kct, stride_kch, stride_vct, stride_vch,
                          stride_kt, stride_kh, stride_vt, stride_vh,
                          D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    # one program per token: its K and V rows go to cache row positions[t] (read on the device)
    t = tl.program_id(0)
    pos = tl.load(pos_ptr + t)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    # a position outside the cache writes nothing rather than corrupting memory
    ok = (pos >= 0) & (pos < L)
    mask = (offs_h < H)[:, None] & (offs_d < D)[None, :] & ok
    src = offs_h[:, None] * stride_kh + offs_d[None, :]
    k = tl.load(k_ptr + t * stride_kt + src, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(k_cache_ptr + pos * stride_kct + offs_h[:, None] * stride_kch + offs_d[None, :],
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + pos * stride_vct + offs_h[:, None] * stride_vch + offs_d[None, :],
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- launcher


def kv_cache_write(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   positions: torch.Tensor) -> None:
    """In place: k_cache[positions] = k, v_cache[positions] = v; = reference.kv_cache_write.

    caches [L, Hkv, D]; k, v [T, Hkv, D] (strided views allowed); positions [T] on the device. A position
    outside [0, L) is skipped (no host check can see it without a synchronisation).
    """
    _check_3d("k_cache", k_cache, "[L, Hkv, D]")
    _check_like("v_cache", v_cache, k_cache.shape, k_cache.dtype, k_cache.device)
    _check_3d("k", k, "[T, Hkv, D]")
    T = k.shape[0]
    if tuple(k.shape[1:]) != tuple(k_cache.shape[1:]) or k.device != k_cache.device:
        raise KernelError(f"k: expected [T, {k_cache.shape[1]}, {k_cache.shape[2]}] on {k_cache.device}, "
                          f"got {tuple(k.shape)} on {k.device}")
    _check_like("v", v, k.shape, None, k.device)
    _check_positions(positions, T, k.device)
    if T == 0:
        return None
    L, H, D = k_cache.shape
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_H = triton.next_power_of_2(H)
    kv_cache_write_kernel[(T,)](k_cache, v_cache, k, v, positions, L, H,
                                k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
                                k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                                D=D, BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D, num_warps=4, **pdl_options(k.device))
    return None
