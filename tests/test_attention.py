"""Attention kernels (the qwen_lab.kernels.attention package) against qwen_lab.reference.

CPU: the Triton interpreter in float32 on small shapes (GQA ratios 1, 2, 3, 4; head_dim 32 and 24/48;
T in 1, 7, 64, 100; caches larger than the prompt; positions not starting at 0).
GPU (marked): bf16 on Qwen3.5-0.8B shapes (8 query heads, 2 KV heads, head_dim 256), prefill of 2048 and
8192 tokens, decode over 1, 2k and 8k cached tokens.
"""

import pytest
import torch

import triton.testing

from qwen_lab import KernelError, reference, runtime
from qwen_lab.course import checks
from qwen_lab.config import QWEN35_0_8B
from qwen_lab.kernels import attention as A
from qwen_lab.kernels import count_launches
from qwen_lab.kernels.attention import decode as attn_decode
from qwen_lab.kernels.attention import prefill as attn_prefill
from qwen_lab.kernels.attention import tuning as attn_tuning


def _randn(gen, rt, *shape, scale=1.0):
    return checks.randn(*shape, g=gen, dtype=rt.dtype, device=rt.device, scale=scale)


def _problem(gen, rt, T, Hq, Hkv, D, L, offset):
    """q as a strided view of a fused [q | gate] projection (like the model's), a cache of capacity L."""
    fused = _randn(gen, rt, T, Hq, 2 * D)
    q, gate = fused[:, :, :D], fused[:, :, D:]
    k = _randn(gen, rt, L, Hkv, D)
    v = _randn(gen, rt, L, Hkv, D)
    pos = torch.arange(offset, offset + T, device=rt.device)
    return q, gate, k, v, pos


# (T, Hq, Hkv, D, cache capacity L, first position)
PREFILL = [
    (7, 4, 4, 32, 7, 0),        # GQA ratio 1, the prompt's own k/v
    (64, 4, 2, 32, 80, 0),      # ratio 2, cache larger than the prompt
    (100, 8, 2, 32, 130, 13),   # ratio 4 (Qwen3.5's), ragged T, positions after a cached prefix
    (7, 6, 2, 24, 20, 5),       # ratio 3 (not a power of two), head_dim 24 (not a power of two)
]
DECODE = [
    (4, 2, 32, 16, 0),          # the first token: one key
    (8, 2, 32, 200, 40),        # a short context in a larger cache: most splits past the length
    (8, 2, 48, 150, 149),       # the cache full, head_dim 48
    (2, 2, 32, 64, 63),         # ratio 1
]


@pytest.mark.parametrize("T,Hq,Hkv,D,L,offset", PREFILL)
def test_prefill_attention_matches_reference(rt, gen, T, Hq, Hkv, D, L, offset):
    q, _, k, v, pos = _problem(gen, rt, T, Hq, Hkv, D, L, offset)
    with count_launches() as launches:
        out = A.attention(q, k, v, pos)
    assert sum(launches.values()) == 1, f"one fused kernel, got {dict(launches)}"
    checks.compare("flash attention", out, reference.attention(q, k, v, pos))


def _prefill_configs():
    """The GPU autotuner's prefill configs, pointer and TMA loads; under the interpreter (which ignores warps and
    stages) one per set of block sizes."""
    configs = A._PREFILL_CONFIGS + A._PREFILL_TMA_CONFIGS + A._SMALL_SMEM_PREFILL_CONFIGS
    if runtime.interpreter_active():
        configs = list({str(sorted(c.kwargs.items())): c for c in configs}.values())
    return configs


_kv_descriptors = attn_prefill._kv_descriptors  # the launcher's, wrapped by the test below to see when it runs


@pytest.mark.parametrize("config", _prefill_configs(), ids=str)
def test_prefill_every_gpu_config(rt, gen, monkeypatch, switch, config):
    """Each config forced in turn, with the fused gate: 100 tokens after a cached prefix (7 ragged tiles), 64 tokens
    at GQA ratio 2 and a ratio-3 layout with head_dim 24 (one tile)."""
    switch.force("flash_attention_kernel", config)
    described = []
    monkeypatch.setattr(attn_prefill, "_kv_descriptors",
                        lambda k, v: described.append(k.shape) or _kv_descriptors(k, v))
    for shape in (PREFILL[2], PREFILL[1], PREFILL[3]):
        q, gate, k, v, pos = _problem(gen, rt, *shape)
        checks.compare(f"flash attention {config} {shape}", A.attention(q, k, v, pos, gate=gate),
                       reference.sigmoid_gate(reference.attention(q, k, v, pos), gate))
    # a TMA config takes the descriptors where the layout allows them (head_dim a power of two), not for head_dim 24
    assert len(described) == (2 if config.kwargs.get("TMA") else 0), described


def test_prefill_small_tiles_only_on_gpus_with_little_shared_memory(rt, gen, monkeypatch):
    """The one-stage 32-row tiles are timed only where a program has less than SMALL_SHARED_MEMORY (an L4's 99 KB),
    where most of the others do not fit, and alone on a T4 (64 KB), where none of the others does; an A100 or an
    H100 times the others alone."""
    small = A._SMALL_SMEM_PREFILL_CONFIGS
    assert small and all(c.kwargs["BLOCK_M"] == 32 and c.num_stages == 1 for c in small)
    every = A._PREFILL_CONFIGS + small
    q = _problem(gen, rt, 7, 4, 2, 32, 40, 0)[0]
    seen = []
    for smem, want in ((65536, small), (101376, every), (166912, A._PREFILL_CONFIGS), (232448, A._PREFILL_CONFIGS)):
        monkeypatch.setattr(attn_tuning, "max_shared_memory", lambda device, smem=smem: seen.append(device) or smem)
        got = attn_tuning._prune_prefill_configs(every, {"q_ptr": q}, TMA_OK=False)
        assert got == want, f"{smem} bytes per program"
    assert set(seen) == {q.device}, "the pruning must ask about the GPU the call runs on"


def test_prefill_tma_configs_only_where_asked_for_and_allowed(rt, gen, monkeypatch):
    """The TMA configs are timed only for calls that allow them (TMA_OK), which takes QWEN_LAB_ATTN_TMA=1 and an sm_90+
    GPU besides the cache's layout; a forced TMA config (tests, probes) needs only the layout."""
    tma = A._PREFILL_TMA_CONFIGS
    assert tma and all(c.kwargs["TMA"] for c in tma)
    every = A._PREFILL_CONFIGS + tma
    _, _, k, v, _ = _problem(gen, rt, 7, 4, 2, 32, 40, 0)
    monkeypatch.setattr(attn_tuning, "max_shared_memory", lambda device: 232448)   # an H100 / H200
    assert attn_tuning._prune_prefill_configs(every, {"q_ptr": k}, TMA_OK=False) == A._PREFILL_CONFIGS
    assert attn_tuning._prune_prefill_configs(every, {"q_ptr": k}, TMA_OK=True) == every
    monkeypatch.setenv("QWEN_LAB_ATTN_TMA", "1")
    assert attn_prefill._kv_tma_ok(k, v, 32) == (rt.device.type == "cuda" and not runtime.interpreter_active()
                                      and k.element_size() == 2 and torch.cuda.get_device_capability()[0] >= 9)
    monkeypatch.setenv("QWEN_LAB_ATTN_TMA", "0")
    assert not attn_prefill._kv_tma_ok(k, v, 32)
    assert attn_prefill._kv_tma_ok(k, v, 32, forced=True)
    assert not attn_prefill._kv_tma_ok(k, v, 64, forced=True)                  # D must fill BLOCK_D
    assert attn_prefill._kv_tma_ok(k[:, 1:], v[:, 1:], 32, forced=True)         # one head of two: rows [D] in [L, 2D]
    assert not attn_prefill._kv_tma_ok(k[..., :16], v[..., :16], 16, forced=True)  # half of each head: not [L, Hkv D]
    assert not attn_prefill._kv_tma_ok(k.transpose(0, 1), v, 32, forced=True)  # heads not side by side


def test_the_kv_descriptors_take_each_configs_tile(gen, monkeypatch):
    """The launcher makes K and V's descriptors once per call; the kernel's pre-run hook gives them each configuration's
    tile [BLOCK_N, BLOCK_D] before it is timed or launched. The hook runs here on the arguments of a launch."""
    assert attn_prefill._fit_kv_descriptors in A.flash_attention_kernel.pre_run_hooks
    k = torch.zeros(40, 2, 256, dtype=torch.bfloat16)
    k_desc, v_desc = attn_prefill._kv_descriptors(k, k.clone())
    assert k_desc.shape == [40, 512] and k_desc.strides == [512, 1]
    names = A.flash_attention_kernel.arg_names
    for config in A._PREFILL_TMA_CONFIGS:
        args = [None] * len(names)
        args[names.index("k_desc")], args[names.index("v_desc")] = k_desc, v_desc
        attn_prefill._fit_kv_descriptors(*args, BLOCK_D=256, **config.kwargs)
        assert k_desc.block_shape == v_desc.block_shape == [config.kwargs["BLOCK_N"], 256]


def test_prefill_autotuners_time_in_a_graph_after_a_synchronisation(monkeypatch):
    """The prefill autotuners (flash attention, the tiled GEMM) time with do_bench_cudagraph, which runs on a stream
    of its own: the caller's pending kernels must finish first (on the H200 a T = 8192 test failed without it: the
    timed calls wrote into memory the caller's kernels were still using). Host logic only: the two calls are
    recorded, not run."""
    from qwen_lab import kernels
    from qwen_lab.kernels import gemm

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("synchronize"))
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph",
                        lambda fn, rep, quantiles: calls.append("do_bench_cudagraph") or 1.0)
    assert kernels.graph_bench(lambda: None, None) == 1.0
    assert calls == ["synchronize", "do_bench_cudagraph"]
    assert attn_prefill._prefill_kernel()._do_bench is kernels.graph_bench
    assert gemm.matmul_kernel._do_bench is kernels.graph_bench


DECODE_LAUNCHES = {"flash_decode_split_kernel": 1, "flash_decode_combine_kernel": 1}


@pytest.mark.parametrize("Hq,Hkv,D,L,pos", DECODE)
def test_decode_attention_matches_reference(rt, gen, Hq, Hkv, D, L, pos):
    q, _, k, v, positions = _problem(gen, rt, 1, Hq, Hkv, D, L, pos)
    with count_launches() as launches:
        out = A.attention(q, k, v, positions)
    assert dict(launches) == DECODE_LAUNCHES
    checks.compare("flash decoding", out, reference.attention(q, k, v, positions))


# (Hq, Hkv, D, cache capacity L, [positions]): ragged lengths (not multiples of the key block or of the chunk),
# one key, a length short of a chunk boundary, the full cache; splits that see no key at short lengths
RAGGED = [
    (8, 2, 32, 100, [0, 1, 17, 50, 99]),
    (6, 2, 24, 70, [2, 33, 69]),
]


@pytest.mark.parametrize("Hq,Hkv,D,L,lengths", RAGGED)
@pytest.mark.parametrize("splits", [2, 5, 7])
def test_decode_on_ragged_lengths_back_to_back(rt, gen, Hq, Hkv, D, L, lengths, splits):
    """The decode path at several split counts over ragged cache lengths, run twice back to back on the same
    buffers at each length (as one layer's attention repeated, or a graph replayed): the second call must give
    the same output; launch count per call checked."""
    fused = _randn(gen, rt, 1, Hq, 2 * D)
    q, gate = fused[:, :, :D], fused[:, :, D:]
    k, v = _randn(gen, rt, L, Hkv, D), _randn(gen, rt, L, Hkv, D)
    pos = torch.zeros(1, dtype=torch.long, device=rt.device)
    out = checks.poison_(torch.empty_like(q))
    ws = checks.poison_(A.decode_workspace(q, k, num_splits=splits))
    for p in lengths:
        pos.fill_(p)
        ref = reference.attention(q, k, v, pos, gate=gate)
        for call in range(2):
            out.fill_(float("nan"))
            with count_launches() as launches:
                A.attention(q, k, v, pos, out=out, gate=gate, num_splits=splits, workspace=ws)
            assert dict(launches) == DECODE_LAUNCHES
            checks.compare(f"decode over {p + 1} keys, {splits} splits, call {call + 1}", out, ref)


@pytest.mark.parametrize("splits", [1, 3, 16])
def test_decode_any_split_count_gives_the_same_result(rt, gen, splits):
    q, _, k, v, positions = _problem(gen, rt, 1, 4, 2, 32, 90, 70)
    ws = checks.poison_(A.decode_workspace(q, k, num_splits=splits))
    out = checks.poison_(torch.empty_like(q))
    result = A.attention(q, k, v, positions, out=out, num_splits=splits, workspace=ws)
    assert result.data_ptr() == out.data_ptr()
    checks.compare(f"decode with {splits} splits", out, reference.attention(q, k, v, positions))


def test_decode_split_count_is_a_runtime_value_tuned_by_its_power_of_two():
    """A cache's capacity sets the split count (decode_splits). As a constexpr, each new capacity a generation
    brings (prompt + new tokens) would compile the split kernel again and tune it again; as a runtime value with
    the autotuner keyed on its power of two, a new capacity compiles nothing new (beyond Triton's variants for an
    integer equal to 1 or a multiple of 16) and similar sizes share one tuning."""
    import inspect

    for kernel in (A.flash_decode_split_kernel, A.flash_decode_combine_kernel):
        params = inspect.signature(kernel.fn).parameters   # (annotations as written: the module defers them)
        assert "num_splits" in params and params["num_splits"].annotation is inspect.Parameter.empty, (
            f"{kernel.fn.__name__}: num_splits should be a runtime argument, not a constexpr")
        assert "constexpr" in str(params["D"].annotation)   # (what a constexpr looks like here)
    assert "splits_p2" in attn_decode._decode_kernel().keys and "num_splits" not in attn_decode._decode_kernel().keys


def test_decode_after_prefill_through_the_cache(rt, gen):
    """Prefill 9 tokens into an empty cache, then decode 3 more one by one; each step against the reference."""
    Hq, Hkv, D, L = 4, 2, 32, 48
    k_cache = torch.zeros(L, Hkv, D, dtype=rt.dtype, device=rt.device)
    v_cache = torch.zeros_like(k_cache)
    q_all = _randn(gen, rt, 12, Hq, D)
    k_all, v_all = _randn(gen, rt, 12, Hkv, D), _randn(gen, rt, 12, Hkv, D)
    pos = torch.arange(9, device=rt.device)
    A.kv_cache_write(k_cache, v_cache, k_all[:9], v_all[:9], pos)
    checks.compare("prefill", A.attention(q_all[:9], k_cache, v_cache, pos),
                   reference.attention(q_all[:9], k_all[:9], v_all[:9], pos))
    step_pos = torch.zeros(1, dtype=torch.long, device=rt.device)
    out = torch.empty(1, Hq, D, dtype=rt.dtype, device=rt.device)
    ws = A.decode_workspace(out, k_cache)
    for t in range(9, 12):
        step_pos.fill_(t)  # the same tensors every step, as a graph replays them
        A.kv_cache_write(k_cache, v_cache, k_all[t:t + 1], v_all[t:t + 1], step_pos)
        A.attention(q_all[t:t + 1], k_cache, v_cache, step_pos, out=out, workspace=ws)
        checks.compare(f"decode step {t}", out, reference.attention(q_all[:t + 1], k_all[:t + 1], v_all[:t + 1],
                                                                    torch.arange(t + 1, device=rt.device))[t:])


@pytest.mark.parametrize("T", [1, 7])
def test_attention_with_fused_gate(rt, gen, T):
    q, gate, k, v, pos = _problem(gen, rt, T, 8, 2, 32, 40, 30)
    out = A.attention(q, k, v, pos, gate=gate)
    checks.compare("attention + gate", out, reference.sigmoid_gate(reference.attention(q, k, v, pos), gate))


@pytest.mark.parametrize("T", [6, 7])
def test_long_prompts_apply_the_gate_apart(rt, gen, T, switch):
    """From switches.gate_apart_from_tokens tokens the gate runs as its own pass over the output, in place: the same values,
    one launch more; below it, the epilogue (one launch). The gate is a strided view, as the model's is."""
    switch(gate_apart_from_tokens=7)
    q, gate, k, v, pos = _problem(gen, rt, T, 8, 2, 32, 40, 30)
    out = checks.poison_(torch.empty_like(q))
    with count_launches() as launches:
        got = A.attention(q, k, v, pos, out=out, gate=gate)
    assert got is out
    want = {"flash_attention_kernel": 1, "sigmoid_gate_kernel": 1} if T >= 7 else {"flash_attention_kernel": 1}
    assert dict(launches) == want, dict(launches)
    checks.compare(f"attention + gate, T={T}", out, reference.sigmoid_gate(reference.attention(q, k, v, pos), gate))


def test_sigmoid_gate_on_a_strided_gate(rt, gen):
    o = _randn(gen, rt, 9, 4, 32)
    fused = _randn(gen, rt, 9, 4, 64, scale=3.0)
    gate = fused[:, :, 32:]
    out = checks.poison_(torch.empty_like(o))
    A.sigmoid_gate(o, gate, out=out)
    checks.compare("sigmoid_gate", out, reference.sigmoid_gate(o, gate))


@pytest.mark.parametrize("T,Hq,Hkv,D,L,offset", [PREFILL[0], PREFILL[3], (64, 4, 2, 32, 64, 0), (1, 8, 2, 32, 50, 44)])
def test_three_kernel_attention_matches_reference(rt, gen, T, Hq, Hkv, D, L, offset):
    q, _, k, v, pos = _problem(gen, rt, T, Hq, Hkv, D, L, offset)
    with count_launches() as launches:
        out = A.attention_three_kernels(q, k, v, pos)
    assert sorted(launches) == ["attn_masked_softmax_kernel", "attn_scores_kernel", "attn_weighted_sum_kernel"]
    checks.compare("three-kernel attention", out, reference.attention(q, k, v, pos))


@pytest.mark.parametrize("form", ["three_kernels", "flash"])
def test_fully_masked_row_gives_zeros_not_nan(rt, gen, form):
    """A padding query (position -1) sees no key: softmax over all -inf would be NaN; the kernels give 0."""
    q, _, k, v, pos = _problem(gen, rt, 6, 4, 2, 32, 8, 0)
    pos[2] = -1
    fn = A.attention_three_kernels if form == "three_kernels" else A.attention
    out = fn(q, k, v, pos)
    # the trap the kernels avoid: the plain softmax of that row is NaN
    assert torch.isnan(torch.softmax(torch.full((4,), float("-inf")), 0)).all()
    assert torch.isfinite(out).all()
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    keep = torch.tensor([0, 1, 3, 4, 5], device=rt.device)
    checks.compare("the other rows", out[keep], reference.attention(q[keep], k, v, pos[keep]))


def test_decode_with_no_visible_key_gives_zeros(rt, gen):
    q, _, k, v, _ = _problem(gen, rt, 1, 4, 2, 32, 32, 0)
    out = A.attention(q, k, v, torch.tensor([-1], device=rt.device))
    assert torch.equal(out, torch.zeros_like(out))


def test_attention_reads_the_length_from_device_memory(rt, gen):
    """One positions tensor, rewritten in place between calls: prefill and decode follow it."""
    q, _, k, v, pos = _problem(gen, rt, 5, 4, 2, 32, 64, 0)
    out = torch.empty_like(q)
    for offset in (0, 20, 59):
        pos.copy_(torch.arange(offset, offset + 5, device=rt.device))
        A.attention(q, k, v, pos, out=out)
        checks.compare(f"prefill at {offset}", out, reference.attention(q, k, v, pos))
    p1 = torch.zeros(1, dtype=torch.long, device=rt.device)
    o1 = torch.empty_like(q[:1])
    ws = A.decode_workspace(o1, k)
    for p in (3, 33, 63):
        p1.fill_(p)
        A.attention(q[:1], k, v, p1, out=o1, workspace=ws)
        checks.compare(f"decode at {p}", o1, reference.attention(q[:1], k, v, p1))


@pytest.mark.parametrize("T,offset", [(1, 0), (7, 30)])
def test_kv_cache_write_matches_reference(rt, gen, T, offset):
    L, Hkv, D = 40, 2, 32
    fused = _randn(gen, rt, T, 3 * Hkv * D)  # k and v as views of a fused projection
    k = fused[:, Hkv * D:2 * Hkv * D].view(T, Hkv, D)
    v = fused[:, 2 * Hkv * D:].view(T, Hkv, D)
    k_cache, v_cache = _randn(gen, rt, L, Hkv, D), _randn(gen, rt, L, Hkv, D)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    pos = torch.arange(offset, offset + T, device=rt.device)
    with count_launches() as launches:
        assert A.kv_cache_write(k_cache, v_cache, k, v, pos) is None
    assert sum(launches.values()) == 1
    reference.kv_cache_write(ref_k, ref_v, k, v, pos)
    checks.compare("k_cache", k_cache, ref_k, atol=0, rtol=0)
    checks.compare("v_cache", v_cache, ref_v, atol=0, rtol=0)


# ---------------------------------------------------------------- decode with the q/k preparation folded in


def _decode_projection(gen, rt, Hq, Hkv, D, L):
    """One token's raw projections as the model slices them ([q_h | gate_h] per head, then k, then v), norm
    weights, and random caches."""
    proj = _randn(gen, rt, 1, 2 * Hq * D + 2 * Hkv * D, scale=2.0)
    qg = proj[:, :2 * Hq * D].unflatten(1, (Hq, 2 * D))
    k = proj[:, 2 * Hq * D:2 * Hq * D + Hkv * D].unflatten(1, (Hkv, D))
    v = proj[:, 2 * Hq * D + Hkv * D:].unflatten(1, (Hkv, D))
    wq, wk = _randn(gen, rt, D, scale=0.2), _randn(gen, rt, D, scale=0.2)
    return qg[..., :D], qg[..., D:], k, v, wq, wk, _randn(gen, rt, L, Hkv, D), _randn(gen, rt, L, Hkv, D)


# (Hq, Hkv, D, rotary_dim, cache capacity L, position, splits)
FOLDED = [
    (4, 2, 32, 8, 16, 0, 3),        # the first token: the only key is the one written in the kernel
    (8, 2, 32, 16, 100, 57, 5),     # Qwen3.5's ratio 4, the new key inside a middle split's chunk
    (6, 2, 24, 8, 70, 69, 7),       # ratio 3, head_dim 24, the last row of the cache
    (2, 2, 32, 32, 40, 13, 1),      # ratio 1, the whole head rotated, one split
]


@pytest.mark.parametrize("Hq,Hkv,D,rot,L,pos,splits", FOLDED)
def test_qk_norm_rope_cache_attention_matches_reference(rt, gen, Hq, Hkv, D, rot, L, pos, splits):
    """A decode token from its raw projections in two launches: the output, and the caches (row pos written,
    every other row untouched), against reference.qk_norm_rope_cache_attention; and against the three-launch
    path it replaces (qk_norm_rope_cache, then attention), bit for bit under the interpreter."""
    from qwen_lab.kernels import rope as R

    q, gate, k, v, wq, wk, kc, vc = _decode_projection(gen, rt, Hq, Hkv, D, L)
    positions = torch.tensor([pos], device=rt.device)
    ref_k, ref_v, two_k, two_v = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    with count_launches() as launches:
        out = A.qk_norm_rope_cache_attention(q, k, v, wq, wk, 1e-6, positions, rot, 1e4, kc, vc, gate=gate,
                                             num_splits=splits)
    assert dict(launches) == DECODE_LAUNCHES, "the q/k preparation runs inside the split kernel"
    ref = reference.qk_norm_rope_cache_attention(q, k, v, wq, wk, 1e-6, positions, rot, 1e4, ref_k, ref_v,
                                                 gate=gate)
    checks.compare("folded decode attention", out, ref)
    others = torch.arange(L, device=rt.device) != pos
    assert torch.equal(kc[others], ref_k[others]) and torch.equal(vc[others], ref_v[others]), "rows other than pos"
    checks.compare("k written at pos", kc[pos], ref_k[pos])
    assert torch.equal(vc[pos], ref_v[pos]), "v is copied as it is"
    two = A.attention(R.qk_norm_rope_cache(q, k, v, wq, wk, 1e-6, positions, rot, 1e4, two_k, two_v), two_k,
                      two_v, positions, gate=gate, num_splits=splits)
    if rt.device == "cpu":  # the same math in the same order; on a GPU the norm's sums may group differently
        assert torch.equal(out, two) and torch.equal(kc, two_k) and torch.equal(vc, two_v)
    else:
        checks.compare("folded against qk_norm_rope_cache + attention", out, two)


@pytest.mark.parametrize("pos", [-1, 16])
def test_qk_norm_rope_cache_attention_outside_the_cache_writes_nothing(rt, gen, pos):
    q, gate, k, v, wq, wk, kc, vc = _decode_projection(gen, rt, 4, 2, 32, 16)
    before_k, before_v = kc.clone(), vc.clone()
    positions = torch.tensor([pos], device=rt.device)
    out = A.qk_norm_rope_cache_attention(q, k, v, wq, wk, 1e-6, positions, 8, 1e4, kc, vc, num_splits=3)
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v), f"position {pos} wrote into a cache of 16 rows"
    assert torch.isfinite(out).all()
    if pos < 0:  # no key visible: zeros, as the decode attention gives
        assert torch.equal(out, torch.zeros_like(out))


def test_qk_norm_rope_cache_attention_rejects_bad_arguments(rt, gen):
    q, gate, k, v, wq, wk, kc, vc = _decode_projection(gen, rt, 4, 2, 32, 16)
    pos = torch.tensor([3], device=rt.device)
    with pytest.raises(KernelError, match="q: 2 tokens; qk_norm_rope_cache_attention serves one decode token"):
        two = torch.cat([q, q])
        A.qk_norm_rope_cache_attention(two, torch.cat([k, k]), torch.cat([v, v]), wq, wk, 1e-6, pos, 8, 1e4, kc, vc)
    with pytest.raises(KernelError, match="k: 2 KV heads; expected a divisor of the 3 query heads"):
        A.qk_norm_rope_cache_attention(q[:, :3], k, v, wq, wk, 1e-6, pos, 8, 1e4, kc, vc)
    with pytest.raises(KernelError, match=r"k_cache: expected shape \(16, 2, 32\)"):
        A.qk_norm_rope_cache_attention(q, k, v, wq, wk, 1e-6, pos, 8, 1e4, kc[:, :1], vc)
    with pytest.raises(KernelError, match="v_cache: expected shape"):
        A.qk_norm_rope_cache_attention(q, k, v, wq, wk, 1e-6, pos, 8, 1e4, kc, vc[:8])
    with pytest.raises(KernelError, match="rotary_dim"):
        A.qk_norm_rope_cache_attention(q, k, v, wq, wk, 1e-6, pos, 7, 1e4, kc, vc)
    with pytest.raises(KernelError, match="gate"):
        A.qk_norm_rope_cache_attention(q, k, v, wq, wk, 1e-6, pos, 8, 1e4, kc, vc, gate=gate[..., :16])


def test_attention_rejects_bad_arguments(rt, gen):
    q, gate, k, v, pos = _problem(gen, rt, 3, 4, 2, 32, 8, 0)
    with pytest.raises(KernelError, match="k: head_dim"):
        A.attention(q, k[..., :16], v[..., :16], pos)
    with pytest.raises(KernelError, match="KV heads"):
        A.attention(q[:, :3], k, v, pos)
    with pytest.raises(KernelError, match="positions"):
        A.attention(q, k, v, pos[:2])
    with pytest.raises(KernelError, match="positions"):
        A.attention(q, k, v, pos.float())
    with pytest.raises(KernelError, match="v: expected"):
        A.attention(q, k, v[:4], pos)
    with pytest.raises(KernelError, match="q: the last dim"):
        A.attention(q.transpose(0, 2).contiguous().transpose(0, 2), k, v, pos)
    with pytest.raises(KernelError, match="gate"):
        A.attention(q, k, v, pos, gate=gate[:2])
    with pytest.raises(KernelError, match="out"):
        A.attention(q, k, v, pos, out=torch.empty(3, 4, 16, dtype=q.dtype, device=q.device))
    with pytest.raises(KernelError, match="workspace"):
        A.attention(q[:1], k, v, pos[:1], num_splits=2, workspace=torch.empty(3, 4, 34, device=q.device))
    with pytest.raises(KernelError, match="k: expected"):
        A.kv_cache_write(k, v, q, q, pos)


# ---------------------------------------------------------------- the teaching kernels (notebook 07)


def test_teaching_file_is_the_notebooks_solution():
    """attention/teach.py holds notebook 07's three exercise solutions character for character."""
    from notebook_source import assert_teaches

    assert_teaches("07_gated_attention.ipynb", "qwen_lab/kernels/attention/teach.py")


@pytest.mark.parametrize("T,Hq,Hkv,D,L,offset", [PREFILL[0], PREFILL[2], PREFILL[3], (1, 8, 2, 32, 50, 44)])
def test_teaching_kernels_match_reference(rt, gen, T, Hq, Hkv, D, L, offset):
    """Scores, masked softmax and weighted sum, each against the notebook's PyTorch reference, and chained against
    reference.attention; one query is a padding row (position -1) that sees no key."""
    from qwen_lab.kernels.attention import teach

    q, _, k, v, pos = _problem(gen, rt, T, Hq, Hkv, D, L, offset)
    pos[T // 2] = -1
    scale = D ** -0.5
    scores = teach.my_scores(q, k, scale)
    checks.compare("my_scores", scores, teach.ref_scores(q, k, scale))
    p = teach.my_masked_softmax(scores, pos)
    checks.compare("my_masked_softmax", p, teach.ref_masked_softmax(scores, pos))
    assert torch.equal(p[:, T // 2], torch.zeros_like(p[:, T // 2])), "a row that sees no key is all zeros"
    o = teach.my_weighted_sum(p, v)
    checks.compare("my_weighted_sum", o, teach.ref_weighted_sum(p, v))
    # reference.attention gives NaN for the padding row (a softmax over no key); the notebook's guard gives zeros
    seen = torch.ones(T, dtype=torch.bool)
    seen[T // 2] = False
    checks.compare("the three teaching kernels", o[seen], reference.attention(q, k, v, pos)[seen])
    assert torch.equal(o[T // 2], torch.zeros_like(o[T // 2])), "the padding row's output is zeros, not NaN"


# ---------------------------------------------------------------- GPU, bf16, real shapes

C = QWEN35_0_8B


def _real(T, L, offset, seed):
    g = torch.Generator().manual_seed(seed)
    D = C.head_dim
    fused = checks.randn(T, C.num_attention_heads, 2 * D, g=g, dtype=torch.bfloat16, device="cuda")
    q, gate = fused[:, :, :D], fused[:, :, D:]
    k = checks.randn(L, C.num_key_value_heads, D, g=g, dtype=torch.bfloat16, device="cuda")
    v = checks.randn(L, C.num_key_value_heads, D, g=g, dtype=torch.bfloat16, device="cuda")
    return q, gate, k, v, torch.arange(offset, offset + T, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2048, 8192])
def test_gpu_prefill_real_shapes(T):
    q, gate, k, v, pos = _real(T, T, 0, T)
    ref = reference.attention(q, k, v, pos)
    checks.compare(f"flash attention bf16, T={T}", A.attention(q, k, v, pos), ref)
    checks.compare(f"flash attention + gate bf16, T={T}", A.attention(q, k, v, pos, gate=gate),
                   reference.sigmoid_gate(ref, gate))


@pytest.mark.gpu
def test_gpu_prefill_every_config_real_shapes(switch):
    """Every prefill config, forced, on 2048 and 300 tokens (ragged: 19 tiles of 16 tokens)."""
    for T in (2048, 300):
        q, gate, k, v, pos = _real(T, T, 0, T + 1)
        ref = reference.sigmoid_gate(reference.attention(q, k, v, pos), gate)
        for config in A._PREFILL_CONFIGS + A._PREFILL_TMA_CONFIGS + A._SMALL_SMEM_PREFILL_CONFIGS:
            switch.force("flash_attention_kernel", config)
            checks.compare(f"flash attention bf16 {config}, T={T}", A.attention(q, k, v, pos, gate=gate), ref)


@pytest.mark.gpu
def test_gpu_prefill_after_a_cached_prefix():
    q, gate, k, v, pos = _real(1000, 4096, 1500, 11)
    checks.compare("chunked prefill bf16", A.attention(q, k, v, pos), reference.attention(q, k, v, pos))


@pytest.mark.gpu
@pytest.mark.parametrize("cached", [1, 2048, 8192])
@pytest.mark.parametrize("capacity", [8192, 32768])
def test_gpu_decode_real_shapes(cached, capacity):
    q, gate, k, v, pos = _real(1, capacity, cached - 1, cached + capacity)
    ref = reference.attention(q, k, v, pos)
    checks.compare(f"decode bf16 over {cached} keys", A.attention(q, k, v, pos), ref)
    checks.compare("decode + gate bf16", A.attention(q, k, v, pos, gate=gate), reference.sigmoid_gate(ref, gate))


@pytest.mark.gpu
def test_gpu_decode_tunes_once_for_caches_of_a_similar_size():
    """Capacities of 2112, 3000 and 4000 positions split the keys 33, 47 and 63 ways: one tuning for the three."""
    tuned = attn_decode._decode_kernel()
    before = len(tuned.cache)
    for capacity in (2112, 3000, 4000):
        q, gate, k, v, pos = _real(1, capacity, 2000, capacity)
        checks.compare(f"decode over 2001 keys, capacity {capacity} ({A.decode_splits(capacity)} splits)",
                       A.attention(q, k, v, pos), reference.attention(q, k, v, pos))
    assert len(tuned.cache) - before <= 1, f"{len(tuned.cache) - before} tunings for one class of split counts"


@pytest.mark.gpu
def test_gpu_decode_replays_in_a_cuda_graph():
    """Captured once at one length, replayed at others: the length comes from device memory."""
    q, gate, k, v, _ = _real(1, 8192, 0, 5)
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    out = torch.empty_like(q)
    ws = A.decode_workspace(q, k)
    A.attention(q, k, v, pos, out=out, gate=gate, workspace=ws)  # warm-up: compile and autotune
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        A.attention(q, k, v, pos, out=out, gate=gate, workspace=ws)
    for p in (0, 100, 4095, 8191):
        pos.fill_(p)
        graph.replay()
        ref = reference.sigmoid_gate(reference.attention(q, k, v, pos), gate)
        checks.compare(f"graph replay at position {p}", out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [False, True], ids=["no_prefetch", "prefetch"])
@pytest.mark.parametrize("folded", [False, True], ids=["three_launches", "folded"])
def test_gpu_decode_layer_in_a_cuda_graph_equals_eager(folded, prefetch, switch):
    """The attention layer's decode sequence, captured once in a CUDA Graph and replayed at 3 increasing positions:
    the output and both caches equal the same sequence run eagerly on copies of the caches. Three launches
    (qk_norm_rope_cache with the cache write, then the split and combine kernels), or the model's two (the
    preparation folded into the split kernel: qk_norm_rope_cache_attention); with and without the L2 prefetch
    before the PDL wait (where a wrong assumption about what the kernel before has written would show). The first
    call before the capture compiles and autotunes."""
    from qwen_lab.kernels import rope as R

    switch(decode_prefetch=prefetch)

    g = torch.Generator().manual_seed(21)
    Hq, Hkv, D, L = C.num_attention_heads, C.num_key_value_heads, C.head_dim, 8192
    proj = checks.randn(1, 2 * Hq * D + 2 * Hkv * D, g=g, dtype=torch.bfloat16, device="cuda", scale=2.0)
    qg = proj[:, :2 * Hq * D].view(1, Hq, 2 * D)
    q, gate = qg[..., :D], qg[..., D:]
    k = proj[:, 2 * Hq * D:2 * Hq * D + Hkv * D].view(1, Hkv, D)
    v = proj[:, 2 * Hq * D + Hkv * D:].view(1, Hkv, D)
    wq = checks.randn(D, g=g, dtype=torch.bfloat16, device="cuda", scale=0.2)
    wk = checks.randn(D, g=g, dtype=torch.bfloat16, device="cuda", scale=0.2)
    k_cache = checks.randn(L, Hkv, D, g=g, dtype=torch.bfloat16, device="cuda")
    v_cache = checks.randn(L, Hkv, D, g=g, dtype=torch.bfloat16, device="cuda")
    eager_k, eager_v = k_cache.clone(), v_cache.clone()
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    q_buf = torch.empty(1, Hq, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(1, Hq, D, dtype=torch.bfloat16, device="cuda")

    def layer(kc, vc, q_out, o):
        if folded:
            return A.qk_norm_rope_cache_attention(q, k, v, wq, wk, C.rms_norm_eps, pos, C.rotary_dim, C.rope_theta,
                                                  kc, vc, gate=gate, out=o)
        R.qk_norm_rope_cache(q, k, v, wq, wk, C.rms_norm_eps, pos, C.rotary_dim, C.rope_theta, kc, vc, out=q_out)
        return A.attention(q_out, kc, vc, pos, gate=gate, out=o)

    pos.fill_(L - 1)
    layer(k_cache.clone(), v_cache.clone(), q_buf, out)  # warm-up outside the capture, on throwaway caches
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(k_cache, v_cache, q_buf, out)
    for p in (100, 2047, 8191):
        pos.fill_(p)
        graph.replay()
        eager = layer(eager_k, eager_v, torch.empty_like(q_buf), torch.empty_like(out))
        torch.cuda.synchronize()
        assert torch.equal(out, eager), f"graph replay at position {p} differs from eager"
        assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v), f"caches differ at position {p}"
        ref_q = reference.qk_norm_rope_cache(q, k, v, wq, wk, C.rms_norm_eps, pos, C.rotary_dim, C.rope_theta,
                                             eager_k.clone(), eager_v.clone())
        checks.compare(f"layer at {p} against the reference", out,
                       reference.attention(ref_q, eager_k, eager_v, pos, gate=gate))


@pytest.mark.gpu
def test_gpu_decode_prefetch_changes_no_bit(switch):
    """The L2 prefetch is a hint: the folded decode at real shapes gives the same bits with it and without (the
    prefetch is not in the autotuning key, so both run the config tuned first)."""
    g = torch.Generator().manual_seed(5)
    Hq, Hkv, D, L = C.num_attention_heads, C.num_key_value_heads, C.head_dim, 2113
    q = checks.randn(1, Hq, D, g=g, dtype=torch.bfloat16, device="cuda")
    k, v = (checks.randn(1, Hkv, D, g=g, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    wq, wk = (checks.randn(D, g=g, dtype=torch.bfloat16, device="cuda", scale=0.2) for _ in range(2))
    cache = [checks.randn(L, Hkv, D, g=g, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    pos = torch.tensor([2048], device="cuda")
    outs = {}
    for on in (False, True):
        switch(decode_prefetch=on)
        kc, vc = cache[0].clone(), cache[1].clone()
        outs[on] = (A.qk_norm_rope_cache_attention(q, k, v, wq, wk, C.rms_norm_eps, pos, C.rotary_dim,
                                                   C.rope_theta, kc, vc), kc, vc)
    torch.cuda.synchronize()
    for name, a, b in zip(("output", "key cache", "value cache"), outs[False], outs[True]):
        assert torch.equal(a, b), f"{name}: the prefetch changed the result"


@pytest.mark.gpu
def test_gpu_three_kernels_real_shapes():
    q, _, k, v, pos = _real(2048, 2048, 0, 2)
    checks.compare("three-kernel attention bf16", A.attention_three_kernels(q, k, v, pos),
                   reference.attention(q, k, v, pos))


@pytest.mark.gpu
def test_gpu_kv_cache_write_and_gate_real_shapes():
    g = torch.Generator().manual_seed(1)
    L, T, D = 4096, 2048, C.head_dim
    kv = checks.randn(T, 2 * C.num_key_value_heads * D, g=g, dtype=torch.bfloat16, device="cuda")
    k = kv[:, :C.num_key_value_heads * D].view(T, C.num_key_value_heads, D)
    v = kv[:, C.num_key_value_heads * D:].view(T, C.num_key_value_heads, D)
    k_cache = torch.zeros(L, C.num_key_value_heads, D, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    pos = torch.arange(100, 100 + T, device="cuda")
    A.kv_cache_write(k_cache, v_cache, k, v, pos)
    reference.kv_cache_write(ref_k, ref_v, k, v, pos)
    checks.compare("k_cache bf16", k_cache, ref_k, atol=0, rtol=0)
    checks.compare("v_cache bf16", v_cache, ref_v, atol=0, rtol=0)
    o = checks.randn(T, C.num_attention_heads, D, g=g, dtype=torch.bfloat16, device="cuda")
    fused = checks.randn(T, C.num_attention_heads, 2 * D, g=g, dtype=torch.bfloat16, device="cuda")
    checks.compare("sigmoid_gate bf16", A.sigmoid_gate(o, fused[:, :, D:]),
                   reference.sigmoid_gate(o, fused[:, :, D:]))
