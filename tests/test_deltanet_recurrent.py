"""The recurrent (decode) form of the Gated DeltaNet kernels (qwen_lab.kernels.deltanet: gates.py, recurrent.py)
against qwen_lab.reference: l2norm and the gates, the recurrent delta rule, the decode step with the gates and with the
causal conv fused in, over consecutive steps and in the model, and notebook 08's teaching kernels.

CPU: the Triton interpreter in float32, small heads (Dk != Dv, Hv = Hk and Hv = 2 Hk). GPU: bf16 inputs and an fp32
state on Qwen3.5-0.8B shapes (16 heads of 128) and the larger models' 32 and 48 value heads; the fused conv decode
step over 8 and 40 steps, eagerly and replayed in a CUDA Graph.
"""

import pytest
import torch
import triton

from qwen_lab import reference, runtime
from qwen_lab.course import checks
from qwen_lab.course.checks import guarded_call as _guarded_call
from qwen_lab.config import QWEN35_0_8B
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches
from qwen_lab.kernels.deltanet import (autotune_configs, delta_rule_recurrent, deltanet_conv_decode_step,
                                       deltanet_decode_step, deltanet_gates, l2norm)
from qwen_lab.switches import switches
from qwen_lab.kernels.deltanet import tuning

from deltanet_cases import (READ_HINT, _case, _conv_decode_inputs, _delta_inputs, _formula_conv_decode_step,
                            _gate_params, _gpu_judge_step, _judge, _pick, _qwen_conv_decode, _run_conv_decode_guarded,
                            _run_guarded, _tickets_are_zero, _two_reference_calls, fail_if_counters_left)


@pytest.fixture(autouse=True)
def _counters_left_at_zero():
    """Every test leaves the counters DeltaNet launches share at zero (see fail_if_counters_left)."""
    yield
    fail_if_counters_left()


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


def test_l2norm_and_gates_stay_inside_their_tensors(rt, gen):
    for shape in [(1, 2, 16), (65, 2, 128), (3, 32)]:
        x = checks.randn(*shape, g=gen, dtype=rt.dtype, device=rt.device)
        got = _guarded_call(l2norm, dict(x=x, out=torch.empty_like(x)), outputs=("out",))
        checks.compare(f"l2norm {shape}", got["out"], reference.l2norm(x), hint=READ_HINT)
    for T, Hv in [(1, 4), (65, 16), (130, 48)]:
        proj = checks.randn(T, 2 * Hv, g=gen, dtype=rt.dtype, device=rt.device, scale=3.0)
        A_log, dt_bias = _gate_params(Hv, gen, rt.device)
        args = dict(a=proj[:, :Hv], b=proj[:, Hv:], A_log=A_log, dt_bias=dt_bias,
                    g_out=torch.empty(T, Hv, device=rt.device), beta_out=torch.empty(T, Hv, device=rt.device))
        got = _guarded_call(deltanet_gates, args, outputs=("g_out", "beta_out"))
        g_ref, beta_ref = reference.deltanet_gates(proj[:, :Hv], proj[:, Hv:], A_log, dt_bias)
        checks.compare(f"g (T={T}, Hv={Hv})", got["g_out"], g_ref, atol=1e-6, rtol=1e-5, hint=READ_HINT)
        checks.compare(f"beta (T={T}, Hv={Hv})", got["beta_out"], beta_ref, atol=1e-6, rtol=1e-5, hint=READ_HINT)


# ---------------------------------------------------------------- the recurrent delta rule


@pytest.mark.parametrize("T, Hk, Hv, Dk, Dv", [
    (1, 2, 2, 16, 32),     # decode
    (6, 2, 4, 16, 32),     # Hv = 2 Hk
    (19, 1, 3, 24, 40),    # ragged head dims: Dv spans one full and one partial block
])
def test_recurrent_matches_reference(T, Hk, Hv, Dk, Dv, rt):
    checks.check_kernel("delta_rule_recurrent", delta_rule_recurrent, reference.delta_rule_recurrent,
                        [_case(T, Hk, Hv, Dk, Dv, rt)], seed=T, inplace=("state",), quiet=True)


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


# T = 1 (decode) and a few tokens; the recurrent kernel has no chunks, and 65 steps of 128-wide heads cost the
# interpreter seconds
_STEP_SHAPES = [(T, Hk, Hv, D, D) for T in (1, 5) for D in (16, 32, 128) for Hk, Hv in ((2, 2), (1, 2))] + \
    [(5, 1, 3, 24, 40)]


@pytest.mark.parametrize("fused", [False, True], ids=["recurrent", "decode_step"])
@pytest.mark.parametrize("shape", _STEP_SHAPES, ids=lambda s: "T{}-Hk{}-Hv{}-Dk{}-Dv{}".format(*s))
def test_recurrent_stays_inside_its_tensors(shape, fused, rt, gen):
    i = _STEP_SHAPES.index(shape) + fused
    config = _pick(autotune_configs("delta_rule_recurrent_kernel", Dv=shape[4]), i)
    kernel = deltanet_decode_step if fused else delta_rule_recurrent
    _run_guarded(kernel, shape, gen, rt, [("delta_rule_recurrent_kernel", config)])


def _zero_and_tiny_heads(x):
    """x [T, H, D] with head 0 all zeros and head 1 scaled by 1e-4 (a sum of squares far below eps) in every token."""
    x = x.clone()
    x[:, 0] = 0.0
    x[:, 1] *= 1e-4
    return x


def test_l2norm_eps_on_zero_and_tiny_keys(rt, gen):
    """q and k heads of zeros and heads whose sum of squares is far below eps: eps decides their l2norm, so a kernel
    that dropped it returns NaN (zero heads) or a unit vector where the reference's is about 0.1 long."""
    T, Hk, Hv, Dk, Dv = 3, 3, 3, 16, 16
    d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    q, k = _zero_and_tiny_heads(d["q"]), _zero_and_tiny_heads(d["k"])
    assert float(reference.l2norm(k[:, 1]).norm(dim=-1).max()) < 0.5, "eps dominates the tiny heads' norm"
    ref_state = d["state"].clone()
    ref = reference.delta_rule_recurrent(q, k, d["v"], d["g"], d["beta"], ref_state)
    o = delta_rule_recurrent(q, k, d["v"], d["g"], d["beta"], d["state"])
    checks.compare("o (zero and tiny q/k heads)", o, ref)
    checks.compare("state (zero and tiny q/k heads)", d["state"], ref_state)


# ---------------------------------------------------------------- the teaching kernels (notebook 08)


@pytest.mark.parametrize("T, H", [(1, 4), (9, 6), (5, 24)])
def test_teaching_gates_match_reference(T, H, rt, gen):
    """Notebook 08's gates kernel as library code: a and b strided slices of one projection, both softplus
    branches."""
    from qwen_lab.kernels.deltanet import teach_recurrent

    proj = checks.randn(T, 2 * H + 3, g=gen, dtype=rt.dtype, device=rt.device, scale=3.0)
    proj[0, 3 + H:] = torch.linspace(-60, 60, H)
    a, b = proj[:, 3 + H:], proj[:, 3:3 + H]
    A_log, dt_bias = _gate_params(H, gen, rt.device)
    g, beta = teach_recurrent.my_deltanet_gates(a, b, A_log, dt_bias)
    g_ref, beta_ref = reference.deltanet_gates(a, b, A_log, dt_bias)
    checks.compare("teach g", g, g_ref, atol=1e-6, rtol=1e-5)
    checks.compare("teach beta", beta, beta_ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("T, Hk, Hv, Dk, Dv", [(1, 2, 2, 16, 32), (6, 2, 4, 16, 32), (5, 1, 3, 24, 40)])
def test_teaching_recurrent_matches_reference(T, Hk, Hv, Dk, Dv, rt):
    """Notebook 08's recurrent kernel as library code: Hv = Hk and a multiple of it, ragged head dims."""
    from qwen_lab.kernels.deltanet import teach_recurrent

    case = _case(T, Hk, Hv, Dk, Dv, rt)

    def drop_out(g):
        d = case(g)
        del d["out"]  # the notebook's launcher allocates its output
        return d
    checks.check_kernel("teach delta_rule_recurrent", teach_recurrent.my_delta_rule_recurrent,
                        reference.delta_rule_recurrent, [drop_out], seed=T, inplace=("state",), quiet=True)


# ---------------------------------------------------------------- the decode step with the conv fused in
#
# deltanet_conv_decode_step = reference causal_conv1d (conv + SiLU, conv_state shifted in place), the split into
# q, k, v, then deltanet_decode_step, in one launch. The q/k channels of a key head are read by every program of
# the value heads sharing it (Hv / Hk heads times Dv / BV column blocks) and shifted by the last of them to draw
# a ticket: the shapes below have several such readers (Hv = 2 Hk, 3 Hk, two column blocks of BV = 32 for
# Dv = 40), so a writer that went first would hand the next readers a shifted state.


# (Hk, Hv, Dk, Dv, W): Hv = Hk with Dk != Dv; Hv = 2 Hk; Hv = 3 Hk with ragged dims and two column blocks;
# Hv = 3 Hk with a width-3 filter; a width-2 filter (a one-column state, nothing shifted but the input)
_CONV_DECODE_SHAPES = [(2, 2, 16, 32, 4), (2, 4, 16, 16, 4), (1, 3, 24, 40, 4), (2, 6, 12, 20, 3), (1, 2, 16, 8, 2)]


@pytest.mark.parametrize("shape", _CONV_DECODE_SHAPES, ids=lambda s: "Hk{}-Hv{}-Dk{}-Dv{}-W{}".format(*s))
def test_conv_decode_step_equals_conv_then_decode_step(shape, rt, gen):
    """Three consecutive steps, conv state and state carried, against the reference conv + decode step."""
    Hk, Hv, Dk, Dv, W = shape
    heads = (Hk, Dk, Hv, Dv)
    steps = 3
    d = _conv_decode_inputs(steps, Hk, Hv, Dk, Dv, W, gen, rt.dtype, rt.device)
    conv_state, state = d["conv_state"].clone(), d["state"].clone()          # the kernel's
    ref_conv_state, ref_state = d["conv_state"].clone(), d["state"].clone()  # the two reference calls'
    for s in range(steps):
        row = {n: d[n][s:s + 1] for n in ("qkv", "a", "b")}
        params = dict(conv_weight=d["conv_weight"], A_log=d["A_log"], dt_bias=d["dt_bias"])
        if s == 0:  # the first step also against the formulas, apart from the reference's composition
            want_o, want_conv_state, want_state = _formula_conv_decode_step(
                row["qkv"], d["conv_weight"], conv_state, row["a"], row["b"], d["A_log"], d["dt_bias"], state, *heads)
            c0, s0 = d["conv_state"].clone(), d["state"].clone()
            ref0 = reference.deltanet_conv_decode_step(**row, **params, conv_state=c0, state=s0, num_k_heads=Hk,
                                                       head_k_dim=Dk, num_v_heads=Hv, head_v_dim=Dv)
        with count_launches() as launches:
            o = deltanet_conv_decode_step(**row, **params, conv_state=conv_state, state=state, num_k_heads=Hk,
                                          head_k_dim=Dk, num_v_heads=Hv, head_v_dim=Dv)
        assert dict(launches) == {"conv_decode_step_kernel": 1}, dict(launches)
        ref = _two_reference_calls(row["qkv"], d["conv_weight"], ref_conv_state, row["a"], row["b"], d["A_log"],
                                   d["dt_bias"], ref_state, *heads)
        if s == 0:
            loose = {} if rt.dtype == torch.float32 else dict(atol=2e-3, rtol=1e-2)   # (see _gpu_judge_step)
            checks.compare("reference.deltanet_conv_decode_step against the formulas", ref0, want_o.to(ref0.dtype))
            checks.compare("step 0: o against the formulas", o, want_o.to(o.dtype))
            checks.compare("step 0: state against the formulas", state, want_state.float(), **loose)
            assert torch.equal(conv_state, want_conv_state.to(conv_state.dtype)) and torch.equal(c0, conv_state)
        assert o.shape == (1, Hv, Dv) and o.dtype == rt.dtype
        if rt.dtype == torch.float32:
            checks.compare(f"step {s}: o", o, ref)
            checks.compare(f"step {s}: state", state, ref_state)
        else:  # bf16 conv outputs on a GPU (see _gpu_judge_step)
            _gpu_judge_step(f"step {s}", o, ref, conv_state, ref_conv_state, state, ref_state)
        # the conv state holds inputs: moving them is exact
        assert torch.equal(conv_state, ref_conv_state), f"step {s}: conv_state differs from the reference's"
        _tickets_are_zero(rt.device)


def test_conv_decode_step_l2norm_eps_on_zero_and_tiny_rows(rt, gen):
    """The fused step's l2norm where eps decides it: key head 0's q and k channels are zero (inputs and carried
    state, so the conv gives 0), key head 1's are 1e-4 of the usual (a sum of squares far below eps)."""
    Hk, Hv, Dk, Dv, W = 2, 4, 16, 16, 4
    d = _conv_decode_inputs(1, Hk, Hv, Dk, Dv, W, gen, rt.dtype, rt.device)
    for part in (0, Hk * Dk):   # the q channels, then the k channels
        for x in (d["qkv"][:, part:part + Hk * Dk].T, d["conv_state"][part:part + Hk * Dk]):
            x[:Dk] = 0.0
            x[Dk:] *= 1e-4
    ref_conv_state, ref_state = d["conv_state"].clone(), d["state"].clone()
    ref = _two_reference_calls(d["qkv"], d["conv_weight"], ref_conv_state, d["a"], d["b"], d["A_log"],
                               d["dt_bias"], ref_state, Hk, Dk, Hv, Dv)
    o = deltanet_conv_decode_step(d["qkv"], d["conv_weight"], d["conv_state"], d["a"], d["b"], d["A_log"],
                                  d["dt_bias"], d["state"], Hk, Dk, Hv, Dv)
    if rt.dtype == torch.float32:
        checks.compare("o (zero and tiny q/k rows)", o, ref)
        checks.compare("state (zero and tiny q/k rows)", d["state"], ref_state)
    else:
        _gpu_judge_step("zero and tiny q/k rows", o, ref, d["conv_state"], ref_conv_state, d["state"], ref_state)


def test_conv_decode_step_with_the_models_weight_layout(rt, gen):
    """The model stores the conv weight [W, C] and passes its [C, W] view (strides (1, C)): the same step."""
    Hk, Hv, Dk, Dv, W = _CONV_DECODE_SHAPES[2]
    d = _conv_decode_inputs(1, Hk, Hv, Dk, Dv, W, gen, rt.dtype, rt.device)
    by_tap = d["conv_weight"].t().contiguous().t()
    assert by_tap.stride() == (1, d["conv_weight"].shape[0])
    ref_conv_state, ref_state = d["conv_state"].clone(), d["state"].clone()
    ref = _two_reference_calls(d["qkv"], d["conv_weight"], ref_conv_state, d["a"], d["b"], d["A_log"],
                               d["dt_bias"], ref_state, Hk, Dk, Hv, Dv)
    o = deltanet_conv_decode_step(d["qkv"], by_tap, d["conv_state"], d["a"], d["b"], d["A_log"], d["dt_bias"],
                                  d["state"], Hk, Dk, Hv, Dv)
    if rt.dtype == torch.float32:
        checks.compare("o, weight stored [W, C]", o, ref)
        checks.compare("state, weight stored [W, C]", d["state"], ref_state)
    else:
        _gpu_judge_step("weight stored [W, C]", o, ref, d["conv_state"], ref_conv_state, d["state"], ref_state)
    assert torch.equal(d["conv_state"], ref_conv_state)


def test_conv_decode_step_stays_inside_its_tensors_with_every_gpu_config(rt, gen):
    """Every block size the GPU autotuner may pick (BV = 8 gives Dv / 8 readers of each q/k channel per value
    head), with every tensor a guarded view: NaN around inputs, a sentinel around outputs, padded row pitches
    (so the conv state, its weight and the state have row strides larger than their widths)."""
    ran = 0
    for shape, W in [((1, 1, 3, 24, 40), 4), ((1, 2, 4, 16, 16), 3)]:
        configs = autotune_configs("conv_decode_step_kernel", Dv=shape[4])
        if runtime.interpreter_active():  # it ignores num_warps and num_stages: one run per set of block sizes
            configs = list({str(c.kwargs): c for c in configs}.values())
        for config in configs:
            _run_conv_decode_guarded(shape, gen, rt, [("conv_decode_step_kernel", config)], W=W)
            ran += 1
    assert ran >= 3


def test_conv_decode_step_runs_with_the_config_its_pick_times(rt, gen, monkeypatch):
    """The fused decode step's first call of a kind times every config through the launcher's own launch (here with
    a made-up timer that prefers one config, under the interpreter): the states are put back after each timing, the
    call then runs once with the pick, and its output, states and ticket counters are the reference's."""
    Hk, Hv, Dk, Dv, W = _CONV_DECODE_SHAPES[2]
    configs = autotune_configs("conv_decode_step_kernel", Dv=Dv)
    best = configs[-1]
    used = []
    launch = tuning._launch

    def spy(kernel, grid, args, kwargs, interpreter_meta, untuned=None):
        used.append(untuned)
        return launch(kernel, grid, args, kwargs, interpreter_meta, untuned)

    def timer(calls, warmup, replays):
        assert len(calls) == 16, f"{len(calls)} launches per timing graph, expected 16"
        calls[0]()                                       # one of them: the interpreter is slow
        return 1.0 if used[-1] is best else 2.0
    real_pick = tuning._pick_in_place
    keys = []

    def pick(kernel, key, launch, states, on_gpu, calls, **named_args):
        keys.append(key)
        return real_pick(kernel, key, launch, states, True, calls, **named_args)   # time as on a GPU
    monkeypatch.setattr(tuning, "_launch", spy)
    monkeypatch.setattr(tuning, "_time_in_graph", timer)
    monkeypatch.setattr(tuning, "_pick_in_place", pick)
    monkeypatch.setitem(tuning._PICKS, "conv_decode_step_kernel", {})
    for settled in (False, True):
        d = _conv_decode_inputs(1, Hk, Hv, Dk, Dv, W, gen, rt.dtype, rt.device)
        ref_conv_state, ref_state = d["conv_state"].clone(), d["state"].clone()
        ref = _two_reference_calls(d["qkv"], d["conv_weight"], ref_conv_state, d["a"], d["b"], d["A_log"],
                                   d["dt_bias"], ref_state, Hk, Dk, Hv, Dv)
        used.clear()
        o = deltanet_conv_decode_step(**d, num_k_heads=Hk, head_k_dim=Dk, num_v_heads=Hv, head_v_dim=Dv,
                                      state_settled=settled)
        assert used[:-1] == configs, f"each config timed once here, then the call: {used}"
        assert used[-1] is best, f"the call ran with {used[-1]}, not the pick {best}"
        _judge(f"o (state_settled={settled})", o, ref)
        _judge(f"state (state_settled={settled})", d["state"], ref_state)
        assert torch.equal(d["conv_state"], ref_conv_state), "conv_state: not put back after the timing runs"
        _tickets_are_zero(rt.device)
    assert len(keys) == 2 and keys[0] != keys[1], "state_settled is part of the kind of call"
    assert list(tuning._PICKS["conv_decode_step_kernel"].values()) == [best, best]


def test_conv_decode_step_rejects_bad_arguments(rt, gen):
    Hk, Hv, Dk, Dv, W = 2, 4, 16, 16, 4
    d = _conv_decode_inputs(2, Hk, Hv, Dk, Dv, W, gen, rt.dtype, rt.device)
    good = dict(qkv=d["qkv"][:1], conv_weight=d["conv_weight"], conv_state=d["conv_state"], a=d["a"][:1],
                b=d["b"][:1], A_log=d["A_log"], dt_bias=d["dt_bias"], state=d["state"], num_k_heads=Hk,
                head_k_dim=Dk, num_v_heads=Hv, head_v_dim=Dv)
    bad = [
        ("qkv", dict(qkv=d["qkv"])),                                   # two tokens: not a decode step
        ("qkv", dict(qkv=d["qkv"][:1, :-1])),                          # a channel short
        ("qkv", dict(qkv=d["qkv"][:1, ::2])),                          # channels not contiguous
        ("conv_weight", dict(conv_weight=d["conv_weight"][:-1])),
        ("conv_state", dict(conv_state=d["conv_state"][:, :-1])),      # W-2 columns for a width-W filter
        ("a", dict(a=d["a"][:1, :-1])),
        ("b", dict(b=d["b"])),
        ("A_log", dict(A_log=d["A_log"][:-1])),
        ("state", dict(state=d["state"].double())),
        ("state", dict(state=d["state"][:, :8])),
        ("num_v_heads", dict(num_v_heads=3, qkv=d["qkv"][:1, :2 * Hk * Dk + 3 * Dv])),  # not a multiple of Hk
        ("head_k_dim", dict(head_k_dim=0)),
        ("out", dict(out=torch.empty(1, Hv, Dv, dtype=torch.float64, device=rt.device))),
        ("out", dict(out=torch.empty(1, Hv, Dv + 1, dtype=rt.dtype, device=rt.device))),
    ]
    for name, change in bad:
        with pytest.raises(KernelError, match=rf"^{name}\b"):
            deltanet_conv_decode_step(**{**good, **change})
    before = (d["conv_state"].clone(), d["state"].clone())
    with pytest.raises(KernelError):
        deltanet_conv_decode_step(**{**good, "qkv": d["qkv"]})
    assert torch.equal(before[0], d["conv_state"]) and torch.equal(before[1], d["state"]), "a rejected call wrote"


def test_model_decode_runs_the_fused_conv_and_equals_the_unfused_route(rt):
    """The tiny model's fast route (Hv = 2 Hk): decode through deltanet_conv_decode_step equals the two-call route
    forced by swapping the conv entry (for the reference conv, and for the same Triton conv under another name), and
    launches one kernel fewer per DeltaNet layer than the latter."""
    from qwen_lab.kernels import conv1d
    from qwen_lab.model import Qwen35Model, load_model
    from qwen_lab.plan import fast_plan

    base = load_model("tiny", device=rt.device, dtype=rt.dtype)
    cfg = base.config
    ids = torch.arange(7, device=rt.device) * 37 % cfg.vocab_size
    prefilled = base.new_cache(16)
    with torch.inference_mode():
        base.step(ids[:5], torch.arange(5, device=rt.device), prefilled)
    routes = {"fused": None, "reference conv": reference.causal_conv1d,
              "triton conv, unfused": lambda *args, **kw: conv1d.causal_conv1d(*args, **kw)}
    results = {}
    for route, conv in routes.items():
        model = Qwen35Model(cfg, base.weights, device=rt.device, dtype=rt.dtype)
        if conv is not None:
            model.ops["causal_conv1d"] = conv
        plan = fast_plan(model)
        cache = model.new_cache(16)
        for mine, theirs in zip(cache.tensors(), prefilled.tensors()):
            mine.copy_(theirs)
        traced = []
        logits, launches = [], []
        with torch.inference_mode():
            if not runtime.interpreter_active():  # on a GPU, compile and autotune first: tuning launches too
                scratch = model.new_cache(16)
                for mine, theirs in zip(scratch.tensors(), prefilled.tensors()):
                    mine.copy_(theirs)
                plan.step(ids[5:6], torch.tensor([5], device=rt.device), scratch)
            plan.observe = lambda layer, name, out: traced.append((layer, name))
            for t in (5, 6):
                with count_launches() as c:
                    logits.append(plan.step(ids[t:t + 1], torch.tensor([t], device=rt.device), cache).float())
                launches.append(c)
        results[route] = (logits, cache, launches, traced)
    fused_logits, fused_cache, fused_launches, fused_traced = results["fused"]
    for route in ("reference conv", "triton conv, unfused"):
        logits, cache, _, traced = results[route]
        for j, (a, b) in enumerate(zip(fused_logits, logits)):
            assert checks.relative_error(a, b) <= (1e-5 if rt.dtype == torch.float32 else 2e-2), f"{route}: step {j}"
        for i in range(cfg.num_hidden_layers):
            if fused_cache.conv_state[i] is not None:
                checks.compare(f"{route}: conv_state[{i}]", fused_cache.conv_state[i], cache.conv_state[i])
                checks.compare(f"{route}: recurrent_state[{i}]", fused_cache.recurrent_state[i],
                               cache.recurrent_state[i], *checks.tolerance(rt.dtype))
        assert any(name == "causal_conv1d" for _, name in traced)
    n_linear = cfg.num_linear_layers
    for c in fused_launches:
        assert c["conv_decode_step_kernel"] == n_linear and c["conv1d_step_kernel"] == 0
        assert c["delta_rule_recurrent_kernel"] == 0
    unfused_launches = results["triton conv, unfused"][2]
    for fused, unfused in zip(fused_launches, unfused_launches):
        assert sum(unfused.values()) - sum(fused.values()) == n_linear, (dict(fused), dict(unfused))
    assert not any(name == "causal_conv1d" for _, name in fused_traced)
    assert sum(name == "deltanet_conv_decode_step" for _, name in fused_traced) == 2 * n_linear


def _settled_steps(Hk, Hv, Dk, Dv, W, steps, rt, gen, graph: bool = False):
    """The model's decode order for one DeltaNet layer, `steps` tokens: the in-projection GEMV, then the conv decode
    step with state_settled=True (it reads both states before its PDL wait), against the reference chain fed the
    same projections. graph=True: the two launches captured once and replayed per token."""
    from qwen_lab.kernels import gemm

    H = 64
    C = 2 * Hk * Dk + Hv * Dv
    d = _conv_decode_inputs(1, Hk, Hv, Dk, Dv, W, gen, rt.dtype, rt.device)
    w_in = checks.randn(C + 2 * Hv, H, g=gen, dtype=rt.dtype, device=rt.device, scale=H ** -0.5)
    xs = checks.randn(steps, H, g=gen, dtype=rt.dtype, device=rt.device)
    x = xs[:1].clone()
    proj = torch.empty(1, C + 2 * Hv, dtype=rt.dtype, device=rt.device)
    out = torch.empty(1, Hv, Dv, dtype=rt.dtype, device=rt.device)
    conv_state, state = d["conv_state"].clone(), d["state"].clone()
    ref_conv_state, ref_state = d["conv_state"].clone(), d["state"].clone()

    def layer():
        gemm.linear(x, w_in, out=proj)
        deltanet_conv_decode_step(proj[:, :C], d["conv_weight"], conv_state, proj[:, C + Hv:], proj[:, C:C + Hv],
                                  d["A_log"], d["dt_bias"], state, Hk, Dk, Hv, Dv, out=out, state_settled=True)

    if graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile, tune and allocate outside the capture
                layer()
        torch.cuda.current_stream().wait_stream(stream)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            layer()
        conv_state.copy_(d["conv_state"])
        state.copy_(d["state"])
    for s in range(steps):
        x.copy_(xs[s:s + 1])
        captured.replay() if graph else layer()
        p = proj.clone()
        ref = _two_reference_calls(p[:, :C], d["conv_weight"], ref_conv_state, p[:, C + Hv:], p[:, C:C + Hv],
                                   d["A_log"], d["dt_bias"], ref_state, Hk, Dk, Hv, Dv)
        if rt.dtype == torch.float32:
            checks.compare(f"step {s}: o", out, ref)
            checks.compare(f"step {s}: state", state, ref_state)
            assert torch.equal(conv_state, ref_conv_state), f"step {s}: conv_state"
        else:
            _gpu_judge_step(f"{'replay' if graph else 'step'} {s}", out, ref, conv_state, ref_conv_state, state,
                            ref_state)
    _tickets_are_zero(rt.device)


def test_conv_decode_step_with_settled_states_after_the_projection(rt, gen):
    """state_settled=True (the model's setting): in the model's order, the same results as the reference chain."""
    _settled_steps(2, 4, 16, 16, 4, 3, rt, gen)


# ---------------------------------------------------------------- GPU: real shapes, bf16 inputs, fp32 state


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


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_gpu_conv_decode_step_settled_states_forty_steps(graph, rt, gen):
    """Under PDL with state_settled=True each step reads the states before it waits for the in-projection; a
    step that started before the previous step of the layer had written them would read stale states."""
    cfg = QWEN35_0_8B
    _settled_steps(cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                   cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim, 40, rt, gen, graph=graph)


@pytest.mark.gpu
def test_gpu_conv_decode_step_picked_in_place_leaves_the_result_right(rt, gen, monkeypatch):
    """The first call of a kind times the decode step's configs in a graph on the call's own states (then put back)
    before it runs: its output and states must be the reference's, the timing runs not counted as its launches,
    and the pick kept for the next call."""
    monkeypatch.setitem(tuning._PICKS, "conv_decode_step_kernel", {})
    d, heads = _qwen_conv_decode(QWEN35_0_8B.linear_num_value_heads, 2, rt, gen)
    conv_state, state = d["conv_state"].clone(), d["state"].clone()
    ref_conv_state, ref_state = d["conv_state"].clone(), d["state"].clone()
    for s in range(2):
        qkv, a, b = d["qkv"][s:s + 1], d["a"][s:s + 1], d["b"][s:s + 1]
        with count_launches() as launches:
            o = deltanet_conv_decode_step(qkv, d["conv_weight"], conv_state, a, b, d["A_log"], d["dt_bias"], state,
                                          *heads)
        assert sum(launches.values()) == 1, f"step {s}: the timing runs are not the call's launches: {dict(launches)}"
        ref = _two_reference_calls(qkv, d["conv_weight"], ref_conv_state, a, b, d["A_log"], d["dt_bias"], ref_state,
                                   *heads)
        _gpu_judge_step(f"step {s}", o, ref, conv_state, ref_conv_state, state, ref_state)
    picks = list(tuning._PICKS["conv_decode_step_kernel"].values())
    assert len(picks) == 1 and isinstance(picks[0], triton.Config), picks
    _tickets_are_zero(rt.device)


@pytest.mark.gpu
@pytest.mark.parametrize("Hv", [16, 32, 48])
def test_gpu_conv_decode_step_eight_steps(Hv, rt, gen):
    """Eight consecutive decode steps (conv state and state carried) against reference conv + decode step."""
    d, heads = _qwen_conv_decode(Hv, 8, rt, gen)
    conv_state, state = d["conv_state"].clone(), d["state"].clone()
    ref_conv_state, ref_state = d["conv_state"].clone(), d["state"].clone()
    for s in range(8):
        qkv, a, b = d["qkv"][s:s + 1], d["a"][s:s + 1], d["b"][s:s + 1]
        o = deltanet_conv_decode_step(qkv, d["conv_weight"], conv_state, a, b, d["A_log"], d["dt_bias"], state,
                                      *heads)
        ref = _two_reference_calls(qkv, d["conv_weight"], ref_conv_state, a, b, d["A_log"], d["dt_bias"], ref_state,
                                   *heads)
        _gpu_judge_step(f"Hv={Hv} step {s}", o, ref, conv_state, ref_conv_state, state, ref_state)
    _tickets_are_zero(rt.device)


@pytest.mark.gpu
@pytest.mark.parametrize("Hv", [16, 48])
def test_gpu_conv_decode_step_every_config_many_steps(Hv, rt, gen):
    """Every autotuning config for 40 steps each: a program that read a q/k channel's conv state after another
    had shifted it would compute a wrong q or k for its value columns, and o would show it."""
    d, heads = _qwen_conv_decode(Hv, 40, rt, gen)
    for config in autotune_configs("conv_decode_step_kernel", Dv=heads[3]):
        conv_state, state = d["conv_state"].clone(), d["state"].clone()
        ref_conv_state, ref_state = d["conv_state"].clone(), d["state"].clone()
        with switches.force_config("conv_decode_step_kernel", config):
            for s in range(40):
                qkv, a, b = d["qkv"][s:s + 1], d["a"][s:s + 1], d["b"][s:s + 1]
                o = deltanet_conv_decode_step(qkv, d["conv_weight"], conv_state, a, b, d["A_log"], d["dt_bias"],
                                              state, *heads)
                ref = _two_reference_calls(qkv, d["conv_weight"], ref_conv_state, a, b, d["A_log"], d["dt_bias"],
                                           ref_state, *heads)
                _gpu_judge_step(f"Hv={Hv} {config} step {s}", o, ref, conv_state, ref_conv_state, state, ref_state)
        _tickets_are_zero(rt.device)


@pytest.mark.gpu
def test_gpu_conv_decode_step_replays_in_a_cuda_graph(rt, gen):
    """Captured once after a warm-up (which allocates the ticket counters), replayed for four tokens."""
    d, heads = _qwen_conv_decode(QWEN35_0_8B.linear_num_value_heads, 6, rt, gen)
    Hv, Dv = heads[2], heads[3]
    qkv, a, b = d["qkv"][:1].clone(), d["a"][:1].clone(), d["b"][:1].clone()   # the graph's static inputs
    conv_state, state = d["conv_state"].clone(), d["state"].clone()
    out = torch.empty(1, Hv, Dv, dtype=rt.dtype, device=rt.device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up: compile and autotune outside the capture
            deltanet_conv_decode_step(qkv, d["conv_weight"], conv_state, a, b, d["A_log"], d["dt_bias"], state,
                                      *heads, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deltanet_conv_decode_step(qkv, d["conv_weight"], conv_state, a, b, d["A_log"], d["dt_bias"], state,
                                  *heads, out=out)
    conv_state.copy_(d["conv_state"])
    state.copy_(d["state"])
    ref_conv_state, ref_state = d["conv_state"].clone(), d["state"].clone()
    for s in range(2, 6):
        qkv.copy_(d["qkv"][s:s + 1])
        a.copy_(d["a"][s:s + 1])
        b.copy_(d["b"][s:s + 1])
        graph.replay()
        ref = _two_reference_calls(qkv, d["conv_weight"], ref_conv_state, a, b, d["A_log"], d["dt_bias"], ref_state,
                                   *heads)
        _gpu_judge_step(f"replay {s}", out, ref, conv_state, ref_conv_state, state, ref_state)
    _tickets_are_zero(rt.device)
