"""Compile the GPU configurations of the course's kernels for an H100/H200 (sm_90) on a machine without a GPU.

Triton compiles ahead of time for any target: TTIR -> TTGIR -> LLVM -> PTX -> cubin (with the ptxas it ships).
The metadata then says how much shared memory each program needs, which is what fails on the GPU when a tile
or a pipeline depth is too large ("out of resource: shared memory"). Run as a script (with the interpreter
off) it prints one JSON line per case; tests/test_sm90_compile.py runs it and checks every case.

    TRITON_INTERPRET=0 python tests/sm90_compile.py [--notebook-09-stages N | --persistent | --gemv-late]
"""

import inspect
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before triton: the kernels must be real JIT functions, not interpreted

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TARGET = GPUTarget("cuda", 90, 32)
# dynamic shared memory one program may use on sm_90 (227 KB)
SHARED_LIMIT = 232448
# A T4 (Colab's free GPU): sm_75, 64 KB per program, fp16 (no bf16 below sm_80), no programmatic dependent launch
T4 = GPUTarget("cuda", 75, 32)
T4_SHARED_LIMIT = 65536


def _jit(fn):
    while isinstance(fn, triton.runtime.Autotuner):
        fn = fn.fn
    return fn


def compile_case(fn, constexprs: dict, types: dict | None = None, warps: int = 4, stages: int = 1,
                 ptx_check=None, target=None) -> dict:
    """Compile `fn` for sm_90 (or `target`): arguments ending in _ptr are bf16 pointers (fp16 below sm_80) and the
    others int32 unless `types` says otherwise; pointers and integer sizes/strides are taken as multiples of 16 (as
    Triton specialises them for the model's shapes). ptx_check(ptx) -> dict adds what it finds in the generated PTX
    to the result."""
    target = target or TARGET
    model_ptr = "*bf16" if target.arch >= 80 else "*fp16"
    fn = _jit(fn)
    types = types or {}
    # A constexpr the case leaves out takes its default, as a launch does; one left out and not marked constexpr
    # in `sig` would be compiled as a runtime argument, both sides of its branches kept: not the GPU's kernel.
    params = inspect.signature(fn.fn).parameters
    constexprs = dict(constexprs)
    for i in fn.constexprs:
        name = fn.arg_names[i]
        if name not in constexprs:
            if params[name].default is inspect.Parameter.empty:
                raise ValueError(f"{fn.__name__}: constexpr {name} has no default and the case does not set it")
            constexprs[name] = params[name].default
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        sig[name] = types.get(name, model_ptr if name.endswith("_ptr") else "i32")
        if sig[name].startswith("*") or sig[name] == "i32":
            attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(ASTSource(fn, sig, constexprs=constexprs, attrs=attrs), target=target,
                            options={"num_warps": warps, "num_stages": stages})
    return {"shared": kernel.metadata.shared, **(ptx_check(kernel.asm["ptx"]) if ptx_check else {})}


def clears_after_reading(ptx: str) -> dict:
    """The atomic split-K reduction's last program reads the sums (ld.global.cg) and then clears them (st.global):
    whether a barrier (bar.sync) separates the two. Without one, a thread may clear an element that another thread,
    to which the compiler gave it in the load's layout, has not read yet."""
    lines = ptx.splitlines()
    read = max(i for i, line in enumerate(lines) if "ld.global.cg" in line)
    clear = next(i for i in range(read, len(lines)) if "st.global" in lines[i])
    return {"barrier_before_clear": any("bar.sync" in line for line in lines[read:clear])}


def tma_descriptor_use(ptx: str) -> dict:
    """A TMA matmul's descriptors: loaded through (cp.async.bulk.tensor), and whether the kernel builds any in global
    memory itself (tensormap.replace: device-made descriptors, 2-3.5 us more per call than the host's on the H200)."""
    return {"tma_loads": "cp.async.bulk.tensor" in ptx, "device_made_descriptors": "tensormap.replace" in ptx}


def prefetches_before_the_wait(ptx: str) -> dict:
    """The decode split kernel's L2 prefetch: how many prefetch.global.L2 the PTX holds, and whether all come before
    the PDL wait (griddepcontrol.wait), where they overlap the kernel before."""
    lines = ptx.splitlines()
    wait = next((i for i, line in enumerate(lines) if "griddepcontrol.wait" in line), len(lines))
    at = [i for i, line in enumerate(lines) if "prefetch.global.L2" in line]
    return {"prefetches": len(at), "prefetches_before_wait": bool(at) and max(at) < wait}


def cases():
    """(label, thunk) for every case: the library's GPU configurations at Qwen3.5-0.8B's sizes, and the
    notebook exercise whose launcher sets its own pipeline depth."""
    from qwen_lab.config import QWEN35_0_8B as C
    from qwen_lab.kernels import attention, conv1d, deltanet, dot_precision, gemm, rope
    from qwen_lab.kernels.gemm import tuning as gemm_tuning
    from qwen_lab.switches import switches

    # The dot precision the launchers pass for a bf16 model: bf16 operands ignore it, but the chunk prep's fp32
    # merges (the inverse) then run on the tensor cores in tf32, where "ieee" would compile a different kernel
    # (fp32 FMA loops, 19 KB of spills per thread) from the one the GPU runs.
    prec = dot_precision(torch.bfloat16)
    out = []
    for swiglu in (False, True):  # SWIGLU: two accumulators and two W tiles per step, its own tile shapes
        for c in gemm_tuning._matmul_configs(swiglu):  # TMA=True: the tensor-descriptor candidates (sm_90+ only)
            tma = c.kwargs.get("TMA", False)
            meta = dict(c.kwargs, DOT_PRECISION=prec, SWIGLU=swiglu, TMA=tma, TMA_OK=tma, USE_PDL=True)
            bm, bn, bk = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
            # a candidate's own TAIL; the other persistent ones also with their last round in half-height slices
            # (TAIL = 2: the probe's form)
            tails = (c.kwargs["TAIL"],) if "TAIL" in c.kwargs else (1, 2) if c.kwargs.get("PERSIST") else (1,)
            for tail in tails:
                case = dict(meta, TAIL=tail)
                if tma:  # the host descriptors' types, their tiles as `_fit_descriptors` shapes them
                    w_tile = f"2, {bn}, {bk}" if c.kwargs.get("JOIN") else f"{bn}, {bk}"
                    types = {"x_desc": f"tensordesc<bf16[{bm}, {bk}]>", "w_desc": f"tensordesc<bf16[{w_tile}]>"}
                    # the slices' descriptor: the SwiGLU launches pass one to every candidate (some have TAIL),
                    # the others only where TAIL > 1 (matmul_with_config); else None
                    if tail > 1 or swiglu:
                        types["xt_desc"] = f"tensordesc<bf16[{bm // tail}, {bk}]>"
                    else:
                        case["xt_desc"] = None
                else:   # a call without TMA passes None for all three
                    types, case = {}, dict(case, x_desc=None, w_desc=None, xt_desc=None)
                types.update(eps="fp32", nw_ptr="*fp32", ss_ptr="*fp32")
                # the norm split between two GEMMs (linear_add_rms_norm, rms_scaled_linear): the TMA candidates,
                # which serve the prompts it is for, with each half of it
                epilogues = [{}]
                if tma:
                    slots = gemm.ss_slots(C.hidden_size)
                    epilogues += [dict(ROW_SCALE=True, SS_SLOTS=slots)] + \
                        ([] if swiglu else [dict(RES_NORM=True, SS_SLOTS=slots)])
                for epi in epilogues:
                    label = f"matmul SWIGLU={swiglu} TAIL={tail} {' '.join(epi) or 'plain'} {c}"
                    out.append((label, lambda meta=dict(case, **epi), c=c, types=types, tma=tma: compile_case(
                        gemm.matmul_kernel, meta, types, warps=c.num_warps, stages=c.num_stages,
                        ptx_check=tma_descriptor_use if tma else None)))
    gemv_types = {"ws_ptr": "*fp32", "count_ptr": "*i32", "eps": "fp32"}
    for c in gemm_tuning._gemv_configs(gpu=True):
        if c.kwargs.get("PERSIST"):  # the persistent form: one row, one split, its own kernel
            for prologue, dv in ((gemm.PRO_NONE, 1), (gemm.PRO_SWIGLU, 1), (gemm.PRO_RMS, 1), (gemm.PRO_ADD_RMS, 1),
                                 (gemm.PRO_GATED, C.linear_value_head_dim)):
                meta = dict(c.kwargs, PROLOGUE=prologue, DV=dv, USE_PDL=True)
                out.append((f"gemv_rows prologue {prologue} {c}", lambda meta=meta, c=c: compile_case(
                    gemm.gemv_rows_kernel, meta, {"eps": "fp32"}, c.num_warps, c.num_stages)))
            continue
        # every prologue the model uses at decode: plain (o_proj), SwiGLU (down), RMSNorm (the first layer's input),
        # add + RMSNorm (every other input and gate/up), the gated norm (the DeltaNet out-projection)
        for prologue, dv in ((gemm.PRO_NONE, 1), (gemm.PRO_SWIGLU, 1), (gemm.PRO_RMS, 1), (gemm.PRO_ADD_RMS, 1),
                             (gemm.PRO_GATED, C.linear_value_head_dim)):
            if c.kwargs["BLOCK_K"] < dv:
                continue
            meta = dict(c.kwargs, BLOCK_M=1, REDUCE=gemm.REDUCE_ATOMIC, PROLOGUE=prologue, DV=dv,
                        DOT_PRECISION=prec, USE_PDL=True,
                        K_POW2=triton.next_power_of_2(C.hidden_size) if prologue in (gemm.PRO_RMS, gemm.PRO_ADD_RMS)
                        else 0)
            out.append((f"gemv M=1 prologue {prologue} {c}", lambda meta=meta, c=c: compile_case(
                gemm.gemv_splitk_kernel, meta, gemv_types, c.num_warps, c.num_stages, clears_after_reading)))
            if prologue == gemm.PRO_ADD_RMS:  # the deterministic reduction as well (its loop has names too)
                meta = dict(meta, REDUCE=gemm.REDUCE_DETERMINISTIC)
                out.append((f"gemv M=1 deterministic prologue {prologue} {c}", lambda meta=meta, c=c: compile_case(
                    gemm.gemv_splitk_kernel, meta, gemv_types, c.num_warps, c.num_stages)))
        if c.kwargs["BLOCK_N"] >= 16:  # a few prompt rows: the tl.dot path, whole and split (atomic)
            meta = dict(c.kwargs, BLOCK_M=16, REDUCE=gemm.REDUCE_NONE, PROLOGUE=gemm.PRO_ADD_RMS, DV=1,
                        DOT_PRECISION=prec, USE_PDL=False, K_POW2=0)
            out.append((f"gemv M=16 {c}", lambda meta=meta, c=c: compile_case(
                gemm.gemv_splitk_kernel, meta, gemv_types, c.num_warps, c.num_stages)))
            meta = dict(meta, REDUCE=gemm.REDUCE_ATOMIC, PROLOGUE=gemm.PRO_NONE, USE_PDL=True)
            out.append((f"gemv M=16 atomic {c}", lambda meta=meta, c=c: compile_case(
                gemm.gemv_splitk_kernel, meta, gemv_types, c.num_warps, c.num_stages, clears_after_reading)))
    D, G = C.head_dim, C.num_attention_heads // C.num_key_value_heads
    attn_types = {"pos_ptr": "*i64", "qk_scale": "fp32"}
    decode_prep_types = dict(attn_types, ws_ptr="*fp32", inv_freq_ptr="*fp32", eps="fp32")

    def prefill_meta(c, dot_prec, pdl):
        return dict(c.kwargs, G=G, GP=triton.next_power_of_2(G), D=D, BLOCK_D=triton.next_power_of_2(D),
                    HAS_GATE=True, DOT_PREC=dot_prec, USE_PDL=pdl)

    def decode_meta(c, dot_prec, pdl):
        return dict(c.kwargs, G=G, ROWS=max(16, triton.next_power_of_2(G)), D=D, BLOCK_D=triton.next_power_of_2(D),
                    DOT_PREC=dot_prec, USE_PDL=pdl)

    for c in attention._PREFILL_CONFIGS + attention._PREFILL_TMA_CONFIGS:
        meta = prefill_meta(c, prec, True)
        if c.kwargs.get("TMA"):  # K and V's host descriptors, their tile as _fit_kv_descriptors shapes it
            desc = f"tensordesc<bf16[{c.kwargs['BLOCK_N']}, {triton.next_power_of_2(D)}]>"
            types = dict(attn_types, k_desc=desc, v_desc=desc)
        else:
            types, meta = attn_types, dict(meta, k_desc=None, v_desc=None)
        out.append((f"flash_attention {c}", lambda meta=meta, c=c, types=types: compile_case(
            attention.flash_attention_kernel, meta, types, c.num_warps, c.num_stages,
            tma_descriptor_use if c.kwargs.get("TMA") else None)))
    for c in attention._DECODE_CONFIGS:
        meta = decode_meta(c, prec, True)
        out.append((f"flash_decode_split {c}", lambda meta=meta, c=c: compile_case(
            attention.flash_decode_split_kernel, meta, dict(attn_types, ws_ptr="*fp32"), c.num_warps, c.num_stages)))
        # the model's decode form: q/k norm, RoPE and the cache write folded in (qk_norm_rope_cache_attention)
        meta = dict(meta, PREP=True, HALF=C.rotary_dim // 2)
        out.append((f"flash_decode_split PREP {c}", lambda meta=meta, c=c: compile_case(
            attention.flash_decode_split_kernel, meta, decode_prep_types, c.num_warps, c.num_stages)))
        # ... with the L2 prefetch of its chunk before the wait (switches.decode_prefetch, the model's default)
        meta = dict(meta, PREFETCH=True)
        out.append((f"flash_decode_split PREP PREFETCH {c}", lambda meta=meta, c=c: compile_case(
            attention.flash_decode_split_kernel, meta, decode_prep_types, c.num_warps, c.num_stages,
            prefetches_before_the_wait)))
    # A T4: the small prefill tiles offered where shared memory is short, and the decode tiles (the autotuner skips
    # whichever do not fit), for an fp16 model without PDL
    t4_prec = dot_precision(torch.float16)
    for c in attention._SMALL_SMEM_PREFILL_CONFIGS:
        meta = dict(prefill_meta(c, t4_prec, False), k_desc=None, v_desc=None)
        out.append((f"flash_attention sm_75 {c}", lambda meta=meta, c=c: compile_case(
            attention.flash_attention_kernel, meta, attn_types, c.num_warps, c.num_stages, target=T4)))
    for c in attention._DECODE_CONFIGS:
        meta = dict(decode_meta(c, t4_prec, False), PREP=True, HALF=C.rotary_dim // 2)
        out.append((f"flash_decode_split sm_75 PREP {c}", lambda meta=meta, c=c: compile_case(
            attention.flash_decode_split_kernel, meta, decode_prep_types, c.num_warps, c.num_stages, target=T4)))
    rope_meta = dict(D=D, HALF=C.rotary_dim // 2, BLOCK_H=triton.next_power_of_2(C.num_attention_heads),
                     BLOCK_D=triton.next_power_of_2(D), USE_PDL=True)
    out.append(("qk_norm_rope_cache", lambda: compile_case(
        rope.qk_norm_rope_cache_kernel, rope_meta, {"pos_ptr": "*i64", "inv_freq_ptr": "*fp32", "eps": "fp32"})))
    Dk, Dv = C.linear_key_head_dim, C.linear_value_head_dim
    prep_types = {"g_ptr": "*fp32", "beta_ptr": "*fp32", "gcum_ptr": "*fp32", "ready_ptr": "*i32", "scale": "fp32",
                  "eps": "fp32"}
    for c in deltanet.autotune_configs("chunk_prep_kernel"):
        for fused in (False, True):  # the gates given, or computed from the raw a, b (deltanet_chunked)
            meta = dict(c.kwargs, BT=64, BK=Dk, BDV=Dv, MERGES=5, PREC=prec, INV_PREC=prec, FUSED_GATES=fused,
                        GROUP=switches.scan_group)
            types = dict(prep_types, g_ptr="*bf16", beta_ptr="*bf16", A_log_ptr="*fp32") if fused else prep_types
            out.append((f"chunk_prep fused_gates={fused} {c}", lambda meta=meta, c=c, types=types: compile_case(
                deltanet.chunk_prep_kernel, meta, types, c.num_warps, c.num_stages)))
            # PREP_PERSISTENT: the same body in a loop over the (head, chunk) items
            out.append((f"chunk_prep PERSIST fused_gates={fused} {c}",
                        lambda meta=meta, c=c, types=types: compile_case(
                            deltanet.chunk_prep_kernel, dict(meta, PERSIST=True, USE_PDL=True), types, c.num_warps,
                            c.num_stages)))
    scan_types = {"gcum_ptr": "*fp32", "state_ptr": "*fp32", "ready_ptr": "*i32"}
    for c in deltanet.autotune_configs("chunk_scan_kernel", Dv=Dv):
        meta = dict(c.kwargs, BT=64, BK=Dk, PREC=prec, GROUP=switches.scan_group)
        out.append((f"chunk_scan {c}", lambda meta=meta, c=c: compile_case(
            deltanet.chunk_scan_kernel, meta, scan_types, c.num_warps, c.num_stages)))
    conv_types = {"state_ptr": "*fp32", "A_log_ptr": "*fp32", "dt_bias_ptr": "*bf16", "ticket_ptr": "*i32",
                  "scale": "fp32", "eps": "fp32"}
    for c in deltanet.autotune_configs("conv_decode_step_kernel", Dv=Dv):
        for settled in (False, True):
            meta = dict(c.kwargs, W=C.linear_conv_kernel_dim, BW=4, BK=Dk, USE_PDL=True, STATE_SETTLED=settled)
            out.append((f"conv_decode_step settled={settled} {c}", lambda meta=meta, c=c: compile_case(
                deltanet.conv_decode_step_kernel, meta, conv_types, c.num_warps, c.num_stages)))
    for c in conv1d.PREFILL_CONFIGS:
        W = C.linear_conv_kernel_dim  # the model's form: PDL on, the new state written by the first tile
        meta = dict(c.kwargs, W=W, BLOCK_S=triton.next_power_of_2(W - 1), WRITE_STATE=True, USE_PDL=True)
        out.append((f"conv1d_prefill {c}", lambda meta=meta, c=c: compile_case(
            conv1d.conv1d_prefill_kernel, meta, warps=c.num_warps, stages=c.num_stages)))
    # the sampler's GPU configuration over Qwen3.5-0.8B's vocabulary: round 0 (every token in play) and the later
    # rounds (each chunk tested for tokens in play first), with top-k and top-p each alone and together
    from qwen_lab.kernels import sampling
    sc = sampling._GPU
    nb_p2 = max(2, triton.next_power_of_2(triton.cdiv(C.vocab_size, sc.block)))
    sample_types = {"pmax_ptr": "*fp32", "parg_ptr": "*i32", "counter_ptr": "*i32", "mx_ptr": "*fp32",
                    "out_ptr": "*i64", "hcount_ptr": "*i32", "hmass_ptr": "*fp64", "state_i_ptr": "*i64",
                    "state_f_ptr": "*fp64", "kmass_ptr": "*fp64", "klast_ptr": "*i32", "u_ptr": "*fp32",
                    "scale": "fp32", "top_p": "fp32"}
    blocks = dict(BLOCK=sc.block, NB_P2=nb_p2, USE_PDL=True)
    out.append(("sample_max", lambda: compile_case(sampling.sample_max_kernel, blocks, sample_types, sc.warps)))
    for r, use_k, use_p in ((0, True, True), (1, True, True), (1, True, False), (1, False, True),
                            (sampling.KEY_BITS // sc.nbits - 1, True, True)):
        meta = dict(blocks, ROUND=r, USE_K=use_k, USE_P=use_p, NBITS=sc.nbits, KEY_BITS=sampling.KEY_BITS,
                    SKIP_DEAD=sc.skip_dead, CHUNK=sc.chunk)
        out.append((f"sample_round {r} top_k={use_k} top_p={use_p}", lambda meta=meta: compile_case(
            sampling.sample_round_kernel, meta, sample_types, sc.warps)))
    for tau in (False, True):
        meta = dict(blocks, USE_TAU=tau, CHUNK=sc.chunk)
        out.append((f"sample_draw USE_TAU={tau}", lambda meta=meta: compile_case(
            sampling.sample_draw_kernel, meta, sample_types, sc.warps)))
    out.append(("notebook 09 exercise chunk_scan_kernel, as its launcher runs it", _notebook_09_scan))
    out += persistent_cases()
    return out


def persistent_counters(ptx: str) -> dict:
    """The persistent step's counter protocol as compiled: a wait's acquire read (ld.global.gpu.acquire), the bump's
    release atomic (atom.global.gpu.release; red.global.gpu.release where its result is unused, as Triton 3.9 emits it), the spin's volatile loads, and how many loads are 16 bytes wide (the
    GEMV tiles' weights: a pointer read from the table must carry its alignment)."""
    import re

    return {"acquire_loads": len(re.findall(r"ld\.global\.gpu\.acquire", ptx)),
            "release_atomics": len(re.findall(r"(?:atom|red)\.global\.gpu\.release", ptx)),
            "volatile_loads": len(re.findall(r"ld\.volatile\.global", ptx)),
            "wide_loads": len(re.findall(r"ld\.global(?:\.nc)?\.v4", ptx)),
            "l2_prefetches": len(re.findall(r"prefetch\.global\.L2", ptx)),
            "timer_reads": len(re.findall(r"%globaltimer", ptx)),
            "async_copies": len(re.findall(r"cp\.async\.c[ag]", ptx))}


def persistent_cases():
    """The persistent decode step (kernels/persistent) at Qwen3.5-0.8B's sizes in each kernel shape its benchmark times,
    and the notebook's two dependent GEMVs."""
    from qwen_lab.config import QWEN35_0_8B as C
    from qwen_lab.kernels import persistent
    from qwen_lab.kernels.persistent import schedule

    types = {"table_ptr": "*i64", "items_ptr": "*i32", "order_ptr": "*i32", "starts_ptr": "*i32",
             "counters_ptr": "*i32", "errors_ptr": "*i32", "epoch_ptr": "*i32", "token_ptr": "*i64",
             "pos_ptr": "*i64", "ws_ptr": "*fp32", "best_val_ptr": "*fp32", "best_idx_ptr": "*i32",
             "inv_freq_ptr": "*fp32", "eps": "fp32", "l2_eps": "fp32", "dn_scale": "fp32", "qk_scale": "fp32"}
    out = []
    # (the next to last: PersistentDecode's GPU defaults, deltanet_block 128 included; the last with its DeltaNet
    # heads split into 8 items each, and 8 x 2048 blocks for the tiles that add into the residual stream)
    for warps, block_n, prefetch, trace, loop, bv, dn_split in (
            (4, 16, False, False, "", 32, 1), (4, 32, False, False, "", 32, 1), (8, 32, False, False, "", 32, 1),
            (4, 16, True, False, "", 32, 1), (4, 16, False, True, "", 32, 1), (8, 16, False, False, "ahead", 32, 1),
            (8, 32, True, False, "ahead", 32, 1), (8, 16, False, False, "stages", 32, 1),
            (8, 16, True, False, "stages", 128, 1), (8, 16, True, False, "stages", 128, 8)):
        meta = dict(schedule.kernel_sizes(C, 64, 32, 132, dn_split), GEMV_N=block_n, GEMV_K=1024 if loop else 256,
                    ALIGNED=True, DOT_PREC="tf32", F=schedule.ITEM_FIELDS, PREFETCH=prefetch, LINES=32 * warps,
                    TRACE=trace, GEMV_AHEAD=loop == "ahead", GEMV_STAGES=3 if loop == "stages" else 0)
        meta["BV"] = bv
        if dn_split > 1:
            meta.update(ADD_N=8, ADD_K=2048)
        label = (f"persistent_decode w{warps} {block_n}x{meta['GEMV_K']}" + (f" d{bv}" if bv != 32 else "")
                 + (f" v{dn_split} r8x2048" if dn_split > 1 else "")
                 + (" prefetch" if prefetch else "") + (" trace" if trace else "") + (f" {loop}" if loop else ""))
        case_types = dict(types, trace_ptr="*i64") if trace else types
        out.append((label, lambda meta=meta, warps=warps, case_types=case_types: compile_case(
            persistent.persistent_decode_kernel, meta, case_types, warps, ptx_check=persistent_counters)))
    # the defaults with each GEMV item's input computed in its pipelined loop's first pass (gemv_late) and the
    # attention prep folded into the splits (fold_prep)
    late = dict(meta, GEMV_LATE=True, FOLD_PREP=True)
    out.append((label[:-len(" stages")] + " late fold stages", lambda: compile_case(persistent.persistent_decode_kernel, late, types, 8,
                                                             ptx_check=persistent_counters)))
    # and with each GEMV item's wait in that loop's first pass too (gemv_early), each item's fields read ahead
    # and the L2 prefetch of the DeltaNet column items' states and the splits' keys and values (prefetch_states)
    # (through 6 stages: a layer's tile, 4 blocks or fewer, all on its way before the wait)
    early = dict(late, GEMV_EARLY=True, FIELDS_AHEAD=True, PREFETCH_STATES=True, GEMV_STAGES=6)
    out.append((label[:-len(" stages")] + " late early fold fields states c6 stages", lambda: compile_case(
        persistent.persistent_decode_kernel, early, types, 8, ptx_check=persistent_counters)))
    # every wait polled by acquire loads of all the program's threads (acquire_poll), the GEMV ones in their loops
    polled = dict(early, ACQUIRE_POLL=True)
    out.append((label[:-len(" stages")] + " early acquire-poll stages", lambda: compile_case(
        persistent.persistent_decode_kernel, polled, types, 8, ptx_check=persistent_counters)))
    teach_types = {"counter_ptr": "*i32", "error_ptr": "*i32"}
    out.append(("persistent two_gemvs teaching kernel", lambda: compile_case(
        persistent.two_gemvs_kernel, dict(BLOCK_N=16, BLOCK_K=64), teach_types, 4, ptx_check=persistent_counters)))
    return out


def first_lines(ptx: str) -> dict:
    """The line of the first asynchronous copy, the first global load, the first barrier and the first counter poll
    (volatile load) in the PTX."""
    import re

    lines = ptx.splitlines()
    first = {name: next((i for i, line in enumerate(lines) if re.search(pattern, line)), -1)
             for name, pattern in (("cp_async", r"cp\.async\.c[ag]"), ("ld_global", r"ld\.global"),
                                   ("bar_sync", r"bar\.sync"), ("poll", r"ld\.volatile\.global"),
                                   ("acquire", r"ld\.global\.gpu\.acquire"))}
    # after the wait's acquire read: the first barrier and the first other global load (an input)
    after = lines[first["acquire"] + 1:] if first["acquire"] >= 0 else []
    for name, pattern in (("bar_after_acquire", r"bar\.sync"), ("load_after_acquire", r"ld\.global")):
        i = next((i for i, line in enumerate(after) if re.search(pattern, line)), None)
        first[name] = -1 if i is None else first["acquire"] + 1 + i
    return first


def gemv_late_cases():
    """A persistent GEMV_NORM item alone (gemv_item, its GPU blocks: 16 x 1024 through 3 stages, 8 warps), with its
    input computed before the pipelined loop, in the loop's first pass (LATE), with its wait there too (EARLY), and
    that wait polled by acquire loads of every thread (POLL)."""
    from qwen_lab.kernels.persistent.items import gemv_item

    @triton.jit
    def one_gemv_norm_item(w_ptr, in_ptr, out_ptr, nw_ptr, table_ptr, proj_ptr, ss_ptr, bv_ptr, bi_ptr, row0, nrows,
                           K, eps, counters_ptr, wc, target, spin_limit, seen_ptr, LATE: tl.constexpr,
                           EARLY: tl.constexpr, POLL: tl.constexpr):
        seen, _ = gemv_item(w_ptr, in_ptr, out_ptr, row0, nrows, K, 0, bv_ptr, bi_ptr, nw_ptr, eps, table_ptr,
                            proj_ptr, ss_ptr, 4, 16, 1024, True, 1024, 6144, 4, 4, 128, 8, False, 3, 8, 2048, LATE,
                            EARLY, counters_ptr, wc, target, spin_limit, False, POLL)
        tl.store(seen_ptr, seen)

    types = {"table_ptr": "*i64", "ss_ptr": "*fp32", "bv_ptr": "*fp32", "bi_ptr": "*i32", "nw_ptr": "*fp32",
             "eps": "fp32", "counters_ptr": "*i32", "seen_ptr": "*i32"}
    return [(f"gemv_norm item late={late} early={early} poll={poll}", lambda late=late, early=early, poll=poll:
             compile_case(one_gemv_norm_item, {"LATE": late, "EARLY": early, "POLL": poll}, types, 8,
                          ptx_check=first_lines))
            for late, early, poll in ((False, False, 0), (True, False, 0), (False, True, 0), (False, True, 256))]


def _notebook_09_scan(stages: int | None = None) -> dict:
    """The solution of exercise 09.2, compiled with the launch options of the notebook's own launcher (or with
    `stages` pipeline stages)."""
    import re

    nb = json.load(open(os.path.join(ROOT, "solutions", "09_gated_deltanet_chunked.ipynb")))
    src = next("".join(c["source"]) for c in nb["cells"]
               if c["cell_type"] == "code" and "".join(c["source"]).startswith("# Exercise 09.2"))
    launcher = src[src.index("def my_delta_rule_chunked"):]
    if stages is None:
        stages = int(re.search(r"num_stages=(\d+)", launcher).group(1)) if "num_stages=" in launcher else 3
    kernel_src = src[:src.index("def my_delta_rule_chunked")]
    kernel_src = re.sub(r"^\s*### (BEGIN|END) SOLUTION\n", "", kernel_src, flags=re.M)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "qwen_lab_nb09_scan.py")
    with open(path, "w") as f:  # Triton reads a kernel's source from its file
        f.write("import triton\nimport triton.language as tl\n\n" + kernel_src)
    import importlib.util

    spec = importlib.util.spec_from_file_location("qwen_lab_nb09_scan", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = module.chunk_scan_kernel
    types = {n: ("*fp32" if n.endswith("_ptr") else "i32") for n in fn.arg_names}
    return compile_case(fn, {"Dk": 128, "Dv": 128, "C": 64, "BV": 16}, types, warps=4, stages=stages)


if __name__ == "__main__":
    todo = cases()
    if len(sys.argv) > 1 and sys.argv[1] == "--notebook-09-stages":  # one case, at a given pipeline depth
        todo = [(f"notebook 09 exercise, {sys.argv[2]} stages", lambda: _notebook_09_scan(int(sys.argv[2])))]
    if len(sys.argv) > 1 and sys.argv[1] == "--persistent":  # the persistent step's cases alone
        todo = persistent_cases()
    if len(sys.argv) > 1 and sys.argv[1] == "--gemv-late":  # one GEMV item, its input before or in the loop
        todo = gemv_late_cases()
    for label, thunk in todo:
        try:
            result = {"label": label, "ok": True, **thunk()}
        except Exception as e:  # reported, judged by the test
            result = {"label": label, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(json.dumps(result), flush=True)
