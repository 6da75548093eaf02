"""RMSNorm, fused add + RMSNorm and gated RMSNorm against qwen_lab.reference."""

import pytest
import torch

from qwen_lab import reference
from qwen_lab.course import checks
from qwen_lab.config import QWEN35_0_8B, TINY
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches
from qwen_lab.kernels.norms import add_rms_norm, gated_rms_norm, rms_norm

EPS = 1e-6


def _randn(*shape, g, rt, scale=1.0, dtype=None):
    return checks.randn(*shape, g=g, dtype=dtype or rt.dtype, device=rt.device, scale=scale)


# ---------------------------------------------------------------- rms_norm

@pytest.mark.parametrize("shape", [(1, 64), (5, TINY.hidden_size), (33, 100), (7, 3, 32), (19,), (2, 3, 2, 24)])
def test_rms_norm_matches_reference(rt, gen, shape):
    x = _randn(*shape, g=gen, rt=rt, scale=3.0)
    w = _randn(shape[-1], g=gen, rt=rt, scale=0.2)
    with count_launches() as launches:
        out = rms_norm(x, w, EPS)
    assert launches["rms_norm_kernel"] == 1
    assert out.is_contiguous() and out.dtype == x.dtype
    checks.compare("rms_norm", out, reference.rms_norm(x, w, EPS))


def test_rms_norm_is_zero_centred(rt, gen):
    # with w = 0 the zero-centred norm is the plain normalised row; a kernel that forgot the +1 gives zeros
    x = _randn(6, 48, g=gen, rt=rt)
    out = rms_norm(x, torch.zeros(48, device=rt.device, dtype=rt.dtype), EPS)
    xf = x.float()
    expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)
    checks.compare("rms_norm(w=0)", out, expected)
    assert out.abs().mean() > 0.5


def test_rms_norm_eps_matters(rt, gen):
    x = _randn(4, 32, g=gen, rt=rt, scale=1e-3)      # mean(x^2) ~ 1e-6: eps is not negligible
    w = _randn(32, g=gen, rt=rt, scale=0.1)
    for eps in (1e-6, 1e-2):
        checks.compare(f"rms_norm(eps={eps})", rms_norm(x, w, eps), reference.rms_norm(x, w, eps))


def test_per_head_norm_on_strided_projection_views(rt, gen):
    """q/k norm read straight from the fused attention projection, no copy."""
    cfg = TINY
    T, Hq, Hkv, D = 9, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    proj = _randn(T, cfg.attn_in_proj_dim, g=gen, rt=rt, scale=2.0)
    q = proj[:, :cfg.attn_q_dim].view(T, Hq, 2 * D)[:, :, :D]     # per head: D query then D gate columns
    k = proj[:, cfg.attn_q_dim:cfg.attn_q_dim + cfg.attn_kv_dim].view(T, Hkv, D)
    assert q.stride() == (cfg.attn_in_proj_dim, 2 * D, 1) and k.stride(0) == cfg.attn_in_proj_dim
    wq, wk = _randn(D, g=gen, rt=rt, scale=0.3), _randn(D, g=gen, rt=rt, scale=0.3)
    before = proj.clone()
    for name, t, w in (("q_norm", q, wq), ("k_norm", k, wk)):
        out = rms_norm(t, w, EPS)
        assert out.shape == t.shape and out.is_contiguous()
        checks.compare(name, out, reference.rms_norm(t, w, EPS))
    assert torch.equal(proj, before)                               # inputs untouched


def test_rms_norm_out_buffer_strided_and_in_place(rt, gen):
    x = _randn(10, 40, g=gen, rt=rt)
    w = _randn(40, g=gen, rt=rt, scale=0.5)
    ref = reference.rms_norm(x, w, EPS)
    big = checks.poison_(torch.empty(10, 64, device=rt.device, dtype=rt.dtype))
    out = rms_norm(x, w, EPS, out=big[:, 8:48])                    # a strided destination
    checks.compare("rms_norm(out=view)", out, ref)
    assert torch.isnan(big[:, :8]).all() and torch.isnan(big[:, 48:]).all()   # nothing written outside
    y = x.clone()
    assert rms_norm(y, w, EPS, out=y).data_ptr() == y.data_ptr()
    checks.compare("rms_norm(in place)", y, ref)


def test_rms_norm_mixed_weight_dtype(rt, gen):
    x = _randn(3, 64, g=gen, rt=rt)
    w = _randn(64, g=gen, rt=rt, scale=0.2, dtype=torch.float64)
    checks.compare("rms_norm(float64 weight)", rms_norm(x, w, EPS), reference.rms_norm(x, w, EPS))


def test_rms_norm_through_check_kernel(rt):
    checks.check_kernel(
        "rms_norm", rms_norm, reference.rms_norm, quiet=True,
        cases=[lambda g: dict(x=_randn(17, 72, g=g, rt=rt), weight=_randn(72, g=g, rt=rt, scale=0.1),
                              eps=EPS, out=torch.empty(17, 72, device=rt.device, dtype=rt.dtype))])


# ---------------------------------------------------------------- add_rms_norm

@pytest.mark.parametrize("T,H", [(1, 64), (21, 64), (18, 90)])
def test_add_rms_norm_matches_reference(rt, gen, T, H):
    x = _randn(T, H, g=gen, rt=rt)
    res = _randn(T, H, g=gen, rt=rt, scale=4.0)
    w = _randn(H, g=gen, rt=rt, scale=0.2)
    with count_launches() as launches:
        normed, s = add_rms_norm(x, res, w, EPS)
    assert launches["add_rms_norm_kernel"] == 1 and sum(launches.values()) == 1
    ref_normed, ref_s = reference.add_rms_norm(x, res, w, EPS)
    checks.compare("add_rms_norm sum", s, ref_s)
    checks.compare("add_rms_norm normed", normed, ref_normed)


@pytest.mark.parametrize("alias", ["residual", "x"])
def test_add_rms_norm_in_place_residual_stream(rt, gen, alias):
    T, H = 37, 64                                   # several programs, a ragged last one
    x = _randn(T, H, g=gen, rt=rt)
    res = _randn(T, H, g=gen, rt=rt, scale=2.0)
    w = _randn(H, g=gen, rt=rt, scale=0.2)
    ref_normed, ref_s = reference.add_rms_norm(x, res, w, EPS)
    target = res if alias == "residual" else x
    out = checks.poison_(torch.empty(T, H, device=rt.device, dtype=rt.dtype))
    normed, s = add_rms_norm(x, res, w, EPS, out=out, residual_out=target)
    assert s.data_ptr() == target.data_ptr() and normed.data_ptr() == out.data_ptr()
    checks.compare(f"add_rms_norm sum into {alias}", target, ref_s)
    checks.compare(f"add_rms_norm normed ({alias} aliased)", normed, ref_normed)


def test_add_rms_norm_strided_rows(rt, gen):
    T, H = 12, 48
    xbuf = _randn(T, 2 * H, g=gen, rt=rt)
    x = xbuf[:, H:]
    res = _randn(T, 3 * H, g=gen, rt=rt)[:, :H]
    w = _randn(H, g=gen, rt=rt, scale=0.2)
    normed, s = add_rms_norm(x, res, w, EPS)
    ref_normed, ref_s = reference.add_rms_norm(x, res, w, EPS)
    checks.compare("add_rms_norm sum (strided)", s, ref_s)
    checks.compare("add_rms_norm normed (strided)", normed, ref_normed)


def test_add_rms_norm_normalises_the_stored_residual(rt, gen):
    """The norm reads s as stored (rounded to x's dtype), not the fp32 sum. In float32 the two are one number, so
    this runs in float16 (the interpreter rounds float16 through NumPy as a GPU does): a large first column
    carries each row's norm and loses its low bits when s is stored, which moves every normed value by about a
    quarter of a float16 step. Normalising the fp32 sum changes about half the outputs by one step; the kernel
    matches the reference but for rare rounding ties."""
    T, H = 8, 256
    x = checks.randn(T, H, g=gen, scale=0.5)
    x[:, 0] = 1000.0 + 500.0 * torch.rand(T, generator=gen)
    res = 0.5 * torch.rand(T, H, generator=gen)
    w = checks.randn(H, g=gen, scale=0.1)
    x, res, w = (t.to(device=rt.device, dtype=torch.float16) for t in (x, res, w))
    normed, s = add_rms_norm(x, res, w, EPS)
    ref_normed, ref_s = reference.add_rms_norm(x, res, w, EPS)
    assert torch.equal(s, ref_s)
    differ = (normed != ref_normed).float().mean().item()
    assert differ <= 0.01, f"add_rms_norm (float16): {differ:.1%} of the normed values differ from the reference"
    checks.compare("add_rms_norm normed (float16)", normed, ref_normed)


def test_add_rms_norm_through_check_kernel(rt):
    # residual_out is left to the kernel to allocate here (the in-place tests above, and the poisoning test
    # below, cover that buffer)
    def case(g):
        return dict(x=_randn(9, 64, g=g, rt=rt), residual=_randn(9, 64, g=g, rt=rt),
                    weight=_randn(64, g=g, rt=rt, scale=0.1), eps=EPS,
                    out=torch.empty(9, 64, device=rt.device, dtype=rt.dtype))
    checks.check_kernel("add_rms_norm", add_rms_norm, reference.add_rms_norm, cases=[case], quiet=True)


# ---------------------------------------------------------------- gated_rms_norm

@pytest.mark.parametrize("shape", [(1, 4, 16), (11, TINY.linear_num_value_heads, TINY.linear_value_head_dim),
                                   (6, 3, 40), (13, 24)])
def test_gated_rms_norm_matches_reference(rt, gen, shape):
    x = _randn(*shape, g=gen, rt=rt)
    z = _randn(*shape, g=gen, rt=rt, scale=2.0)
    w = _randn(shape[-1], g=gen, rt=rt, scale=0.5) + 1.0     # plain weight near 1
    with count_launches() as launches:
        out = gated_rms_norm(x, z, w, EPS)
    assert launches["gated_rms_norm_kernel"] == 1
    checks.compare("gated_rms_norm", out, reference.gated_rms_norm(x, z, w, EPS))


def test_gated_norm_uses_plain_weight(rt, gen):
    x = _randn(5, 32, g=gen, rt=rt)
    z = _randn(5, 32, g=gen, rt=rt)
    out = gated_rms_norm(x, z, torch.zeros(32, device=rt.device, dtype=rt.dtype), EPS)
    assert torch.count_nonzero(out) == 0                         # w = 0 zeroes it: no hidden +1


def test_gated_norm_z_from_fused_projection(rt, gen):
    cfg = TINY
    T, Hv, Dv = 7, cfg.linear_num_value_heads, cfg.linear_value_head_dim
    proj = _randn(T, cfg.linear_in_proj_dim, g=gen, rt=rt)
    z = proj[:, cfg.linear_conv_dim:cfg.linear_conv_dim + cfg.linear_value_dim].view(T, Hv, Dv)
    x = _randn(T, Hv, Dv, g=gen, rt=rt)
    w = _randn(Dv, g=gen, rt=rt, dtype=torch.float32) + 1.0   # checkpoints store this one in float32
    out = gated_rms_norm(x, z, w, EPS)
    assert out.dtype == x.dtype and out.is_contiguous()
    checks.compare("gated_rms_norm(strided z)", out, reference.gated_rms_norm(x, z, w, EPS))


def test_gated_norm_through_check_kernel(rt):
    def case(g):
        return dict(x=_randn(5, 4, 16, g=g, rt=rt), z=_randn(5, 4, 16, g=g, rt=rt),
                    weight=_randn(16, g=g, rt=rt), eps=EPS,
                    out=torch.empty(5, 4, 16, device=rt.device, dtype=rt.dtype))
    checks.check_kernel("gated_rms_norm", gated_rms_norm, reference.gated_rms_norm, cases=[case], quiet=True)


# ---------------------------------------------------------------- argument errors

def test_bad_arguments_are_named(rt, gen):
    x = _randn(4, 32, g=gen, rt=rt)
    w = _randn(32, g=gen, rt=rt)
    with pytest.raises(KernelError, match="weight"):
        rms_norm(x, w[:16], EPS)
    with pytest.raises(KernelError, match="contiguous"):
        rms_norm(_randn(32, 4, g=gen, rt=rt).t(), w, EPS)
    with pytest.raises(KernelError, match="floating"):
        rms_norm(x.long(), w, EPS)
    with pytest.raises(KernelError, match="out"):
        rms_norm(x, w, EPS, out=torch.empty(4, 31, device=rt.device, dtype=rt.dtype))
    with pytest.raises(KernelError, match="residual"):
        add_rms_norm(x, x[:3], w, EPS)
    with pytest.raises(KernelError, match=r"\[T, H\]"):
        add_rms_norm(x[None], x[None], w, EPS)
    with pytest.raises(KernelError, match="z"):
        gated_rms_norm(x, x[:, :16], w, EPS)
    with pytest.raises(KernelError, match="merged"):
        rms_norm(_randn(4, 3, 5, 32, g=gen, rt=rt).transpose(0, 2), w, EPS)


def test_empty_rows(rt, gen):
    w = _randn(8, g=gen, rt=rt)
    assert rms_norm(torch.empty(0, 8, device=rt.device, dtype=rt.dtype), w, EPS).shape == (0, 8)


# ---------------------------------------------------------------- GPU: bf16, Qwen3.5-0.8B shapes

@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 5, 2048])
def test_gpu_hidden_norms(gen, T):
    H = QWEN35_0_8B.hidden_size
    x = checks.randn(T, H, g=gen, dtype=torch.bfloat16, device="cuda", scale=4.0)
    res = checks.randn(T, H, g=gen, dtype=torch.bfloat16, device="cuda", scale=4.0)
    w = checks.randn(H, g=gen, dtype=torch.bfloat16, device="cuda", scale=0.3)
    checks.compare("rms_norm", rms_norm(x, w, EPS), reference.rms_norm(x, w, EPS))
    ref_normed, ref_s = reference.add_rms_norm(x, res, w, EPS)
    normed, s = add_rms_norm(x, res, w, EPS, residual_out=res)        # in-place residual stream
    checks.compare("add_rms_norm sum", s, ref_s)
    checks.compare("add_rms_norm normed", normed, ref_normed)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 2048])
def test_gpu_qk_norm_on_fused_projection(gen, T):
    cfg = QWEN35_0_8B
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    proj = checks.randn(T, cfg.attn_in_proj_dim, g=gen, dtype=torch.bfloat16, device="cuda", scale=2.0)
    q = proj[:, :cfg.attn_q_dim].view(T, Hq, 2 * D)[:, :, :D]
    k = proj[:, cfg.attn_q_dim:cfg.attn_q_dim + cfg.attn_kv_dim].view(T, Hkv, D)
    w = checks.randn(D, g=gen, dtype=torch.bfloat16, device="cuda", scale=0.3)
    checks.compare("q_norm", rms_norm(q, w, cfg.rms_norm_eps), reference.rms_norm(q, w, cfg.rms_norm_eps))
    checks.compare("k_norm", rms_norm(k, w, cfg.rms_norm_eps), reference.rms_norm(k, w, cfg.rms_norm_eps))


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 2048])
def test_gpu_gated_norm(gen, T):
    cfg = QWEN35_0_8B
    Hv, Dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    proj = checks.randn(T, cfg.linear_in_proj_dim, g=gen, dtype=torch.bfloat16, device="cuda")
    z = proj[:, cfg.linear_conv_dim:cfg.linear_conv_dim + cfg.linear_value_dim].view(T, Hv, Dv)
    x = checks.randn(T, Hv, Dv, g=gen, dtype=torch.bfloat16, device="cuda")
    w = checks.randn(Dv, g=gen, dtype=torch.float32, device="cuda") + 1.0
    checks.compare("gated_rms_norm", gated_rms_norm(x, z, w, cfg.rms_norm_eps),
                   reference.gated_rms_norm(x, z, w, cfg.rms_norm_eps))


def test_check_kernel_poisons_every_output_buffer_by_name(rt, gen):
    """`residual_out` is an output like `out`: poisoned before the call and never handed to the reference. (Named as
    the notebook names its check of the library's kernel: an exercise's name would add that exercise's float16 case.)"""
    from qwen_lab.kernels.norms import add_rms_norm

    def case(g):
        x = checks.randn(3, 40, g=g, dtype=rt.dtype, device=rt.device)
        return dict(x=x, residual=checks.randn(3, 40, g=g, dtype=rt.dtype, device=rt.device),
                    weight=checks.randn(40, g=g, device=rt.device, scale=0.1), eps=1e-6,
                    out=torch.empty_like(x), residual_out=torch.empty_like(x))
    results = checks.check_kernel("qwen_lab add_rms_norm", add_rms_norm, reference.add_rms_norm, [case], quiet=True)
    assert len(results) == 2

    def lazy(x, residual, weight, eps, out=None, residual_out=None):  # forgets to write residual_out
        normed, _ = add_rms_norm(x, residual, weight, eps, out=out)
        return normed, residual_out
    with pytest.raises(checks.CheckFailed, match="NaN"):
        checks.check_kernel("qwen_lab add_rms_norm", lazy, reference.add_rms_norm, [case], quiet=True)


def test_check_kernel_hands_strided_views_over_with_their_strides(rt, gen):
    """A case's strided view (rows farther apart than their length) reaches the kernel with its strides, so a
    kernel that assumes contiguous rows fails the check instead of passing on a contiguous copy."""
    from qwen_lab.kernels.norms import rms_norm

    def case(g):
        wide = checks.randn(5, 64, g=g, dtype=rt.dtype, device=rt.device)
        return dict(x=wide[:, 8:48], weight=checks.randn(40, g=g, device=rt.device, scale=0.1), eps=1e-6)
    seen = []

    def right(x, weight, eps):
        seen.append(x.stride())
        return rms_norm(x, weight, eps)

    checks.check_kernel("qwen_lab rms_norm", right, reference.rms_norm, [case], quiet=True)
    assert seen == [(64, 1)]

    def assumes_contiguous_rows(x, weight, eps):  # reads row r at r * 40, as a kernel ignoring stride_x would
        packed = torch.as_strided(x, x.shape, (x.shape[1], 1), x.storage_offset())
        return rms_norm(packed, weight, eps)
    with pytest.raises(checks.CheckFailed):
        checks.check_kernel("qwen_lab rms_norm", assumes_contiguous_rows, reference.rms_norm, [case], quiet=True,
                            require_triton=False)


# ---------------------------------------------------------------- the teaching kernels (notebook 02)


def test_the_teaching_kernels_are_the_notebooks_solutions():
    """qwen_lab/kernels/norms/teach.py holds exercises 02.1-02.3 as solutions/02_rmsnorm.ipynb writes them."""
    from notebook_source import assert_teaches

    assert_teaches("02_rmsnorm.ipynb", "qwen_lab/kernels/norms/teach.py")


@pytest.mark.parametrize("rows", [(1,), (13,), (9, 3)])
def test_the_teaching_kernels_match_the_reference(rt, gen, rows):
    """The teaching launchers as library code: ragged row counts (not multiples of BLOCK_R = 8) and widths (not
    powers of two), a strided [T, heads, D] view for the two that take one."""
    from qwen_lab.kernels.norms import teach

    D = 40
    x = _randn(*rows, D, g=gen, rt=rt, scale=2.0)
    w = _randn(D, g=gen, rt=rt, scale=0.2)
    checks.compare("my_rms_norm", teach.my_rms_norm(x, w, EPS), reference.rms_norm(x, w, EPS))
    if len(rows) == 2:   # a view whose heads are not adjacent: every other head of a wider projection
        wide = _randn(rows[0], 2 * rows[1], D, g=gen, rt=rt, scale=2.0)
        view = wide[:, ::2]
        checks.compare("my_rms_norm(strided)", teach.my_rms_norm(view, w, EPS), reference.rms_norm(view, w, EPS))
    z = _randn(*rows, D, g=gen, rt=rt, scale=2.0)
    checks.compare("my_gated_rms_norm", teach.my_gated_rms_norm(x, z, w, EPS),
                   reference.gated_rms_norm(x, z, w, EPS))
    if len(rows) == 1:
        r = _randn(*rows, D, g=gen, rt=rt)
        normed, s = teach.my_add_rms_norm(x, r, w, EPS)
        want_normed, want_s = reference.add_rms_norm(x, r, w, EPS)
        checks.compare("my_add_rms_norm (sum)", s, want_s)
        checks.compare("my_add_rms_norm (normed)", normed, want_normed)
