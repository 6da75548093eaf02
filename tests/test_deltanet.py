"""The Gated DeltaNet family as a whole (qwen_lab.kernels.deltanet) against qwen_lab.reference and transformers:
the two forms against each other and against transformers, prefill then decode, the argument checks, the tuning
surface (the autotuners' restores, _pick_in_place, the switches), every GPU config of every
kernel, and the teaching files held to notebooks 08 and 09. Each form's own tests: test_deltanet_recurrent.py,
test_deltanet_chunked.py; what they share: deltanet_cases.py.
"""

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
from qwen_lab.kernels.deltanet import (autotune_configs, delta_rule_chunked, delta_rule_recurrent, deltanet_chunked,
                                       deltanet_conv_decode_step, deltanet_decode_step, deltanet_gates)
from qwen_lab.kernels.deltanet import tuning
from qwen_lab.switches import switches

from deltanet_cases import (_close, _delta_inputs, _gate_params, _judge, _run_conv_decode_guarded, _run_guarded,
                            fail_if_counters_left)
from notebook_source import assert_teaches


@pytest.fixture(autouse=True)
def _counters_left_at_zero():
    """Every test leaves the counters DeltaNet launches share at zero (see fail_if_counters_left)."""
    yield
    fail_if_counters_left()


# ---------------------------------------------------------------- both forms


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


# ---------------------------------------------------------------- the tuning surface


def test_autotuned_kernels_put_back_what_their_timing_runs_write_in_place():
    """On a GPU Triton's autotuner launches a kernel many times on the call's own arguments before the real launch.
    Whatever a launch updates in place must be put back after each timing run: the states (else the real launch
    starts from a state advanced many steps) and the scan's `ready` counters, which the prep counts up and only
    the scan clears (else the scan beside the real prep goes on before the prep has written its chunks)."""
    writes = {"delta_rule_recurrent_kernel": {"state_ptr"}, "conv_decode_step_kernel": {"state_ptr", "conv_state_ptr"},
              "chunk_prep_kernel": {"ready_ptr"}, "chunk_scan_kernel": {"state_ptr", "ready_ptr"}}
    assert set(writes) <= set(tuning._RESTORED), sorted(tuning._RESTORED)
    for kernel, written in writes.items():
        missing = written - set(tuning._RESTORED[kernel])
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
        return tuning._pick_in_place(kernel, key, launch, states, on_gpu, calls=5, Dv=128)
    monkeypatch.setattr(tuning, "_time_in_graph", timer)
    monkeypatch.setattr(tuning, "_PICKS", {kernel: {}})
    assert pick("a", launch, states, on_gpu=True) is configs[-2]
    assert sorted(set(launched)) == sorted(map(str, configs)), "every config timed"
    assert torch.equal(states[0], torch.zeros(2, 4, 4)) and torch.equal(states[1], torch.ones(6, 3)), \
        "the states must be put back after each timing, one that ran out of resources too"
    assert pick("a", None, states, on_gpu=True) is configs[-2], "the pick is kept"
    assert pick("b", launch, states, on_gpu=False) is None
    with switches.force_config(kernel, configs[0]):
        assert pick("c", launch, states, on_gpu=True) is None
    monkeypatch.setenv("QWEN_LAB_TUNE", "0")
    assert pick("d", launch, states, on_gpu=True) is None
    monkeypatch.setenv("QWEN_LAB_TUNE", "1")
    with torch.inference_mode():                         # a cache allocated under inference mode, a call outside it
        states = (torch.zeros(2, 4, 4), torch.ones(6, 3))
    assert pick("e", launch, states, on_gpu=True) is configs[-2]
    assert torch.equal(states[0], torch.zeros(2, 4, 4)) and torch.equal(states[1], torch.ones(6, 3))
    assert set(tuning._PICKS[kernel]) == {"a", "e"}, "only the timed kinds hold a pick"


def test_switches_reach_the_launchers_for_their_block_only(rt, gen, monkeypatch):
    """The family's switches set through qwen_lab.switches (as notebook 09 and the benchmarks do) reach the launchers
    inside the `with` block and no further: a scan group of 1 (ten chunks), the prep as 3 programs and the scan
    after it give the same result, and a replaced _launch in tuning.py sees every launch."""
    seen = set()
    launch = tuning._launch

    def spy(kernel, *rest, **kw):
        fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
        seen.add(fn.fn.__name__)
        return launch(kernel, *rest, **kw)
    monkeypatch.setattr(tuning, "_launch", spy)
    T = 9 * 64 + 5
    d = _delta_inputs(T, 1, 2, 64, 64, gen, rt.dtype, rt.device)
    ref_state = d["state"].clone()
    ref = reference.delta_rule_chunked(**{**d, "state": ref_state})
    with switches.set(prep_persistent=3, scan_group=1, scan_beside_prep=False):
        assert (switches.prep_persistent, switches.scan_group, switches.scan_beside_prep) == (3, 1, False)
        assert tuning._prep_programs(2, 10, 64, rt.device) == 3
        _judge("o", delta_rule_chunked(**d), ref)
    _judge("state", d["state"], ref_state)
    assert seen == {"chunk_prep_kernel", "chunk_scan_kernel"}, seen
    assert switches.prep_persistent is True and switches.scan_group == 8 and switches.scan_beside_prep is True


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


# ---------------------------------------------------------------- the teaching kernels: the notebooks' own text


def test_teaching_kernels_are_the_notebooks_solutions():
    """deltanet/teach_recurrent.py holds Exercises 08.2 and 08.3's solutions, teach_chunked.py 09.1, 09.2 and
    09.3's, as the notebooks have them: the two must not drift apart."""
    assert_teaches("08_gated_deltanet_recurrent.ipynb", "qwen_lab/kernels/deltanet/teach_recurrent.py", exercises=["08.2", "08.3"])
    assert_teaches("09_gated_deltanet_chunked.ipynb", "qwen_lab/kernels/deltanet/teach_chunked.py", exercises=["09.1", "09.2", "09.3"])


# ---------------------------------------------------------------- GPU: every autotuning config, faults isolated
#
# A kernel that faults leaves the CUDA context unusable, so one bad config would fail every later test of this
# process with the same error. This test runs every config the autotuner may pick (forced one by one, guarded as
# in deltanet_cases.py) in a child process: the chunk kernels at T = 1 and on a prompt of exactly one chunk, with
# 64-wide heads (the narrowest they serve on a GPU; smaller ones faulted on the H200 and now take the recurrent
# kernel) and with Qwen3.5-0.8B's, and at T = 77 (two chunks); the recurrent kernels with small heads and
# Qwen3.5's. A child that faults reports the job and exits; the next child starts after it. The report lists every
# job.


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository (for child processes)


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
    # the child runs this file as a script: the repository and tests/ (the helpers beside it) on its path
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1",
               PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]
                                          + [p for p in [os.environ.get("PYTHONPATH")] if p]))
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


# ---------------------------------------------------------------- GPU: the two forms on real shapes


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
