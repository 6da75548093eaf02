"""What the DeltaNet test files share: inputs like a layer's, the judges of each form's precision, the guarded runs
and the fused decode step's reference chain."""

import contextlib

import pytest
import torch

from qwen_lab import reference
from qwen_lab.course import checks
from qwen_lab.course.checks import GUARD_NAN as NAN, GuardedTensor as _Guard
from qwen_lab.course.checks import guarded_call as _guarded_call
from qwen_lab.config import QWEN35_0_8B
from qwen_lab.kernels.deltanet import (ChunkWorkspace, chunk_workspace, delta_rule_chunked, deltanet_chunked,
                                       deltanet_conv_decode_step, deltanet_decode_step)
from qwen_lab.switches import switches
from qwen_lab.kernels.deltanet import counters as device_counters


def fail_if_counters_left():
    """After every test, the counters every DeltaNet launch shares on a device (the decode step's tickets, the scan's
    `ready` counts) must be back at zero: one left non-zero makes a later call's scan read a chunk before its prep
    wrote it, in whichever test runs next in this process. Checked after each test, the failure names the test that
    left it; the counters are cleared so the tests after it start clean. (Each test file's autouse fixture calls
    this.)"""
    for key, counters in list(device_counters._TICKETS.items()):
        left = counters.nonzero().flatten().tolist()
        if left:
            counters.zero_()
            pytest.fail(f"this test left the DeltaNet counters {left[:8]} on {key} non-zero")


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


def _close(name, got, ref, max_rel=2e-2):
    """bf16 matmul operands: judged by the relative error of the whole tensor (about 4e-3 expected when bf16
    rounding is emulated on the CPU), plus an elementwise bound at a tenth of the tensor's scale that catches
    a wrong row or head."""
    checks.finite_or_raise(name, got)
    err = checks.relative_error(got, ref)
    assert err < max_rel, f"{name}: relative error {err:.3g} >= {max_rel}"
    checks.compare(name, got, ref, atol=0.1 * float(ref.float().abs().max()), rtol=0.1)


READ_HINT = "NaN here means a kernel read outside its inputs or a row it should not (that memory holds NaN)"


def _judge(name, got, ref):
    """The chunked form against an fp32 computation. Under the interpreter everything is fp32: elementwise at
    the fp32 tolerance. On a GPU its matmul operands are bf16, which moves even the fp32 state by about 1e-3
    (beyond the fp32 tolerance of checks.compare): judged by _close."""
    if got.device.type == "cpu" and got.dtype == torch.float32:
        checks.compare(name, got, ref, hint=READ_HINT)
    else:
        _close(name, got.float(), ref.float())


def _chunked_tol(rt) -> dict:
    """check_kernel tolerances for the chunked form: its defaults in fp32, else the bf16 operands' level for
    the output and the fp32 state alike (a wrong row or head is off by O(1))."""
    return {} if rt.dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)


def _fused_gates_case(T, Hk, Hv, Dk, Dv, gen, rt):
    """deltanet_chunked's arguments (a, b strided views of one projection, wide enough that softplus and sigmoid
    see both signs) and reference.deltanet_chunked's output and final state on copies."""
    d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    proj = checks.randn(T, 2 * Hv + 1, g=gen, dtype=rt.dtype, device=rt.device, scale=3.0)
    A_log, dt_bias = _gate_params(Hv, gen, rt.device)
    args = dict(q=d["q"], k=d["k"], v=d["v"], a=proj[:, 1 + Hv:], b=proj[:, 1:1 + Hv], A_log=A_log, dt_bias=dt_bias,
                state=d["state"])
    ref_state = d["state"].clone()
    ref = reference.deltanet_chunked(**{**args, "state": ref_state})
    return args, ref, ref_state


# ---------------------------------------------------------------- guard regions: nothing outside the tensors
#
# The interpreter loads and stores through raw CPU pointers, so an access past the end of a tensor usually
# lands in a neighbouring allocation and goes unnoticed; on the GPU it faults or corrupts memory. Here every
# tensor a kernel sees is a strided view in the middle of a larger buffer: around inputs (margins and the
# gaps between rows) the buffer holds NaN, which would reach an output if read; around outputs it holds a
# sentinel. After the call every element outside the views must be bit for bit what it was. The GPU's
# autotuning configs (block sizes the interpreter never picks) are forced in turn with `switches.force_config`.


def _inputs_for(kernel, T, Hk, Hv, Dk, Dv, gen, rt):
    """The keyword arguments of `kernel` (chunked, recurrent or the fused decode step) and its reference."""
    d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    if kernel in (deltanet_decode_step, deltanet_chunked):
        proj = checks.randn(T, 2 * Hv + 1, g=gen, dtype=rt.dtype, device=rt.device)
        A_log, dt_bias = _gate_params(Hv, gen, rt.device)
        d = dict(q=d["q"], k=d["k"], v=d["v"], a=proj[:, 1 + Hv:], b=proj[:, 1:1 + Hv], A_log=A_log,
                 dt_bias=dt_bias, state=d["state"])
        g, beta = reference.deltanet_gates(d["a"], d["b"], A_log, dt_bias)
        ref_args = dict(q=d["q"], k=d["k"], v=d["v"], g=g, beta=beta)
        ref_fn = reference.delta_rule_recurrent if kernel is deltanet_decode_step else reference.delta_rule_chunked
    else:
        ref_args = {n: d[n] for n in ("q", "k", "v", "g", "beta")}
        ref_fn = reference.delta_rule_chunked if kernel is delta_rule_chunked else reference.delta_rule_recurrent
    ref_state = d["state"].clone()
    ref = ref_fn(**ref_args, state=ref_state)
    d["out"] = torch.empty(T, Hv, Dv, dtype=rt.dtype, device=rt.device)
    return d, ref, ref_state


def _run_guarded(kernel, shape, gen, rt, forced=()):
    """Run `kernel` on guarded inputs of `shape` = (T, Hk, Hv, Dk, Dv) with the (kernel name, config) pairs
    of `forced`, and judge its output and final state against the reference."""
    d, ref, ref_state = _inputs_for(kernel, *shape, gen, rt)
    extra, ws = {}, []
    if kernel in (delta_rule_chunked, deltanet_chunked):  # its scratch too: one chunk too few would show
        T, _, Hv, Dk, Dv = shape
        ws = [_Guard(t, NAN, pad=0) for t in chunk_workspace(T, Hv, Dk, Dv, rt.dtype, rt.device)]
        extra["workspace"] = ChunkWorkspace(*(g.view for g in ws))
    with contextlib.ExitStack() as stack:
        for name, config in forced:
            stack.enter_context(switches.force_config(name, config))
        got = _guarded_call(kernel, d, outputs=("out",), **extra)
    for name, g in zip(ChunkWorkspace._fields, ws):
        assert g.touched() == 0, f"{kernel.__name__}{shape}: a store went past the end of workspace.{name}"
    where = f"{kernel.__name__}{shape} with {[f'{n}: {c}' for n, c in forced]}"
    _judge(f"{where}: o", got["out"], ref)
    _judge(f"{where}: state", got["state"], ref_state)


def _pick(configs, i):
    return configs[i % len(configs)]


# ---------------------------------------------------------------- the fused conv decode step: inputs, reference


def _conv_decode_inputs(steps, Hk, Hv, Dk, Dv, W, gen, dtype, device):
    """`steps` decode tokens: qkv, b, a as column slices of one in-projection-like [steps, C + z + 2 Hv] tensor
    (row stride larger than each width), a conv weight, a non-zero conv state, the gate parameters, a state."""
    C = 2 * Hk * Dk + Hv * Dv
    proj = checks.randn(steps, C + Dv + 2 * Hv, g=gen, dtype=dtype, device=device)
    A_log, dt_bias = _gate_params(Hv, gen, device)
    return dict(qkv=proj[:, :C], b=proj[:, C + Dv:C + Dv + Hv], a=proj[:, C + Dv + Hv:],
                conv_weight=checks.randn(C, W, g=gen, dtype=dtype, device=device, scale=0.5),
                conv_state=checks.randn(C, W - 1, g=gen, dtype=dtype, device=device),
                A_log=A_log, dt_bias=dt_bias, state=checks.randn(Hv, Dk, Dv, g=gen, device=device, scale=0.5))


def _two_reference_calls(qkv, conv_weight, conv_state, a, b, A_log, dt_bias, state, Hk, Dk, Hv, Dv):
    """The unfused route of the model: reference causal_conv1d, the split, reference deltanet_decode_step."""
    y = reference.causal_conv1d(qkv, conv_weight, conv_state)
    kd = Hk * Dk
    q, k = y[:, :kd].unflatten(1, (Hk, Dk)), y[:, kd:2 * kd].unflatten(1, (Hk, Dk))
    v = y[:, 2 * kd:].unflatten(1, (Hv, Dv))
    return reference.deltanet_decode_step(q, k, v, a, b, A_log, dt_bias, state)


def _formula_conv_decode_step(qkv, conv_weight, conv_state, a, b, A_log, dt_bias, state, Hk, Dk, Hv, Dv, eps=1e-6):
    """One decode token written out from the formulas in float64, apart from qwen_lab.reference: the conv taps over
    the carried inputs and this input, SiLU (rounded to the input dtype, as the conv stores it), the gates, the
    l2norm of q and k, and the delta rule head by head. Inputs are left untouched.
    -> (o [1, Hv, Dv], the new conv state [C, W-1], the new state [Hv, Dk, Dv]), all float64."""
    xx = torch.cat([conv_state.double(), qkv.double().t()], dim=1)              # [C, W]: oldest input first
    y = (xx * conv_weight.double()).sum(1)
    y = (y / (1 + torch.exp(-y))).to(qkv.dtype).double()
    kd = Hk * Dk
    q, k, v = y[:kd].view(Hk, Dk), y[kd:2 * kd].view(Hk, Dk), y[2 * kd:].view(Hv, Dv)
    x = a[0].double() + dt_bias.double()
    softplus = torch.where(x > 20, x, torch.log1p(torch.exp(torch.clamp(x, max=20))))
    decay = torch.exp(-torch.exp(A_log.double()) * softplus)
    beta = 1 / (1 + torch.exp(-b[0].double()))
    S = state.double().clone()
    o = torch.empty(1, Hv, Dv, dtype=torch.float64, device=qkv.device)
    for h in range(Hv):
        hk = h // (Hv // Hk)
        qh = q[hk] / torch.sqrt((q[hk] ** 2).sum() + eps) * Dk ** -0.5
        kh = k[hk] / torch.sqrt((k[hk] ** 2).sum() + eps)
        S[h] = decay[h] * S[h]
        S[h] = S[h] + torch.outer(kh, beta[h] * (v[h] - S[h].t() @ kh))
        o[0, h] = S[h].t() @ qh
    return o, xx[:, 1:], S


def _tickets_are_zero(device):
    """The kernel's counters are back at zero after every launch (the next launch counts from there)."""
    from qwen_lab.kernels import device_key

    counters = device_counters._TICKETS.get(device_key(device))
    assert counters is not None and int(counters.abs().sum()) == 0, f"ticket counters left at {counters}"


def _run_conv_decode_guarded(shape, gen, rt, forced=(), W=4):
    """deltanet_conv_decode_step on guarded inputs of shape (1, Hk, Hv, Dk, Dv) (the layout of the other kernels'
    shapes) with the (kernel name, config) pairs of `forced`, judged against the two reference calls."""
    _, Hk, Hv, Dk, Dv = shape
    d = _conv_decode_inputs(1, Hk, Hv, Dk, Dv, W, gen, rt.dtype, rt.device)
    ref_conv_state, ref_state = d["conv_state"].clone(), d["state"].clone()
    ref = _two_reference_calls(d["qkv"], d["conv_weight"], ref_conv_state, d["a"], d["b"], d["A_log"],
                               d["dt_bias"], ref_state, Hk, Dk, Hv, Dv)
    args = dict(d, num_k_heads=Hk, head_k_dim=Dk, num_v_heads=Hv, head_v_dim=Dv,
                out=torch.empty(1, Hv, Dv, dtype=rt.dtype, device=rt.device))
    with contextlib.ExitStack() as stack:
        for name, config in forced:
            stack.enter_context(switches.force_config(name, config))
        got = _guarded_call(deltanet_conv_decode_step, args, outputs=("out",))
    where = f"deltanet_conv_decode_step Hk={Hk} Hv={Hv} Dk={Dk} Dv={Dv} W={W} with {[str(c) for _, c in forced]}"
    if rt.dtype == torch.float32:
        checks.compare(f"{where}: o", got["out"], ref, hint=READ_HINT)
        checks.compare(f"{where}: state", got["state"], ref_state, hint=READ_HINT)
    else:
        _gpu_judge_step(where, got["out"], ref, got["conv_state"], ref_conv_state, got["state"], ref_state)
    assert torch.equal(got["conv_state"], ref_conv_state), f"{where}: conv_state differs"
    _tickets_are_zero(rt.device)


def _qwen_conv_decode(Hv, steps, rt, gen):
    """Qwen3.5-0.8B's DeltaNet shapes (Hk = 16 heads of 128, width-4 conv) with Hv value heads; bf16 inputs, conv
    weight and conv state (the model dtype), fp32 state."""
    cfg = QWEN35_0_8B
    Hk, Dk, Dv, W = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim, \
        cfg.linear_conv_kernel_dim
    d = _conv_decode_inputs(steps, Hk, Hv, Dk, Dv, W, gen, rt.dtype, rt.device)
    return d, (Hk, Dk, Hv, Dv)


def _gpu_judge_step(where, o, ref, conv_state, ref_conv_state, state, ref_state):
    # The conv outputs are rounded to bf16 in both; a sum in another order can round a few of them one bf16 step
    # apart, which then moves the fp32 state by ~1e-4: the state is judged as a whole and loosely elementwise.
    checks.compare(f"{where}: o", o, ref)
    assert torch.equal(conv_state, ref_conv_state), f"{where}: conv_state differs (it only moves inputs)"
    assert checks.relative_error(state, ref_state) <= 1e-3, f"{where}: state"
    checks.compare(f"{where}: state", state, ref_state, atol=2e-3, rtol=1e-2)
