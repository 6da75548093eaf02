"""The work items of the persistent decode step: one device function per item kind (decode.py dispatches to them).

Every item reads its inputs from global memory and writes its outputs there; the counters (decode.py) order the
items. Activations are stored in the model dtype DT (bf16 on a GPU, fp32 under the interpreter) exactly where the
fast plan (qwen_lab.plan) stores them, and every sum is fp32, so the step rounds where the plan rounds.

    EMBED          x = embed[token]                                                    x [H]
    NORM           h = rmsnorm(x) * (1 + w)                                            h [H]
    GEMV           out[r0:r0+n] = W[r0:r0+n] @ in                                      a tile of rows of one projection
    GEMV_ADD       x[r0:r0+n] += W[r0:r0+n] @ in         (the residual add: a tile owns its rows of x)
    GEMV_SWIGLU    x[r0:r0+n] += W[r0:r0+n] @ (silu(gu[:I]) * gu[I:])                   the MLP's down projection
    GEMV_ARGMAX    logits[r0:r0+n] = W[r0:r0+n] @ h, and the tile's (max, first argmax)   the LM head
    GEMV_NORM, GEMV_NORM_ARGMAX   as GEMV and GEMV_ARGMAX, with h = rmsnorm(x) (1 + w) computed in the tile
    GEMV_CONV, GEMV_NORM_CONV     as GEMV and GEMV_NORM, then the causal conv + SiLU of the tile's q/k/v rows
                   (a channel's conv reads only that channel: its conv state shifted in place, the result stored)
    GEMV_ADD_GATED as GEMV_ADD, the input being the gated RMSNorm of o * silu(z) (DeltaNet's out_proj), its rms
                   from the column splits' sums of squares
    DELTANET       per key head: causal conv + SiLU of its q/k/v channels (state shifted in place), the gates,
                   one delta-rule step per value head (state [Dk, Dv] fp32 in place), gated RMSNorm * silu(z)
    DELTANET_COLS  per (key head, column split): DELTANET's step on its columns of the state, the conv done by
                   GEMV_CONV, the gated norm left to GEMV_ADD_GATED (this split's sum of squares stored for it)
    ATTN_PREP      per KV head: q/k RMSNorm + RoPE; k, v into cache row pos; the G prepared query rows to q
    ATTN_SPLIT     per (KV head, split): online softmax of its G query rows over one chunk of the keys
    ATTN_COMBINE   per query head: merge the splits' partials, times sigmoid(gate)
    ARGMAX         the greedy token from the LM head tiles' partials; token, position and epoch advanced

The math is the existing kernels': the conv and delta-rule step of deltanet/recurrent.py, rope's _norm_rope_rows,
attention's _decode_chunk and _flash_step (called here as they are), the combine of attention/decode.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..attention.decode import _combine_splits, _decode_chunk, _prep_split
from ..attention.flash import _flash_step
from ..deltanet.gates import _softplus


@triton.jit
def _slot(table_ptr, slot, ty: tl.constexpr):
    """The pointer held in entry `slot` of the pointer table (int64 addresses), typed as *ty. The schedule holds only
    16-byte aligned addresses and says so here: a pointer read from memory carries no alignment the compiler can
    see, and without it the weights would load 2 bytes at a time. (The hint goes on the op that makes the pointer:
    on a function's argument it is lost.)"""
    return tl.multiple_of(tl.load(table_ptr + slot).to(tl.pointer_type(ty), bitcast=True), 16)


@triton.jit
def _globaltimer():
    """The GPU's global timer in ns (one clock for every SM, so items of different programs line up)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _load_acquire(ptrs):
    """ld.acquire.gpu of each pointer (the loads that follow it in its thread see what the matching release
    published)."""
    return tl.inline_asm_elementwise("ld.global.gpu.acquire.b32 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def wait_counter(counters_ptr, wc, target, spin_limit, BARRIER: tl.constexpr = True, POLL_THREADS: tl.constexpr = 0):
    """Wait until counters[wc] >= target: a bounded spin of volatile polls, then one acquire read, whose value is
    returned (below target: the spin ran out). The acquire is one read for the program, shared with all its threads
    (each polled on its own and may have left the loop at another count), so they all take the same branch after
    it; the barrier makes what it acquired visible to every thread before any of them reads an input. (Its value
    is used: an atomic whose result is unused is dropped by the compiler.) BARRIER=False inside a loop that Triton
    pipelines (an explicit barrier there stops the pipelining): the read's value reaches the other threads through
    shared memory across a barrier of its own (one thread reads, sm_90 PTX), which orders their loads after it.
    POLL_THREADS (the program's thread count; a GPU only): every poll is an acquire load by each thread, and the
    loop ends on the least count any thread saw (a reduction: one decision for all threads), so no read is left to
    do once the counter is met: a round trip fewer between the producer's bump and the consumer's first load."""
    if POLL_THREADS > 0:
        ptrs = counters_ptr + wc + tl.zeros([POLL_THREADS], tl.int32)
        seen_all = _load_acquire(ptrs)
        polls = 0
        while (tl.min(seen_all, 0) < target) & (polls < spin_limit):
            seen_all = _load_acquire(ptrs)
            polls += 1
        seen = tl.min(seen_all, 0)
    else:
        seen = tl.load(counters_ptr + wc, volatile=True)
        polls = 0
        while (seen < target) & (polls < spin_limit):
            seen = tl.load(counters_ptr + wc, volatile=True)
            polls += 1
        seen = tl.atomic_add(counters_ptr + wc, 0, sem="acquire", scope="gpu")
        if BARRIER:
            tl.debug_barrier()
    return seen


@triton.jit
def embed_item(emb_ptr, token_ptr, x_ptr, H: tl.constexpr, BLOCK: tl.constexpr):
    tok = tl.load(token_ptr).to(tl.int64)
    for k0 in range(0, H, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        m = offs < H
        tl.store(x_ptr + offs, tl.load(emb_ptr + tok * H + offs, mask=m), mask=m)


@triton.jit
def _rstd(x_ptr, H, eps, BLOCK: tl.constexpr):
    """rsqrt(mean(x^2) + eps) of x [H], fp32: the NORM item and the GEMV_NORM tiles share it, so the two forms of
    the step round alike."""
    ss = tl.zeros([BLOCK], tl.float32)
    for k0 in range(0, H, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < H, other=0.0).to(tl.float32)
        ss += x * x
    return tl.rsqrt(tl.sum(ss, 0) / H + eps)


@triton.jit
def norm_item(x_ptr, w_ptr, h_ptr, eps, H: tl.constexpr, BLOCK: tl.constexpr):
    """h = x * rsqrt(mean(x^2) + eps) * (1 + w), fp32 math, stored in x's dtype (two passes over the row)."""
    rstd = _rstd(x_ptr, H, eps, BLOCK)
    for k0 in range(0, H, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        m = offs < H
        x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(h_ptr + offs, (x * rstd * (1.0 + w)).to(h_ptr.dtype.element_ty), mask=m)


@triton.jit
def _weight_block(w_ptr, r, end, K, k0, offs_n, offs_k):
    """W[r + offs_n, k0 + offs_k] (W [N, K] row-major), zeros past row `end` or column K."""
    rows = r + offs_n
    ks = k0 + offs_k
    mask = (rows < end)[:, None] & (ks < K)[None, :]
    return tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :], mask=mask, other=0.0)


@triton.jit
def _gemv_input(in_ptr, nw_ptr, z_ptr, ss_ptr, ks, K, rstd, eps, MODE: tl.constexpr, DT: tl.constexpr,
                DV: tl.constexpr, DN_SPLIT: tl.constexpr):
    """The GEMV's input at ks in fp32, rounded to DT where the plan stores it: silu(g) * u for MODE 2, the
    normed x for MODE 4, 5 and 7, the gated norm of o for MODE 8 (o * rsqrt(ss / DV + eps) * w * silu(z), ss the
    sum of its head's column splits' sums of squares, added in order as DELTANET adds its blocks'), x itself
    otherwise."""
    k_ok = ks < K
    if MODE == 2:
        g = tl.load(in_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        u = tl.load(in_ptr + K + ks, mask=k_ok, other=0.0).to(tl.float32)
        x = (g * tl.sigmoid(g) * u).to(DT).to(tl.float32)
    elif MODE == 8:
        o = tl.load(in_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        head = ks // DV
        z = tl.load(z_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        nw = tl.load(nw_ptr + ks - head * DV, mask=k_ok, other=0.0).to(tl.float32)
        ss = tl.zeros_like(o)
        for part in tl.static_range(DN_SPLIT):
            ss += tl.load(ss_ptr + head * DN_SPLIT + part, mask=k_ok, other=0.0)
        x = (o * tl.rsqrt(ss / DV + eps) * nw * (z * tl.sigmoid(z))).to(DT).to(tl.float32)
    elif MODE == 4 or MODE == 5 or MODE == 7:
        x = tl.load(in_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        nw = tl.load(nw_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        x = (x * rstd * (1.0 + nw)).to(DT).to(tl.float32)
    else:
        x = tl.load(in_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
    return x


@triton.jit
def _gemv_rows_out(out_ptr, rows, end, acc, best_v, best_i, ADD: tl.constexpr, ARGMAX: tl.constexpr,
                   DT: tl.constexpr):
    """Store a row block's sums (rounded to DT; added to out, rounded again, with ADD); with ARGMAX, fold its
    (max, first index of the max) into (best_v, best_i)."""
    r_ok = rows < end
    y = acc.to(DT)
    if ADD:   # x + y, y rounded first: the plan's GEMV output, then its residual add
        old = tl.load(out_ptr + rows, mask=r_ok, other=0.0).to(tl.float32)
        y = (old + y.to(tl.float32)).to(DT)
    tl.store(out_ptr + rows, y, mask=r_ok)
    if ARGMAX:
        v = tl.where(r_ok, y.to(tl.float32), float("-inf"))
        m = tl.max(v, 0)
        i = tl.min(tl.where(v == m, rows, end), 0)
        better = m > best_v          # strictly: an earlier block keeps a tie (the first index wins)
        best_i = tl.where(better, i, best_i)
        best_v = tl.where(better, m, best_v)
    return best_v, best_i


@triton.jit
def _conv_tile(out_ptr, cw_ptr, cs_ptr, row0, end, CONV_DIM: tl.constexpr, CW: tl.constexpr, BW: tl.constexpr,
               BLOCK: tl.constexpr):
    """The causal conv + SiLU of a tile's rows below CONV_DIM (the q/k/v channels of a DeltaNet in-projection),
    in place in out, as DELTANET's conv computes it (the conv weight [CONV_DIM, CW] column-major). Done once after
    the tile's GEMV loop, BLOCK rows at a time, instead of after each row block: a row block's conv waits on its
    state and weight loads, which inside the loop stalled every iteration."""
    tl.debug_barrier()   # every thread's stores of the tile's sums before they are read back by other threads
    for r in range(row0, tl.minimum(end, CONV_DIM), BLOCK):
        rows = r + tl.arange(0, BLOCK)
        c_ok = (rows < end) & (rows < CONV_DIM)
        y, shifted = _conv_silu(out_ptr, cw_ptr, cs_ptr, rows, c_ok, 1, CONV_DIM, CW, BW)
        tl.debug_barrier()   # every thread's loads of the conv state (and of out) before a row is stored
        _conv_shift(cs_ptr, rows, c_ok, shifted, CW, BW)
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=c_ok)


@triton.jit
def _pair_block(w_ptr, row0, end, K, it, total, n_k, offs_n, offs_k, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The weight block of pair `it` of a tile's (row block, K block) pairs, walked row block by row block; zeros
    (nothing read) once `it` is past the last pair."""
    return _weight_block(w_ptr, row0 + (it // n_k) * BLOCK_N, tl.where(it < total, end, 0), K,
                         (it % n_k) * BLOCK_K, offs_n, offs_k)


@triton.jit
def _pair_sum(w, it, acc, best_v, best_i, x_first, in_ptr, nw_ptr, z_ptr, ss_ptr, out_ptr, row0, end, K, n_k, rstd,
              eps, offs_n, offs_k, MODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              ADD: tl.constexpr, ARGMAX: tl.constexpr, DT: tl.constexpr, DV: tl.constexpr, DN_SPLIT: tl.constexpr):
    """Pair `it`'s share of a GEMV tile: its input times its weight block `w` into acc; at its row block's last K
    block, the rows out (nothing past `end`) and acc cleared."""
    r = row0 + (it // n_k) * BLOCK_N
    k0 = (it % n_k) * BLOCK_K
    x = x_first
    if n_k > 1:
        x = _gemv_input(in_ptr, nw_ptr, z_ptr, ss_ptr, k0 + offs_k, K, rstd, eps, MODE, DT, DV, DN_SPLIT)
    acc += tl.sum(w.to(tl.float32) * x[None, :], 1)
    if k0 + BLOCK_K >= K:
        best_v, best_i = _gemv_rows_out(out_ptr, r + offs_n, end, acc, best_v, best_i, ADD, ARGMAX, DT)
        acc = tl.zeros([BLOCK_N], tl.float32)
    return acc, best_v, best_i


@triton.jit
def gemv_item(w_ptr, in_ptr, out_ptr, row0, nrows, K, tile, best_val_ptr, best_idx_ptr, nw_ptr, eps, table_ptr,
              proj_ptr, ss_ptr, MODE: tl.constexpr, GEMV_N: tl.constexpr, GEMV_K: tl.constexpr,
              ALIGNED: tl.constexpr, NORM_BLOCK: tl.constexpr, CONV_DIM: tl.constexpr, CW: tl.constexpr,
              BW: tl.constexpr, DV: tl.constexpr, DN_SPLIT: tl.constexpr, AHEAD: tl.constexpr = False,
              STAGES: tl.constexpr = 0, ADD_N: tl.constexpr = 0, ADD_K: tl.constexpr = 0,
              LATE: tl.constexpr = False, EARLY: tl.constexpr = False, counters_ptr=None, wc=-1, target=0,
              spin_limit=0, TRACE: tl.constexpr = False, POLL_THREADS: tl.constexpr = 0):
    """Rows row0 .. row0 + nrows - 1 of out = W @ in (W [N, K] row-major), BLOCK_N rows at a time: blocks of
    GEMV_N x GEMV_K, or ADD_N x ADD_K in the forms that add into out (when given: their tiles are a few rows).
    MODE (the item kind less GEMV): 0 store; 1 add into out (the residual stream); 2 the input is
    silu(gu[:K]) * gu[K:] (rounded to DT, as silu_mul stores it), added into out; 3 store, and the tile's (max,
    first index of the max) to slot `tile`; 4 and 5: as 0 and 3, the input being rmsnorm(x) * (1 + nw) computed
    here (x = in, K = H), rounded to DT where the NORM item stores it; 6 and 7: as 0 and 4, then the causal conv
    of the rows below CONV_DIM (`tile`: the slot of the conv weight, its state the next); 8: as 1, the input being
    the gated RMSNorm of o (in) with z from proj, nw its weight, the rms from ss_ptr's column-split sums.
    ALIGNED: the schedule vouches that every K is a multiple of 16, so the rows' loads can be 16 bytes wide.
    AHEAD: the (row block, K block) pairs are walked as one loop, and the next pair's weight block is loaded before
    this one's sum, so two blocks are on their way from memory at once instead of one (a lone program per SM
    otherwise waits a whole memory latency per block). The same sums in the same order.
    STAGES (2 or more, in place of AHEAD): the pairs walked by one loop that Triton's pipeliner compiles to
    asynchronous copies into shared memory, STAGES - 1 blocks in flight. In AHEAD's loop the compiler issues a
    block's loads only as the previous block's multiplies free the registers they land in (sm_90 SASS), so little
    of a load's time is hidden; a copy into shared memory holds no register, so it stays ahead. The same sums in
    the same order.
    LATE (with STAGES): the input (the norm's rms, the normed x, silu(g) * u, the gated norm of o) is computed in
    the loop's first pass instead of before the loop. The pipeliner issues the first blocks' copies before the
    loop, so they are on their way while the input makes its round trips, instead of after. The same sums.
    EARLY (with LATE and STAGES): the item's wait too (wait_counter on counters[wc] up to target, unless wc < 0) in
    the loop's first pass, before the input: the first blocks' copies then stream while the producers finish (the
    weights are never written, so they need no ordering; POLL_THREADS: wait_counter's). -> (what the wait's acquire
    read saw, the time it was met with TRACE); (target, 0) without EARLY."""
    ADD: tl.constexpr = MODE == 1 or MODE == 2 or MODE == 8
    ARGMAX: tl.constexpr = MODE == 3 or MODE == 5
    NORM: tl.constexpr = MODE == 4 or MODE == 5 or MODE == 7
    CONV: tl.constexpr = MODE == 6 or MODE == 7
    BLOCK_N: tl.constexpr = ADD_N if ADD and ADD_N > 0 else GEMV_N
    BLOCK_K: tl.constexpr = ADD_K if ADD and ADD_N > 0 else GEMV_K
    DT = out_ptr.dtype.element_ty
    cw_ptr = w_ptr   # (read only by the CONV modes)
    cs_ptr = w_ptr
    if CONV:
        cw_ptr = _slot(table_ptr, tile, DT)
        cs_ptr = _slot(table_ptr, tile + 1, DT)
    z_ptr = proj_ptr + CONV_DIM   # z (read by MODE 8): the in-projection's rows after the conv's channels
    if ALIGNED:   # K written as a multiple of 16 for the offsets and masks (tl.multiple_of on a scalar int is lost)
        K = (K // 16) * 16
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    end = row0 + nrows
    n_k = tl.cdiv(K, BLOCK_K)
    total = tl.cdiv(nrows, BLOCK_N) * n_k
    LOOK_AHEAD: tl.constexpr = AHEAD and STAGES < 2
    if LOOK_AHEAD:   # the first block asked for before the norm's sum of squares, which then overlaps it
        w = _pair_block(w_ptr, row0, end, K, 0, total, n_k, offs_n, offs_k, BLOCK_N, BLOCK_K)
    LATE_INPUT: tl.constexpr = (LATE or EARLY) and STAGES > 1
    seen = target
    t_met = tl.zeros([], tl.int64)
    rstd = tl.full([], 1.0, tl.float32)
    x_first = tl.zeros([BLOCK_K], tl.float32)
    if not LATE_INPUT:
        if NORM:
            rstd = _rstd(in_ptr, K, eps, NORM_BLOCK)
        # the input of K block 0: where K fits in one block (the projections of x, the LM head) every row block
        # reads this same input, so it is loaded and normed once here instead of once per row block
        x_first = _gemv_input(in_ptr, nw_ptr, z_ptr, ss_ptr, offs_k, K, rstd, eps, MODE, DT, DV, DN_SPLIT)
    best_v = float("-inf")
    best_i = row0
    if STAGES > 1:
        acc = tl.zeros([BLOCK_N], tl.float32)
        for it in tl.range(0, total, num_stages=STAGES):
            w = _pair_block(w_ptr, row0, end, K, it, total, n_k, offs_n, offs_k, BLOCK_N, BLOCK_K)
            if LATE_INPUT:
                if it == 0:   # (the copies of the first blocks were issued before the loop: in flight meanwhile)
                    if EARLY:
                        if wc >= 0:
                            seen = wait_counter(counters_ptr, wc, target, spin_limit, False, POLL_THREADS)
                            if TRACE:
                                t_met = _globaltimer()
                    if NORM:
                        rstd = _rstd(in_ptr, K, eps, NORM_BLOCK)
                    x_first = _gemv_input(in_ptr, nw_ptr, z_ptr, ss_ptr, offs_k, K, rstd, eps, MODE, DT, DV,
                                          DN_SPLIT)
            acc, best_v, best_i = _pair_sum(w, it, acc, best_v, best_i, x_first, in_ptr, nw_ptr, z_ptr, ss_ptr,
                                            out_ptr, row0, end, K, n_k, rstd, eps, offs_n, offs_k, MODE, BLOCK_N,
                                            BLOCK_K, ADD, ARGMAX, DT, DV, DN_SPLIT)
    elif LOOK_AHEAD:
        acc = tl.zeros([BLOCK_N], tl.float32)
        for it in range(total):
            # the next pair's block, asked for before this one's sum (past the last pair: zeros, never summed)
            w_next = _pair_block(w_ptr, row0, end, K, it + 1, total, n_k, offs_n, offs_k, BLOCK_N, BLOCK_K)
            acc, best_v, best_i = _pair_sum(w, it, acc, best_v, best_i, x_first, in_ptr, nw_ptr, z_ptr, ss_ptr,
                                            out_ptr, row0, end, K, n_k, rstd, eps, offs_n, offs_k, MODE, BLOCK_N,
                                            BLOCK_K, ADD, ARGMAX, DT, DV, DN_SPLIT)
            w = w_next   # the block summed next
    else:
        for r in range(row0, end, BLOCK_N):
            rows = r + offs_n
            acc = tl.zeros([BLOCK_N], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                x = x_first
                if n_k > 1:
                    x = _gemv_input(in_ptr, nw_ptr, z_ptr, ss_ptr, k0 + offs_k, K, rstd, eps, MODE, DT, DV,
                                    DN_SPLIT)
                w = _weight_block(w_ptr, r, end, K, k0, offs_n, offs_k)
                acc += tl.sum(w.to(tl.float32) * x[None, :], 1)
            best_v, best_i = _gemv_rows_out(out_ptr, rows, end, acc, best_v, best_i, ADD, ARGMAX, DT)
    if CONV:
        _conv_tile(out_ptr, cw_ptr, cs_ptr, row0, end, CONV_DIM, CW, BW, 4 * GEMV_N)
    if ARGMAX:
        tl.store(best_val_ptr + tile, best_v)
        tl.store(best_idx_ptr + tile, best_i)
    return seen, t_met


@triton.jit
def argmax_item(best_val_ptr, best_idx_ptr, n_tiles, token_ptr, pos_ptr, epoch_ptr, BLOCK: tl.constexpr):
    """The greedy token (the first index of the largest logit) from the tiles' partials, written as the next step's
    token; the position and the epoch advance. Every other item of the step is an ancestor of this one."""
    best_v = float("-inf")
    best_i = 0
    for t0 in range(0, n_tiles, BLOCK):
        offs = t0 + tl.arange(0, BLOCK)
        v = tl.load(best_val_ptr + offs, mask=offs < n_tiles, other=float("-inf"))
        i = tl.load(best_idx_ptr + offs, mask=offs < n_tiles, other=0)
        m = tl.max(v, 0)
        first = tl.min(tl.where(v == m, i, 2147483647), 0)
        better = m > best_v
        best_i = tl.where(better, first, best_i)
        best_v = tl.where(better, m, best_v)
    tl.store(token_ptr, best_i.to(tl.int64))
    tl.store(pos_ptr, tl.load(pos_ptr) + 1)
    tl.store(epoch_ptr, tl.load(epoch_ptr) + 1)


@triton.jit
def _conv_silu(proj_ptr, cw_ptr, cs_ptr, ch, ch_ok, cw0, cw1, W: tl.constexpr, BW: tl.constexpr):
    """Causal conv + SiLU of channels `ch` for this token (conv_state [C, W-1] holds the last W-1 inputs, oldest
    first), rounded to DT as causal_conv1d stores it. -> (y, the state rows shifted by one): the caller stores
    those with _conv_shift after a barrier (different threads load the same row), so the loads of several calls
    can be in flight at once."""
    x = tl.load(proj_ptr + ch, mask=ch_ok, other=0.0)
    offs_w = tl.arange(0, BW)
    w_ok = offs_w < W - 1
    shift = offs_w + 1 < W - 1
    m2 = ch_ok[:, None] & w_ok[None, :]
    rows = cs_ptr + ch.to(tl.int64)[:, None] * (W - 1)
    old = tl.load(rows + offs_w[None, :], mask=m2, other=0.0)
    nxt = tl.load(rows + 1 + offs_w[None, :], mask=ch_ok[:, None] & shift[None, :], other=0.0)
    w = tl.load(cw_ptr + ch[:, None] * cw0 + offs_w[None, :] * cw1, mask=m2, other=0.0).to(tl.float32)
    w_last = tl.load(cw_ptr + ch * cw0 + (W - 1) * cw1, mask=ch_ok, other=0.0).to(tl.float32)
    y = tl.sum(w * old.to(tl.float32), 1) + w_last * x.to(tl.float32)
    y = (y * tl.sigmoid(y)).to(x.dtype).to(tl.float32)
    return y, tl.where(shift[None, :], nxt, x[:, None].to(nxt.dtype))


@triton.jit
def _conv_shift(cs_ptr, ch, ch_ok, shifted, W: tl.constexpr, BW: tl.constexpr):
    """Store _conv_silu's shifted state rows of channels `ch` in place."""
    offs_w = tl.arange(0, BW)
    m2 = ch_ok[:, None] & (offs_w < W - 1)[None, :]
    tl.store(cs_ptr + ch.to(tl.int64)[:, None] * (W - 1) + offs_w[None, :], shifted, mask=m2)


@triton.jit
def _gate_loads(proj_ptr, A_log_ptr, dt_bias_ptr, hk, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
                DV: tl.constexpr, REP_P: tl.constexpr):
    """The gates' inputs of key head hk's REP value heads (REP_P: REP to a power of two): a and b from the
    in-projection row [q k v | z | b | a], A_log, dt_bias. -> (a, b, A_log, dt_bias, the heads' offsets)"""
    REP: tl.constexpr = HV // HK
    ZB: tl.constexpr = 2 * HK * DK + 2 * HV * DV   # where b starts
    offs_r = tl.arange(0, REP_P)
    r_ok = offs_r < REP
    heads = hk * REP + offs_r
    a_all = tl.load(proj_ptr + ZB + HV + heads, mask=r_ok, other=0.0).to(tl.float32)
    b_all = tl.load(proj_ptr + ZB + heads, mask=r_ok, other=0.0).to(tl.float32)
    A_all = tl.load(A_log_ptr + heads, mask=r_ok, other=0.0).to(tl.float32)
    dtb_all = tl.load(dt_bias_ptr + heads, mask=r_ok, other=0.0)
    return a_all, b_all, A_all, dtb_all, offs_r


@triton.jit
def _gates_and_scales(a_all, b_all, A_all, dtb_all, q, k, scale, l2_eps):
    """The decay and beta of each value head, and the L2 norms of q (times scale) and k as factors, with k.q."""
    d_all = tl.exp(-tl.exp(A_all) * _softplus(a_all + dtb_all))
    beta_all = tl.sigmoid(b_all)
    rq = tl.rsqrt(tl.sum(q * q, 0) + l2_eps) * scale
    rk = tl.rsqrt(tl.sum(k * k, 0) + l2_eps)
    return d_all, beta_all, rq, rk, tl.sum(k * q, 0)


@triton.jit
def _delta_step(S, s_ptrs, s_ok, v, q, k, d, beta, rq, rk, kq, o_ptrs, v_ok, DT: tl.constexpr):
    """conv_decode_step_kernel's delta-rule step on one block of a value head's state, S [DK, N] (from s_ptrs),
    for its columns v: o stored in DT at o_ptrs, the new state in place. -> o in fp32, 0 past the columns (for the
    gated norm's sum of squares)."""
    Sk = tl.sum(S * k[:, None], 0)
    Sq = tl.sum(S * q[:, None], 0)
    delta = (v - d * rk * Sk) * beta
    o = (d * rq * Sq + (rk * rq * kq) * delta).to(DT)
    tl.store(o_ptrs, o, mask=v_ok)
    tl.store(s_ptrs, S * d + (k * rk)[:, None] * delta[None, :], mask=s_ok)
    return tl.where(v_ok, o.to(tl.float32), 0.0)


@triton.jit
def deltanet_item(proj_ptr, cw_ptr, cs_ptr, A_log_ptr, dt_bias_ptr, nw_ptr, state_ptr, o_ptr, hk, cw0, cw1,
                  scale, eps, l2_eps,
                  HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, W: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, BW: tl.constexpr, REP_P: tl.constexpr):
    """Key head hk of one Gated DeltaNet layer: its q/k channels and the v channels of its REP value heads through
    the conv; per value head, the delta-rule step of conv_decode_step_kernel (reassociated the same way) over
    column blocks of BV, o stored in DT; then the gated RMSNorm (plain w) * silu(z) of each head's o row in place.
    The in-projection row `proj` is [q k v (conv input) | z | b | a].
    The loads are grouped so that independent ones are in flight together (a lone program per item: each round
    trip to memory is on the step's critical path): the q and k convs with the gates of every value head, then per
    column block the state block with the v conv."""
    DT = o_ptr.dtype.element_ty
    REP: tl.constexpr = HV // HK
    KEY_DIM: tl.constexpr = HK * DK
    CONV_DIM: tl.constexpr = 2 * HK * DK + HV * DV
    offs_k = tl.arange(0, BK)
    k_ok = offs_k < DK
    # the gates' inputs, with the q and k convs' loads
    a_all, b_all, A_all, dtb_all, offs_r = _gate_loads(proj_ptr, A_log_ptr, dt_bias_ptr, hk, HK, HV, DK, DV, REP_P)
    q, q_shifted = _conv_silu(proj_ptr, cw_ptr, cs_ptr, hk * DK + offs_k, k_ok, cw0, cw1, W, BW)
    k, k_shifted = _conv_silu(proj_ptr, cw_ptr, cs_ptr, KEY_DIM + hk * DK + offs_k, k_ok, cw0, cw1, W, BW)
    d_all, beta_all, rq, rk, kq = _gates_and_scales(a_all, b_all, A_all, dtb_all, q, k, scale, l2_eps)
    tl.debug_barrier()   # every thread's loads of the conv state before a shifted row is stored
    _conv_shift(cs_ptr, hk * DK + offs_k, k_ok, q_shifted, W, BW)
    _conv_shift(cs_ptr, KEY_DIM + hk * DK + offs_k, k_ok, k_shifted, W, BW)
    for r in range(REP):
        h = hk * REP + r
        d = tl.sum(tl.where(offs_r == r, d_all, 0.0), 0)   # value head r's gates (the others are zeros: exact)
        beta = tl.sum(tl.where(offs_r == r, beta_all, 0.0), 0)
        ss = 0.0
        for c0 in range(0, DV, BV):
            offs_v = c0 + tl.arange(0, BV)
            v_ok = offs_v < DV
            s_ptrs = state_ptr + h * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
            s_ok = k_ok[:, None] & v_ok[None, :]
            S = tl.load(s_ptrs, mask=s_ok, other=0.0)   # first: in flight with the v conv's loads
            v, v_shifted = _conv_silu(proj_ptr, cw_ptr, cs_ptr, 2 * KEY_DIM + h * DV + offs_v, v_ok, cw0, cw1, W,
                                      BW)
            o = _delta_step(S, s_ptrs, s_ok, v, q, k, d, beta, rq, rk, kq, o_ptr + h * DV + offs_v, v_ok, DT)
            ss += tl.sum(o * o, 0)
            tl.debug_barrier()   # the v conv state's loads before its shifted rows are stored
            _conv_shift(cs_ptr, 2 * KEY_DIM + h * DV + offs_v, v_ok, v_shifted, W, BW)
        rstd = tl.rsqrt(ss / DV + eps)
        tl.debug_barrier()   # this program's o stores, read back below by other threads
        for c0 in range(0, DV, BV):
            offs_v = c0 + tl.arange(0, BV)
            v_ok = offs_v < DV
            o = tl.load(o_ptr + h * DV + offs_v, mask=v_ok, other=0.0).to(tl.float32)
            z = tl.load(proj_ptr + CONV_DIM + h * DV + offs_v, mask=v_ok, other=0.0).to(tl.float32)
            nw = tl.load(nw_ptr + offs_v, mask=v_ok, other=0.0).to(tl.float32)
            tl.store(o_ptr + h * DV + offs_v, (o * rstd * nw * (z * tl.sigmoid(z))).to(DT), mask=v_ok)


@triton.jit
def deltanet_cols_item(proj_ptr, A_log_ptr, dt_bias_ptr, state_ptr, o_ptr, ss_ptr, hk, part, scale, l2_eps,
                       HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
                       REP_P: tl.constexpr, DN_SPLIT: tl.constexpr, DN_COLS: tl.constexpr, BS: tl.constexpr):
    """Columns part * DN_COLS .. (part + 1) * DN_COLS - 1 of key head hk's value heads: deltanet_item's delta-rule
    step on those columns of each state [DK, DV], q, k and v read already convolved (the GEMV_CONV tiles of the
    in-projection ran the conv), o stored in DT, and the sum of squares of those o columns to ss[h, part] (the
    out_proj tiles finish the gated norm). Every column's math is deltanet_item's: a head split into DN_COLS-wide
    items gives its bits with deltanet_block = DN_COLS."""
    DT = o_ptr.dtype.element_ty
    REP: tl.constexpr = HV // HK
    KEY_DIM: tl.constexpr = HK * DK
    offs_k = tl.arange(0, BK)
    k_ok = offs_k < DK
    a_all, b_all, A_all, dtb_all, offs_r = _gate_loads(proj_ptr, A_log_ptr, dt_bias_ptr, hk, HK, HV, DK, DV, REP_P)
    q = tl.load(proj_ptr + hk * DK + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    k = tl.load(proj_ptr + KEY_DIM + hk * DK + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    d_all, beta_all, rq, rk, kq = _gates_and_scales(a_all, b_all, A_all, dtb_all, q, k, scale, l2_eps)
    c0 = part * DN_COLS
    offs_v = c0 + tl.arange(0, BS)
    v_ok = (offs_v < c0 + DN_COLS) & (offs_v < DV)
    for r in range(REP):
        h = hk * REP + r
        d = tl.sum(tl.where(offs_r == r, d_all, 0.0), 0)
        beta = tl.sum(tl.where(offs_r == r, beta_all, 0.0), 0)
        s_ptrs = state_ptr + h * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
        s_ok = k_ok[:, None] & v_ok[None, :]
        S = tl.load(s_ptrs, mask=s_ok, other=0.0)
        v = tl.load(proj_ptr + 2 * KEY_DIM + h * DV + offs_v, mask=v_ok, other=0.0).to(tl.float32)
        o = _delta_step(S, s_ptrs, s_ok, v, q, k, d, beta, rq, rk, kq, o_ptr + h * DV + offs_v, v_ok, DT)
        tl.store(ss_ptr + h * DN_SPLIT + part, tl.sum(o * o, 0))


@triton.jit
def attn_prep_item(proj_ptr, qw_ptr, kw_ptr, k_cache_ptr, v_cache_ptr, q_ptr, inv_freq_ptr, pos_ptr, g, L, eps,
                   HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                   ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """KV head g: the q/k RMSNorm (1 + w) and RoPE of its G query heads and its key (_prep_split, over all the keys
    [0, L), so the key and the value go to cache row pos wherever pos is inside the cache), the prepared queries to
    q [HQ, D]. proj is [(q_h | gate_h) per head | k | v]."""
    G: tl.constexpr = HQ // HKV
    QD: tl.constexpr = 2 * HQ * D
    q = _prep_split(proj_ptr, 2 * D, proj_ptr + QD, D, proj_ptr + QD + HKV * D, D, qw_ptr, kw_ptr, inv_freq_ptr,
                    k_cache_ptr, v_cache_ptr, HKV * D, D, HKV * D, D, g, tl.load(pos_ptr), 0, L, eps, G, D, HALF,
                    ROWS, BLOCK_D)
    rows = tl.arange(0, ROWS)
    offs_d = tl.arange(0, BLOCK_D)
    tl.store(q_ptr + (g * G + rows)[:, None] * D + offs_d[None, :], q.to(q_ptr.dtype.element_ty),
             mask=(rows < G)[:, None] & (offs_d < D)[None, :])


@triton.jit
def attn_split_item(q_ptr, k_cache_ptr, v_cache_ptr, ws_ptr, pos_ptr, g, split, num_splits, L, qk_scale,
                    proj_ptr, qw_ptr, kw_ptr, inv_freq_ptr, eps,
                    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, ROWS: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
                    PREP: tl.constexpr = False):
    """The partial (acc, m, l) of KV head g's query rows over split `split` of the keys 0 .. pos (attention/decode.py's
    chunking), to ws [num_splits, HQ, D + 2]. PREP: ATTN_PREP's work done here, as the graph decode's split kernel
    does it (_prep_split): the queries normed and rotated from proj, and the split holding key pos writes this
    token's key and value to the cache before its loop reads them."""
    G: tl.constexpr = HQ // HKV
    QD: tl.constexpr = 2 * HQ * D
    rows = tl.arange(0, ROWS)
    row_ok = rows < G
    offs_h = g * G + rows
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)
    start, end = _decode_chunk(pos_ptr, L, split, num_splits, BLOCK_N)
    if PREP:
        q = _prep_split(proj_ptr, 2 * D, proj_ptr + QD, D, proj_ptr + QD + HKV * D, D, qw_ptr, kw_ptr, inv_freq_ptr,
                        k_cache_ptr, v_cache_ptr, HKV * D, D, HKV * D, D, g, tl.load(pos_ptr), start, end, eps, G, D,
                        HALF, ROWS, BLOCK_D)
    else:
        q = tl.load(q_ptr + offs_h[:, None] * D + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    pos_rows = tl.zeros([ROWS], tl.int32) + (end - 1)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    k_rows = k_cache_ptr + g * D + offs_d[None, :]
    v_rows = v_cache_ptr + g * D + offs_d[None, :]
    for s in range(start, end, BLOCK_N):
        acc, m_i, l_i = _flash_step(acc, m_i, l_i, q, k_rows, v_rows, s, pos_rows, L, qk_scale, offs_n, d_ok,
                                    HKV * D, HKV * D, True, DOT_PREC)
    base = ws_ptr + split * (HQ * (D + 2)) + offs_h * (D + 2)
    tl.store(base[:, None] + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
    tl.store(base + D, m_i, mask=row_ok)
    tl.store(base + D + 1, l_i, mask=row_ok)


@triton.jit
def attn_combine_item(ws_ptr, proj_ptr, o_ptr, h, num_splits, HQ: tl.constexpr, D: tl.constexpr,
                      SPLITS_P: tl.constexpr, BLOCK_D: tl.constexpr):
    """Query head h's merge of the splits' partials (attention/decode.py's _combine_splits), rounded to DT, then
    * sigmoid(gate), to o[h] [D]. One item per query head, not per KV head: each is a few independent loads, so the
    G heads of a KV head merge side by side instead of one after another."""
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    gate = tl.load(proj_ptr + h * 2 * D + D + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    o = _combine_splits(ws_ptr, h, HQ * (D + 2), D + 2, num_splits, offs_d, d_ok, D, SPLITS_P)
    o = o.to(o_ptr.dtype.element_ty).to(tl.float32) * tl.sigmoid(gate)
    tl.store(o_ptr + h * D + offs_d, o.to(o_ptr.dtype.element_ty), mask=d_ok)
