r"""Drawing the next token on the device: greedy, temperature, top-k and top-p, with no sort and no sync.

The definition is `qwen_lab.reference.sample`. With p = softmax(logits / T), token i is kept when
    top-k (k > 0):  #{j : p_j > p_i} < k            (fewer than k tokens strictly more likely)
    top-p (p < 1):  sum{p_j : p_j > p_i} < top_p    (the strictly more likely tokens hold less than top_p)
Both conditions only get easier as p_i grows, so the kept set is {i : p_i >= tau} for one threshold tau,
and the draw is inverse-CDF in *index* order: with M the kept mass, return the first index whose running
kept mass exceeds u * M (u in [0, 1) read from a device tensor). Temperature 0 is argmax, lowest index on
ties. Neither step needs the vocabulary sorted.

How the kernels find tau without sorting V = 248320 probabilities:

- Work with e_i = exp2((x_i - max x) * log2(e) / T) in [0, 1] instead of p_i = e_i / S: the same order,
  the max token gets exactly 1, and the top-p test becomes sum{e_j > e_i} < top_p * S.
- Non-negative fp32 numbers compare like their bit patterns read as integers (the key), and e <= 1 uses
  only the low 30 bits. Radix select fixes tau's key from the top, NBITS bits per round (on a GPU 6 rounds
  of 5 bits). In a round every program takes the tokens of its block whose key starts with the bits fixed
  so far, and builds a histogram of their next NBITS bits: a count and a mass (sum of e) per bin. Scanning
  the bins from the top, the boundary bin is the lowest non-empty one whose largest token is still kept:
      n_above + count(higher bins) < k   and   m_above + mass(higher bins) < top_p * S,
  where n_above, m_above count the tokens already known to lie above. Its bits are appended to tau's key,
  and the tokens of the higher bins join n_above, m_above. After 30 bits, tau is the exact key of the
  smallest kept token (ties share a key, so they stay together, as the definition wants).
- Most draws need fewer rounds: once every token of the boundary bin is kept (it holds one token, or even
  its smallest token passes the tests: n_above + count(bin and higher) - 1 < k and
  m_above + mass(bin and higher) < top_p * S), tau can be the bin's lowest key: the kept set is the same.
  That round marks the search done, and the remaining rounds' kernels return at once. Under a peaked
  distribution two or three rounds decide; a CUDA Graph still launches all six, but a finished one costs
  only its launch.
- The draw: each program sums the kept mass of its block; a block prefix finds the block where the running
  mass crosses u * M, and a scan inside that one block finds the index.

Launches: greedy 1; temperature alone 2 (max, draw); with top-k or top-p 2 + rounds (8 on a GPU). Each
kernel ends with the "last program" pattern: every program writes its partial result, then takes a ticket
from an atomic counter; the program that draws the last ticket sees all partials, reduces them, writes the
decision for the next kernel and resets the counter. No host synchronisation anywhere: a CUDA Graph can
capture the whole draw with its workspace.

Numerics: masses in fp64 (sums of up to 248320 fp32 values, in a fixed order: the result is the same at
every run, and the kept set and the draw agree with the fp32 reference except when u * M or a top-p
boundary falls within rounding distance, ~1e-7 of the mass, of a token edge).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...errors import KernelError
from .. import pdl_options
from .. import sampling as family
from .tuning import _Config, _config

KEY_BITS = 30          # keys of e in [0, 1]: bit patterns 0 .. 0x3F800000 < 2^30
LOG2E = 1.4426950408889634
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38    # the smallest normal float32


@triton.jit
def sample_max_kernel(logits_ptr, V, stride,
                      pmax_ptr, parg_ptr, counter_ptr, mx_ptr, out_ptr,
                      NB, BLOCK: tl.constexpr, NB_P2: tl.constexpr, USE_PDL: tl.constexpr = False):
    """Per block: max and argmax (lowest index on ties). The last program: the global ones.
    Writes the max logit for the next kernels and the argmax into out (the greedy answer)."""
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + offs.to(tl.int64) * stride, mask=offs < V, other=float("-inf")).to(tl.float32)
    tl.store(pmax_ptr + pid, tl.max(x, axis=0))
    tl.store(parg_ptr + pid, tl.argmax(x, axis=0, tie_break_left=True) + pid * BLOCK)
    # The "last program" pattern: finish every thread's stores, then one atomic both publishes them
    # (release) and tells this program how many got here first (acquire).
    tl.debug_barrier()
    if tl.atomic_add(counter_ptr, 1, sem="acq_rel") == NB - 1:
        b = tl.arange(0, NB_P2)
        pm = tl.load(pmax_ptr + b, mask=b < NB, other=float("-inf"), cache_modifier=".cg")
        pa = tl.load(parg_ptr + b, mask=b < NB, other=0, cache_modifier=".cg")
        # blocks are in index order, so the lowest block holding the max holds the lowest index
        first = tl.argmax(pm, axis=0, tie_break_left=True)
        tl.store(mx_ptr, tl.max(pm, axis=0))
        tl.store(out_ptr, tl.sum(tl.where(b == first, pa, 0), axis=0).to(tl.int64))
        tl.store(counter_ptr, 0)                          # ready for the next kernel, or graph replay


@triton.jit
def sample_round_kernel(logits_ptr, V, stride, scale, top_k, top_p,
                        mx_ptr, hcount_ptr, hmass_ptr, state_i_ptr, state_f_ptr, counter_ptr,
                        NB, ROUND: tl.constexpr, USE_K: tl.constexpr, USE_P: tl.constexpr,
                        NBITS: tl.constexpr, KEY_BITS: tl.constexpr, SKIP_DEAD: tl.constexpr,
                        BLOCK: tl.constexpr, CHUNK: tl.constexpr, NB_P2: tl.constexpr, USE_PDL: tl.constexpr = False):
    """One radix-select round: fix the next NBITS bits of tau's key, unless an earlier round finished the search.
    state_i: [0] tau's key so far (all KEY_BITS of it once done), [1] tokens above, [2] done (0 / 1)."""
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    SHIFT: tl.constexpr = KEY_BITS - NBITS * (ROUND + 1)
    pid = tl.program_id(0)
    mx = tl.load(mx_ptr)
    if ROUND == 0:
        prefix = 0
        go = True
    else:   # (three independent loads, issued together)
        prefix = tl.load(state_i_ptr).to(tl.int32)
        go = tl.load(state_i_ptr + 2) == 0    # round 0 always writes the flag: no reset is needed between draws
    if go:
        _round(logits_ptr, V, stride, scale, top_k, top_p, mx, prefix, hcount_ptr, hmass_ptr, state_i_ptr,
               state_f_ptr, counter_ptr, pid, NB, ROUND, USE_K, USE_P, NBITS, SHIFT, SKIP_DEAD, BLOCK, CHUNK, NB_P2)


@triton.jit
def _round(logits_ptr, V, stride, scale, top_k, top_p, mx, prefix,
           hcount_ptr, hmass_ptr, state_i_ptr, state_f_ptr, counter_ptr,
           pid, NB, ROUND: tl.constexpr, USE_K: tl.constexpr, USE_P: tl.constexpr,
           NBITS: tl.constexpr, SHIFT: tl.constexpr, SKIP_DEAD: tl.constexpr,
           BLOCK: tl.constexpr, CHUNK: tl.constexpr, NB_P2: tl.constexpr):
    NBINS: tl.constexpr = 1 << NBITS
    bins = tl.arange(0, NBINS)
    # 2-D accumulators, reduced once after the loop: adding a [CHUNK, NBINS] tile needs no traffic
    # between threads, reducing it at every chunk would.
    acc_n = tl.zeros((CHUNK, NBINS), dtype=tl.int32)
    acc_m = tl.zeros((CHUNK, NBINS), dtype=tl.float64)
    for c in range(0, BLOCK, CHUNK):
        offs = pid * BLOCK + c + tl.arange(0, CHUNK)
        valid = offs < V
        x = tl.load(logits_ptr + offs.to(tl.int64) * stride, mask=valid, other=float("-inf")).to(tl.float32)
        # subtract first, then scale: the max token gets exactly 1 and every kernel derives
        # bit-identical keys (a fused multiply-add could round differently in different kernels)
        e = tl.exp2((x - mx) * scale)
        key = e.to(tl.int32, bitcast=True)
        live = valid & ((key >> (SHIFT + NBITS)) == prefix)       # tokens whose key starts with prefix
        if SKIP_DEAD and ROUND > 0:   # after round 0 most chunks hold no token in play: one reduction spares them
            todo = tl.max(live.to(tl.int32), axis=0) > 0
        else:
            todo = True
        if todo:
            hit = live[:, None] & (((key >> SHIFT) & (NBINS - 1))[:, None] == bins[None, :])
            acc_n += hit.to(tl.int32)
            if USE_P:
                acc_m += tl.where(hit, e.to(tl.float64)[:, None], 0.0)
    tl.store(hcount_ptr + pid * NBINS + bins, tl.sum(acc_n, axis=0))
    if USE_P:
        tl.store(hmass_ptr + pid * NBINS + bins, tl.sum(acc_m, axis=0))

    tl.debug_barrier()
    if tl.atomic_add(counter_ptr, 1, sem="acq_rel") == NB - 1:
        rows = tl.arange(0, NB_P2)
        tile = rows[:, None] * NBINS + bins[None, :]
        rmask = (rows < NB)[:, None]
        count = tl.sum(tl.load(hcount_ptr + tile, mask=rmask, other=0, cache_modifier=".cg"), axis=0).to(tl.int64)
        count_gt = tl.cumsum(count, axis=0, reverse=True) - count      # tokens in play in higher bins
        if ROUND == 0:
            n_above = tl.zeros((), dtype=tl.int64)
            m_above = tl.zeros((), dtype=tl.float64)
        else:
            n_above = tl.load(state_i_ptr + 1)
            m_above = tl.load(state_f_ptr + 1)
        # the boundary bin: the lowest non-empty bin whose largest token is still kept
        ok = count > 0
        if USE_K:
            ok = ok & (n_above + count_gt < top_k)
        if USE_P:
            mass = tl.sum(tl.load(hmass_ptr + tile, mask=rmask, other=0.0, cache_modifier=".cg"), axis=0)
            mass_ge = tl.cumsum(mass, axis=0, reverse=True)
            mass_gt = mass_ge - mass
            if ROUND == 0:
                total = tl.max(mass_ge, axis=0)                  # every token is in play in round 0
                tl.store(state_f_ptr, total)
            else:
                total = tl.load(state_f_ptr)
            ok = ok & (m_above + mass_gt < total * top_p)
        d0 = tl.minimum(tl.min(tl.where(ok, bins, NBINS), axis=0), NBINS - 1)
        sel = bins == d0
        n_gt = n_above + tl.sum(tl.where(sel, count_gt, 0), axis=0)   # tokens above the boundary bin
        n_bin = tl.sum(tl.where(sel, count, 0), axis=0)
        # is the whole boundary bin kept (see the module's docstring)? Then tau is its lowest key, and done
        all_pass = n_bin > 0
        if USE_K:
            all_pass = all_pass & (n_gt + n_bin - 1 < top_k)
        if USE_P:
            m_gt = m_above + tl.sum(tl.where(sel, mass_gt, 0.0), axis=0)
            all_pass = all_pass & (m_gt + tl.sum(tl.where(sel, mass, 0.0), axis=0) < total * top_p)
        whole = (n_bin == 1) | all_pass   # a bin of one token holds the boundary token itself, which is kept
        tau_key = ((prefix << NBITS) | d0).to(tl.int64)
        tl.store(state_i_ptr, tl.where(whole, tau_key << SHIFT, tau_key))
        tl.store(state_i_ptr + 1, n_gt)
        tl.store(state_i_ptr + 2, whole.to(tl.int64))
        if USE_P:
            tl.store(state_f_ptr + 1, m_gt)
        tl.store(counter_ptr, 0)


@triton.jit
def sample_draw_kernel(logits_ptr, V, stride, scale,
                       mx_ptr, u_ptr, state_i_ptr, kmass_ptr, klast_ptr, counter_ptr, out_ptr,
                       NB, USE_TAU: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                       NB_P2: tl.constexpr, USE_PDL: tl.constexpr = False):
    """Kept mass and last kept index per block; the last program finds the block, then the index,
    where the running kept mass first exceeds u * M."""
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    mx = tl.load(mx_ptr)
    if USE_TAU:
        tau = tl.load(state_i_ptr).to(tl.int32)
    else:
        tau = 0                                                 # temperature only: every token is kept
    acc = tl.zeros((CHUNK,), dtype=tl.float64)
    last = tl.full((CHUNK,), -1, dtype=tl.int32)
    for c in range(0, BLOCK, CHUNK):
        offs = pid * BLOCK + c + tl.arange(0, CHUNK)
        valid = offs < V
        x = tl.load(logits_ptr + offs.to(tl.int64) * stride, mask=valid, other=float("-inf")).to(tl.float32)
        e = tl.exp2((x - mx) * scale)
        kept = valid & (e.to(tl.int32, bitcast=True) >= tau)
        acc += tl.where(kept, e.to(tl.float64), 0.0)
        last = tl.maximum(last, tl.where(kept, offs, -1))
    tl.store(kmass_ptr + pid, tl.sum(acc, axis=0))
    tl.store(klast_ptr + pid, tl.max(last, axis=0))

    tl.debug_barrier()
    if tl.atomic_add(counter_ptr, 1, sem="acq_rel") == NB - 1:
        b = tl.arange(0, NB_P2)
        km = tl.load(kmass_ptr + b, mask=b < NB, other=0.0, cache_modifier=".cg")
        kl = tl.load(klast_ptr + b, mask=b < NB, other=-1, cache_modifier=".cg")
        incl = tl.cumsum(km, axis=0)
        target = tl.load(u_ptr).to(tl.float32).to(tl.float64) * tl.max(incl, axis=0)   # u * M
        blk = tl.min(tl.where((incl > target) & (b < NB), b, NB_P2), axis=0)
        found_blk = blk < NB
        blk = tl.minimum(blk, NB - 1)
        sel = b == blk
        # the whole block in one scan: one cumsum instead of a loop of small ones
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        valid = offs < V
        x = tl.load(logits_ptr + offs.to(tl.int64) * stride, mask=valid, other=float("-inf")).to(tl.float32)
        e = tl.exp2((x - mx) * scale)
        kept = valid & (e.to(tl.int32, bitcast=True) >= tau)
        run = tl.sum(tl.where(sel, incl - km, 0.0), axis=0) + tl.cumsum(tl.where(kept, e.to(tl.float64), 0.0), axis=0)
        hit = tl.min(tl.where(kept & (run > target), offs, 2147483647), axis=0)
        # rounding can leave u * M at or past the last edge of a block, or of the whole kept set:
        # then the last kept token, as the reference does
        idx = tl.where(hit < 2147483647, hit, tl.sum(tl.where(sel, kl, 0), axis=0))
        idx = tl.where(found_blk, idx, tl.max(kl, axis=0))
        tl.store(out_ptr, idx.to(tl.int64))
        tl.store(counter_ptr, 0)


# ---------------------------------------------------------------- launcher

def _f32(v: float) -> float:
    """v rounded to float32 on the host: the value a GPU kernel receives, so the interpreter sees it too."""
    return struct.unpack("f", struct.pack("f", v))[0]


@dataclass
class SamplingWorkspace:
    """Scratch of `sample` for one vocabulary size and device; reusable across calls (a CUDA Graph
    owns one). The counter must start at 0 and every kernel leaves it at 0."""
    vocab_size: int
    config: _Config
    counter: torch.Tensor      # int32 [1]
    mx: torch.Tensor           # fp32 [1]: the max logit
    pmax: torch.Tensor         # fp32 [NB]
    parg: torch.Tensor         # int32 [NB]
    hcount: torch.Tensor       # int32 [NB, 2^nbits]
    hmass: torch.Tensor        # fp64 [NB, 2^nbits]
    state_i: torch.Tensor      # int64 [3]: tau's key so far, tokens above, search done
    state_f: torch.Tensor      # fp64 [2]: total mass S, mass above
    kmass: torch.Tensor        # fp64 [NB]
    klast: torch.Tensor        # int32 [NB]


def sampling_workspace(vocab_size: int, device) -> SamplingWorkspace:
    """Allocate the scratch buffers `sample` needs for logits of `vocab_size` on `device`."""
    cfg = _config(vocab_size)
    nb, nbins = triton.cdiv(vocab_size, cfg.block), 1 << cfg.nbits
    dev = torch.device(device)
    return SamplingWorkspace(
        vocab_size=vocab_size, config=cfg,
        counter=torch.zeros(1, dtype=torch.int32, device=dev),
        mx=torch.empty(1, dtype=torch.float32, device=dev),
        pmax=torch.empty(nb, dtype=torch.float32, device=dev),
        parg=torch.empty(nb, dtype=torch.int32, device=dev),
        hcount=torch.empty(nb, nbins, dtype=torch.int32, device=dev),
        hmass=torch.empty(nb, nbins, dtype=torch.float64, device=dev),
        state_i=torch.empty(3, dtype=torch.int64, device=dev),
        state_f=torch.empty(2, dtype=torch.float64, device=dev),
        kmass=torch.empty(nb, dtype=torch.float64, device=dev),
        klast=torch.empty(nb, dtype=torch.int32, device=dev),
    )


def _check_args(logits, temperature, top_k, top_p, uniform, out):
    fn = "sample"
    if not isinstance(logits, torch.Tensor) or logits.dim() != 1 or not logits.is_floating_point():
        raise KernelError(f"{fn}: logits must be a 1-D float tensor [V], got "
                          f"{tuple(getattr(logits, 'shape', ()))} {getattr(logits, 'dtype', type(logits).__name__)}")
    if logits.numel() == 0:
        raise KernelError(f"{fn}: logits is empty; expected [V] with V >= 1")
    if logits.numel() >= 2**31 - 1:
        raise KernelError(f"{fn}: V = {logits.numel()} does not fit the kernels' int32 indices")
    if isinstance(temperature, torch.Tensor) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise KernelError(f"{fn}: temperature must be a finite Python number >= 0 (0 = greedy), got {temperature!r}")
    if temperature > 0 and not LOG2E / temperature < FLOAT32_MAX:
        raise KernelError(f"{fn}: temperature={temperature!r} is too small for float32 math; use 0 for greedy")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise KernelError(f"{fn}: top_k must be a Python int >= 0 (0 = off), got {top_k!r}")
    if isinstance(top_p, torch.Tensor) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise KernelError(f"{fn}: top_p must be a Python number in (0, 1] (1 = off), got {top_p!r}")
    if temperature > 0:
        if not isinstance(uniform, torch.Tensor) or uniform.numel() != 1 or not uniform.is_floating_point():
            got = f"{tuple(getattr(uniform, 'shape', ()))} {getattr(uniform, 'dtype', type(uniform).__name__)}"
            raise KernelError(f"{fn}: uniform must be a one-element float tensor in [0, 1) on the device, got {got}")
        if uniform.device != logits.device:
            raise KernelError(f"{fn}: uniform is on {uniform.device} but logits are on {logits.device}")
    if out is not None and (not isinstance(out, torch.Tensor) or out.numel() != 1 or out.dtype != torch.int64
                            or out.device != logits.device):
        raise KernelError(f"{fn}: out must be a one-element int64 tensor on {logits.device}, got "
                          f"{tuple(getattr(out, 'shape', ()))} {getattr(out, 'dtype', None)} "
                          f"on {getattr(out, 'device', None)}")


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, uniform: torch.Tensor,
           out: torch.Tensor | None = None, workspace: SamplingWorkspace | None = None) -> torch.Tensor:
    """Draw one token id from logits [V] (see `qwen_lab.reference.sample` for the exact rules).

    temperature 0 = greedy (argmax, lowest index on ties; `uniform` is not read). top_k 0 and top_p 1
    switch those filters off. temperature, top_k and top_p are Python numbers (fixed for a generation);
    `uniform` is a one-element float tensor in [0, 1) on the logits' device, read by the kernel.
    Returns a 0-d int64 tensor on the device, or writes into `out` (one int64 element) and returns it.
    `workspace` (from `sampling_workspace(V, device)`) holds the scratch; pass one to reuse it across calls
    and inside a CUDA Graph; by default it is allocated here. Nothing synchronises with the host.
    Logits must have a finite maximum (NaN or +inf logits give an undefined token).
    """
    _check_args(logits, temperature, top_k, top_p, uniform, out)
    V = logits.numel()
    device = logits.device
    if workspace is None:  # (through the family: a sampling_workspace put there, as a test's counter, is called)
        workspace = family.sampling_workspace(V, device)
    elif not isinstance(workspace, SamplingWorkspace) or workspace.vocab_size != V \
            or workspace.counter.device != device or workspace.config != _config(V):
        got = type(workspace).__name__
        if isinstance(workspace, SamplingWorkspace):
            got += f" for V={workspace.vocab_size} on {workspace.counter.device}"
        raise KernelError(f"sample: workspace must come from sampling_workspace({V}, '{device}') for these logits, "
                          f"got {got}")
    if out is None:
        out = torch.empty((), dtype=torch.int64, device=device)
    ws, cfg = workspace, workspace.config
    nb = triton.cdiv(V, cfg.block)
    nb_p2 = max(2, triton.next_power_of_2(nb))
    stride = logits.stride(0)
    grid = (nb,)
    pdl = pdl_options(device)
    sample_max_kernel[grid](logits, V, stride, ws.pmax, ws.parg, ws.counter, ws.mx, out,
                            nb, BLOCK=cfg.block, NB_P2=nb_p2, num_warps=cfg.warps, **pdl)
    if temperature == 0:
        return out
    scale = _f32(LOG2E / float(temperature))
    use_k = 0 < top_k < V
    use_p = top_p < 1.0
    top_p32 = max(_f32(top_p), FLOAT32_TINY)     # a positive top_p keeps the argmax even below float32's range
    for r in range(KEY_BITS // cfg.nbits if (use_k or use_p) else 0):
        sample_round_kernel[grid](logits, V, stride, scale, top_k, top_p32,
                                  ws.mx, ws.hcount, ws.hmass, ws.state_i, ws.state_f, ws.counter,
                                  nb, ROUND=r, USE_K=use_k, USE_P=use_p, NBITS=cfg.nbits, KEY_BITS=KEY_BITS,
                                  SKIP_DEAD=cfg.skip_dead, BLOCK=cfg.block, CHUNK=cfg.chunk, NB_P2=nb_p2,
                                  num_warps=cfg.warps, **pdl)
    sample_draw_kernel[grid](logits, V, stride, scale, ws.mx, uniform, ws.state_i, ws.kmass, ws.klast,
                             ws.counter, out, nb, USE_TAU=use_k or use_p, BLOCK=cfg.block, CHUNK=cfg.chunk,
                             NB_P2=nb_p2, num_warps=cfg.warps, **pdl)
    return out


__all__ = ["SamplingWorkspace", "sample", "sample_draw_kernel", "sample_max_kernel", "sample_round_kernel",
           "sampling_workspace"]
