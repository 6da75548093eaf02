"""The Gated DeltaNet kernels (qwen_lab.kernels.deltanet) against qwen_lab.reference and transformers.

CPU: the Triton interpreter in float32, small heads (Dk != Dv, Hv = Hk and Hv = 2 Hk), token counts around
the chunk size of 64; the decode step with the causal conv fused in, over consecutive steps and in the
model. GPU: bf16 inputs and an fp32 state on Qwen3.5-0.8B shapes (16 heads of 128), the larger models' 32
and 48 value heads, and 2048 / 8192-token prefills; the fused conv decode step over 8 and 40 steps.
"""

import contextlib
import os
import subprocess
import sys
import time

import pytest
import torch
import triton

from qwen_lab import reference, runtime
from qwen_lab.course import checks
from qwen_lab.config import QWEN35_0_8B
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches, deltanet
from qwen_lab.kernels.deltanet import (ChunkWorkspace, autotune_configs, chunk_workspace, delta_rule_chunked,
                                       delta_rule_recurrent, deltanet_chunked, deltanet_conv_decode_step,
                                       deltanet_decode_step,
                                       deltanet_gates, force_config, l2norm)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository (for child processes)


@pytest.fixture(autouse=True)
def _counters_left_at_zero():
    """After every test, the counters every DeltaNet launch shares on a device (the decode step's tickets, the scan's
    `ready` counts) must be back at zero: one left non-zero makes a later call's scan read a chunk before its prep
    wrote it, in whichever test runs next in this process. Checked here, the failure names the test that left it;
    the counters are cleared so the tests after it start clean."""
    yield
    for key, counters in list(deltanet._TICKETS.items()):
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
                            [_case(T, Hk, Hv, 16, 32, rt)], seed=T + Hv, inplace=("state",), quiet=True,
                            **_chunked_tol(rt))
    # two kernels; on a GPU these 16/32-wide heads run the recurrent kernel instead (see delta_rule_chunked)
    assert sum(launches.values()) == (2 if deltanet.INTERPRET else 1)


def test_chunked_ragged_dims_and_chunk_128(rt):
    checks.check_kernel("delta_rule_chunked", delta_rule_chunked, reference.delta_rule_chunked,
                        [_case(70, 1, 2, 24, 40, rt), _case(130, 2, 2, 16, 16, rt, chunk_size=128)],
                        seed=5, inplace=("state",), quiet=True, **_chunked_tol(rt))


def test_chunked_leaves_the_scan_counters_at_zero(rt, gen):
    """On a GPU the scan waits for the prep's chunks through counters that every call must leave at zero: one
    left full would let the next call's scan read a chunk before its prep had written it. Ten chunks make two
    groups of deltanet.SCAN_GROUP; the counters are checked before and after two calls. (Heads of 64: on a GPU
    narrower ones take the recurrent kernel.)"""
    T = 9 * 64 + 5
    d = _delta_inputs(T, 1, 2, 64, 64, gen, rt.dtype, rt.device)
    counters = deltanet._tickets(rt.device, 2 * (T // 64 + 2))
    assert T // 64 + 1 > deltanet.SCAN_GROUP and int(counters.count_nonzero()) == 0
    for _ in range(2):
        delta_rule_chunked(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"])
        left = counters.nonzero().flatten().tolist()
        assert not left, f"the scan left counters {left} non-zero"


@pytest.mark.parametrize("group", [1, 3, 4])
def test_scan_group_size_changes_only_the_polling(group, rt, gen, monkeypatch):
    """SCAN_GROUP (chunks per counter the scan polls) changes when the scan may go on, not what it computes: the
    same output and final state bit for bit as groups of 8, with ten chunks (a last group cut short) and every
    counter left at zero."""
    T = 9 * 64 + 5
    d = _delta_inputs(T, 1, 2, 64, 64, gen, rt.dtype, rt.device)
    start = d["state"].clone()
    runs = {}
    for size in (8, group):
        monkeypatch.setattr(deltanet, "SCAN_GROUP", size)
        d["state"].copy_(start)
        runs[size] = delta_rule_chunked(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"]), d["state"].clone()
    assert torch.equal(runs[group][0], runs[8][0]) and torch.equal(runs[group][1], runs[8][1])
    assert not deltanet._tickets(rt.device, 1).nonzero().numel(), f"groups of {group} left counters non-zero"


@pytest.mark.parametrize("programs", [1, 3, 7, 1000])
@pytest.mark.parametrize("T, Hk, Hv, Dk, Dv", [(300, 1, 2, 64, 64), (70, 1, 3, 24, 40), (1, 1, 2, 64, 64)])
def test_persistent_prep_equals_the_grid(programs, T, Hk, Hv, Dk, Dv, rt, gen, monkeypatch):
    """PREP_PERSISTENT: the prep as `programs` programs walking the (head, chunk) items gives bit for bit the
    output and final state of the grid (Hv, chunks), with the gates given and fused, for one program, fewer
    programs than heads, more than the items, and a last program with fewer items than the rest; the scan's
    counters are left at zero."""
    d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    fused = _fused_gates_case(T, Hk, Hv, Dk, Dv, gen, rt)[0]
    starts = d["state"].clone(), fused["state"].clone()
    runs = {}
    left = deltanet._tickets(rt.device, 1).nonzero().flatten().tolist()
    assert not left, f"counters {left} were non-zero before this test: left by an earlier call in this process"
    for setting in (False, programs):
        monkeypatch.setattr(deltanet, "PREP_PERSISTENT", setting)
        d["state"].copy_(starts[0])
        fused["state"].copy_(starts[1])
        o = delta_rule_chunked(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"])
        o_fused = deltanet_chunked(**fused)
        runs[setting] = o, d["state"].clone(), o_fused, fused["state"].clone()
        left = deltanet._tickets(rt.device, 1).nonzero().flatten().tolist()
        assert not left, f"PREP_PERSISTENT={setting}: the calls left counters {left} non-zero"
    for name, got, want in zip(("o", "final state", "o (fused gates)", "final state (fused gates)"),
                               runs[programs], runs[False]):
        assert torch.equal(got, want), f"{programs} persistent prep programs: {name} differs from the grid's"


@pytest.mark.parametrize("i", range(len(autotune_configs("chunk_prep_kernel"))))
def test_persistent_prep_every_gpu_config_guarded(i, rt, gen, monkeypatch):
    """The persistent prep with each of the prep's GPU configs forced (force_config reaches it, though it is not
    autotuned), on guarded inputs and workspace, a last program with fewer items than the rest."""
    monkeypatch.setattr(deltanet, "PREP_PERSISTENT", 5)
    c = autotune_configs("chunk_prep_kernel")[i]
    for fn in (delta_rule_chunked, deltanet_chunked):
        _run_guarded(fn, (300, 1, 2, 64, 64), gen, rt, forced=(("chunk_prep_kernel", c),))


def test_persistent_prep_program_count(monkeypatch):
    """PREP_PERSISTENT = True sizes the prep from the GPU: two programs per SM less one per scan program (at the
    scan's narrowest value block, 32 columns), never more than the items, at any prompt length; the grid where
    those programs would publish chunks slower than the scan reads them (the larger Qwen3.5s' 32 and 48 value
    heads), where the scan does not run beside the prep (no PDL, or the interpreter), or where the switch is off."""
    device = torch.device("cuda", 0)
    monkeypatch.setattr(deltanet, "INTERPRET", False)
    monkeypatch.setattr(deltanet.gemm, "sm_count", lambda dev: 132)
    monkeypatch.setattr(deltanet, "pdl_options", lambda dev: {"USE_PDL": True, "launch_pdl": True})
    monkeypatch.setattr(deltanet, "PREP_PERSISTENT", True)
    assert deltanet._prep_programs(16, 32, 128, device) == 2 * 132 - 16 * 4   # Qwen3.5-0.8B at 2048 tokens
    assert deltanet._prep_programs(16, 128, 128, device) == 200              # 8192 tokens: as many programs
    assert deltanet._prep_programs(16, 5, 128, device) == 16 * 5             # fewer items than programs
    assert deltanet._prep_programs(32, 32, 128, device) is None              # 136 programs for 32 heads
    assert deltanet._prep_programs(48, 32, 128, device) is None              # 72 programs for 48 heads
    monkeypatch.setattr(deltanet.gemm, "sm_count", lambda dev: 114)           # an H100 PCIe: 164 programs
    assert deltanet._prep_programs(16, 32, 128, device) == 2 * 114 - 16 * 4
    monkeypatch.setattr(deltanet, "SCAN_BESIDE_PREP", False)
    assert deltanet._prep_programs(16, 32, 128, device) is None
    monkeypatch.setattr(deltanet, "SCAN_BESIDE_PREP", True)
    monkeypatch.setattr(deltanet, "pdl_options", lambda dev: {})
    assert deltanet._prep_programs(16, 32, 128, device) is None
    monkeypatch.setattr(deltanet, "PREP_PERSISTENT", False)
    assert deltanet._prep_programs(16, 32, 128, device) is None


def test_chunked_kernels_tune_per_class_of_prompt_length(rt, gen, monkeypatch):
    """The prep's and the scan's GPU autotuners key their cache on the prompt's chunk count rounded up to a power of
    two (N_CLASS), and the launcher passes it: a tuning made on a short prompt (a chat's first turn, a small prefill
    bucket) must not serve a 2048-token one."""
    for kernel in ("chunk_prep_kernel", "chunk_scan_kernel"):
        assert "N_CLASS" in deltanet._KEYS[kernel], f"{kernel}: N_CLASS missing from {deltanet._KEYS[kernel]}"
    assert [deltanet.chunk_class(n) for n in (1, 2, 3, 5, 32, 33)] == [1, 2, 4, 8, 32, 64]
    seen = {}
    launch = deltanet._launch

    def spy(kernel, grid, args, *rest, **kw):
        fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
        seen[fn.fn.__name__] = dict(zip(fn.arg_names, args))
        return launch(kernel, grid, args, *rest, **kw)
    monkeypatch.setattr(deltanet, "_launch", spy)
    D = 16 if rt.device.type == "cpu" else deltanet.CHUNKED_MIN_HEAD_DIM  # smaller heads take the recurrent kernel
    for T, want in ((150, 4), (64, 1)):
        d = _delta_inputs(T, 1, 1, D, D, gen, rt.dtype, rt.device)
        delta_rule_chunked(**d)
        for kernel in ("chunk_prep_kernel", "chunk_scan_kernel"):
            assert seen[kernel]["N_CLASS"] == want, f"T={T}: {kernel} got N_CLASS={seen[kernel]['N_CLASS']}"


def test_the_prep_tunes_one_config_where_triton_has_no_tensor_core_dots(monkeypatch):
    """Below sm_80 (a T4) Triton compiles each product of the prep to fp32 FMA loops, minutes per config: the
    autotuner gets the first config alone there, and every config from sm_80 on."""
    from qwen_lab import kernels

    q = torch.empty(1, device="meta")
    every = deltanet._CONFIGS["chunk_prep_kernel"][0]
    for capability, want in (((7, 5), every[:1]), ((8, 0), every), ((9, 0), every)):
        monkeypatch.setattr(deltanet, "tensor_core_dots", lambda device, c=capability: c[0] >= 8)
        assert autotune_configs("chunk_prep_kernel", q_ptr=q) == want, f"compute capability {capability}"
    assert autotune_configs("chunk_prep_kernel") == every, "asked without a call's arguments: every config"
    assert not kernels.tensor_core_dots("cpu")
    for capability, want in (((7, 5), False), ((8, 6), True), ((9, 0), True)):
        monkeypatch.setattr(kernels, "_capability", lambda index, c=capability: c)
        assert kernels.tensor_core_dots(torch.device("cuda", 0)) is want, f"compute capability {capability}"


def test_autotuned_kernels_put_back_what_their_timing_runs_write_in_place():
    """On a GPU Triton's autotuner launches a kernel many times on the call's own arguments before the real launch.
    Whatever a launch updates in place must be put back after each timing run: the states (else the real launch
    starts from a state advanced many steps) and the scan's `ready` counters, which the prep counts up and only
    the scan clears (else the scan beside the real prep goes on before the prep has written its chunks)."""
    writes = {"delta_rule_recurrent_kernel": {"state_ptr"}, "conv_decode_step_kernel": {"state_ptr", "conv_state_ptr"},
              "chunk_prep_kernel": {"ready_ptr"}, "chunk_scan_kernel": {"state_ptr", "ready_ptr"}}
    assert set(writes) <= set(deltanet._RESTORED), sorted(deltanet._RESTORED)
    for kernel, written in writes.items():
        missing = written - set(deltanet._RESTORED[kernel])
        assert not missing, f"{kernel}: its autotuner must restore {sorted(missing)}"


@pytest.mark.parametrize("kernel", ["chunk_scan_kernel", "conv_decode_step_kernel"])
def test_pick_in_place_times_every_config_where_it_runs(kernel, monkeypatch):
    """On the first call of a kind, _pick_in_place times every GPU config of the kernel through launch(config) (the
    launcher's own launch: the scan beside its prep, the decode step back to back), puts every state back after
    each, keeps the fastest and reuses it; it leaves the pick to the autotuner off the GPU, under a forced config
    and with QWEN_LAB_TUNE=0."""
    configs = autotune_configs(kernel, Dv=128)
    assert len(configs) > 1
    cost = {str(c): 100.0 + i for i, c in enumerate(configs)}
    cost[str(configs[-2])] = 50.0
    states = (torch.zeros(2, 4, 4), torch.ones(6, 3))
    launched = []

    def launch(config):
        launched.append(str(config))
        for s in states:
            s.add_(1.0)                                  # the kernel writes its states in place

    def timer(calls, warmup, replays):
        assert len(calls) == 5
        for call in calls:
            call()
        if launched[-1] == str(configs[0]):             # one that fails to compile after the launch began (the
            raise triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")   # scan, after its prep)
        return cost[launched[-1]]

    def pick(key, launch, states, on_gpu):
        return deltanet._pick_in_place(kernel, key, launch, states, on_gpu, calls=5, Dv=128)
    monkeypatch.setattr(deltanet, "_time_in_graph", timer)
    monkeypatch.setattr(deltanet, "_PICKS", {kernel: {}})
    assert pick("a", launch, states, on_gpu=True) is configs[-2]
    assert sorted(set(launched)) == sorted(map(str, configs)), "every config timed"
    assert torch.equal(states[0], torch.zeros(2, 4, 4)) and torch.equal(states[1], torch.ones(6, 3)), \
        "the states must be put back after each timing, one that ran out of resources too"
    assert pick("a", None, states, on_gpu=True) is configs[-2], "the pick is kept"
    assert pick("b", launch, states, on_gpu=False) is None
    with force_config(kernel, configs[0]):
        assert pick("c", launch, states, on_gpu=True) is None
    monkeypatch.setenv("QWEN_LAB_TUNE", "0")
    assert pick("d", launch, states, on_gpu=True) is None
    monkeypatch.setenv("QWEN_LAB_TUNE", "1")
    with torch.inference_mode():                         # a cache allocated under inference mode, a call outside it
        states = (torch.zeros(2, 4, 4), torch.ones(6, 3))
    assert pick("e", launch, states, on_gpu=True) is configs[-2]
    assert torch.equal(states[0], torch.zeros(2, 4, 4)) and torch.equal(states[1], torch.ones(6, 3))
    assert set(deltanet._PICKS[kernel]) == {"a", "e"}, "only the timed kinds hold a pick"


def test_chunked_launch_runs_the_scan_with_its_pick(rt, gen, monkeypatch):
    """The launcher asks _pick_in_place once per call, keyed on the call's kind (its chunk class, the prep's form),
    and launches the scan with what it returns; the result is right with any config."""
    D = 16 if rt.device.type == "cpu" else deltanet.CHUNKED_MIN_HEAD_DIM  # smaller heads take the recurrent kernel
    configs = autotune_configs("chunk_scan_kernel", Dv=D)
    asked, used = [], []

    def pick(kernel, key, launch, states, on_gpu, calls, **named_args):
        asked.append((kernel, key, calls, named_args, states))
        return configs[-1]
    monkeypatch.setattr(deltanet, "_pick_in_place", pick)
    launch = deltanet._launch

    def spy(kernel, grid, args, kwargs, interpreter_meta, untuned=None):
        if "BV" in interpreter_meta:                      # the scan's launch
            used.append(untuned)
        return launch(kernel, grid, args, kwargs, interpreter_meta, untuned)
    monkeypatch.setattr(deltanet, "_launch", spy)
    d = _delta_inputs(150, 1, 2, D, D, gen, rt.dtype, rt.device)
    ref_state = d["state"].clone()
    ref = reference.delta_rule_chunked(**{**d, "state": ref_state})
    _judge("o", delta_rule_chunked(**d), ref)
    _judge("state", d["state"], ref_state)
    assert used == [configs[-1]] and len(asked) == 1
    kernel, key, calls, named_args, states = asked[0]
    assert kernel == "chunk_scan_kernel" and named_args == {"Dv": D} and calls == 3
    assert key[2:8] == (2, D, D, 64, 4, False), key
    assert states[0] is d["state"] and states[1] is deltanet._tickets(rt.device, 1), \
        "the timing must put back the state and the scan's counters"


def _two_prompts_through_one_workspace(rt, gen, T=2048):
    """Two deltanet_chunked prompts at Qwen3.5-0.8B's shapes sharing one workspace: run(i) runs prompt i from its
    starting state -> (output, final state). Alternated, a chunk the scan reads before its prep wrote it holds the
    other prompt's values."""
    Hk = Hv = QWEN35_0_8B.linear_num_value_heads
    Dk, Dv = QWEN35_0_8B.linear_key_head_dim, QWEN35_0_8B.linear_value_head_dim
    cases = [_fused_gates_case(T, Hk, Hv, Dk, Dv, gen, rt)[0] for _ in range(2)]
    ws = deltanet.chunk_workspace(T, Hv, Dk, Dv, rt.dtype, rt.device)
    start = [c["state"].clone() for c in cases]

    def run(i):
        cases[i]["state"].copy_(start[i])
        return deltanet_chunked(**cases[i], workspace=ws).clone(), cases[i]["state"].clone()
    return run


def _alternate_under_pdl(run, want, monkeypatch, calls=20):
    """Alternate the two prompts `calls` times with PDL on: each must equal `want` (the same calls without PDL)
    bit for bit."""
    monkeypatch.setenv("QWEN_LAB_PDL", "1")
    for rep in range(calls):
        i = rep % 2
        o, state = run(i)
        assert torch.equal(o, want[i][0]) and torch.equal(state, want[i][1]), (
            f"call {rep} (prompt {i}) differs from the same call without PDL: the scan read a chunk too early")


@pytest.mark.gpu
def test_gpu_persistent_prep_beside_the_scan(rt, gen, monkeypatch):
    """PREP_PERSISTENT at the model's shapes (2048 tokens, bf16): under PDL its scan starts beside the whole prep.
    Two prompts alternate through one workspace; every call must equal bit for bit the same persistent prep
    without PDL (the scan after it: a chunk read too early would show), and the grid's prep within bf16 rounding."""
    run = _two_prompts_through_one_workspace(rt, gen)
    monkeypatch.setattr(deltanet, "PREP_PERSISTENT", False)
    grid = [run(0), run(1)]
    Hv, Dv = QWEN35_0_8B.linear_num_value_heads, QWEN35_0_8B.linear_value_head_dim
    programs = deltanet.PREP_PROGRAMS_PER_SM * deltanet.gemm.sm_count(rt.device) - Hv * Dv // 32
    monkeypatch.setattr(deltanet, "PREP_PERSISTENT", programs)   # an int: the same count with PDL off
    monkeypatch.setenv("QWEN_LAB_PDL", "0")
    want = [run(0), run(1)]
    for i in range(2):
        _close(f"prompt {i}: o, persistent prep against the grid", want[i][0], grid[i][0])
        _close(f"prompt {i}: final state, persistent prep against the grid", want[i][1], grid[i][1])
    _alternate_under_pdl(run, want, monkeypatch)


def test_scan_counters_are_not_inference_tensors(rt, monkeypatch):
    """The first call may come under torch.inference_mode() (the model's generation does); the counters it
    allocates are later restored with copy_ by the scan's GPU autotuner, perhaps outside that mode, which PyTorch
    refuses for an inference tensor (the H200 raised it while capturing prefill graphs)."""
    monkeypatch.setattr(deltanet, "_TICKETS", {})
    with torch.inference_mode():
        counters = deltanet._tickets(rt.device, 10)
    assert not counters.is_inference()
    counters.copy_(torch.zeros_like(counters))  # what the autotuner's restore does, outside inference mode


@pytest.mark.gpu
def test_gpu_scan_beside_the_prep_reads_only_finished_chunks(rt, gen, monkeypatch):
    """Under PDL the scan runs beside the prep (the grid's last programs; the persistent prep's, the default, all of
    them) and waits for each group of chunks. Two prompts alternate through one workspace, so a chunk read before
    its prep wrote it holds the other prompt's values: every output must equal, bit for bit, the same call without
    PDL (no overlap; the grid's prep, the same arithmetic)."""
    run = _two_prompts_through_one_workspace(rt, gen)
    monkeypatch.setenv("QWEN_LAB_PDL", "0")
    want = [run(0), run(1)]
    _alternate_under_pdl(run, want, monkeypatch)


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
    _judge("outputs", torch.cat(outs), o_long)
    _judge("state", state, long_state)


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


@pytest.mark.parametrize("T", [1, 63, 64, 70, 130])
def test_chunked_fuses_the_gates(T, rt, gen):
    """deltanet_chunked: the gates computed in the chunk prep from the raw a, b equal deltanet_gates then
    delta_rule_chunked; the padded tail of the last chunk must get g = beta = 0 (the raw a there is 0, whose gate
    is not)."""
    args, ref, ref_state = _fused_gates_case(T, 2, 4, 16, 32, gen, rt)
    with count_launches() as launches:
        o = deltanet_chunked(**args)
    # two kernels; on a GPU these 16/32-wide heads run the recurrent kernel instead (see delta_rule_chunked)
    assert sum(launches.values()) == (2 if deltanet.INTERPRET else 1), dict(launches)
    assert launches["deltanet_gates_kernel"] == 0, dict(launches)
    _judge("o", o, ref)
    _judge("state", args["state"], ref_state)
    with pytest.raises(KernelError, match="dt_bias"):
        deltanet_chunked(**{**args, "dt_bias": args["dt_bias"][:2]})


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
    _judge("o", o, ref)
    _judge("state", state, clean["state"])


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
        _judge("o", o, ref)
        _judge("state", s, ref_state)
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


# ---------------------------------------------------------------- guard regions: nothing outside the tensors
#
# The interpreter loads and stores through raw CPU pointers, so an access past the end of a tensor usually
# lands in a neighbouring allocation and goes unnoticed; on the GPU it faults or corrupts memory. Here every
# tensor a kernel sees is a strided view in the middle of a larger buffer: around inputs (margins and the
# gaps between rows) the buffer holds NaN, which would reach an output if read; around outputs it holds a
# sentinel. After the call every element outside the views must be bit for bit what it was. The GPU's
# autotuning configs (block sizes the interpreter never picks) are forced in turn with `force_config`.

from qwen_lab.course.checks import GUARD_NAN as NAN, GuardedTensor as _Guard  # noqa: E402
from qwen_lab.course.checks import guarded_call as _guarded_call  # noqa: E402


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
            stack.enter_context(force_config(name, config))
        got = _guarded_call(kernel, d, outputs=("out",), **extra)
    for name, g in zip(ChunkWorkspace._fields, ws):
        assert g.touched() == 0, f"{kernel.__name__}{shape}: a store went past the end of workspace.{name}"
    where = f"{kernel.__name__}{shape} with {[f'{n}: {c}' for n, c in forced]}"
    _judge(f"{where}: o", got["out"], ref)
    _judge(f"{where}: state", got["state"], ref_state)


def _pick(configs, i):
    return configs[i % len(configs)]


# T around the chunk of 64 (1, one short, exact, one over, two exact, two and a bit), head dims from the
# tiny model's 16 to Qwen3.5's 128, Hv = Hk and Hv = 2 Hk, a few Dk != Dv and ragged ones (not powers of 2).
_CHUNK_SHAPES = [(T, Hk, Hv, D, D) for T in (1, 2, 63, 64, 65, 128, 130) for D in (16, 32, 128)
                 for Hk, Hv in ((2, 2), (1, 2))]
_CHUNK_SHAPES += [(65, 1, 2, 16, 128), (64, 2, 2, 128, 32), (1, 1, 2, 32, 16), (70, 1, 3, 24, 40)]


@pytest.mark.parametrize("shape", _CHUNK_SHAPES, ids=lambda s: "T{}-Hk{}-Hv{}-Dk{}-Dv{}".format(*s))
def test_chunked_stays_inside_its_tensors(shape, rt, gen):
    """Each shape also runs one of the scan's and one of the prep's GPU configs, in turn across the shapes, and
    alternates between the gates given (delta_rule_chunked) and the gates computed in the prep (deltanet_chunked)."""
    i = _CHUNK_SHAPES.index(shape)
    forced = (("chunk_scan_kernel", _pick(autotune_configs("chunk_scan_kernel", Dv=shape[4]), i)),
              ("chunk_prep_kernel", _pick(autotune_configs("chunk_prep_kernel"), i)))
    _run_guarded(deltanet_chunked if i % 2 else delta_rule_chunked, shape, gen, rt, forced)


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


@pytest.mark.parametrize("kernel", ["chunk_scan_kernel", "chunk_prep_kernel", "delta_rule_recurrent_kernel"])
def test_every_gpu_config(kernel, rt, gen):
    """Every config the GPU autotuner may pick, on the shapes that failed on the H200 (T = 1 with the test's
    small heads, a prompt of exactly one chunk on the tiny model's heads and on Qwen3.5's) and a ragged one."""
    if kernel == "delta_rule_recurrent_kernel":
        shapes, fns = [(1, 2, 2, 16, 32), (3, 2, 4, 16, 16), (1, 1, 2, 128, 128)], \
            (delta_rule_recurrent, deltanet_decode_step)
    else:
        # (on a GPU, heads below CHUNKED_MIN_HEAD_DIM take the recurrent kernel: only the 128-wide shapes run the
        # chunk kernels there; the interpreter runs them all)
        shapes, fns = [(1, 2, 2, 16, 32), (64, 2, 4, 16, 16), (64, 1, 2, 128, 128), (70, 1, 2, 128, 128)], \
            (delta_rule_chunked,)
    ran = 0
    for shape in shapes:
        configs = autotune_configs(kernel, Dv=shape[4])
        if runtime.interpreter_active():  # it ignores num_warps and num_stages: one run per set of block sizes
            configs = list({str(c.kwargs): c for c in configs}.values())
        for config in configs:
            for fn in fns:
                _run_guarded(fn, shape, gen, rt, [(kernel, config)])
                ran += 1
    assert ran >= len(shapes) * len(fns)


@pytest.mark.parametrize("T0", [1, 64, 65])
def test_decode_after_prefill_equals_a_longer_prefill(T0, rt, gen):
    """Prefill T0 tokens (chunked), decode 3 more with delta_rule_recurrent and with the fused decode step, and
    prefill the rest in a second chunked call: each equals one chunked prefill of them all (and the reference);
    T0 = 64 is a prompt of exactly one chunk."""
    steps, Hk, Hv, Dk, Dv = 3, 2, 4, 16, 32
    T = T0 + steps
    d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    proj = checks.randn(T, 2 * Hv + 1, g=gen, dtype=rt.dtype, device=rt.device)
    a, b = proj[:, 1 + Hv:], proj[:, 1:1 + Hv]
    A_log, dt_bias = _gate_params(Hv, gen, rt.device)
    g, beta = reference.deltanet_gates(a, b, A_log, dt_bias)
    q, k, v = d["q"], d["k"], d["v"]
    ref_state = d["state"].clone()
    ref = reference.delta_rule_chunked(q, k, v, g, beta, ref_state)
    long_state = d["state"].clone()
    o_long = delta_rule_chunked(q, k, v, g, beta, long_state)
    _judge("one long prefill", o_long, ref)
    for how in ("recurrent", "decode_step", "second prefill"):
        state = d["state"].clone()
        outs = [delta_rule_chunked(q[:T0], k[:T0], v[:T0], g[:T0], beta[:T0], state)]
        if how == "second prefill":
            outs.append(delta_rule_chunked(q[T0:], k[T0:], v[T0:], g[T0:], beta[T0:], state))
        for t in range(T0, T) if how != "second prefill" else ():
            s = slice(t, t + 1)
            if how == "recurrent":
                outs.append(delta_rule_recurrent(q[s], k[s], v[s], g[s], beta[s], state))
            else:
                outs.append(deltanet_decode_step(q[s], k[s], v[s], a[s], b[s], A_log, dt_bias, state))
        _judge(f"prefill {T0} then {how}: outputs", torch.cat(outs), o_long)
        _judge(f"prefill {T0} then {how}: state", state, long_state)


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


# ---------------------------------------------------------------- the decode step with the conv fused in
#
# deltanet_conv_decode_step = reference causal_conv1d (conv + SiLU, conv_state shifted in place), the split into
# q, k, v, then deltanet_decode_step, in one launch. The q/k channels of a key head are read by every program of
# the value heads sharing it (Hv / Hk heads times Dv / BV column blocks) and shifted by the last of them to draw
# a ticket: the shapes below have several such readers (Hv = 2 Hk, 3 Hk, two column blocks of BV = 32 for
# Dv = 40), so a writer that went first would hand the next readers a shifted state.

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


def _tickets_are_zero(device):
    """The kernel's counters are back at zero after every launch (the next launch counts from there)."""
    from qwen_lab.kernels import device_key

    counters = deltanet._TICKETS.get(device_key(device))
    assert counters is not None and int(counters.abs().sum()) == 0, f"ticket counters left at {counters}"


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
        if s == 0:  # the reference function added for this kernel is the same composition
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
            assert torch.equal(ref0, ref) and torch.equal(c0, ref_conv_state) and torch.equal(s0, ref_state)
        assert o.shape == (1, Hv, Dv) and o.dtype == rt.dtype
        if rt.dtype == torch.float32:
            checks.compare(f"step {s}: o", o, ref)
            checks.compare(f"step {s}: state", state, ref_state)
        else:  # bf16 conv outputs on a GPU (see _gpu_judge_step)
            _gpu_judge_step(f"step {s}", o, ref, conv_state, ref_conv_state, state, ref_state)
        # the conv state holds inputs: moving them is exact
        assert torch.equal(conv_state, ref_conv_state), f"step {s}: conv_state differs from the reference's"
        _tickets_are_zero(rt.device)


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
            stack.enter_context(force_config(name, config))
        got = _guarded_call(deltanet_conv_decode_step, args, outputs=("out",))
    where = f"deltanet_conv_decode_step Hk={Hk} Hv={Hv} Dk={Dk} Dv={Dv} W={W} with {[str(c) for _, c in forced]}"
    if rt.dtype == torch.float32:
        checks.compare(f"{where}: o", got["out"], ref, hint=READ_HINT)
        checks.compare(f"{where}: state", got["state"], ref_state, hint=READ_HINT)
    else:
        _gpu_judge_step(where, got["out"], ref, got["conv_state"], ref_conv_state, got["state"], ref_state)
    assert torch.equal(got["conv_state"], ref_conv_state), f"{where}: conv_state differs"
    _tickets_are_zero(rt.device)


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
    launch = deltanet._launch

    def spy(kernel, grid, args, kwargs, interpreter_meta, untuned=None):
        used.append(untuned)
        return launch(kernel, grid, args, kwargs, interpreter_meta, untuned)

    def timer(calls, warmup, replays):
        assert len(calls) == 16, f"{len(calls)} launches per timing graph, expected 16"
        calls[0]()                                       # one of them: the interpreter is slow
        return 1.0 if used[-1] is best else 2.0
    real_pick = deltanet._pick_in_place
    keys = []

    def pick(kernel, key, launch, states, on_gpu, calls, **named_args):
        keys.append(key)
        return real_pick(kernel, key, launch, states, True, calls, **named_args)   # time as on a GPU
    monkeypatch.setattr(deltanet, "_launch", spy)
    monkeypatch.setattr(deltanet, "_time_in_graph", timer)
    monkeypatch.setattr(deltanet, "_pick_in_place", pick)
    monkeypatch.setitem(deltanet._PICKS, "conv_decode_step_kernel", {})
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
    assert list(deltanet._PICKS["conv_decode_step_kernel"].values()) == [best, best]


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
    """The tiny model (Hv = 2 Hk): decode through deltanet_conv_decode_step equals the two-call route forced by
    swapping the conv entry (for the reference conv, and for the same Triton conv under another name), and
    launches one kernel fewer per DeltaNet layer than the latter."""
    from qwen_lab.kernels import conv1d
    from qwen_lab.model import Qwen35Model, load_model

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
                model.step(ids[5:6], torch.tensor([5], device=rt.device), scratch)
            model.trace = lambda layer, name, t: traced.append((layer, name))
            for t in (5, 6):
                with count_launches() as c:
                    logits.append(model.step(ids[t:t + 1], torch.tensor([t], device=rt.device), cache).float())
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
        assert any(name == "conv1d" for _, name in traced)
    n_linear = cfg.num_linear_layers
    for c in fused_launches:
        assert c["conv_decode_step_kernel"] == n_linear and c["conv1d_step_kernel"] == 0
        assert c["delta_rule_recurrent_kernel"] == 0
    unfused_launches = results["triton conv, unfused"][2]
    for fused, unfused in zip(fused_launches, unfused_launches):
        assert sum(unfused.values()) - sum(fused.values()) == n_linear, (dict(fused), dict(unfused))
    assert not any(name == "conv1d" for _, name in fused_traced)
    assert sum(name == "conv_state" for _, name in fused_traced) == 2 * n_linear


# ---------------------------------------------------------------- GPU: every autotuning config, faults isolated
#
# A kernel that faults leaves the CUDA context unusable, so one bad config would fail every later test of this
# file with the same error. This test runs every config the autotuner may pick (forced one by one, guarded as
# above) in a child process: the chunk kernels at T = 1 and on a prompt of exactly one chunk, with 64-wide heads
# (the narrowest they serve on a GPU; smaller ones faulted on the H200 and now take the recurrent kernel) and with
# Qwen3.5-0.8B's, and at T = 77 (two chunks); the recurrent kernels with small heads and Qwen3.5's. A child
# that faults reports the job and exits; the next child starts after it. The report lists every job.

def _probe_jobs():
    """(kernel, shape (T, Hk, Hv, Dk, Dv), forced (kernel name, config) pairs) of every probe job."""
    jobs = []
    prep = autotune_configs("chunk_prep_kernel")
    # head dims of 64 and up: smaller heads take the recurrent kernel on a GPU (CHUNKED_MIN_HEAD_DIM), so they
    # would not run the chunk kernels these jobs force
    for shape in [(1, 2, 2, 64, 64), (64, 2, 4, 64, 64), (64, 16, 16, 128, 128), (77, 16, 16, 128, 128)]:
        scan = autotune_configs("chunk_scan_kernel", Dv=shape[4])
        jobs.append((delta_rule_chunked, shape, ()))  # the autotuner's own pick
        jobs += [(delta_rule_chunked, shape, (("chunk_scan_kernel", c), ("chunk_prep_kernel", prep[0]))) for c in scan]
        jobs += [(delta_rule_chunked, shape, (("chunk_scan_kernel", scan[0]), ("chunk_prep_kernel", c)))
                 for c in prep[1:]]
        jobs += [(deltanet_chunked, shape, (("chunk_scan_kernel", scan[0]), ("chunk_prep_kernel", c))) for c in prep]
    for shape in [(1, 2, 2, 16, 32), (1, 16, 16, 128, 128), (6, 2, 4, 16, 32)]:
        for fn in (delta_rule_recurrent, deltanet_decode_step):
            jobs.append((fn, shape, ()))
            jobs += [(fn, shape, (("delta_rule_recurrent_kernel", c),))
                     for c in autotune_configs("delta_rule_recurrent_kernel", Dv=shape[4])]
    for shape in [(1, 2, 4, 16, 32), (1, 16, 16, 128, 128), (1, 16, 48, 128, 128)]:  # one token: W = 4
        jobs.append((deltanet_conv_decode_step, shape, ()))
        jobs += [(deltanet_conv_decode_step, shape, (("conv_decode_step_kernel", c),))
                 for c in autotune_configs("conv_decode_step_kernel", Dv=shape[4])]
    return jobs


def _probe_label(job):
    fn, shape, forced = job
    how = "; ".join(f"{name} {', '.join(f'{k}={v}' for k, v in c.kwargs.items())} warps={c.num_warps} "
                    f"stages={c.num_stages}".replace("  ", " ") for name, c in forced) or "autotuned"
    return f"{fn.__name__} T={shape[0]} Hk={shape[1]} Hv={shape[2]} Dk={shape[3]} Dv={shape[4]} [{how}]"


def _probe_main(start: int):
    """Child process: run the jobs from `start` on, one line each; stop at the first CUDA fault."""
    import traceback
    rt = runtime.choose()
    for i, job in enumerate(_probe_jobs()):
        if i < start:
            continue
        fn, shape, forced = job
        try:
            if fn is deltanet_conv_decode_step:
                _run_conv_decode_guarded(shape, torch.Generator().manual_seed(i), rt, forced)
            else:
                _run_guarded(fn, shape, torch.Generator().manual_seed(i), rt, forced)
            if rt.device.type == "cuda":
                torch.cuda.synchronize()
            print(f"PROBE {i} PASS", flush=True)
        except Exception as e:  # noqa: BLE001  (every failure is reported, by kind)
            fault = "CUDA" in str(e) or "illegal" in str(e).lower()
            why = " ".join(str(e).split())[:300] or traceback.format_exc(limit=1)
            print(f"PROBE {i} {'FAULT' if fault else 'FAIL'} {type(e).__name__}: {why}", flush=True)
            if fault:
                sys.stdout.flush()
                os._exit(3)


@pytest.mark.gpu
def test_gpu_every_config_in_its_own_process():
    jobs = _probe_jobs()
    results, start, deadline = {}, 0, time.time() + 240
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    code = "import runpy, sys; runpy.run_path(sys.argv[1])['_probe_main'](int(sys.argv[2]))"
    while start < len(jobs) and time.time() < deadline:
        child = subprocess.run([sys.executable, "-c", code, __file__, str(start)], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=max(10, deadline - time.time()))
        seen, verdict = start - 1, ""
        for line in child.stdout.splitlines():
            if line.startswith("PROBE "):
                _, i, verdict = line.split(" ", 2)
                results[int(i)] = verdict
                seen = max(seen, int(i))
        if child.returncode != 0 and not verdict.startswith("FAULT") and seen + 1 < len(jobs):
            # died without a word (a crash in the driver, say): blame the job after the last one reported
            results[seen + 1] = f"FAULT process exited with {child.returncode}: {child.stderr.strip()[-300:]}"
            seen += 1
        start = seen + 1
    report = [f"{'PASS' if results.get(i, '').startswith('PASS') else results.get(i, 'NOT RUN (time limit)')[:320]}"
              f"  {_probe_label(job)}" for i, job in enumerate(jobs)]
    print("\n".join(report))
    bad = [line for line in report if not line.startswith("PASS")]
    assert results and not bad, f"{len(bad)} of {len(jobs)} probe jobs did not pass:\n" + "\n".join(bad)


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
def test_gpu_scan_tunes_a_long_prompt_apart_from_a_short_one(rt, gen, monkeypatch):
    """A short prompt first, then a 2048-token one (Qwen3.5-0.8B's shapes): the scan holds a pick for each length
    class, timed beside the prep (and, with QWEN_LAB_TUNE=0, a tuning of Triton's autotuner for each), and the long
    prompt is still right."""
    Hk = Hv = QWEN35_0_8B.linear_num_value_heads
    Dk, Dv = QWEN35_0_8B.linear_key_head_dim, QWEN35_0_8B.linear_value_head_dim
    picks = {}
    monkeypatch.setitem(deltanet._PICKS, "chunk_scan_kernel", picks)
    classes = [deltanet.chunk_class(-(-T // 64)) for T in (150, 2048)]
    picked = []
    for tune in ("1", "0"):
        monkeypatch.setenv("QWEN_LAB_TUNE", tune)
        picked += sorted(key[6] for key in picks)
        picks.clear()
        for T in (150, 2048):
            d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
            ref_state = d["state"].clone()
            ref = reference.delta_rule_chunked(**{**d, "state": ref_state})
            _close(f"o at T={T}, QWEN_LAB_TUNE={tune}", delta_rule_chunked(**d), ref)
            _close(f"state at T={T}, QWEN_LAB_TUNE={tune}", d["state"], ref_state)
    assert picked == classes, f"the scan's picks cover chunk classes {picked}, expected {classes}"
    assert not picks, "QWEN_LAB_TUNE=0 leaves the pick to the autotuner"
    key_at = deltanet.chunk_scan_kernel.keys.index("N_CLASS")
    tuned = {key[key_at] for key in deltanet.chunk_scan_kernel.cache}
    assert set(classes) <= tuned, f"the autotuner's tunings cover chunk classes {sorted(tuned)}, expected {classes}"


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 64, 300])
def test_gpu_grid_prep_tuned_on_the_call_leaves_the_counters_at_zero(T, rt, gen, monkeypatch):
    """The prep as a grid (the larger Qwen3.5s' 32 and 48 value heads take it), tuned by Triton's autotuner on this
    very call, with the scan beside it under PDL: the autotuner's timing runs of the prep count chunks as ready,
    so they must be put back, or the scan would go on before the real prep had written its chunks and leave the
    real prep's counts behind. (On an H200, before the prep restored its counters, one prompt of one token
    left a counter at 1.)"""
    monkeypatch.setattr(deltanet, "PREP_PERSISTENT", False)
    monkeypatch.setattr(deltanet.chunk_prep_kernel, "cache", {})        # tune again, on this call,
    monkeypatch.setattr(deltanet.chunk_prep_kernel, "cache_results", False)   # not from the disk cache
    monkeypatch.setitem(deltanet._PICKS, "chunk_scan_kernel", {})
    d = _delta_inputs(T, 1, 2, 64, 64, gen, rt.dtype, rt.device)
    ref_state = d["state"].clone()
    ref = reference.delta_rule_chunked(**{**d, "state": ref_state})
    o = delta_rule_chunked(**d)
    left = deltanet._tickets(rt.device, 1).nonzero().flatten().tolist()
    assert not left, f"T={T}: counters {left} left non-zero after the prep was tuned on the call"
    _close(f"o at T={T}", o, ref)
    _close(f"state at T={T}", d["state"], ref_state)


@pytest.mark.gpu
def test_gpu_scan_picked_beside_the_prep_leaves_the_result_right(rt, gen, monkeypatch):
    """The first call of a kind times the scan's configs on the call's own state (then put back) before it runs:
    its output and final state must be those of the reference, and the pick kept for the next call."""
    monkeypatch.setitem(deltanet._PICKS, "chunk_scan_kernel", {})
    Hk = Hv = QWEN35_0_8B.linear_num_value_heads
    Dk, Dv = QWEN35_0_8B.linear_key_head_dim, QWEN35_0_8B.linear_value_head_dim
    args, ref, ref_state = _fused_gates_case(2048, Hk, Hv, Dk, Dv, gen, rt)
    with count_launches() as launches:
        o = deltanet_chunked(**args)
    _close("o", o, ref)
    _close("state", args["state"], ref_state)
    assert sum(launches.values()) == 2, f"the timing runs are not the call's launches: {dict(launches)}"
    picks = list(deltanet._PICKS["chunk_scan_kernel"].values())
    assert len(picks) == 1 and isinstance(picks[0], triton.Config), picks


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2048, 77])
def test_gpu_chunked_with_fused_gates(T, rt, gen):
    Hk = Hv = QWEN35_0_8B.linear_num_value_heads
    Dk, Dv = QWEN35_0_8B.linear_key_head_dim, QWEN35_0_8B.linear_value_head_dim
    args, ref, ref_state = _fused_gates_case(T, Hk, Hv, Dk, Dv, gen, rt)
    _close("o", deltanet_chunked(**args), ref)
    _close("state", args["state"], ref_state)


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
    monkeypatch.setitem(deltanet._PICKS, "conv_decode_step_kernel", {})
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
    picks = list(deltanet._PICKS["conv_decode_step_kernel"].values())
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
        with force_config("conv_decode_step_kernel", config):
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
