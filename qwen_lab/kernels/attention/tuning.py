"""The attention kernels' launch configurations.

The prefill autotuner's candidate tiles (`_PREFILL_CONFIGS`, their TMA twins, the small tiles of GPUs with little
shared memory) and the rule that prunes them per GPU; the decode split kernel's candidates; the fixed
configurations of the interpreter; the split count's bounds. `_tuned` holds the autotuners once built
(prefill._prefill_kernel, decode._decode_kernel).
"""

from __future__ import annotations

import triton

from .. import max_shared_memory


# GPU: head_dim 256 in one tile. A [BLOCK_M, 256] bf16 q tile and, per pipeline stage, one [BLOCK_N, 256]
# K and V block live in shared memory (32 + 2 x 32 KB per stage at 64/64: 160 KB with two stages, under the
# H200's 227 KB); the fp32 accumulator [BLOCK_M, 256] lives in registers, hence 8 warps for 128 rows.
# Compiled for sm_90 these configs use 212-255 registers per thread; the 4-warp 64 x 64 tile spills 64-72 bytes
# (docs/experiments.md, 2026-12-01).
_PREFILL_CONFIGS = [
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=2),
]
# GPUs with less shared memory per program (a T4: 64 KB; an L4 or an RTX 30/40: 99 KB) than most of the tiles
# above need (compiled for a T4, sm_75, they take 96-192 KB; tests/test_sm90_compile.py): one-stage tiles of 32
# query rows, 64 and 48 KB there. Offered to the autotuner only on such GPUs (SMALL_SHARED_MEMORY); on the others
# it would compile and time them for nothing.
_SMALL_SMEM_PREFILL_CONFIGS = [
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=1),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1),
]
SMALL_SHARED_MEMORY = 128 * 1024
# The least shared memory any of the other prefill tiles needs per program (64 x 32 keys, 3 stages: 96 KB compiled
# for sm_75, 128 KB for sm_90; the rest 128-192 KB): below it only the small tiles are offered
LARGE_TILE_SHARED_MEMORY = 96 * 1024
# The same tiles with K and V fetched by the TMA unit through host tensor descriptors (sm_90+, a cache whose heads
# sit side by side in 16-byte-aligned rows, D a power of two). Timed by the autotuner only where
# QWEN_LAB_ATTN_TMA=1 asks for them: on the H200 they measured level with the pointer loads (docs/experiments.md,
# 2026-12-02), so the default leaves them out of the tuning.
_PREFILL_TMA_CONFIGS = [triton.Config(dict(c.kwargs, TMA=True), num_warps=c.num_warps, num_stages=c.num_stages)
                        for c in _PREFILL_CONFIGS]
_DECODE_CONFIGS = [
    triton.Config({"BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_N": 64}, num_warps=8, num_stages=3),
]
_tuned: dict = {}


def _prune_prefill_configs(configs, named_args, **kwargs):
    """The TMA configurations only for calls that allow them (TMA_OK); the small tiles only on a GPU with less than
    SMALL_SHARED_MEMORY per program, and they alone on one with less than LARGE_TILE_SHARED_MEMORY (a T4), where
    no other tile fits and each would only cost its compile (9-56 s apiece for sm_75 on a 2-core CPU)."""
    room = max_shared_memory(named_args["q_ptr"].device)
    if room < LARGE_TILE_SHARED_MEMORY:
        return list(_SMALL_SMEM_PREFILL_CONFIGS)
    small = room < SMALL_SHARED_MEMORY
    return [c for c in configs if (kwargs.get("TMA_OK", False) or not c.kwargs.get("TMA", False))
            and (small or not any(c is s for s in _SMALL_SMEM_PREFILL_CONFIGS))]


# the interpreter runs each program in NumPy: one small fixed config
_INTERP_PREFILL = dict(BLOCK_M=32, BLOCK_N=32)
_INTERP_DECODE_BLOCK_N = 16
_DECODE_BLOCK_N = 64  # the chunk granularity used to choose the number of splits on the GPU
MAX_SPLITS = 64


# The family's switches live in qwen_lab.switches: `gate_apart_from_tokens` (from this many query tokens the gate
# runs as a pass of its own: every program of the flash kernel holds a whole SM, so the gate's loads in its epilogue
# leave the SM idle), `decode_prefetch` (the split kernel asks L2 for its keys and values before its PDL wait; not
# part of the autotuning key, so the config timed with it serves the kernel without it and the two give the same
# bits) and a config forced on `flash_attention_kernel`. What each measured: docs/experiments.md.
