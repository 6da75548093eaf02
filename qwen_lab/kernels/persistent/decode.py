"""The persistent decode step: one launch runs a whole token, each program walking its list of work items.

    program p:  epoch = epoch[0]
                for item in items[order[starts[p]:starts[p + 1]]]:
                    wait until counters[item.wait] >= epoch * item.total + item.need   (a bounded spin)
                    do the item (items.py)
                    barrier; counters[item.done] += 1 (release)

The counter protocol (schedule.py builds the items). A counter is never cleared: it gets the same number of bumps
every step (its total), so after `epoch` whole steps it holds epoch * total, and this step's need is counted from
there. The last item (ARGMAX) advances the epoch in device memory, with the token and the position, so the step
needs no reset launch and the next replay of a CUDA Graph finds everything in place. `reset()` zeroes the counters
and the epoch (a new cache, or after an error); 2^31 / (the largest total, ~P) steps fit before an int32 wraps.

Memory ordering. A producer's threads store the item's outputs, meet at a barrier (bar.sync orders every thread's
stores before what follows in the program), and one atomic add with release semantics at GPU scope publishes them:
any program that reads the counter's new value with acquire semantics sees those stores. The consumer spins on a
volatile load (no caching of the counter), then reads the counter once more with an acquire atomic, then meets a
barrier, so all its threads load the inputs after the acquire. Loads of a producer's outputs therefore never see
stale data; the weights, never written, need no ordering. (acquire_poll: every thread polls with acquire loads
instead, and a reduction of what they saw ends the wait for all of them at once.)

Bounded spin: a wait gives up after `spin_limit` polls; the program then writes an error record (item, counter,
the count it waited for, the count it saw) to errors[p] and does nothing more. `PersistentDecode.check()` reads the
records and raises one KernelError naming the items and the counters. (A hang is this design's failure mode: a
schedule whose wait nobody bumps, or a program not resident on the GPU, turns into that error instead.)

How many programs: one per SM on a GPU (they must all be resident at once for the order argument in schedule.py;
one program per SM is what any kernel that launches at all can have). Under the Triton interpreter programs run one
after another, so the step runs as one program walking every item in the schedule's order: the same code, grid (1,).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ...errors import KernelError
from .. import dot_precision
from ..attention.decode import _decode_chunk, _prefetch_rows_l2
from ..attention.flash import LOG2E
from ..deltanet.gates import EPS as L2_EPS
from ..rope import inv_freq_table
from .items import (_globaltimer, _slot, argmax_item, attn_combine_item, attn_prep_item, attn_split_item,
                    deltanet_cols_item, deltanet_item, embed_item, gemv_item, norm_item, wait_counter)
from .schedule import (ARGMAX, ATTN_COMBINE, ATTN_PREP, ATTN_SPLIT, DELTANET, DELTANET_COLS, DN_SS, EMBED, GEMV,
                       GEMV_ADD, GEMV_ADD_GATED, GEMV_CONV, GEMV_KINDS, GEMV_NORM_CONV, GEMV_SWIGLU, ITEM_FIELDS,
                       KIND_NAMES, NORM, Schedule, build_schedule, check_schedule)

# the item kinds as constexprs (a jit function reads no plain global)
K_EMBED, K_NORM, K_GEMV, K_GEMV_ADD, K_GEMV_SWIGLU, K_GEMV_ADD_GATED, K_GEMV_CONV, K_GEMV_NORM_CONV = (
    tl.constexpr(k) for k in (EMBED, NORM, GEMV, GEMV_ADD, GEMV_SWIGLU, GEMV_ADD_GATED, GEMV_CONV, GEMV_NORM_CONV))
N_GEMV_FORMS = tl.constexpr(len(GEMV_KINDS))
K_DELTANET, K_DELTANET_COLS, K_ATTN_PREP, K_ATTN_SPLIT, K_ATTN_COMBINE, K_ARGMAX = (tl.constexpr(k) for k in (
    DELTANET, DELTANET_COLS, ATTN_PREP, ATTN_SPLIT, ATTN_COMBINE, ARGMAX))
K_DN_SS = tl.constexpr(DN_SS)
SPIN_LIMIT_GPU = 1 << 22      # polls of a counter (~1 s on an H100) before a wait is reported as a hang
ERROR_FIELDS = 4              # item + 1 (0: no error), counter, the count waited for, the count seen
# PersistentDecode's defaults: the fastest variant measured (benchmarks/bench_persistent.py on one H100, 2026-12-07:
# 1.148 ms per token with each DeltaNet head's columns over 8 items, 1.202 with one item per head, 0.789 for the graph
# decode in the same process; gemv_ahead applies only with gemv_stages=0)
GPU_DEFAULTS = {"num_warps": 8, "gemv_block": (16, 1024), "prefetch": 64 * 1024, "gemv_ahead": 1,
                "deltanet_block": 128, "gemv_stages": 3, "add_block": (8, 2048), "deltanet_split": 8,
                "gemv_late": 0, "gemv_early": 0, "fields_ahead": 0, "prefetch_states": 0, "acquire_poll": 0,
                "fold_prep": 0}
SHARED_LIMIT = 232448         # bytes of shared memory one program may have on sm_90 (the check off a GPU)
SHARED_OTHER = 8192           # what the kernel holds there besides the GEMV loop's weight blocks (its reductions)
TRACE_FIELDS = 4              # per item with trace=True: reached, wait met, done (ns), the program that ran it


@triton.jit
def _prefetch_item(kind, a0, a1, a2, a3, a4, a5, a6, table_ptr, prefetch_bytes, pos_ptr, L, num_splits,
                   HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, CW: tl.constexpr,
                   HKV: tl.constexpr,
                   D: tl.constexpr, DT, LINES: tl.constexpr, SKIP_BLOCKS: tl.constexpr,
                   GEMV_N: tl.constexpr, GEMV_K: tl.constexpr, ADD_N: tl.constexpr, ADD_K: tl.constexpr,
                   STATES: tl.constexpr, DN_COLS: tl.constexpr, ATTN_BLOCK_N: tl.constexpr):
    """Ask L2 for prefetch_bytes of what an item (its kind and fields) reads from memory and no item writes before
    it: a GEMV tile's rows of weights, a DeltaNet head's recurrent states (written by that item alone). One
    contiguous range, walked by decode attention's row prefetch as rows of one 128-byte line, LINES lines at a
    time. SKIP_BLOCKS: a GEMV tile's range starts after that many of its weight blocks (gemv_early copies them
    before its wait already), so the prefetch brings the blocks after them. STATES: also a DeltaNet column item's
    columns of its states, an attention split's keys and values (all of them: the row this step writes may come in
    stale, L2 being one copy for every SM the writer's store then replaces), and an in-projection tile's conv
    weights and conv states for its channels (read after its GEMV loop)."""
    ESIZE: tl.constexpr = DT.primitive_bitwidth // 8
    if (kind >= K_GEMV) & (kind < K_GEMV + N_GEMV_FORMS):
        tile_bytes = a4 * a5 * ESIZE
        skip = 0
        if SKIP_BLOCKS > 0:   # the block of the tiles that add into x is ADD_N x ADD_K where given
            adds = (kind == K_GEMV_ADD) | (kind == K_GEMV_SWIGLU) | (kind == K_GEMV_ADD_GATED)
            skip = tl.where(adds & (ADD_N > 0), ADD_N * ADD_K, GEMV_N * GEMV_K) * ESIZE * SKIP_BLOCKS
        _prefetch_rows_l2(_slot(table_ptr, a0, tl.int8) + a3.to(tl.int64) * a5 * ESIZE, skip // 128,
                          tl.cdiv(tl.minimum(tile_bytes, skip + prefetch_bytes), 128), 128, 128, LINES)
    elif kind == K_DELTANET:   # the recurrent states of its value heads, fp32 [REP, DK, DV]
        state_bytes: tl.constexpr = (HV // HK) * DK * DV * 4
        lines = tl.cdiv(tl.minimum(state_bytes, prefetch_bytes), 128)
        _prefetch_rows_l2(_slot(table_ptr, a0 + 5, tl.int8) + a1.to(tl.int64) * state_bytes, 0, lines, 128, 128,
                          LINES)
    if STATES:
        if kind == K_DELTANET_COLS:   # its DN_COLS columns of each value head's state: REP * DK rows, DV apart
            REP: tl.constexpr = HV // HK
            state = _slot(table_ptr, a0 + 5, tl.float32) + a1.to(tl.int64) * REP * DK * DV + a2 * DN_COLS
            _prefetch_rows_l2(state, 0, REP * DK, DV, DN_COLS, LINES)
        elif kind == K_ATTN_SPLIT:   # the keys and values of its chunk: rows of D, HKV * D apart
            start, end = _decode_chunk(pos_ptr, L, a2, num_splits, ATTN_BLOCK_N)
            ROWS_AT_ONCE: tl.constexpr = (LINES * 128 + D * ESIZE - 1) // (D * ESIZE)
            _prefetch_rows_l2(_slot(table_ptr, a0 + 2, DT) + a1 * D, start, end, HKV * D, D, ROWS_AT_ONCE)
            _prefetch_rows_l2(_slot(table_ptr, a0 + 3, DT) + a1 * D, start, end, HKV * D, D, ROWS_AT_ONCE)
        elif (kind == K_GEMV_CONV) | (kind == K_GEMV_NORM_CONV):   # its channels' conv state and weights (a6: slot)
            CONV_DIM: tl.constexpr = 2 * HK * DK + HV * DV
            channels = tl.minimum(a3 + a4, CONV_DIM) - a3   # (its rows past CONV_DIM are z, b and a: no conv)
            if channels > 0:   # (one line more: the ranges need not start on a line)
                state = _slot(table_ptr, a6 + 1, tl.int8) + a3.to(tl.int64) * (CW - 1) * ESIZE
                _prefetch_rows_l2(state, 0, tl.cdiv(channels * (CW - 1) * ESIZE, 128) + 1, 128, 128, LINES)
                for w in tl.static_range(CW):   # the weight is [CONV_DIM, CW] column-major: CW runs of channels
                    weight = _slot(table_ptr, a6, tl.int8) + (w * CONV_DIM + a3).to(tl.int64) * ESIZE
                    _prefetch_rows_l2(weight, 0, tl.cdiv(channels * ESIZE, 128) + 1, 128, 128, LINES)


@triton.jit
def _field(ptr, valid, other, MASKED: tl.constexpr):
    """One int32 field: with MASKED, `other` where not valid (nothing read); else a plain load."""
    if MASKED:
        value = tl.load(ptr, mask=valid, other=other)
    else:
        value = tl.load(ptr)
    return value


@triton.jit
def _item_fields(items_ptr, order_ptr, j, valid, epoch, F: tl.constexpr, MASKED: tl.constexpr = True):
    """The fields of the item at order[j] (with MASKED, nothing read where not valid: zeros, -1 for the counters):
    its index, kind, a0 .. a7, wait counter, the count its wait needs this step (epoch * total + need), done
    counter. (Without MASKED, j must be inside the program's list: the loads then carry no predicate.)"""
    index = _field(order_ptr + j, valid, 0, MASKED)
    row = items_ptr + index.to(tl.int64) * F
    kind = _field(row, valid, 0, MASKED)
    a0 = _field(row + 1, valid, 0, MASKED)
    a1 = _field(row + 2, valid, 0, MASKED)
    a2 = _field(row + 3, valid, 0, MASKED)
    a3 = _field(row + 4, valid, 0, MASKED)
    a4 = _field(row + 5, valid, 0, MASKED)
    a5 = _field(row + 6, valid, 0, MASKED)
    a6 = _field(row + 7, valid, 0, MASKED)
    a7 = _field(row + 8, valid, 0, MASKED)
    wc = _field(row + 9, valid, -1, MASKED)
    target = epoch * _field(row + 11, valid, 0, MASKED) + _field(row + 10, valid, 0, MASKED)
    done = _field(row + 12, valid, -1, MASKED)
    return index, kind, a0, a1, a2, a3, a4, a5, a6, a7, wc, target, done


@triton.jit
def _record_error(errors_ptr, pid, index, wc, target, seen):
    """errors[pid] = (the item + 1, the counter, the count waited for, the count seen)."""
    rec = errors_ptr + pid * 4   # (ERROR_FIELDS)
    tl.store(rec, index + 1)
    tl.store(rec + 1, wc)
    tl.store(rec + 2, target)
    tl.store(rec + 3, seen)


@triton.jit
def persistent_decode_kernel(items_ptr, order_ptr, starts_ptr, table_ptr, counters_ptr, errors_ptr, epoch_ptr,
                             token_ptr, pos_ptr, x_ptr, h_ptr, proj_ptr, o_ptr, q_ptr, ws_ptr, logits_ptr,
                             best_val_ptr, best_idx_ptr, inv_freq_ptr,
                             L, num_splits, n_tiles, spin_limit, eps, l2_eps, dn_scale, qk_scale,
                             H: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
                             DV: tl.constexpr, CW: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                             D: tl.constexpr, HALF: tl.constexpr, NORM_BLOCK: tl.constexpr, BK: tl.constexpr,
                             BV: tl.constexpr, BW: tl.constexpr, REP_P: tl.constexpr, DN_SPLIT: tl.constexpr,
                             DN_COLS: tl.constexpr, BS: tl.constexpr, ROWS: tl.constexpr,
                             BLOCK_D: tl.constexpr,
                             ATTN_BLOCK_N: tl.constexpr, SPLITS_P: tl.constexpr, TILES_P: tl.constexpr,
                             GEMV_N: tl.constexpr, GEMV_K: tl.constexpr, ALIGNED: tl.constexpr, DOT_PREC: tl.constexpr,
                             F: tl.constexpr, PREFETCH: tl.constexpr = False, prefetch_bytes=0,
                             LINES: tl.constexpr = 128, TRACE: tl.constexpr = False, trace_ptr=None,
                             GEMV_AHEAD: tl.constexpr = False, GEMV_STAGES: tl.constexpr = 0,
                             ADD_N: tl.constexpr = 0, ADD_K: tl.constexpr = 0, GEMV_LATE: tl.constexpr = False,
                             FOLD_PREP: tl.constexpr = False, GEMV_EARLY: tl.constexpr = False,
                             FIELDS_AHEAD: tl.constexpr = False, PREFETCH_STATES: tl.constexpr = False,
                             ACQUIRE_POLL: tl.constexpr = False):
    DT = logits_ptr.dtype.element_ty
    POLL_THREADS: tl.constexpr = LINES if ACQUIRE_POLL else 0   # (LINES: the program's thread count)
    pid = tl.program_id(0)
    epoch = tl.load(epoch_ptr)
    dn_ss_ptr = _slot(table_ptr, K_DN_SS, tl.float32)   # the DeltaNet column splits' sums of squares (read once)
    ok = 1
    first = tl.load(starts_ptr + pid)
    last = tl.load(starts_ptr + pid + 1)
    # FIELDS_AHEAD: each item's fields are read while the item before it runs (two dependent reads fewer between
    # items: its place in the order, then its row)
    n_index, n_kind, n_a0, n_a1, n_a2, n_a3, n_a4, n_a5, n_a6, n_a7, n_wc, n_target, n_done = _item_fields(
        items_ptr, order_ptr, first, first < last, epoch, F)
    for j in range(first, last):
        # (the fields are read even after a failed wait: Triton keeps a name bound inside an if to that branch)
        if FIELDS_AHEAD:
            index, kind, a0, a1, a2, a3, a4, a5, a6, a7, wc, target, done = (
                n_index, n_kind, n_a0, n_a1, n_a2, n_a3, n_a4, n_a5, n_a6, n_a7, n_wc, n_target, n_done)
            n_index, n_kind, n_a0, n_a1, n_a2, n_a3, n_a4, n_a5, n_a6, n_a7, n_wc, n_target, n_done = _item_fields(
                items_ptr, order_ptr, j + 1, j + 1 < last, epoch, F)
        else:
            index, kind, a0, a1, a2, a3, a4, a5, a6, a7, wc, target, done = _item_fields(
                items_ptr, order_ptr, j, True, epoch, F, False)
        # GEMV_EARLY: a GEMV item waits inside its loop's first pass, after its first weight copies are issued
        wait_here = wc >= 0
        if GEMV_EARLY:
            wait_here = wait_here & ((kind < K_GEMV) | (kind >= K_GEMV + N_GEMV_FORMS))
        if TRACE:
            t_start = _globaltimer()
        if PREFETCH:
            # ---- before the wait: the item's weights (at most prefetch_bytes) on their way into L2, so the memory
            # system streams while the program waits
            _prefetch_item(kind, a0, a1, a2, a3, a4, a5, a6, table_ptr, prefetch_bytes, pos_ptr, L, num_splits, HK,
                           HV, DK, DV, CW, HKV, D, DT, LINES, GEMV_STAGES - 1 if GEMV_EARLY else 0,
                           GEMV_N, GEMV_K, ADD_N, ADD_K, PREFETCH_STATES, DN_COLS, ATTN_BLOCK_N)
        if ok:
            # ---- wait: a bounded spin on the counter, then an acquire read of it
            if wait_here:
                seen = wait_counter(counters_ptr, wc, target, spin_limit, True, POLL_THREADS)
                if seen < target:
                    _record_error(errors_ptr, pid, index, wc, target, seen)
                    ok = 0
        if ok:
            if TRACE:
                t_ready = _globaltimer()
            seen = target   # (an early GEMV item's wait: what its acquire read saw)
            # ---- the item
            # the GEMV forms are consecutive kinds; each is its own compiled MODE of gemv_item (a7: the norm weight's
            # slot of the GEMV_NORM forms, -1 for the others, which never read it)
            for mode in tl.static_range(N_GEMV_FORMS):
                if kind == K_GEMV + mode:
                    seen, t_met = gemv_item(
                        _slot(table_ptr, a0, DT), _slot(table_ptr, a1, DT), _slot(table_ptr, a2, DT), a3, a4, a5, a6,
                        best_val_ptr, best_idx_ptr, _slot(table_ptr, tl.maximum(a7, 0), tl.float32), eps, table_ptr,
                        proj_ptr, dn_ss_ptr, mode, GEMV_N, GEMV_K, ALIGNED, NORM_BLOCK, 2 * HK * DK + HV * DV, CW, BW,
                        DV, DN_SPLIT, GEMV_AHEAD, GEMV_STAGES, ADD_N, ADD_K, GEMV_LATE, GEMV_EARLY, counters_ptr, wc,
                        target, spin_limit, TRACE, POLL_THREADS)
                    if TRACE and GEMV_EARLY:
                        if wc >= 0:
                            t_ready = t_met
            if kind == K_NORM:
                norm_item(x_ptr, _slot(table_ptr, a0, tl.float32), h_ptr, eps, H, NORM_BLOCK)
            elif kind == K_DELTANET:
                deltanet_item(proj_ptr, _slot(table_ptr, a0, DT), _slot(table_ptr, a0 + 1, DT),
                              _slot(table_ptr, a0 + 2, tl.float32), _slot(table_ptr, a0 + 3, tl.float32),
                              _slot(table_ptr, a0 + 4, tl.float32), _slot(table_ptr, a0 + 5, tl.float32), o_ptr,
                              a1, a2, a3, dn_scale, eps, l2_eps, HK, HV, DK, DV, CW, BK, BV, BW, REP_P)
            elif kind == K_DELTANET_COLS:
                deltanet_cols_item(proj_ptr, _slot(table_ptr, a0 + 2, tl.float32), _slot(table_ptr, a0 + 3, tl.float32),
                                   _slot(table_ptr, a0 + 5, tl.float32), o_ptr, dn_ss_ptr,
                                   a1, a2, dn_scale, l2_eps, HK, HV, DK, DV, BK, REP_P, DN_SPLIT, DN_COLS, BS)
            elif kind == K_ATTN_PREP:
                attn_prep_item(proj_ptr, _slot(table_ptr, a0, tl.float32), _slot(table_ptr, a0 + 1, tl.float32),
                               _slot(table_ptr, a0 + 2, DT), _slot(table_ptr, a0 + 3, DT), q_ptr, inv_freq_ptr,
                               pos_ptr, a1, L, eps, HQ, HKV, D, HALF, ROWS, BLOCK_D)
            elif kind == K_ATTN_SPLIT:
                attn_split_item(q_ptr, _slot(table_ptr, a0 + 2, DT), _slot(table_ptr, a0 + 3, DT), ws_ptr, pos_ptr,
                                a1, a2, num_splits, L, qk_scale, proj_ptr, _slot(table_ptr, a0, tl.float32),
                                _slot(table_ptr, a0 + 1, tl.float32), inv_freq_ptr, eps, HQ, HKV, D, HALF, ROWS,
                                BLOCK_D, ATTN_BLOCK_N, DOT_PREC, FOLD_PREP)
            elif kind == K_ATTN_COMBINE:
                attn_combine_item(ws_ptr, proj_ptr, o_ptr, a0, num_splits, HQ, D, SPLITS_P, BLOCK_D)
            elif kind == K_EMBED:
                embed_item(_slot(table_ptr, a0, DT), token_ptr, x_ptr, H, NORM_BLOCK)
            elif kind == K_ARGMAX:
                argmax_item(best_val_ptr, best_idx_ptr, n_tiles, token_ptr, pos_ptr, epoch_ptr, TILES_P)
            if GEMV_EARLY:
                if seen < target:   # an early GEMV item's wait ran out: its sums are of stale inputs, never published
                    _record_error(errors_ptr, pid, index, wc, target, seen)
                    ok = 0
            # ---- done: every thread's stores before the bump, which publishes them (release)
            tl.debug_barrier()
            if (done >= 0) & (ok != 0):
                tl.atomic_add(counters_ptr + done, 1, sem="release", scope="gpu")
            if TRACE:   # the item's times (ns of the GPU's global timer): reached, its wait met, done published
                rec = trace_ptr + index.to(tl.int64) * 4   # (TRACE_FIELDS)
                tl.store(rec, t_start)
                tl.store(rec + 1, t_ready)
                tl.store(rec + 2, _globaltimer())
                tl.store(rec + 3, pid.to(tl.int64))


def _switch(name: str, value, what: str, default=None) -> bool:
    """An on/off option of PersistentDecode: `value`, or where None `default` (GPU_DEFAULTS[name] where None too),
    which must be 0 or 1 (False or True)."""
    if value is None:
        value = GPU_DEFAULTS[name] if default is None else default
    if value not in (0, 1):   # (True and False are 1 and 0)
        raise KernelError(f"{name}={value!r}: expected whether {what}: 0 or 1 (False or True)")
    return bool(value)


class PersistentDecode:
    """The decode step of `model` over `cache` as one persistent launch (greedy token choice inside).

    `token` and `position` are device buffers (LongTensor [1]): set them with `prime(token, position)` after the
    prefill; each `step()` reads them, writes the logits [1, V] (`self.logits`), and leaves the greedy token and the
    next position there. No host synchronisation in `step(check=False)`, static shapes: a CUDA Graph captures it.
    programs: default one per SM on a GPU, 1 under the interpreter (there programs run one after another).
    gemv_tiles, splits, fuse_norms: see build_schedule (fuse_norms on by default: the tiles round the normed input
    where the NORM items do, and the critical path is 134 counter hops instead of 183 on 0.8B); spin_limit: polls
    before a wait gives up; num_warps, gemv_block (the GEMV items' BLOCK_N, BLOCK_K), prefetch (bytes of each
    GEMV item's weights, and each DeltaNet item's states, asked into L2 before its wait; 0: none; the interpreter
    runs no PTX): GPU_DEFAULTS unless given (under the interpreter, blocks of 16 x 64 and no prefetch); schedule:
    one built already (verify=False skips check_schedule); trace: each item's times on the GPU's global timer,
    read by timeline() (the profiler of this design: one kernel, so a kernel profiler sees nothing inside it; a GPU
    only);
    gemv_stages (0, or 2-8 as shared memory allows): the GEMV loop pipelined by Triton through shared memory (copies,
    gemv_stages - 1 weight blocks in flight); with 0, gemv_ahead: each GEMV item loads the next weight block into
    registers before summing the current one. Either way the same sums in the same order: the logits do not change
    by a bit. deltanet_block: the state columns a DeltaNet item updates per iteration (a [DK, N] fp32 block; larger:
    fewer dependent rounds of loads, more registers). All three default to GPU_DEFAULTS. deltanet_split: each
    DeltaNet head's value columns in that many items (DELTANET_COLS), so a layer's delta-rule step spreads over
    HK x deltanet_split programs instead of HK; the conv then runs in the in-projection's tiles and the gated norm
    in out_proj's (schedule.py). Each column's math is unchanged: the logits are those of deltanet_block equal to
    the split's width. None: GPU_DEFAULTS on a GPU (at most one column per item), 1 under the interpreter.
    add_block: the (BLOCK_N, BLOCK_K) of the GEMV items that add into the residual stream (out_proj, o_proj, down),
    in place of gemv_block: their tiles are a few rows each (8 on 0.8B with 132 programs), so a 16-row block is half
    empty and a program has half the bytes in flight; (8, 2048) keeps the block's bytes with full rows. None: GPU_DEFAULTS
    on a GPU, gemv_block under the interpreter; 0: gemv_block. gemv_late (with gemv_stages): each GEMV item computes
    its input (the norm, the gated norm, silu(g) * u) in its loop's first pass, after the first weight blocks' copies
    are issued rather than before them; the same sums (measured slower, off). fold_prep: no ATTN_PREP
    items; each attention split norms and rotates its queries itself, and the split holding key pos writes the new
    key and value, as the graph decode's split kernel does: one counter hop fewer per attention layer, the same bits.
    gemv_early (with gemv_stages; implies gemv_late): each GEMV item waits for its inputs in its loop's first pass
    too, so its first weight blocks stream from memory while its producers finish; the same sums. fields_ahead: each
    program reads its next item's fields (its place in the order, then its row) while the current item runs.
    prefetch_states (with prefetch): the L2 prefetch before a wait also asks for a DeltaNet column item's columns of
    the states, an attention split's keys and values, and an in-projection tile's conv states and weights.
    acquire_poll (a GPU only): every thread polls a counter with acquire loads and the wait ends on the least count
    they saw, instead of volatile polls and then one acquire read shared through shared memory: a round trip fewer
    per wait. All off: fold_prep and acquire_poll measured faster (their GPU tests owed), the others slower
    (docs/experiments.md).
    """

    def __init__(self, model, cache, programs: int | None = None, gemv_tiles: int | None = None,
                 splits: int | None = None, spin_limit: int | None = None, num_warps: int | None = None,
                 gemv_block: tuple[int, int] | None = None, schedule: Schedule | None = None, verify: bool = True,
                 fuse_norms: bool = True, prefetch: int | None = None, trace: bool = False,
                 gemv_ahead: bool | None = None, deltanet_block: int | None = None, gemv_stages: int | None = None,
                 deltanet_split: int | None = None, add_block: tuple[int, int] | None = None,
                 gemv_late: bool | None = None, fold_prep: bool | None = None, gemv_early: bool | None = None,
                 fields_ahead: bool | None = None, prefetch_states: bool | None = None,
                 acquire_poll: bool | None = None):
        dev = model.device
        interp = runtime.interpreter_active()
        if programs is None:
            cuda = dev.type == "cuda" and not interp
            programs = torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 1
        if interp and programs != 1:
            raise KernelError(f"programs={programs}: under the Triton interpreter programs run one after another, so "
                              f"a program that waits on a later one never sees its counter move; use programs=1")
        self.model, self.cache = model, cache
        fold_prep = _switch("fold_prep", fold_prep, "each attention split prepares its own queries (no ATTN_PREP "
                            "items)")
        if deltanet_split is None:
            deltanet_split = 1 if interp else min(GPU_DEFAULTS["deltanet_split"], model.config.linear_value_head_dim)
        self.schedule = schedule if schedule is not None else build_schedule(model, cache, programs, gemv_tiles,
                                                                              splits, fuse_norms, deltanet_split,
                                                                              fold_prep)
        if verify:   # (False only where a test hands the kernel a broken schedule on purpose)
            check_schedule(self.schedule)
        s = self.schedule
        cfg = model.config
        self.spin_limit = (2 if interp else SPIN_LIMIT_GPU) if spin_limit is None else int(spin_limit)
        # the defaults: the fastest variant measured (benchmarks/bench_persistent.py on an H100, docs/experiments.md)
        self.num_warps = GPU_DEFAULTS["num_warps"] if num_warps is None else int(num_warps)
        self.gemv_ahead = int(_switch("gemv_ahead", gemv_ahead, "a GEMV item loads the next weight block before "
                                      "summing the current one"))
        gemv_stages = GPU_DEFAULTS["gemv_stages"] if gemv_stages is None else gemv_stages
        if gemv_stages not in (0, 2, 3, 4, 5, 6, 7, 8):
            raise KernelError(f"gemv_stages={gemv_stages!r}: expected 0 (off) or the stages of the GEMV loop's "
                              f"pipeline through shared memory, 2 to 8")
        self.gemv_stages = gemv_stages
        self.gemv_late = _switch("gemv_late", gemv_late, "a GEMV item computes its input in its loop's first pass "
                                 "(with gemv_stages)")
        self.gemv_early = _switch("gemv_early", gemv_early, "a GEMV item waits in its pipelined loop's first pass")
        if self.gemv_early and gemv_stages < 2:
            raise KernelError(f"gemv_early=True with gemv_stages={gemv_stages}: a GEMV item waits in its pipelined "
                              f"loop's first pass, so 1 only with gemv_stages 2 to 8")
        self.fields_ahead = _switch("fields_ahead", fields_ahead, "each program reads its next item's fields while "
                                    "the current one runs")
        self.prefetch_states = _switch("prefetch_states", prefetch_states, "the L2 prefetch before a wait also asks "
                                       "for the DeltaNet column items' states and the attention splits' keys and "
                                       "values")
        self.acquire_poll = _switch("acquire_poll", acquire_poll, "every thread polls a counter with acquire loads",
                                    0 if interp else None)
        if self.acquire_poll and interp:
            raise KernelError("acquire_poll=True: every thread polls a counter with acquire loads, PTX, which the "
                              "interpreter lacks; 1 only on a GPU")
        prefetch = GPU_DEFAULTS["prefetch"] if prefetch is None else prefetch
        if prefetch < 0:
            raise KernelError(f"prefetch={prefetch!r}: expected the bytes to prefetch per item, 0 for none")
        self.prefetch = 0 if interp else int(prefetch)
        self.sizes = dict(s.sizes)
        deltanet_block = GPU_DEFAULTS["deltanet_block"] if deltanet_block is None else deltanet_block
        if deltanet_block not in (8, 16, 32, 64, 128):
            raise KernelError(f"deltanet_block={deltanet_block!r}: expected the state columns a DeltaNet item updates "
                              f"at once, a power of two from 8 to 128")
        self.sizes["BV"] = min(deltanet_block, triton.next_power_of_2(cfg.linear_value_head_dim))
        if trace and interp:
            raise KernelError("trace=True: the trace reads the GPU's global timer (PTX), which the interpreter lacks")
        self.trace = torch.zeros(len(s.item_list), TRACE_FIELDS, dtype=torch.int64, device=dev) if trace else None
        self.gemv_block = gemv_block or ((16, 64) if interp else GPU_DEFAULTS["gemv_block"])
        if add_block is None:
            add_block = None if interp else GPU_DEFAULTS["add_block"]
        add_block = add_block or None   # (0: the adding tiles walk gemv_block too)
        if add_block is not None and not (len(add_block) == 2 and all(
                isinstance(b, int) and b >= 8 and b & (b - 1) == 0 for b in add_block)):
            raise KernelError(f"add_block={add_block!r}: expected (BLOCK_N, BLOCK_K) of the tiles that add into the "
                              f"residual stream, powers of two from 8")
        self.add_block = add_block
        if self.gemv_stages:   # gemv_stages - 1 weight blocks in shared memory at once, the largest block of the two
            blocks = [self.gemv_block] + ([add_block] if add_block else [])
            need = (self.gemv_stages - 1) * max(n * k for n, k in blocks) * model.dtype.itemsize
            limit = SHARED_LIMIT - SHARED_OTHER
            if dev.type == "cuda" and not interp:
                limit = torch.cuda.get_device_properties(dev).shared_memory_per_block_optin - SHARED_OTHER
            if need > limit:
                raise KernelError(f"gemv_stages={self.gemv_stages} with gemv_block={self.gemv_block} and add_block="
                                  f"{add_block}: {need} bytes of weight blocks in shared memory at once, more than "
                                  f"the {limit} a program has for them; fewer stages or smaller blocks")
        self.counters = torch.zeros(len(s.counter_totals), dtype=torch.int32, device=dev)
        self.errors = torch.zeros(s.programs, ERROR_FIELDS, dtype=torch.int32, device=dev)
        self.epoch = torch.zeros(1, dtype=torch.int32, device=dev)
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.position = torch.zeros(1, dtype=torch.long, device=dev)
        self.logits = s.buffers["logits"].view(1, -1)
        self.inv_freq = inv_freq_table(cfg.rotary_dim, cfg.rope_theta, dev)
        self.scalars = (cache.max_len, s.buffers["ws"].shape[0], s.buffers["best_val"].numel(), self.spin_limit,
                        cfg.rms_norm_eps, L2_EPS, cfg.linear_key_head_dim ** -0.5, cfg.head_dim ** -0.5 * LOG2E)

    def reset(self) -> None:
        """Zero the counters, the epoch and the error records (a new sequence, or after an error)."""
        self.counters.zero_()
        self.epoch.zero_()
        self.errors.zero_()

    def prime(self, token, position: int) -> None:
        """The step's input: the last token (int or tensor) and its position."""
        self.token.copy_(torch.as_tensor(token).reshape(1))
        self.position.fill_(int(position))

    def launch(self) -> None:
        """One decode step: one launch, nothing read back."""
        s, b = self.schedule, self.schedule.buffers
        persistent_decode_kernel[(s.programs,)](
            s.items, s.order, s.starts, s.table, self.counters, self.errors, self.epoch, self.token, self.position,
            b["x"], b["h"], b["proj"], b["o"], b["q"], b["ws"], b["logits"], b["best_val"], b["best_idx"],
            self.inv_freq, *self.scalars, **self.sizes, GEMV_N=self.gemv_block[0], GEMV_K=self.gemv_block[1],
            ADD_N=self.add_block[0] if self.add_block else 0, ADD_K=self.add_block[1] if self.add_block else 0,
            DOT_PREC=dot_precision(self.model.dtype), F=ITEM_FIELDS, PREFETCH=self.prefetch > 0,
            prefetch_bytes=self.prefetch, LINES=32 * self.num_warps, TRACE=self.trace is not None,
            trace_ptr=self.trace, GEMV_AHEAD=bool(self.gemv_ahead),
            GEMV_STAGES=self.gemv_stages, GEMV_LATE=self.gemv_late, FOLD_PREP=self.schedule.fold_prep,
            GEMV_EARLY=self.gemv_early, FIELDS_AHEAD=self.fields_ahead,
            PREFETCH_STATES=self.prefetch_states and self.prefetch > 0, ACQUIRE_POLL=self.acquire_poll,
            num_warps=self.num_warps)

    def step(self, check: bool | None = None) -> torch.Tensor:
        """launch(), then (check: default unless a CUDA Graph is being captured) check(). -> the logits [1, V]."""
        self.launch()
        if check is None:
            check = not (self.model.device.type == "cuda" and torch.cuda.is_current_stream_capturing())
        if check:
            self.check()
        return self.logits

    def timeline(self) -> list[dict]:
        """The last step's items (trace=True): kind, name, program, and in us from the step's first item: start
        (reached), ready (its wait met), done (its counter bumped). Reads the trace: a host sync."""
        if self.trace is None:
            raise KernelError("timeline(): this PersistentDecode was built without trace=True")
        t = self.trace.tolist()
        t0 = min(r[0] for r in t)
        return [{"item": i, "kind": KIND_NAMES[it.kind], "name": it.name, "program": int(r[3]),
                 "start": (r[0] - t0) / 1e3, "ready": (r[1] - t0) / 1e3, "done": (r[2] - t0) / 1e3}
                for i, (it, r) in enumerate(zip(self.schedule.item_list, t))]

    def check(self) -> None:
        """Raise a KernelError naming every item whose wait ran out of polls (reads the records: a host sync)."""
        records = self.errors.tolist()
        bad = [r for r in records if r[0] > 0]
        if not bad:
            return
        s = self.schedule
        lines = [f"{s.describe(r[0] - 1)} waited for counter {r[1]} ({s.counter_names[r[1]]}) to reach {r[2]}, "
                 f"saw {r[3]}" for r in sorted(bad)]
        raise KernelError(f"persistent decode step: {len(bad)} program(s) gave up after {self.spin_limit} polls "
                          f"(a counter nobody bumps, or programs not all resident on the GPU); the step's results "
                          f"are invalid, reset() before the next one:\n  " + "\n  ".join(lines))
