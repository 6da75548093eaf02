"""The Gated DeltaNet kernels (qwen_lab.kernels.deltanet) against qwen_lab.reference and transformers.

CPU: the Triton interpreter in float32, small heads (Dk != Dv, Hv = Hk and Hv = 2 Hk), token counts around
the chunk size of 64. GPU: bf16 inputs and an fp32 state on Qwen3.5-0.8B shapes (16 heads of 128), the
larger models' 32 and 48 value heads, and 2048 / 8192-token prefills.
"""

import pytest
import torch

from qwen_lab import checks, reference
from qwen_lab.config import QWEN35_0_8B
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches
from qwen_lab.kernels.deltanet import (chunk_workspace, delta_rule_chunked, delta_rule_recurrent, deltanet_decode_step,
                                       deltanet_gates, l2norm)


def _gate_params(Hv, g, device):
    """A_log, dt_bias as a trained layer might have them: decays from slow to fast across heads."""
    A = torch.empty(Hv).uniform_(0.05, 4.0, generator=g)
    dt_bias = checks.randn(Hv, g=g) - 1.0
    return A.log().to(device), dt_bias.to(device)


def _delta_inputs(T, Hk, Hv, Dk, Dv, g, dtype, device, state_scale=0.5):
    """q, k, v as views of one conv-output-like tensor [T, q | k | v | pad]; g, beta from the gates; a state."""
    width = 2 * Hk * Dk + Hv * Dv
    qkv = checks.randn(T, width + 8, g=g, dtype=dtype, device=device)
    q = qkv[:, :Hk * Dk].unflatten(1, (Hk, Dk))
    k = qkv[:, Hk * Dk:2 * Hk * Dk].unflatten(1, (Hk, Dk))
    v = qkv[:, 2 * Hk * Dk:width].unflatten(1, (Hv, Dv))
    ab = checks.randn(T, 2 * Hv + 3, g=g, dtype=dtype, device=device)
    A_log, dt_bias = _gate_params(Hv, g, device)
    gate, beta = reference.deltanet_gates(ab[:, :Hv], ab[:, Hv:2 * Hv], A_log, dt_bias)
    state = checks.randn(Hv, Dk, Dv, g=g, device=device, scale=state_scale)
    return dict(q=q, k=k, v=v, g=gate, beta=beta, state=state)


def _case(T, Hk, Hv, Dk, Dv, rt, **extra):
    def make(g):
        d = _delta_inputs(T, Hk, Hv, Dk, Dv, g, rt.dtype, rt.device)
        d["out"] = torch.empty(T, Hv, Dv, dtype=rt.dtype, device=rt.device)
        d.update(extra)
        return d
    return make


# ---------------------------------------------------------------- l2norm and gates


@pytest.mark.parametrize("shape", [(7, 3, 20), (5, 33), (24,), (1, 1, 128)])
def test_l2norm_matches_reference(shape, rt, gen):
    wide = checks.randn(*shape[:-1], shape[-1] + 5, g=gen, dtype=rt.dtype, device=rt.device)
    x = wide[..., 2:2 + shape[-1]]  # strided rows
    out = checks.poison_(torch.empty(shape, dtype=rt.dtype, device=rt.device))
    y = l2norm(x, out=out)
    assert y is out
    checks.compare("l2norm", y, reference.l2norm(x))
    checks.compare("l2norm eps", l2norm(x, eps=0.5), reference.l2norm(x, eps=0.5))


@pytest.mark.parametrize("T, Hv", [(1, 4), (37, 6), (130, 16)])
def test_gates_match_reference(T, Hv, rt, gen):
    proj = checks.randn(T, 2 * Hv + 5, g=gen, dtype=rt.dtype, device=rt.device, scale=3.0)
    proj[0, :Hv] = torch.linspace(-60, 60, Hv)  # both softplus branches: e^x tiny, and x above the threshold 20
    b, a = proj[:, 1:1 + Hv], proj[:, 1 + Hv:1 + 2 * Hv]
    A_log, dt_bias = _gate_params(Hv, gen, rt.device)
    g_out = checks.poison_(torch.empty(T, Hv, device=rt.device))
    beta_out = checks.poison_(torch.empty(T, Hv, device=rt.device))
    g, beta = deltanet_gates(a, b, A_log, dt_bias, g_out=g_out, beta_out=beta_out)
    assert g is g_out and beta is beta_out
    g_ref, beta_ref = reference.deltanet_gates(a, b, A_log, dt_bias)
    checks.compare("g", g, g_ref, atol=1e-6, rtol=1e-5)
    checks.compare("beta", beta, beta_ref, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- the delta rule


@pytest.mark.parametrize("T, Hk, Hv, Dk, Dv", [
    (1, 2, 2, 16, 32),     # decode
    (6, 2, 4, 16, 32),     # Hv = 2 Hk
    (19, 1, 3, 24, 40),    # ragged head dims: Dv spans one full and one partial block
])
def test_recurrent_matches_reference(T, Hk, Hv, Dk, Dv, rt):
    checks.check_kernel("delta_rule_recurrent", delta_rule_recurrent, reference.delta_rule_recurrent,
                        [_case(T, Hk, Hv, Dk, Dv, rt)], seed=T, inplace=("state",), quiet=True)


@pytest.mark.parametrize("Hk, Hv", [(2, 2), (2, 4)])
@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_chunked_matches_reference(T, Hk, Hv, rt):
    with count_launches() as launches:
        checks.check_kernel("delta_rule_chunked", delta_rule_chunked, reference.delta_rule_chunked,
                            [_case(T, Hk, Hv, 16, 32, rt)], seed=T + Hv, inplace=("state",), quiet=True)
    assert sum(launches.values()) == 2


def test_chunked_ragged_dims_and_chunk_128(rt):
    checks.check_kernel("delta_rule_chunked", delta_rule_chunked, reference.delta_rule_chunked,
                        [_case(70, 1, 2, 24, 40, rt), _case(130, 2, 2, 16, 16, rt, chunk_size=128)],
                        seed=5, inplace=("state",), quiet=True)


def _hf_inputs(d, rep):
    """transformers' layout: a batch dim, q/k repeated to the value heads, the state [1, Hv, Dk, Dv]."""
    q, k = (x.float().repeat_interleave(rep, dim=1)[None] for x in (d["q"], d["k"]))
    return dict(query=q, key=k, value=d["v"].float()[None], g=d["g"][None], beta=d["beta"][None],
                initial_state=d["state"].clone()[None], output_final_state=True, use_qk_l2norm_in_kernel=True)


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_matches_transformers(form, rt, gen):
    tf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    T, Hk, Hv, Dk, Dv = (70, 2, 4, 16, 32) if form == "chunked" else (9, 2, 4, 16, 32)
    d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, torch.float32, "cpu")
    hf = tf.torch_chunk_gated_delta_rule if form == "chunked" else tf.torch_recurrent_gated_delta_rule
    o_hf, s_hf = hf(**_hf_inputs(d, Hv // Hk))
    kernel = delta_rule_chunked if form == "chunked" else delta_rule_recurrent
    dev = {name: t.to(rt.device) for name, t in d.items()}
    o = kernel(**dev)
    checks.compare("o", o.cpu().float(), o_hf[0], atol=2e-4, rtol=2e-4)
    checks.compare("state", dev["state"].cpu(), s_hf[0], atol=2e-4, rtol=2e-4)


def test_chunked_prefill_then_decode_equals_longer_prefill(rt, gen):
    """Prefill 65 tokens (chunked), decode 3 more one by one (recurrent) == one chunked prefill of 68."""
    T0, steps, Hk, Hv, Dk, Dv = 65, 3, 2, 4, 16, 32
    d = _delta_inputs(T0 + steps, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    qkvgb = [d[n] for n in ("q", "k", "v", "g", "beta")]
    long_state = d["state"].clone()
    o_long = delta_rule_chunked(*qkvgb, long_state)
    state = d["state"].clone()
    outs = [delta_rule_chunked(*(x[:T0] for x in qkvgb), state)]
    for t in range(T0, T0 + steps):
        outs.append(delta_rule_recurrent(*(x[t:t + 1] for x in qkvgb), state))
    checks.compare("outputs", torch.cat(outs), o_long)
    checks.compare("state", state, long_state)


def test_decode_step_fuses_the_gates(rt, gen):
    T, Hk, Hv, Dk, Dv = 3, 2, 4, 16, 32
    d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    proj = checks.randn(T, 2 * Hv + 1, g=gen, dtype=rt.dtype, device=rt.device)
    b, a = proj[:, 1:1 + Hv], proj[:, 1 + Hv:]
    A_log, dt_bias = _gate_params(Hv, gen, rt.device)
    ref_state = d["state"].clone()
    g, beta = reference.deltanet_gates(a, b, A_log, dt_bias)
    ref = reference.delta_rule_recurrent(d["q"], d["k"], d["v"], g, beta, ref_state)
    with count_launches() as launches:
        o = deltanet_decode_step(d["q"], d["k"], d["v"], a, b, A_log, dt_bias, d["state"])
    assert sum(launches.values()) == 1
    checks.compare("o", o, ref)
    checks.compare("state", d["state"], ref_state)


def test_padding_never_reaches_the_state(rt, gen):
    """Rows past T (the padded tail of the last chunk) hold NaN in memory; they must not be read."""
    T, Hk, Hv, Dk, Dv = 70, 2, 2, 16, 32
    d = _delta_inputs(T + 9, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    for name in ("q", "k", "v", "g", "beta"):
        d[name][T:] = float("nan")
    clean = {n: (t[:T] if n != "state" else t.clone()) for n, t in d.items()}
    ref = reference.delta_rule_chunked(**clean)
    state = d["state"]
    o = delta_rule_chunked(*(d[n][:T] for n in ("q", "k", "v", "g", "beta")), state)
    checks.compare("o", o, ref)
    checks.compare("state", state, clean["state"])


def test_workspace_can_be_reused_and_oversized(rt, gen):
    T, Hk, Hv, Dk, Dv = 70, 2, 2, 16, 32
    d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    args = [d[n] for n in ("q", "k", "v", "g", "beta")]
    ws = chunk_workspace(200, Hv, Dk, Dv, rt.dtype, rt.device)  # room for 200 tokens: a longer row pitch
    first = d["state"].clone()
    o1 = delta_rule_chunked(*args, first, workspace=ws)
    second = d["state"].clone()
    o2 = delta_rule_chunked(*args, second, workspace=ws)
    ref_state = d["state"].clone()
    ref = reference.delta_rule_chunked(*args, ref_state)
    for o, s in ((o1, first), (o2, second)):
        checks.compare("o", o, ref)
        checks.compare("state", s, ref_state)
    with pytest.raises(KernelError, match="workspace"):
        delta_rule_chunked(*args, first, workspace=chunk_workspace(10, Hv, Dk, Dv, rt.dtype, rt.device))


def test_rejects_bad_arguments(rt, gen):
    d = _delta_inputs(5, 2, 4, 16, 32, gen, rt.dtype, rt.device)
    q, k, v, g, beta, state = (d[n] for n in ("q", "k", "v", "g", "beta", "state"))
    with pytest.raises(KernelError, match="state"):
        delta_rule_recurrent(q, k, v, g, beta, state.to(torch.float64))
    with pytest.raises(KernelError, match="state"):
        delta_rule_chunked(q, k, v, g, beta, state[:, :8])
    with pytest.raises(KernelError, match="value heads"):
        delta_rule_recurrent(q, k, v[:, :3], g[:, :3], beta[:, :3], state[:3])
    with pytest.raises(KernelError, match="beta"):
        delta_rule_chunked(q, k, v, g, beta[:4], state)
    with pytest.raises(KernelError, match="k"):
        delta_rule_chunked(q, k[:, :1], v, g, beta, state)
    with pytest.raises(KernelError, match="chunk_size"):
        delta_rule_chunked(q, k, v, g, beta, state, chunk_size=48)
    with pytest.raises(KernelError, match="out"):
        delta_rule_recurrent(q, k, v, g, beta, state, out=torch.empty(5, 4, 16, device=rt.device))
    with pytest.raises(KernelError, match="b"):
        deltanet_gates(g, beta[:, :2], torch.zeros(4), torch.zeros(4))


# ---------------------------------------------------------------- GPU: real shapes, bf16 inputs, fp32 state


def _close(name, got, ref, max_rel=2e-2):
    """bf16 matmul operands: judged by the relative error of the whole tensor (about 4e-3 expected when bf16
    rounding is emulated on the CPU), plus an elementwise bound at a tenth of the tensor's scale that catches
    a wrong row or head."""
    checks.finite_or_raise(name, got)
    err = checks.relative_error(got, ref)
    assert err < max_rel, f"{name}: relative error {err:.3g} >= {max_rel}"
    checks.compare(name, got, ref, atol=0.1 * float(ref.float().abs().max()), rtol=0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("Hv", [16, 32, 48])
def test_gpu_recurrent_decode(Hv, rt, gen):
    Hk, Dk, Dv = QWEN35_0_8B.linear_num_key_heads, QWEN35_0_8B.linear_key_head_dim, QWEN35_0_8B.linear_value_head_dim
    d = _delta_inputs(1, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    ref_state = d["state"].clone()
    ref = reference.delta_rule_recurrent(**{**d, "state": ref_state})
    o = delta_rule_recurrent(**d)
    checks.compare("o", o, ref)  # all fp32 inside: only the final bf16 rounding differs
    checks.compare("state", d["state"], ref_state, atol=1e-4, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("T, Hv", [(2048, 16), (8192, 16), (2048, 32), (2048, 48)])
def test_gpu_chunked_prefill(T, Hv, rt, gen):
    Hk, Dk, Dv = QWEN35_0_8B.linear_num_key_heads, QWEN35_0_8B.linear_key_head_dim, QWEN35_0_8B.linear_value_head_dim
    d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    ref_state = d["state"].clone()
    ref = reference.delta_rule_chunked(**{**d, "state": ref_state})
    o = delta_rule_chunked(**d)
    _close("o", o, ref)
    _close("state", d["state"], ref_state)


@pytest.mark.gpu
def test_gpu_chunked_equals_recurrent(rt, gen):
    Hk = Hv = QWEN35_0_8B.linear_num_value_heads
    Dk, Dv = QWEN35_0_8B.linear_key_head_dim, QWEN35_0_8B.linear_value_head_dim
    d = _delta_inputs(2048 + 3, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    args = [d[n] for n in ("q", "k", "v", "g", "beta")]
    s_chunk, s_rec = d["state"].clone(), d["state"].clone()
    o_chunk = delta_rule_chunked(*args, s_chunk)
    o_rec = delta_rule_recurrent(*args, s_rec)
    _close("o", o_chunk, o_rec)
    _close("state", s_chunk, s_rec)


@pytest.mark.gpu
def test_gpu_decode_step_captures_in_a_cuda_graph(rt, gen):
    cfg = QWEN35_0_8B
    Hk, Hv, Dk, Dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
        cfg.linear_value_head_dim
    d = _delta_inputs(1, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    proj = checks.randn(1, 2 * Hv, g=gen, dtype=rt.dtype, device=rt.device)
    b, a = proj[:, :Hv], proj[:, Hv:]
    A_log, dt_bias = _gate_params(Hv, gen, rt.device)
    start = d["state"].clone()
    out = torch.empty(1, Hv, Dv, dtype=rt.dtype, device=rt.device)
    out2 = torch.empty_like(out)
    for _ in range(2):  # warm-up: autotune and compile outside the capture
        deltanet_decode_step(d["q"], d["k"], d["v"], a, b, A_log, dt_bias, d["state"], out=out)
        delta_rule_recurrent(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], out=out2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deltanet_decode_step(d["q"], d["k"], d["v"], a, b, A_log, dt_bias, d["state"], out=out)
    d["state"].copy_(start)
    graph.replay()
    ref_state = start.clone()
    g, beta = reference.deltanet_gates(a, b, A_log, dt_bias)
    ref = reference.delta_rule_recurrent(d["q"], d["k"], d["v"], g, beta, ref_state)
    checks.compare("o", out, ref)
    checks.compare("state", d["state"], ref_state, atol=1e-4, rtol=1e-3)
