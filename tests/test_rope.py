"""RoPE kernels (qwen_lab.kernels.rope) against qwen_lab.reference.

CPU: the Triton interpreter in float32 on small shapes. GPU (marked): bf16 on Qwen3.5-0.8B shapes.
"""

import pytest
import torch

from qwen_lab import KernelError, reference
from qwen_lab.course import checks
from qwen_lab.config import QWEN35_0_8B, TINY
from qwen_lab.kernels import count_launches
from qwen_lab.kernels import rope as K


def _randn(gen, rt, *shape, scale=1.0):
    return checks.randn(*shape, g=gen, dtype=rt.dtype, device=rt.device, scale=scale)


def _positions(rt, T, offset):
    return torch.arange(offset, offset + T, device=rt.device)


# (T, heads, D, rotary_dim, first position): tiny-model shapes, a full rotation, a non-power-of-two D,
# ragged T, positions not starting at 0
CASES = [
    (1, TINY.num_attention_heads, TINY.head_dim, TINY.rotary_dim, 37),
    (7, 4, 32, 8, 0),
    (64, 2, 32, 32, 3),
    (100, 3, 48, 16, 250),
]


@pytest.mark.parametrize("T,H,D,rot,offset", CASES)
def test_rope_matches_reference_on_a_strided_view(rt, gen, T, H, D, rot, offset):
    fused = _randn(gen, rt, T, H, 2 * D)  # like q inside the fused [q | gate] projection
    x = fused[:, :, :D]
    assert x.stride(1) == 2 * D
    pos = _positions(rt, T, offset)
    with count_launches() as launches:
        out = K.rope(x, pos, rot, TINY.rope_theta)
    assert launches["rope_kernel"] == 1
    checks.compare("rope", out, reference.rope(x, pos, rot, TINY.rope_theta))
    # the dims past rotary_dim are copied, bit for bit
    assert torch.equal(out[..., rot:], x[..., rot:])


def test_rope_rotation_keeps_pair_norms_and_is_relative(rt, gen):
    """Each (x_i, x_{i+half}) pair only turns; q.k after RoPE depends on the position difference only.

    float32 on every device: these are properties of the math, checked tighter than bf16 could."""
    D, rot = 32, 32
    q = checks.randn(1, 1, D, g=gen, device=rt.device)
    k = checks.randn(1, 1, D, g=gen, device=rt.device)
    half = rot // 2

    def at(x, p):
        return K.rope(x, torch.tensor([p], device=rt.device), rot, 10000.0).float()

    qr = at(q, 5)
    pair_norm = lambda x: x[..., :half] ** 2 + x[..., half:rot] ** 2  # noqa: E731
    checks.compare("pair norms", pair_norm(qr), pair_norm(q.float()), atol=1e-4, rtol=1e-4)
    d1 = (at(q, 9) * at(k, 4)).sum()
    d2 = (at(q, 105) * at(k, 100)).sum()
    checks.compare("q.k at equal offsets", d1.reshape(1), d2.reshape(1), atol=1e-3, rtol=1e-3)


def test_rope_reads_positions_from_device_memory(rt, gen):
    """Same tensors, new values written into `positions` in place (what a graph replay does)."""
    T, H, D, rot = 3, 2, 32, 16
    x = _randn(gen, rt, T, H, D)
    pos = _positions(rt, T, 0)
    out = checks.poison_(torch.empty_like(x))
    for offset in (0, 41, 1000):
        pos.copy_(torch.arange(offset, offset + T, device=rt.device))
        result = K.rope(x, pos, rot, 1e7, out=out)
        assert result.data_ptr() == out.data_ptr()
        checks.compare(f"rope at offset {offset}", out, reference.rope(x, pos, rot, 1e7))


def test_rope_large_positions(rt, gen):
    """Angles up to 2.6e5 rad: the in-kernel cos/sin of the fp32 angle match torch's."""
    T, H, D, rot = 5, 2, 32, 16
    x = _randn(gen, rt, T, H, D)
    pos = torch.tensor([0, 1, 8191, 100_000, 262_143], device=rt.device)
    checks.compare("rope, long context", K.rope(x, pos, rot, 1e7), reference.rope(x, pos, rot, 1e7))


@pytest.mark.parametrize("T,Hq,Hk,D,rot,offset", [(1, 4, 2, 32, 8, 17), (9, 4, 2, 32, 8, 0), (33, 6, 1, 48, 16, 5)])
def test_qk_norm_rope_matches_reference_composition(rt, gen, T, Hq, Hk, D, rot, offset):
    fused = _randn(gen, rt, T, Hq, 2 * D)
    q = fused[:, :, :D]
    k = _randn(gen, rt, T, Hk, D, scale=3.0)
    wq = _randn(gen, rt, D, scale=0.1)
    wk = _randn(gen, rt, D, scale=0.1)
    pos = _positions(rt, T, offset)
    eps = 1e-6
    with count_launches() as launches:
        qo, ko = K.qk_norm_rope(q, k, wq, wk, eps, pos, rot, 1e7)
    assert sum(launches.values()) == 1, "q and k in one launch"
    checks.compare("q", qo, reference.rope(reference.rms_norm(q, wq, eps), pos, rot, 1e7))
    checks.compare("k", ko, reference.rope(reference.rms_norm(k, wk, eps), pos, rot, 1e7))


def test_qk_norm_rope_on_tiny_and_zero_heads(rt, gen):
    """Head rows whose mean square is far below eps (and rows of zeros): eps decides the norm there, so a fused
    norm that dropped or moved it gives other numbers (NaN for the zero rows). Both fused forms."""
    T, Hq, Hk, D, rot, L = 3, 4, 2, 32, 8, 8
    scales = torch.tensor([0.0, 1e-4, 1.0], device=rt.device, dtype=rt.dtype)[:, None, None]   # per token
    q = _randn(gen, rt, T, Hq, D) * scales
    k = _randn(gen, rt, T, Hk, D) * scales
    v = _randn(gen, rt, T, Hk, D)
    wq, wk = _randn(gen, rt, D, scale=0.1), _randn(gen, rt, D, scale=0.1)
    pos = _positions(rt, T, 2)
    eps = 1e-6
    ref_q = reference.rope(reference.rms_norm(q, wq, eps), pos, rot, 1e7)
    ref_k = reference.rope(reference.rms_norm(k, wk, eps), pos, rot, 1e7)
    assert ref_q[1].abs().max() > 1e-2 and ref_q[1].abs().max() < 0.5, "eps dominates the tiny token's norm"
    qo, ko = K.qk_norm_rope(q, k, wq, wk, eps, pos, rot, 1e7)
    checks.compare("q (tiny and zero heads)", qo, ref_q)
    checks.compare("k (tiny and zero heads)", ko, ref_k)
    k_cache = torch.zeros(L, Hk, D, device=rt.device, dtype=rt.dtype)
    v_cache = torch.zeros(L, Hk, D, device=rt.device, dtype=rt.dtype)
    qc = K.qk_norm_rope_cache(q, k, v, wq, wk, eps, pos, rot, 1e7, k_cache, v_cache)
    checks.compare("qk_norm_rope_cache q (tiny and zero heads)", qc, ref_q)
    checks.compare("qk_norm_rope_cache k rows (tiny and zero heads)", k_cache[2:2 + T], ref_k)


def test_qk_norm_rope_out_buffers(rt, gen):
    T, Hq, Hk, D, rot = 4, 4, 2, 32, 8
    q, k = _randn(gen, rt, T, Hq, D), _randn(gen, rt, T, Hk, D)
    wq, wk = _randn(gen, rt, D, scale=0.1), _randn(gen, rt, D, scale=0.1)
    pos = _positions(rt, T, 2)
    q_out = checks.poison_(torch.empty_like(q))
    k_out = checks.poison_(torch.empty_like(k))
    qo, ko = K.qk_norm_rope(q, k, wq, wk, 1e-6, pos, rot, 1e7, q_out=q_out, k_out=k_out)
    assert qo.data_ptr() == q_out.data_ptr() and ko.data_ptr() == k_out.data_ptr()
    checks.compare("q_out", q_out, reference.rope(reference.rms_norm(q, wq, 1e-6), pos, rot, 1e7))
    checks.compare("k_out", k_out, reference.rope(reference.rms_norm(k, wk, 1e-6), pos, rot, 1e7))


def _fused_qkv(gen, rt, T, Hq, Hk, D, scale=1.0):
    """q, gate, k, v as strided views of one fused projection [T, 2 Hq D + 2 Hk D], as the model's attention gets
    them (q and its gate interleaved per head, then k, then v)."""
    proj = _randn(gen, rt, T, 2 * Hq * D + 2 * Hk * D, scale=scale)
    qg = proj[:, :2 * Hq * D].view(T, Hq, 2 * D)
    q, gate = qg[..., :D], qg[..., D:]
    k = proj[:, 2 * Hq * D:2 * Hq * D + Hk * D].view(T, Hk, D)
    v = proj[:, 2 * Hq * D + Hk * D:].view(T, Hk, D)
    return q, gate, k, v


@pytest.mark.parametrize("T,Hq,Hk,D,rot,L,positions", [
    (1, 4, 2, 32, 8, 24, [0]),              # the first decode token
    (1, 4, 2, 32, 8, 24, [23]),             # the last row of the cache
    (1, 8, 2, 48, 16, 40, [17]),            # Qwen3.5's GQA ratio, head_dim not a power of two
    (5, 4, 2, 32, 8, 24, [3, 4, 5, 6, 7]),  # a short prefill after a cached prefix
    (5, 6, 1, 32, 32, 30, [0, 1, 2, 3, 4]),  # a full rotation, one KV head
])
def test_qk_norm_rope_cache_matches_reference(rt, gen, T, Hq, Hk, D, rot, L, positions):
    q, _, k, v = _fused_qkv(gen, rt, T, Hq, Hk, D, scale=2.0)
    assert q.stride(1) == 2 * D  # q interleaved with its gate per head, like the model's
    if T > 1:
        assert not k.is_contiguous() and not v.is_contiguous()
    wq, wk = _randn(gen, rt, D, scale=0.1), _randn(gen, rt, D, scale=0.1)
    pos = torch.tensor(positions, device=rt.device)
    k_cache, v_cache = _randn(gen, rt, L, Hk, D), _randn(gen, rt, L, Hk, D)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    eps = 1e-6
    with count_launches() as launches:
        qo = K.qk_norm_rope_cache(q, k, v, wq, wk, eps, pos, rot, 1e7, k_cache, v_cache)
    assert dict(launches) == {"qk_norm_rope_cache_kernel": 1}, "norm, RoPE and the cache write in one launch"
    ref_q = reference.qk_norm_rope_cache(q, k, v, wq, wk, eps, pos, rot, 1e7, ref_k, ref_v)
    checks.compare("q", qo, ref_q)
    # the written rows against the reference, every other row untouched (bit for bit)
    written = torch.zeros(L, dtype=torch.bool, device=rt.device)
    written[pos] = True
    checks.compare("k_cache rows at positions", k_cache[written], ref_k[written])
    checks.compare("v_cache rows at positions", v_cache[written], ref_v[written], atol=0, rtol=0)
    assert torch.equal(k_cache[~written], ref_k[~written]), "k_cache rows away from positions changed"
    assert torch.equal(v_cache[~written], ref_v[~written]), "v_cache rows away from positions changed"


@pytest.mark.parametrize("T,Tq", [(5, 1), (20, 1), (20, 3), (33, 32)])
def test_qk_norm_rope_cache_prepares_the_last_queries_only(rt, gen, T, Tq):
    """q for the last Tq of T tokens (a prompt's last layer, where only the last row's query is wanted): every
    token's k and v go to the cache as in the full call, and q equals the full call's last Tq rows."""
    Hq, Hk, D, rot, L = 8, 2, 48, 16, 40
    q, _, k, v = _fused_qkv(gen, rt, T, Hq, Hk, D, scale=2.0)
    wq, wk = _randn(gen, rt, D, scale=0.1), _randn(gen, rt, D, scale=0.1)
    pos = _positions(rt, T, 3)
    caches = [(torch.zeros(L, Hk, D, dtype=rt.dtype, device=rt.device),
               torch.zeros(L, Hk, D, dtype=rt.dtype, device=rt.device)) for _ in range(3)]
    full = K.qk_norm_rope_cache(q, k, v, wq, wk, 1e-6, pos, rot, 1e7, *caches[0])
    last = K.qk_norm_rope_cache(q[T - Tq:], k, v, wq, wk, 1e-6, pos, rot, 1e7, *caches[1])
    ref = reference.qk_norm_rope_cache(q[T - Tq:], k, v, wq, wk, 1e-6, pos, rot, 1e7, *caches[2])
    assert last.shape == (Tq, Hq, D)
    assert torch.equal(last, full[T - Tq:]), "the last queries differ from the full call's"
    checks.compare("q of the last tokens", last, ref)
    (k_full, v_full), (k_last, v_last), (k_ref, v_ref) = caches
    assert torch.equal(k_last, k_full) and torch.equal(v_last, v_full), "the caches differ from the full call's"
    checks.compare("k_cache", k_last, k_ref)
    assert torch.equal(v_last, v_ref)


def test_qk_norm_rope_cache_reads_positions_from_device_memory(rt, gen):
    """One decode token, the same tensors every step with `positions` rewritten in place (a graph replay), into an
    out buffer: q and the cache rows follow the position; a position outside the cache writes no row."""
    Hq, Hk, D, rot, L = 4, 2, 32, 8, 16
    q, _, k, v = _fused_qkv(gen, rt, 1, Hq, Hk, D)
    wq, wk = _randn(gen, rt, D, scale=0.1), _randn(gen, rt, D, scale=0.1)
    k_cache = torch.zeros(L, Hk, D, dtype=rt.dtype, device=rt.device)
    v_cache = torch.zeros_like(k_cache)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    pos = torch.zeros(1, dtype=torch.long, device=rt.device)
    out = checks.poison_(torch.empty(1, Hq, D, dtype=rt.dtype, device=rt.device))
    for p in (0, 9, 15):
        pos.fill_(p)
        result = K.qk_norm_rope_cache(q, k, v, wq, wk, 1e-6, pos, rot, 1e7, k_cache, v_cache, out=out)
        assert result.data_ptr() == out.data_ptr()
        ref_q = reference.qk_norm_rope_cache(q, k, v, wq, wk, 1e-6, pos, rot, 1e7, ref_k, ref_v)
        checks.compare(f"q at {p}", out, ref_q)
        checks.compare(f"k_cache after {p}", k_cache, ref_k)
        assert torch.equal(v_cache, ref_v)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    pos.fill_(L)  # past the cache: skipped on the device (no host check could see it without a sync)
    K.qk_norm_rope_cache(q, k, v, wq, wk, 1e-6, pos, rot, 1e7, k_cache, v_cache, out=out)
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)


def test_qk_norm_rope_cache_rejects_bad_arguments(rt, gen):
    q, _, k, v = _fused_qkv(gen, rt, 3, 4, 2, 32)
    w = _randn(gen, rt, 32)
    pos = _positions(rt, 3, 0)
    kc = torch.zeros(8, 2, 32, dtype=rt.dtype, device=rt.device)
    with pytest.raises(KernelError, match="v: expected"):
        K.qk_norm_rope_cache(q, k, v[:, :1], w, w, 1e-6, pos, 8, 1e7, kc, kc.clone())
    with pytest.raises(KernelError, match="k_cache"):
        K.qk_norm_rope_cache(q, k, v, w, w, 1e-6, pos, 8, 1e7, kc[:, :1], kc.clone())
    with pytest.raises(KernelError, match="v_cache"):
        K.qk_norm_rope_cache(q, k, v, w, w, 1e-6, pos, 8, 1e7, kc, kc[:4].clone())
    with pytest.raises(KernelError, match="k_cache: the last dim"):
        K.qk_norm_rope_cache(q, k, v, w, w, 1e-6, pos, 8, 1e7, kc.transpose(1, 2).contiguous().transpose(1, 2),
                             kc.clone())
    with pytest.raises(KernelError, match="positions"):
        K.qk_norm_rope_cache(q, k, v, w, w, 1e-6, pos[:1], 8, 1e7, kc, kc.clone())
    with pytest.raises(KernelError, match="out"):
        K.qk_norm_rope_cache(q, k, v, w, w, 1e-6, pos, 8, 1e7, kc, kc.clone(), out=torch.empty_like(k))
    with pytest.raises(KernelError, match="q: 3 tokens, expected at most k's 2"):
        K.qk_norm_rope_cache(q, k[:2], v[:2], w, w, 1e-6, pos[:2], 8, 1e7, kc, kc.clone())


def test_rope_rejects_bad_arguments(rt, gen):
    x = _randn(gen, rt, 3, 2, 32)
    pos = _positions(rt, 3, 0)
    with pytest.raises(KernelError, match="rotary_dim"):
        K.rope(x, pos, 7, 1e7)
    with pytest.raises(KernelError, match="rotary_dim"):
        K.rope(x, pos, 64, 1e7)
    with pytest.raises(KernelError, match="positions"):
        K.rope(x, pos[:2], 8, 1e7)
    with pytest.raises(KernelError, match="positions"):
        K.rope(x, pos.float(), 8, 1e7)
    with pytest.raises(KernelError, match="x: the last dim"):
        K.rope(x.transpose(1, 2), pos, 8, 1e7)
    with pytest.raises(KernelError, match="x: expected"):
        K.rope(x[0], pos, 8, 1e7)
    with pytest.raises(KernelError, match="out"):
        K.rope(x, pos, 8, 1e7, out=torch.empty(3, 2, 16, dtype=x.dtype, device=x.device))
    with pytest.raises(KernelError, match="k_weight"):
        K.qk_norm_rope(x, x, x[0, 0], x[0, 0, :16], 1e-6, pos, 8, 1e7)


# ---------------------------------------------------------------- GPU, bf16, real shapes

C = QWEN35_0_8B


@pytest.mark.gpu
@pytest.mark.parametrize("T,offset", [(1, 0), (1, 8191), (2048, 0), (8192, 17)])
def test_gpu_rope_real_shapes(T, offset):
    g = torch.Generator().manual_seed(T + offset)
    proj = checks.randn(T, C.num_attention_heads, 2 * C.head_dim, g=g, dtype=torch.bfloat16, device="cuda")
    q = proj[:, :, :C.head_dim]
    pos = torch.arange(offset, offset + T, device="cuda")
    out = K.rope(q, pos, C.rotary_dim, C.rope_theta)
    checks.compare("rope bf16", out, reference.rope(q, pos, C.rotary_dim, C.rope_theta))
    assert torch.equal(out[..., C.rotary_dim:], q[..., C.rotary_dim:])


@pytest.mark.gpu
@pytest.mark.parametrize("T,offset", [(1, 4000), (2048, 0), (8192, 0)])
def test_gpu_qk_norm_rope_real_shapes(T, offset):
    g = torch.Generator().manual_seed(7 * T + offset)
    D = C.head_dim
    proj = checks.randn(T, C.num_attention_heads, 2 * D, g=g, dtype=torch.bfloat16, device="cuda")
    q = proj[:, :, :D]
    k = checks.randn(T, C.num_key_value_heads, D, g=g, dtype=torch.bfloat16, device="cuda", scale=4.0)
    wq = checks.randn(D, g=g, dtype=torch.bfloat16, device="cuda", scale=0.2)
    wk = checks.randn(D, g=g, dtype=torch.bfloat16, device="cuda", scale=0.2)
    pos = torch.arange(offset, offset + T, device="cuda")
    qo, ko = K.qk_norm_rope(q, k, wq, wk, C.rms_norm_eps, pos, C.rotary_dim, C.rope_theta)
    ref_q = reference.rope(reference.rms_norm(q, wq, C.rms_norm_eps), pos, C.rotary_dim, C.rope_theta)
    ref_k = reference.rope(reference.rms_norm(k, wk, C.rms_norm_eps), pos, C.rotary_dim, C.rope_theta)
    checks.compare("q bf16", qo, ref_q)
    checks.compare("k bf16", ko, ref_k)


@pytest.mark.gpu
def test_gpu_rope_long_context_angles():
    g = torch.Generator().manual_seed(3)
    x = checks.randn(4, C.num_key_value_heads, C.head_dim, g=g, dtype=torch.float32, device="cuda")
    pos = torch.tensor([1, 65_535, 200_000, 262_143], device="cuda")
    out = K.rope(x, pos, C.rotary_dim, C.rope_theta)
    checks.compare("rope fp32 at long positions", out, reference.rope(x, pos, C.rotary_dim, C.rope_theta),
                   atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("T,offset,L", [(1, 0, 8192), (1, 2047, 8192), (1, 8191, 8192), (2048, 0, 8192),
                                        (100, 6000, 8192)])
def test_gpu_qk_norm_rope_cache_real_shapes(T, offset, L):
    g = torch.Generator().manual_seed(11 * T + offset)
    Hq, Hk, D = C.num_attention_heads, C.num_key_value_heads, C.head_dim
    proj = checks.randn(T, 2 * Hq * D + 2 * Hk * D, g=g, dtype=torch.bfloat16, device="cuda", scale=3.0)
    q = proj[:, :2 * Hq * D].view(T, Hq, 2 * D)[..., :D]
    k = proj[:, 2 * Hq * D:2 * Hq * D + Hk * D].view(T, Hk, D)
    v = proj[:, 2 * Hq * D + Hk * D:].view(T, Hk, D)
    wq = checks.randn(D, g=g, dtype=torch.bfloat16, device="cuda", scale=0.2)
    wk = checks.randn(D, g=g, dtype=torch.bfloat16, device="cuda", scale=0.2)
    k_cache = checks.randn(L, Hk, D, g=g, dtype=torch.bfloat16, device="cuda")
    v_cache = checks.randn(L, Hk, D, g=g, dtype=torch.bfloat16, device="cuda")
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    pos = torch.arange(offset, offset + T, device="cuda")
    qo = K.qk_norm_rope_cache(q, k, v, wq, wk, C.rms_norm_eps, pos, C.rotary_dim, C.rope_theta, k_cache, v_cache)
    ref_q = reference.qk_norm_rope_cache(q, k, v, wq, wk, C.rms_norm_eps, pos, C.rotary_dim, C.rope_theta,
                                         ref_k, ref_v)
    checks.compare("q bf16", qo, ref_q)
    checks.compare("k_cache bf16", k_cache, ref_k)
    assert torch.equal(v_cache, ref_v)


# ---------------------------------------------------------------- the teaching kernel (notebook 06)


def test_teaching_file_is_the_notebooks_solution():
    """rope/teach.py holds notebook 06's exercise solution character for character."""
    from notebook_source import assert_teaches

    assert_teaches("06_rope.ipynb", "qwen_lab/kernels/rope/teach.py")


@pytest.mark.parametrize("T,H,D,rot,offset", CASES)
def test_teaching_rope_matches_reference(rt, gen, T, H, D, rot, offset):
    from qwen_lab.kernels.rope import teach

    x = _randn(gen, rt, T, H, 2 * D)[:, :, :D]  # a strided view, as q is in the model
    pos = _positions(rt, T, offset)
    out = checks.poison_(torch.empty(T, H, D, dtype=rt.dtype, device=rt.device))
    assert teach.my_rope(x, pos, rot, TINY.rope_theta, out=out) is out
    checks.compare("my_rope", out, reference.rope(x, pos, rot, TINY.rope_theta))
