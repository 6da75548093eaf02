r"""A decode step's projections from one mixer's output to the next mixer's input, in ONE launch.

Between two mixers a decode token goes through four GEMVs and nothing else:

    A   y   = W_o  a(o)                     the mixer's out-projection; a = the DeltaNet's gated RMSNorm of o
                                            (times silu(z)), or o itself after attention
    B   x1  = x + y;   g = W_gu rms(x1)     residual add, RMSNorm (1 + w), the MLP's gate/up   [2I]
    C   m   = W_d (silu(g_gate) * g_up)     SwiGLU, the down-projection                          [H]
    D   x2  = x1 + m;  p = W_in rms(x2)     residual add, RMSNorm, the next layer's in-projection (optional)

Launched as four kernels (chapters 03-05), each one ramps its weight stream up from nothing and lets it run dry
while its last programs finish: at a few microseconds per GEMV that ramp and tail are a third of the time
(docs/perf-log.md, session 5). Here one persistent grid runs the four phases with a *grid-wide barrier* between
them, and every program requests its first weight tile of the next phase BEFORE it waits at the barrier: the
weights do not depend on the previous phase, only the activations do, so memory keeps streaming while the
slowest programs finish.

Rows are dealt out round-robin: program p of G computes rows p, p + G, p + 2G, ... of each W, BLOCK_N of them per
step (a [BLOCK_N, BLOCK_K] tile, the whole row: K <= BLOCK_K), so every program has ceil(N / G) or floor(N / G)
rows of each phase and the barrier waits for at most one extra row. Each program computes the activation row
once per phase, in fp32, rounded where the unfused operators round (the prologues of `gemm.gemv_rows_kernel`).

The barrier: every program adds 1 to a counter (release), then polls it (acquire) until it holds G times the
number of barriers passed; the last program out resets it for the next launch. A grid barrier needs every
program resident at once, so the launcher sizes the grid from the compiled kernel's registers and shared memory
(`resident_programs`), and the poll gives up after POLL_LIMIT tries, raising a flag the launcher's `check` reads,
instead of hanging the GPU. Under the Triton interpreter programs run one after another, so no barrier could ever
be passed: there the phases are launched one by one (FIRST = LAST), the same code without the barriers.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..errors import KernelError
from ..runtime import interpreter_active
from . import pdl_options
from . import gemm
from .gemm import PRO_GATED, PRO_NONE, _row_activation

# polls of the barrier counter before a program gives up (about a second): only a grid larger than what fits the
# GPU at once gets there
POLL_LIMIT = 1 << 20
# The GPU's configuration: programs per SM, warps, and rows per step of each phase (A, B, C, D).
GPU_CONFIG = dict(PERSIST=2, num_warps=8, BN=(4, 8, 2, 8), POLL_LOAD=True)
# Under the interpreter: a few programs, so that each has several rows and some none (ragged shapes).
CPU_CONFIG = dict(PERSIST=1, num_warps=4, BN=(2, 2, 2, 2), POLL_LOAD=False, programs=3)


@triton.jit
def _chain_tile(w_ptr, pid, G, step, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Rows pid + G j, j in [step BLOCK_N, (step + 1) BLOCK_N), of W [N, K]: [BLOCK_N, BLOCK_K], zeros past N and K.
    (W is read once per call: evict it first and keep L2 for the activations every program reads.)"""
    rows = pid + (step * BLOCK_N + tl.arange(0, BLOCK_N)) * G
    offs_k = tl.arange(0, BLOCK_K)
    mask = (rows < N)[:, None] & (offs_k < K)[None, :]
    return tl.load(w_ptr + rows.to(tl.int64)[:, None] * stride_wn + offs_k[None, :], mask=mask, other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _chain_phase(w_first, pid, G, x_ptr, r_ptr, z_ptr, nw_ptr, s_ptr, w_ptr, out_ptr, N, K, stride_wn, up_offset,
                 stride_xh, stride_zh, eps, PROLOGUE: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """One GEMV of the chain: out[rows of this program] = W[rows] a, a = the prologue of x; w_first: this program's
    first tile, already requested. The next step's tile is requested before the current one is multiplied."""
    a = _row_activation(x_ptr, r_ptr, z_ptr, nw_ptr, s_ptr, pid == 0, K, up_offset, stride_xh, stride_zh, eps,
                        PROLOGUE, DV, BLOCK_K)                                                   # [1, BLOCK_K]
    w = w_first
    for step in range(tl.cdiv(tl.cdiv(N, G), BLOCK_N)):
        w_next = _chain_tile(w_ptr, pid, G, step + 1, N, K, stride_wn, BLOCK_N, BLOCK_K)  # past the end: masked
        y = tl.sum(w.to(tl.float32) * a, axis=1)                                               # [BLOCK_N]
        rows = pid + (step * BLOCK_N + tl.arange(0, BLOCK_N)) * G
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)
        w = w_next


@triton.jit
def _load_acquire(ptr):
    """One int32 read with acquire semantics at GPU scope, no read-modify-write: the pollers of a barrier only
    read its counter, so they do not queue behind each other's atomics at the counter's L2 slice."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _grid_barrier(sync_ptr, target, POLL_LIMIT: tl.constexpr, POLL_LOAD: tl.constexpr):
    """Wait until every program of the grid has arrived here as often as `target` says (G per barrier so far).
    The block barrier first: every thread's stores are issued before the release that announces them."""
    tl.debug_barrier()
    got = tl.atomic_add(sync_ptr, 1, sem="acq_rel", scope="gpu") + 1
    tries = got * 0
    while (got < target) & (tries < POLL_LIMIT):
        if POLL_LOAD:
            got = _load_acquire(sync_ptr)
        else:
            got = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
        tries += 1
    if got < target:
        tl.atomic_xchg(sync_ptr + 2, 1, sem="relaxed", scope="gpu")  # gave up: the launcher's check says why
    tl.debug_barrier()


@triton.jit
def gemv_chain_kernel(xa_ptr, za_ptr, nwa_ptr, wa_ptr, ya_ptr, Na, Ka, stride_wa, stride_xh, stride_zh,
                      r_ptr, nwb_ptr, sb_ptr, wb_ptr, yb_ptr, Nb, Kb, stride_wb,
                      wc_ptr, yc_ptr, Nc, Kc, stride_wc,
                      nwd_ptr, sd_ptr, wd_ptr, yd_ptr, Nd, Kd, stride_wd,
                      sync_ptr, eps,
                      A_PROLOGUE: tl.constexpr, DV: tl.constexpr,
                      BN_A: tl.constexpr, BK_A: tl.constexpr, BN_B: tl.constexpr, BK_B: tl.constexpr,
                      BN_C: tl.constexpr, BK_C: tl.constexpr, BN_D: tl.constexpr, BK_D: tl.constexpr,
                      FIRST: tl.constexpr, LAST: tl.constexpr, POLL_LIMIT: tl.constexpr, POLL_LOAD: tl.constexpr = True,
                      USE_PDL: tl.constexpr = False):
    # Phases FIRST..LAST of A (out-projection), B (add + norm, gate/up), C (SwiGLU, down), D (add + norm, next
    # in-projection), a grid barrier between two of them. Phase B's x is A's output, C's is B's, D's is C's; D's
    # residual is B's new residual stream sb.
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    # The first phase's first tile before the PDL wait: no kernel writes the weights.
    if FIRST == 0:
        w0 = _chain_tile(wa_ptr, pid, G, 0, Na, Ka, stride_wa, BN_A, BK_A)
    elif FIRST == 1:
        w0 = _chain_tile(wb_ptr, pid, G, 0, Nb, Kb, stride_wb, BN_B, BK_B)
    elif FIRST == 2:
        w0 = _chain_tile(wc_ptr, pid, G, 0, Nc, Kc, stride_wc, BN_C, BK_C)
    else:
        w0 = _chain_tile(wd_ptr, pid, G, 0, Nd, Kd, stride_wd, BN_D, BK_D)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    if FIRST == 0:
        _chain_phase(w0, pid, G, xa_ptr, xa_ptr, za_ptr, nwa_ptr, xa_ptr, wa_ptr, ya_ptr, Na, Ka, stride_wa, 0,
                     stride_xh, stride_zh, eps, A_PROLOGUE, DV, BN_A, BK_A)
    if FIRST <= 1 and LAST >= 1:
        if FIRST == 1:
            w1 = w0
        else:
            w1 = _chain_tile(wb_ptr, pid, G, 0, Nb, Kb, stride_wb, BN_B, BK_B)  # streams during the barrier
            _grid_barrier(sync_ptr, (1 - FIRST) * G, POLL_LIMIT, POLL_LOAD)
        _chain_phase(w1, pid, G, ya_ptr, r_ptr, ya_ptr, nwb_ptr, sb_ptr, wb_ptr, yb_ptr, Nb, Kb, stride_wb, 0,
                     0, 0, eps, 3, 1, BN_B, BK_B)   # gemm.PRO_ADD_RMS
    if FIRST <= 2 and LAST >= 2:
        if FIRST == 2:
            w2 = w0
        else:
            w2 = _chain_tile(wc_ptr, pid, G, 0, Nc, Kc, stride_wc, BN_C, BK_C)
            _grid_barrier(sync_ptr, (2 - FIRST) * G, POLL_LIMIT, POLL_LOAD)
        # SwiGLU prologue: x = [gate | up], up at offset Kc
        _chain_phase(w2, pid, G, yb_ptr, yb_ptr, yb_ptr, yb_ptr, yb_ptr, wc_ptr, yc_ptr, Nc, Kc, stride_wc, Kc,
                     0, 0, eps, 1, 1, BN_C, BK_C)   # gemm.PRO_SWIGLU
    if LAST >= 3:
        if FIRST == 3:
            w3 = w0
        else:
            w3 = _chain_tile(wd_ptr, pid, G, 0, Nd, Kd, stride_wd, BN_D, BK_D)
            _grid_barrier(sync_ptr, (3 - FIRST) * G, POLL_LIMIT, POLL_LOAD)
        _chain_phase(w3, pid, G, yc_ptr, sb_ptr, yc_ptr, nwd_ptr, sd_ptr, wd_ptr, yd_ptr, Nd, Kd, stride_wd, 0,
                     0, 0, eps, 3, 1, BN_D, BK_D)   # gemm.PRO_ADD_RMS
    if LAST > FIRST:
        # Every program has passed every barrier before it counts itself out here; the last one out resets the
        # barrier's counter for the next launch (kernel boundaries order that reset before the next launch reads it).
        out = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if out == G - 1:
            tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")


# ------------------------------------------------------------------------------------------------
# Launcher
# ------------------------------------------------------------------------------------------------


def _fail(arg: str, what: str):
    raise KernelError(f"gemv_chain (qwen_lab/kernels/chain.py): {arg} {what}")


@functools.lru_cache(maxsize=None)
def _sync(device) -> torch.Tensor:
    """The barrier's counters for one device: [arrivals, departures, gave-up flag] (int32, zeroed once)."""
    return torch.zeros(4, dtype=torch.int32, device=device)


def resident_programs(n_regs: int, num_warps: int, shared: int, props) -> int:
    """How many programs of a compiled kernel (registers per thread, warps, bytes of shared memory) one SM of a GPU
    (`torch.cuda.get_device_properties`) holds at once: registers are allocated per warp in units of 256, and
    shared memory, threads and the limit of 32 blocks per SM bound it too."""
    regs_per_warp = -(-max(n_regs, 1) * 32 // 256) * 256
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * num_warps)
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * num_warps)
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    by_smem = smem // (shared + 1024) if shared else 32   # (the driver reserves 1 KB per block)
    return max(0, min(by_regs, by_threads, by_smem, 32))


_grids: dict = {}


def check(device=None) -> None:
    """Raise KernelError if a chain launched on `device` since the last check gave up waiting at a barrier (its
    programs did not all fit on the GPU at once, so its outputs are wrong). Synchronises with the GPU."""
    sync = _sync(torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device()))
    if int(sync[2].item()):
        sync[2] = 0
        _fail("grid", "did not fit the GPU at once: a program gave up waiting at the grid barrier; "
              "lower chain.GPU_CONFIG['PERSIST']")


def gemv_chain(o, z, mixer_norm, o_proj, residual, post_norm, gate_up, down, eps, next_norm=None,
               next_proj=None, phases_apart: bool = False):
    """The projections between two mixers of a decode token, one launch on a GPU (see the module docstring).

    o: the mixer's output, [1, Hv, Dv] with z [1, Hv, Dv] and mixer_norm [Dv] (Gated DeltaNet: gated RMSNorm), or
    [1, D] with z = mixer_norm = None (attention: o as is). o_proj [H, K_o], residual [1, H], post_norm [H],
    gate_up [2I, H], down [H, I]; next_norm [H] and next_proj [N, H] (the next layer's), or both None (the last
    layer). Returns (next_proj's output [1, N], the residual after the MLP [1, H]) or, without a next layer,
    (the MLP's output [1, H], the residual before it [1, H]): the model's (y, x) either way.
    phases_apart: launch the phases one by one even on a GPU (to measure what the barriers save).
    """
    gated = z is not None
    if gated:
        if o.dim() != 3 or z.shape != o.shape or mixer_norm is None:
            _fail("o, z", f"must be [1, Hv, Dv] alike with mixer_norm [Dv]; got o {tuple(o.shape)}, "
                  f"z {tuple(z.shape)}")
        M, Hv, Dv = o.shape
        if Dv & (Dv - 1) or o.stride(-1) != 1 or z.stride(-1) != 1:
            _fail("o, z", f"need a power-of-two head dim and a contiguous last dim; got Dv = {Dv}, strides "
                  f"{o.stride()} and {z.stride()}")
        Ka = Hv * Dv
    else:
        if o.dim() != 2 or not o.is_contiguous():
            _fail("o", f"must be a contiguous [1, D] row when z is None; got {tuple(o.shape)}")
        M, Ka = o.shape
        Dv = 1
    if M != 1:
        _fail("o", f"has {M} rows; the chain serves one decode token (use the per-operator kernels for more)")
    H = residual.shape[-1]
    shapes = {"o_proj": (o_proj, (H, Ka)), "gate_up": (gate_up, (gate_up.shape[0], H)),
              "down": (down, (H, gate_up.shape[0] // 2))}
    if next_proj is not None:
        shapes["next_proj"] = (next_proj, (next_proj.shape[0], H))
    for name, (w, want) in shapes.items():
        if w.dim() != 2 or tuple(w.shape) != want or w.stride(-1) != 1:
            _fail(name, f"must be a row-major [{want[0]}, {want[1]}] matrix; got {tuple(w.shape)}, "
                  f"strides {w.stride()}")
    if gate_up.shape[0] % 2:
        _fail("gate_up", f"has {gate_up.shape[0]} rows; expected [gate; up], an even number")
    if (next_norm is None) != (next_proj is None):
        _fail("next_norm, next_proj", "must be given together (the next layer) or both be None (the last layer)")
    if residual.shape != (1, H) or not residual.is_contiguous():
        _fail("residual", f"must be a contiguous [1, {H}] row; got {tuple(residual.shape)}")
    dev, dt = o.device, o.dtype
    I2 = gate_up.shape[0]
    ya = torch.empty((1, H), device=dev, dtype=dt)
    yb = torch.empty((1, I2), device=dev, dtype=dt)
    yc = torch.empty((1, H), device=dev, dtype=dt)
    sb = torch.empty((1, H), device=dev, dtype=dt)
    has_d = next_proj is not None
    Nd = next_proj.shape[0] if has_d else 0
    yd = torch.empty((1, Nd), device=dev, dtype=dt) if has_d else yc
    sd = torch.empty((1, H), device=dev, dtype=dt) if has_d else sb
    wd, nwd = (next_proj, next_norm) if has_d else (down, post_norm)
    stride_xh = o.stride(1) if gated else 0
    stride_zh = z.stride(1) if gated else 0
    args = (o, z if gated else o, mixer_norm if gated else o, o_proj, ya, H, Ka, o_proj.stride(0),
            stride_xh, stride_zh,
            residual, post_norm, sb, gate_up, yb, I2, H, gate_up.stride(0),
            down, yc, H, I2 // 2, down.stride(0),
            nwd, sd, wd, yd, Nd, H, wd.stride(0))
    p2 = triton.next_power_of_2
    meta = dict(A_PROLOGUE=PRO_GATED if gated else PRO_NONE, DV=Dv, BK_A=p2(Ka), BK_B=p2(H), BK_C=p2(I2 // 2),
                BK_D=p2(H), POLL_LIMIT=POLL_LIMIT)
    last = 3 if has_d else 2
    interp = interpreter_active() or dev.type != "cuda"
    cfg = CPU_CONFIG if interp else GPU_CONFIG
    meta.update(zip(("BN_A", "BN_B", "BN_C", "BN_D"), cfg["BN"]), POLL_LOAD=cfg["POLL_LOAD"])
    sync = _sync(dev)
    pdl = {} if interp else pdl_options(dev)
    if interp:
        G = cfg["programs"]
    else:
        key = (dev, tuple(sorted(meta.items())), cfg["PERSIST"], cfg["num_warps"], bool(pdl))
        G = _grids.get(key)
        if G is None:  # as many programs as fit the GPU at once (the barrier's condition), up to PERSIST per SM
            compiled = gemv_chain_kernel.warmup(*args, sync, eps, FIRST=0, LAST=last, num_warps=cfg["num_warps"],
                                                grid=(1,), **meta, **pdl)
            compiled._init_handles()  # loading the binary is what reports its registers
            fit = resident_programs(compiled.n_regs, compiled.metadata.num_warps, compiled.metadata.shared,
                                    torch.cuda.get_device_properties(dev))
            if fit < 1:
                _fail("grid", f"cannot hold one program per SM ({compiled.n_regs} registers, "
                      f"{compiled.metadata.shared} bytes of shared memory)")
            G = _grids[key] = gemm.sm_count(dev) * min(cfg["PERSIST"], fit)
    if interp or phases_apart:
        for phase in range(last + 1):
            gemv_chain_kernel[(G,)](*args, sync, eps, FIRST=phase, LAST=phase, num_warps=cfg["num_warps"], **meta,
                                    **pdl)
    else:
        gemv_chain_kernel[(G,)](*args, sync, eps, FIRST=0, LAST=last, num_warps=cfg["num_warps"], **meta, **pdl)
    return (yd, sd) if has_d else (yc, sb)


__all__ = ["GPU_CONFIG", "check", "gemv_chain", "gemv_chain_kernel", "resident_programs"]
