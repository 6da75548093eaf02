"""The chunked (prefill) form of the Gated DeltaNet kernels (qwen_lab.kernels.deltanet: chunk_prep.py,
chunk_scan.py, and the plan of tuning.py) against qwen_lab.reference: the prep and the scan, the gates fused into
the prep, the persistent prep, the scan's counters and groups, the tunings per class of prompt length, the
workspace, and notebook 09's teaching kernels.

CPU: the Triton interpreter in float32, small heads, token counts around the chunk size of 64. GPU: bf16 inputs
and an fp32 state on Qwen3.5-0.8B shapes, the larger models' 32 and 48 value heads, 2048 / 8192-token prefills,
and the scan beside the prep under PDL.
"""

import pytest
import torch
import triton

from qwen_lab import reference, runtime
from qwen_lab.course import checks
from qwen_lab.config import QWEN35_0_8B
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches, deltanet
from qwen_lab.kernels.deltanet import autotune_configs, chunk_workspace, delta_rule_chunked, deltanet_chunked
from qwen_lab.kernels.deltanet import counters as device_counters
from qwen_lab.kernels.deltanet import tuning
from qwen_lab.switches import switches

from deltanet_cases import (_case, _chunked_tol, _close, _delta_inputs, _fused_gates_case, _judge, _pick, _run_guarded,
                            fail_if_counters_left)


@pytest.fixture(autouse=True)
def _counters_left_at_zero():
    """Every test leaves the counters DeltaNet launches share at zero (see fail_if_counters_left)."""
    yield
    fail_if_counters_left()


# ---------------------------------------------------------------- the chunked delta rule


@pytest.mark.parametrize("Hk, Hv", [(2, 2), (2, 4)])
@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_chunked_matches_reference(T, Hk, Hv, rt):
    with count_launches() as launches:
        checks.check_kernel("delta_rule_chunked", delta_rule_chunked, reference.delta_rule_chunked,
                            [_case(T, Hk, Hv, 16, 32, rt)], seed=T + Hv, inplace=("state",), quiet=True,
                            **_chunked_tol(rt))
    # two kernels; on a GPU these 16/32-wide heads run the recurrent kernel instead (see delta_rule_chunked)
    assert sum(launches.values()) == (2 if tuning.INTERPRET else 1)


def test_chunked_ragged_dims_and_chunk_128(rt):
    checks.check_kernel("delta_rule_chunked", delta_rule_chunked, reference.delta_rule_chunked,
                        [_case(70, 1, 2, 24, 40, rt), _case(130, 2, 2, 16, 16, rt, chunk_size=128)],
                        seed=5, inplace=("state",), quiet=True, **_chunked_tol(rt))


@pytest.mark.parametrize("T", [1, 63, 64, 70, 130])
def test_chunked_fuses_the_gates(T, rt, gen):
    """deltanet_chunked: the gates computed in the chunk prep from the raw a, b equal deltanet_gates then
    delta_rule_chunked; the padded tail of the last chunk must get g = beta = 0 (the raw a there is 0, whose gate
    is not)."""
    args, ref, ref_state = _fused_gates_case(T, 2, 4, 16, 32, gen, rt)
    with count_launches() as launches:
        o = deltanet_chunked(**args)
    # two kernels; on a GPU these 16/32-wide heads run the recurrent kernel instead (see delta_rule_chunked)
    assert sum(launches.values()) == (2 if tuning.INTERPRET else 1), dict(launches)
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


# ---------------------------------------------------------------- the scan beside the prep


def test_chunked_leaves_the_scan_counters_at_zero(rt, gen):
    """On a GPU the scan waits for the prep's chunks through counters that every call must leave at zero: one
    left full would let the next call's scan read a chunk before its prep had written it. Ten chunks make two
    groups of switches.scan_group; the counters are checked before and after two calls. (Heads of 64: on a GPU
    narrower ones take the recurrent kernel.)"""
    T = 9 * 64 + 5
    d = _delta_inputs(T, 1, 2, 64, 64, gen, rt.dtype, rt.device)
    counters = device_counters._tickets(rt.device, 2 * (T // 64 + 2))
    assert T // 64 + 1 > switches.scan_group and int(counters.count_nonzero()) == 0
    for _ in range(2):
        delta_rule_chunked(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"])
        left = counters.nonzero().flatten().tolist()
        assert not left, f"the scan left counters {left} non-zero"


@pytest.mark.parametrize("group", [1, 3, 4])
def test_scan_group_size_changes_only_the_polling(group, rt, gen, monkeypatch, switch):
    """switches.scan_group (chunks per counter the scan polls) changes when the scan may go on, not what it computes: the
    same output and final state bit for bit as groups of 8, with ten chunks (a last group cut short) and every
    counter left at zero."""
    T = 9 * 64 + 5
    d = _delta_inputs(T, 1, 2, 64, 64, gen, rt.dtype, rt.device)
    start = d["state"].clone()
    runs = {}
    for size in (8, group):
        switch(scan_group=size)
        d["state"].copy_(start)
        runs[size] = delta_rule_chunked(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"]), d["state"].clone()
    assert torch.equal(runs[group][0], runs[8][0]) and torch.equal(runs[group][1], runs[8][1])
    assert not device_counters._tickets(rt.device, 1).nonzero().numel(), f"groups of {group} left counters non-zero"


@pytest.mark.parametrize("programs", [1, 3, 7, 1000])
@pytest.mark.parametrize("T, Hk, Hv, Dk, Dv", [(300, 1, 2, 64, 64), (70, 1, 3, 24, 40), (1, 1, 2, 64, 64)])
def test_persistent_prep_equals_the_grid(programs, T, Hk, Hv, Dk, Dv, rt, gen, monkeypatch, switch):
    """switches.prep_persistent: the prep as `programs` programs walking the (head, chunk) items gives bit for bit the
    output and final state of the grid (Hv, chunks), with the gates given and fused, for one program, fewer
    programs than heads, more than the items, and a last program with fewer items than the rest; the scan's
    counters are left at zero."""
    d = _delta_inputs(T, Hk, Hv, Dk, Dv, gen, rt.dtype, rt.device)
    fused = _fused_gates_case(T, Hk, Hv, Dk, Dv, gen, rt)[0]
    starts = d["state"].clone(), fused["state"].clone()
    runs = {}
    left = device_counters._tickets(rt.device, 1).nonzero().flatten().tolist()
    assert not left, f"counters {left} were non-zero before this test: left by an earlier call in this process"
    for setting in (False, programs):
        switch(prep_persistent=setting)
        d["state"].copy_(starts[0])
        fused["state"].copy_(starts[1])
        o = delta_rule_chunked(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"])
        o_fused = deltanet_chunked(**fused)
        runs[setting] = o, d["state"].clone(), o_fused, fused["state"].clone()
        left = device_counters._tickets(rt.device, 1).nonzero().flatten().tolist()
        assert not left, f"prep_persistent={setting}: the calls left counters {left} non-zero"
    for name, got, want in zip(("o", "final state", "o (fused gates)", "final state (fused gates)"),
                               runs[programs], runs[False]):
        assert torch.equal(got, want), f"{programs} persistent prep programs: {name} differs from the grid's"


@pytest.mark.parametrize("i", range(len(autotune_configs("chunk_prep_kernel"))))
def test_persistent_prep_every_gpu_config_guarded(i, rt, gen, monkeypatch, switch):
    """The persistent prep with each of the prep's GPU configs forced (switches.force_config reaches it, though it is not
    autotuned), on guarded inputs and workspace, a last program with fewer items than the rest."""
    switch(prep_persistent=5)
    c = autotune_configs("chunk_prep_kernel")[i]
    for fn in (delta_rule_chunked, deltanet_chunked):
        _run_guarded(fn, (300, 1, 2, 64, 64), gen, rt, forced=(("chunk_prep_kernel", c),))


def test_persistent_prep_program_count(monkeypatch, switch):
    """switches.prep_persistent = True sizes the prep from the GPU: two programs per SM less one per scan program (at the
    scan's narrowest value block, 32 columns), never more than the items, at any prompt length; the grid where
    those programs would publish chunks slower than the scan reads them (the larger Qwen3.5s' 32 and 48 value
    heads), where the scan does not run beside the prep (no PDL, or the interpreter), or where the switch is off."""
    device = torch.device("cuda", 0)
    monkeypatch.setattr(tuning, "INTERPRET", False)
    monkeypatch.setattr(tuning.gemm, "sm_count", lambda dev: 132)
    monkeypatch.setattr(tuning, "pdl_options", lambda dev: {"USE_PDL": True, "launch_pdl": True})
    switch(prep_persistent=True)
    assert tuning._prep_programs(16, 32, 128, device) == 2 * 132 - 16 * 4   # Qwen3.5-0.8B at 2048 tokens
    assert tuning._prep_programs(16, 128, 128, device) == 200              # 8192 tokens: as many programs
    assert tuning._prep_programs(16, 5, 128, device) == 16 * 5             # fewer items than programs
    assert tuning._prep_programs(32, 32, 128, device) is None              # 136 programs for 32 heads
    assert tuning._prep_programs(48, 32, 128, device) is None              # 72 programs for 48 heads
    monkeypatch.setattr(tuning.gemm, "sm_count", lambda dev: 114)           # an H100 PCIe: 164 programs
    assert tuning._prep_programs(16, 32, 128, device) == 2 * 114 - 16 * 4
    switch(scan_beside_prep=False)
    assert tuning._prep_programs(16, 32, 128, device) is None
    switch(scan_beside_prep=True)
    monkeypatch.setattr(tuning, "pdl_options", lambda dev: {})
    assert tuning._prep_programs(16, 32, 128, device) is None
    switch(prep_persistent=False)
    assert tuning._prep_programs(16, 32, 128, device) is None


def test_scan_counters_are_not_inference_tensors(rt, monkeypatch):
    """The first call may come under torch.inference_mode() (the model's generation does); the counters it
    allocates are later restored with copy_ by the scan's GPU autotuner, perhaps outside that mode, which PyTorch
    refuses for an inference tensor (the H200 raised it while capturing prefill graphs)."""
    monkeypatch.setattr(device_counters, "_TICKETS", {})
    with torch.inference_mode():
        counters = device_counters._tickets(rt.device, 10)
    assert not counters.is_inference()
    counters.copy_(torch.zeros_like(counters))  # what the autotuner's restore does, outside inference mode


# ---------------------------------------------------------------- tuning of the chunked kernels


def test_chunked_kernels_tune_per_class_of_prompt_length(rt, gen, monkeypatch):
    """The prep's and the scan's GPU autotuners key their cache on the prompt's chunk count rounded up to a power of
    two (N_CLASS), and the launcher passes it: a tuning made on a short prompt (a chat's first turn, a small prefill
    bucket) must not serve a 2048-token one."""
    for kernel in ("chunk_prep_kernel", "chunk_scan_kernel"):
        assert "N_CLASS" in tuning._KEYS[kernel], f"{kernel}: N_CLASS missing from {tuning._KEYS[kernel]}"
    assert [deltanet.chunk_class(n) for n in (1, 2, 3, 5, 32, 33)] == [1, 2, 4, 8, 32, 64]
    seen = {}
    launch = tuning._launch

    def spy(kernel, grid, args, *rest, **kw):
        fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
        seen[fn.fn.__name__] = dict(zip(fn.arg_names, args))
        return launch(kernel, grid, args, *rest, **kw)
    monkeypatch.setattr(tuning, "_launch", spy)
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
    every = tuning._CONFIGS["chunk_prep_kernel"][0]
    for capability, want in (((7, 5), every[:1]), ((8, 0), every), ((9, 0), every)):
        monkeypatch.setattr(tuning, "tensor_core_dots", lambda device, c=capability: c[0] >= 8)
        assert autotune_configs("chunk_prep_kernel", q_ptr=q) == want, f"compute capability {capability}"
    assert autotune_configs("chunk_prep_kernel") == every, "asked without a call's arguments: every config"
    assert not kernels.tensor_core_dots("cpu")
    for capability, want in (((7, 5), False), ((8, 6), True), ((9, 0), True)):
        monkeypatch.setattr(kernels, "_capability", lambda index, c=capability: c)
        assert kernels.tensor_core_dots(torch.device("cuda", 0)) is want, f"compute capability {capability}"


def test_chunked_launch_runs_the_scan_with_its_pick(rt, gen, monkeypatch):
    """The launcher asks _pick_in_place once per call, keyed on the call's kind (its chunk class, the prep's form),
    and launches the scan with what it returns; the result is right with any config."""
    D = 16 if rt.device.type == "cpu" else deltanet.CHUNKED_MIN_HEAD_DIM  # smaller heads take the recurrent kernel
    configs = autotune_configs("chunk_scan_kernel", Dv=D)
    asked, used = [], []

    def pick(kernel, key, launch, states, on_gpu, calls, **named_args):
        asked.append((kernel, key, calls, named_args, states))
        return configs[-1]
    monkeypatch.setattr(tuning, "_pick_in_place", pick)
    launch = tuning._launch

    def spy(kernel, grid, args, kwargs, interpreter_meta, untuned=None):
        if "BV" in interpreter_meta:                      # the scan's launch
            used.append(untuned)
        return launch(kernel, grid, args, kwargs, interpreter_meta, untuned)
    monkeypatch.setattr(tuning, "_launch", spy)
    d = _delta_inputs(150, 1, 2, D, D, gen, rt.dtype, rt.device)
    ref_state = d["state"].clone()
    ref = reference.delta_rule_chunked(**{**d, "state": ref_state})
    _judge("o", delta_rule_chunked(**d), ref)
    _judge("state", d["state"], ref_state)
    assert used == [configs[-1]] and len(asked) == 1
    kernel, key, calls, named_args, states = asked[0]
    assert kernel == "chunk_scan_kernel" and named_args == {"Dv": D} and calls == 3
    assert key[2:8] == (2, D, D, 64, 4, False), key
    assert states[0] is d["state"] and states[1] is device_counters._tickets(rt.device, 1), \
        "the timing must put back the state and the scan's counters"


# ---------------------------------------------------------------- the teaching kernels (notebook 09)


@pytest.mark.parametrize("B, n", [(4, 16), (3, 37), (2, 64)])
def test_teaching_tril_inverse_matches_reference(B, n, rt, gen):
    """Notebook 09's forward substitution: (I + L)^-1 of strictly lower triangular L, overlapping keys as in a chunk."""
    from qwen_lab.kernels.deltanet import teach_chunked

    k = torch.nn.functional.normalize(checks.randn(B, n, 32, g=gen, device=rt.device), dim=-1)
    beta = torch.rand(B, n, 1, generator=gen).to(rt.device)
    G = (-torch.rand(B, n, generator=gen) * 0.3).cumsum(-1).to(rt.device)
    L = ((beta * k) @ k.transpose(1, 2) * (G[:, :, None] - G[:, None, :]).clamp(max=0).exp()).tril(-1).contiguous()
    checks.compare(f"teach tril inverse B={B} n={n}", teach_chunked.my_tril_inverse(L),
                   teach_chunked.ref_tril_inverse(L), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("T, Hk, Hv, D", [(7, 2, 2, 16), (70, 1, 2, 16), (130, 2, 4, 32)])
def test_teaching_chunked_matches_reference(T, Hk, Hv, D, rt):
    """Notebook 09's PyTorch prep + scan kernel as library code: a partial last chunk, Hv = Hk and a multiple of it.
    (Its scan holds fp32 tiles: on a GPU tl.dot rounds them to tf32, held to bf16's tolerance as the notebook does.)"""
    from qwen_lab.kernels.deltanet import teach_chunked

    if not runtime.interpreter_active():
        D = max(D, 64)  # Triton's chunk kernels are trusted on a GPU from heads of 64 on (CHUNKED_MIN_HEAD_DIM)
    case = _case(T, Hk, Hv, D, D, rt)

    def drop_out(g):
        d = case(g)
        del d["out"]  # the notebook's launcher allocates its output
        return d
    tol = {} if runtime.interpreter_active() else dict(zip(("atol", "rtol"), checks.tolerance(torch.bfloat16)))
    checks.check_kernel("teach delta_rule_chunked", teach_chunked.my_delta_rule_chunked,
                        reference.delta_rule_chunked, [drop_out], seed=T, inplace=("state",), quiet=True, **tol)


def test_teaching_segment_maps_compose_like_the_chain(gen):
    """Notebook 09's segment maps: a segment's (M, B) is its chunks' maps applied in order, and segments composed
    give the state of the chunks run one after the other."""
    from qwen_lab.kernels.deltanet import teach_chunked

    Dk, Dv, n = 8, 5, 7
    A = [torch.eye(Dk) * 0.9 + 0.05 * torch.randn(Dk, Dk, generator=gen) for _ in range(n)]
    b = [torch.randn(Dk, Dv, generator=gen) for _ in range(n)]
    S0 = torch.randn(Dk, Dv, generator=gen)

    def chain(S, lo, hi):
        for c in range(lo, hi):
            S = A[c] @ S + b[c]
        return S
    for lo, hi in [(0, 1), (0, 2), (2, 7)]:
        M, B = teach_chunked.segment_map(A[lo:hi], b[lo:hi])
        checks.compare(f"segment {lo}..{hi - 1}: M S0 + B", M @ S0 + B, chain(S0, lo, hi), atol=1e-5, rtol=1e-5)
        checks.compare(f"segment {lo}..{hi - 1}: B", B, chain(torch.zeros(Dk, Dv), lo, hi), atol=1e-5, rtol=1e-5)
    maps = [teach_chunked.segment_map(A[i:i + 2], b[i:i + 2]) for i in range(0, n, 2)]
    checks.compare("segments composed", teach_chunked.run_segments(maps, S0), chain(S0, 0, n), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- GPU: real shapes, bf16 inputs, fp32 state


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
def test_gpu_persistent_prep_beside_the_scan(rt, gen, monkeypatch, switch):
    """switches.prep_persistent at the model's shapes (2048 tokens, bf16): under PDL its scan starts beside the whole prep.
    Two prompts alternate through one workspace; every call must equal bit for bit the same persistent prep
    without PDL (the scan after it: a chunk read too early would show), and the grid's prep within bf16 rounding."""
    run = _two_prompts_through_one_workspace(rt, gen)
    switch(prep_persistent=False)
    grid = [run(0), run(1)]
    Hv, Dv = QWEN35_0_8B.linear_num_value_heads, QWEN35_0_8B.linear_value_head_dim
    programs = tuning.PREP_PROGRAMS_PER_SM * tuning.gemm.sm_count(rt.device) - Hv * Dv // 32
    switch(prep_persistent=programs)   # an int: the same count with PDL off
    monkeypatch.setenv("QWEN_LAB_PDL", "0")
    want = [run(0), run(1)]
    for i in range(2):
        _close(f"prompt {i}: o, persistent prep against the grid", want[i][0], grid[i][0])
        _close(f"prompt {i}: final state, persistent prep against the grid", want[i][1], grid[i][1])
    _alternate_under_pdl(run, want, monkeypatch)


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
    monkeypatch.setitem(tuning._PICKS, "chunk_scan_kernel", picks)
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
def test_gpu_grid_prep_tuned_on_the_call_leaves_the_counters_at_zero(T, rt, gen, monkeypatch, switch):
    """The prep as a grid (the larger Qwen3.5s' 32 and 48 value heads take it), tuned by Triton's autotuner on this
    very call, with the scan beside it under PDL: the autotuner's timing runs of the prep count chunks as ready,
    so they must be put back, or the scan would go on before the real prep had written its chunks and leave the
    real prep's counts behind. (On an H200, before the prep restored its counters, one prompt of one token
    left a counter at 1.)"""
    switch(prep_persistent=False)
    monkeypatch.setattr(deltanet.chunk_prep_kernel, "cache", {})        # tune again, on this call,
    monkeypatch.setattr(deltanet.chunk_prep_kernel, "cache_results", False)   # not from the disk cache
    monkeypatch.setitem(tuning._PICKS, "chunk_scan_kernel", {})
    d = _delta_inputs(T, 1, 2, 64, 64, gen, rt.dtype, rt.device)
    ref_state = d["state"].clone()
    ref = reference.delta_rule_chunked(**{**d, "state": ref_state})
    o = delta_rule_chunked(**d)
    left = device_counters._tickets(rt.device, 1).nonzero().flatten().tolist()
    assert not left, f"T={T}: counters {left} left non-zero after the prep was tuned on the call"
    _close(f"o at T={T}", o, ref)
    _close(f"state at T={T}", d["state"], ref_state)


@pytest.mark.gpu
def test_gpu_scan_picked_beside_the_prep_leaves_the_result_right(rt, gen, monkeypatch):
    """The first call of a kind times the scan's configs on the call's own state (then put back) before it runs:
    its output and final state must be those of the reference, and the pick kept for the next call."""
    monkeypatch.setitem(tuning._PICKS, "chunk_scan_kernel", {})
    Hk = Hv = QWEN35_0_8B.linear_num_value_heads
    Dk, Dv = QWEN35_0_8B.linear_key_head_dim, QWEN35_0_8B.linear_value_head_dim
    args, ref, ref_state = _fused_gates_case(2048, Hk, Hv, Dk, Dv, gen, rt)
    with count_launches() as launches:
        o = deltanet_chunked(**args)
    _close("o", o, ref)
    _close("state", args["state"], ref_state)
    assert sum(launches.values()) == 2, f"the timing runs are not the call's launches: {dict(launches)}"
    picks = list(tuning._PICKS["chunk_scan_kernel"].values())
    assert len(picks) == 1 and isinstance(picks[0], triton.Config), picks


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2048, 77])
def test_gpu_chunked_with_fused_gates(T, rt, gen):
    Hk = Hv = QWEN35_0_8B.linear_num_value_heads
    Dk, Dv = QWEN35_0_8B.linear_key_head_dim, QWEN35_0_8B.linear_value_head_dim
    args, ref, ref_state = _fused_gates_case(T, Hk, Hv, Dk, Dv, gen, rt)
    _close("o", deltanet_chunked(**args), ref)
    _close("state", args["state"], ref_state)
