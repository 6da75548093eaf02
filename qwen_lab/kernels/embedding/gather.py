"""Token embedding, the fast form: a gather of rows of the embedding table.

    out[t, :] = weight[ids[t], :]        ids [T] (int32 or int64), weight [V, H] -> out [T, H]

No arithmetic at all: the kernel moves bytes. Each program copies a tile of BLOCK_T tokens x
BLOCK_H columns. The token ids are read *inside* the kernel from device memory, so the launcher never
synchronises with the GPU and a CUDA Graph can replay it with new ids written into the same buffer.

An id outside [0, V) must never make the kernel read outside the table: the row address is computed
from row 0 in place of the bad id and the load is masked off, so such a row of `out` is written as zeros. The model
checks ids on the host before it calls this kernel; the zeros are a safety net, not a feature.

Memory traffic: T * H * 2 elements (read a row, write a row) plus T ids: a pure bandwidth kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...errors import KernelError
from ...runtime import interpreter_active
from .. import pdl_options


@triton.jit
def embedding_kernel(ids_ptr, weight_ptr, out_ptr,
                     T, V, H,
                     stride_ids, stride_w, stride_out,
                     BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)          # token positions of this tile
    cols = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)          # hidden columns of this tile
    row_ok = rows < T
    col_ok = cols < H
    # The ids live in device memory: one small vector load per tile, no host round trip.
    ids = tl.load(ids_ptr + rows * stride_ids, mask=row_ok, other=0).to(tl.int64)
    id_ok = row_ok & (ids >= 0) & (ids < V)
    # A bad id is replaced by row 0 for the address *and* masked off, so no lane ever touches
    # memory outside the table; `other=0` then fills that row of the tile with zeros.
    safe = tl.where(id_ok, ids, 0)
    # int64 offsets: V * H is 254 million elements for Qwen3.5-0.8B, close enough to 2^31 that
    # larger vocabularies or widths would overflow int32 arithmetic.
    src = weight_ptr + safe[:, None] * stride_w + cols[None, :]
    vals = tl.load(src, mask=id_ok[:, None] & col_ok[None, :], other=0.0)
    dst = out_ptr + rows[:, None].to(tl.int64) * stride_out + cols[None, :]
    tl.store(dst, vals, mask=row_ok[:, None] & col_ok[None, :])


def _blocks(T: int, H: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_H, num_warps). One small fixed tile under the interpreter (every program costs
    time there); on a GPU ~2K elements per program, enough to keep the copy bandwidth-bound."""
    if interpreter_active():
        return 16, min(64, triton.next_power_of_2(H)), 1
    block_h = min(1024, triton.next_power_of_2(H))
    block_t = max(1, min(2048 // block_h, triton.next_power_of_2(T)))
    return block_t, block_h, 4


def embedding(ids: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = weight[ids[t]]. ids [T] int32/int64 on weight's device, weight [V, H] -> [T, H] in weight's dtype.

    `ids` may be any shape if contiguous (the result is ids.shape + (H,)); a 1-D `ids` may be strided.
    An id outside [0, V) is not an error here (checking it would need a host synchronisation): its
    output row is written as zeros and the table is never read out of bounds. Validate ids on the host
    before calling when they come from outside.
    `out`: optional preallocated result (same shape and dtype, last dim contiguous), returned.
    """
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
        raise KernelError(f"embedding: ids must be an int32 or int64 tensor, got "
                          f"{getattr(ids, 'dtype', type(ids).__name__)}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise KernelError(f"embedding: weight must be a 2-D tensor [V, H], got shape "
                          f"{tuple(getattr(weight, 'shape', ()))}")
    if weight.stride(1) != 1:
        raise KernelError(f"embedding: weight's last dim must be contiguous (stride 1), got strides {weight.stride()}")
    if ids.device != weight.device:
        raise KernelError(f"embedding: ids are on {ids.device} but weight is on {weight.device}")
    V, H = weight.shape
    out_shape = tuple(ids.shape) + (H,)
    if ids.dim() == 1:
        flat_ids = ids
    elif ids.is_contiguous():
        flat_ids = ids.view(-1)
    else:
        raise KernelError(f"embedding: ids with {ids.dim()} dims must be contiguous (got strides {ids.stride()}); "
                          f"a 1-D ids may be strided")
    T = flat_ids.numel()
    if out is None:
        out = torch.empty(out_shape, device=weight.device, dtype=weight.dtype)
    else:
        if tuple(out.shape) != out_shape or out.dtype != weight.dtype or out.device != weight.device:
            raise KernelError(f"embedding: out must be {out_shape} {weight.dtype} on {weight.device}, got "
                              f"{tuple(out.shape)} {out.dtype} on {out.device}")
        if H > 1 and out.stride(-1) != 1:
            raise KernelError(f"embedding: out's last dim must be contiguous, got strides {out.stride()}")
        if out.dim() > 2 and not out.is_contiguous():
            raise KernelError("embedding: an out with more than 2 dims must be contiguous")
    if T == 0 or H == 0:
        return out
    out2d = out.view(T, H) if out.dim() != 2 else out
    block_t, block_h, warps = _blocks(T, H)
    grid = (triton.cdiv(T, block_t), triton.cdiv(H, block_h))
    embedding_kernel[grid](flat_ids, weight, out2d, T, V, H,
                           flat_ids.stride(0) if T > 1 else 1, weight.stride(0), out2d.stride(0),
                           BLOCK_T=block_t, BLOCK_H=block_h, num_warps=warps, **pdl_options(weight.device))
    return out


__all__ = ["embedding", "embedding_kernel"]
